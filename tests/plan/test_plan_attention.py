"""segadv-plan plans F.scaled_dot_product_attention as the CUDA kernel a GPU runs (flash or
memory-efficient: no N x N attention matrix kept), and the math path where that is what runs."""

import json

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from conftest import needs_planner_torch
from segadv.cli.plan import main
from segadv.plan import attention

pytestmark = needs_planner_torch

# configs/dinov2_tiny (ViT-S/14: 6 heads, 4 blocks) under the mean teacher, at 168 px: N = 12 x 12
# patches + the class token; batch 2, float32 (so CUDA's kernel is the memory-efficient one).
SIDE, BATCH, HEADS, DEPTH = 168, 2, 6, 4
TINY = ["--config", "dinov2_tiny", "method.name=mean_teacher", f"data.synthetic.image_size={SIDE}",
        f"target_data.synthetic.image_size={SIDE}", f"data.batch_size={BATCH}", "--steps", "1",
        "--device-map", "g:0,t:0"]


def peak(capsys, kernel):
    """cuda:0's peak, the most live at once: the moment the saved attention matrices count in. (The
    activations column is the largest of the other bytes at any moment, which at this size is
    reached at another moment of the iteration, the same for both kernels.)"""
    assert main([*TINY, f"model.generator.attention={kernel}", "--json"]) == 0
    return json.loads(capsys.readouterr().out)["devices"]["cuda:0"]["peak_bytes"]


def test_fused_attention_keeps_no_attention_matrix(capsys, monkeypatch):
    tokens = (SIDE // 14) ** 2 + 1
    # Each G forward is followed by its own backward: one batch's graph is live at the peak, each
    # block holding its softmax(QK^T) (B, heads, N, N) in fp32 on the math path.
    matrices = DEPTH * BATCH * HEADS * tokens * tokens * 4
    math, fused = peak(capsys, "math"), peak(capsys, "fused")
    # what the efficient kernel keeps instead: a logsumexp of (B, heads, N rounded up to 32) in fp32
    logsumexp = DEPTH * BATCH * HEADS * -(-tokens // 32) * 32 * 4
    assert math - fused == pytest.approx(matrices - logsumexp, rel=0.01)

    # The math plan is what it was before the stand-in routed SDPA: timm spells attention out and
    # never calls it, so the routing mode passes everything through.
    monkeypatch.setattr(attention.CudaAttention, "__torch_function__",
                        lambda self, func, types, args=(), kwargs=None: func(*args, **(kwargs or {})))
    assert peak(capsys, "math") == math


def test_the_plan_says_which_kernel_it_assumed_per_network(capsys):
    assert main([*TINY, "--steps", "1"]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if "scaled_dot_product_attention" in line]
    assert len(notes) == 1
    assert "generator: efficient" in notes[0] and "teacher: efficient" in notes[0]


def test_checkpointed_blocks_recompute_with_the_same_kernel(capsys):
    """Activation checkpointing recomputes each block inside the backward, on autograd's thread:
    the routing holds there too (a thread's function mode would not, and the recompute's other
    saved tensors would abort the process), and the recompute is not counted as a second call."""
    assert main([*TINY, "model.generator.activation_checkpointing=true", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["devices"]["cuda:0"]["peak_bytes"] > 0


@pytest.mark.parametrize("dtype, head, expected", [
    (torch.bfloat16, 64, "flash"), (torch.float16, 64, "flash"), (torch.float32, 64, "efficient"),
    (torch.bfloat16, 320, "efficient"), (torch.float32, 6, "math"),
])
def test_cuda_kernel_choice(dtype, head, expected):
    q = torch.empty(1, 2, 5, head, dtype=dtype, device="meta")
    assert attention.cuda_kernel(q, q, q, None, False) == expected


def test_cuda_kernel_choice_follows_sdpa_kernel_switches_and_masks():
    q = torch.empty(1, 2, 5, 64, dtype=torch.bfloat16, device="meta")
    mask = torch.empty(1, 1, 5, 5, dtype=torch.bool, device="meta")
    assert attention.cuda_kernel(q, q, q, mask, False) == "efficient"  # flash takes no mask
    with sdpa_kernel(SDPBackend.MATH):
        assert attention.cuda_kernel(q, q, q, None, False) == "math"


def test_the_split_dinov2_b_mean_teacher_with_d_is_planned_per_device(capsys):
    """G's blocks over cuda:0 and cuda:1, the teacher and D on cuda:1: one peak per device. DINOv2-B
    cut to 4 blocks at 56 px so the test stays small; the split and the roles are the real ones."""
    argv = ["--config", "mean_teacher_dinov2_voc", "model.generator.encoder=vit_base_patch14_dinov2",
            "loss.lambda_adv=0.001", "model.generator.depth=4", "data.batch_size=1",
            "method.mean_teacher.unlabeled_batch_size=1", "train.max_steps=2", "--steps", "1",
            "--device-map", "g:0/1,d:1,t:1"]
    pipeline = [{"name": "RandomCrop", "height": 56, "width": 56}]
    argv += [f"data.train_transforms={json.dumps(pipeline)}", f"data.val_transforms={json.dumps(pipeline)}"]
    assert main(argv) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()
            if line.startswith("cuda:")}
    assert set(rows) == {"cuda:0", "cuda:1"}
    assert all(float(row[5]) > 0 for row in rows.values())  # the peak column
