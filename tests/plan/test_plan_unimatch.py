"""segadv-plan of UniMatch: V2's EMA teacher where the device map puts it (t:0), the images G
carries a gradient for (V2: the labeled batch and two strong views; V1 the weak view besides),
the DINOv2 G split into stages, and a planted bug (the teacher's pseudo labels left on its own
device) caught."""

import pytest

from conftest import TINY_OVERRIDES, needs_planner_torch
from segadv.config import load_config
from segadv.methods.unimatch import iteration as um_iteration
from segadv.plan.accounting import PlacementError
from segadv.plan.dry_run import dry_run

pytestmark = needs_planner_torch

UNIMATCH = [*TINY_OVERRIDES, "method.name=unimatch"]
DINOV2 = ["model.generator={arch: dinov2, encoder: vit_small_patch14_dinov2, depth: 2, head_features: 16, "
          "head_out_channels: [8, 16, 32, 64]}", "data.synthetic.image_size=42", "data.normalization=imagenet"]


def planned(device_map, *overrides):
    return dry_run(load_config(None, [*UNIMATCH, f"device_map={device_map}", *overrides]), steps=1)


def test_v2s_teacher_on_ds_card_and_three_gradient_carrying_batches_on_gs():
    plan = planned("g:1,d:0,t:0")
    g_row, t_row = plan.devices["cuda:1"], plan.devices["cuda:0"]
    assert t_row.params_bytes == g_row.params_bytes > 0 and t_row.grads_bytes == t_row.optimizer_bytes == 0
    batch = load_config(None, UNIMATCH).data.batch_size
    assert g_row.gradient_images_per_iteration == 3 * batch and g_row.gradient_batches_per_iteration == 3
    assert t_row.gradient_images_per_iteration == 0  # the teacher's forward keeps nothing for a backward
    assert t_row.flops_per_iteration > 0


@pytest.mark.parametrize("overrides, batches", [
    (["method.unimatch.variant=v1"], 4),  # the labeled batch and the weak view in one forward, two strong views
    (["method.unimatch.variant=v1", "model.generator.arch=deeplabv3plus_unimatch"], 4),  # UniMatch's own head
    (["loss.lambda_adv=0.01"], 4),  # V2 with D on top: the student's own forward of the weak view
    (["method.name=supervised", "loss.lambda_adv=0"], 1),
])
def test_gradient_carrying_batches_by_setting(overrides, batches):
    plan = planned("g:0,d:0", *overrides)
    assert plan.devices["cuda:0"].gradient_batches_per_iteration == batches


@pytest.mark.parametrize("variant", ["v1", "v2"])
def test_a_split_dinov2_g_plans_with_its_feature_scales_on_the_heads_stage(variant):
    extra = [f"method.unimatch.variant={variant}", *DINOV2]
    plan = planned("g:0/1,d:1" + (",t:1" if variant == "v2" else ""), *extra)
    first, last = plan.devices["cuda:0"], plan.devices["cuda:1"]
    assert first.params_bytes > 0 and last.params_bytes > 0 and first.activations_bytes > 0
    assert first.gradient_batches_per_iteration == (3 if variant == "v2" else 4)


def test_pseudo_labels_left_on_the_teachers_device_are_caught(monkeypatch):
    """Planted bug: the teacher's argmax and confidence not handed back to G's device (t:0, G on
    cuda:1): pasting them into the views mixes devices, as CUDA would refuse."""

    def unhanded(self, images):
        t = self.teacher
        t.module.eval()
        logits = t.module(um_iteration.hand_over(self.phases, images, self.g, t))
        confidence, pseudo = um_iteration.mixing.teacher_confidence(logits.float())
        return pseudo, confidence

    monkeypatch.setattr(um_iteration.UniMatchV2, "teacher_labels", unhanded)
    with pytest.raises(PlacementError, match="mixes devices"):
        planned("g:1,d:0,t:0")
