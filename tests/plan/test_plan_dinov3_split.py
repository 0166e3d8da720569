"""segadv-plan of DINOv3's G split into pipeline stages (``g:0/1,d:0``, configs/dinov3_tiny.yaml)
on two stand-in GPUs: each stage's weights on its own device and nothing anywhere else, and a
planted bug (a later stage handed the first stage's rotary embedding) caught."""

import pytest

import segadv.models.vit.model as vit_model
from conftest import needs_planner_torch
from segadv.cli.plan import main
from segadv.config import load_config
from segadv.models import build_discriminator, build_generator
from segadv.plan.accounting import PlacementError
from segadv.plan.dry_run import dry_run

pytestmark = needs_planner_torch

SMALL = ["data.batch_size=2", "train.max_steps=2"]
# dinov3_tiny's 4 blocks split evenly: the embedding (the rotary periods with it) and blocks 0-1 on
# the first stage, blocks 2-3, the final norm and the head on the second.
SECOND_STAGE = ("encoder.blocks.2.", "encoder.blocks.3.", "encoder.norm.", "head.")


def config(device_map="g:0/1,d:0"):
    return load_config("dinov3_tiny", [f"device_map={device_map}", *SMALL])


def tensor_bytes(named):
    return sum(t.numel() * t.element_size() for _, t in named)


def test_each_stage_is_planned_on_its_own_device_and_nothing_elsewhere():
    cfg = config()
    plan = dry_run(cfg, steps=1)
    assert list(plan.devices) == ["cuda:0", "cuda:1"]
    g = build_generator(cfg.model.generator, cfg.data.num_classes)
    d = build_discriminator(cfg.model.discriminator, cfg.data.num_classes)
    tensors = [*g.named_parameters(), *g.named_buffers()]
    second = [(name, t) for name, t in tensors if name.startswith(SECOND_STAGE)]
    first = [(name, t) for name, t in tensors if not name.startswith(SECOND_STAGE)]
    assert any(name == "encoder.rope.periods" for name, _ in first)
    d_bytes = tensor_bytes([*d.named_parameters(), *d.named_buffers()])
    assert plan.devices["cuda:0"].params_bytes == tensor_bytes(first) + d_bytes
    assert plan.devices["cuda:1"].params_bytes == tensor_bytes(second)
    for row in plan.devices.values():
        assert row.grads_bytes > 0 and row.activations_bytes > 0 and row.flops_per_iteration > 0


def test_the_command_line_plans_the_two_stages(capsys):
    assert main(["--config", "dinov3_tiny", *SMALL, "--steps", "1", "--device-map", "g:0/1,d:0"]) == 0
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.startswith(("cuda:", "cpu"))]
    assert rows == ["cuda:0", "cuda:1"]


def test_a_stage_handed_the_first_stages_rotary_embedding_is_caught(monkeypatch):
    """Planted bug: the tokens go to each block's device, the rotary embedding stays where the
    embedding made it; blocks 2 and 3 on cuda:1 would read it from cuda:0."""

    def tokens_only(device, tokens, block_inputs):
        return tokens.to(device), block_inputs

    monkeypatch.setattr(vit_model, "to_stage", tokens_only)
    with pytest.raises(PlacementError, match="mixes devices"):
        dry_run(config(), steps=1)
