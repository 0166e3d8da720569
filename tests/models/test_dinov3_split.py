"""DINOv3's G split into pipeline stages (the device map's ``g:0/1``; segadv/models/vit/split.py):
the split forward and its gradients equal the unsplit model's on the CPU, each stage's tensors are
where the split puts them (the rotary embedding's periods with the embedding), and every block reads
the rotary embedding on its own device (a CPU + meta split: meta refuses a host tensor)."""

import copy

import pytest
import torch
from dinov3_tiny import images, tiny

from segadv.errors import UserError
from segadv.parallel.activation_checkpoint import checkpointed
from segadv.parallel.pipeline import can_split, is_split

META = torch.device("meta")
CPU = torch.device("cpu")


def loss_and_grads(model, x):
    out = model(x)
    (out.square().mean() + out.mean()).backward()
    return out.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def assert_same_logits_and_gradients(model, split, x):
    out, grads = loss_and_grads(model, x)
    out_s, grads_s = loss_and_grads(split, x)
    assert torch.equal(out, out_s)
    assert grads.keys() == grads_s.keys()
    assert [k for k in grads if not torch.equal(grads[k], grads_s[k])] == []


@pytest.mark.parametrize("boundaries", [None, [1], [3]])
def test_split_over_two_devices_equals_the_unsplit_model_bitwise(boundaries):
    model = tiny().train()
    split = copy.deepcopy(model)
    split.split([CPU, CPU], boundaries)
    assert len(split.placement.blocks) == 4 and split.pipeline_devices == (CPU, CPU)
    assert list(split.state_dict()) == list(model.state_dict())
    assert_same_logits_and_gradients(model, split, images(48, 80))


def test_checkpointed_blocks_take_the_rotary_embedding_when_split():
    model = tiny().train()
    wrapped = copy.deepcopy(model)
    for name in wrapped.checkpoint_units():
        checkpointed(wrapped.get_submodule(name))
    wrapped.split([CPU, CPU])  # both at once, as a large model would run
    assert list(wrapped.state_dict()) == list(model.state_dict())
    assert_same_logits_and_gradients(model, wrapped, images())


def test_each_stage_is_placed_on_its_device_and_the_rotary_periods_go_with_the_embedding():
    model = tiny()
    assert [name for name, _ in model.stages()] == ["embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "head"]
    model.split([CPU, META], [1])
    vit = model.encoder
    assert model.placement.blocks == (CPU, META, META, META)
    assert model.placement.embed == CPU and model.placement.head == META
    first = [vit.cls_token, vit.reg_token, vit.rope.periods, *vit.patch_embed.parameters(), *vit.blocks[0].parameters()]
    assert {t.device for t in first} == {CPU}
    last = [*vit.blocks[1:].parameters(), *vit.norm.parameters(), *model.head.parameters()]
    assert {t.device for t in last} == {META}
    on_the_host = {name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.device == CPU}
    assert on_the_host == {"encoder.cls_token", "encoder.reg_token", "encoder.rope.periods",
                           *(f"encoder.{name}" for name, _ in vit.patch_embed.named_parameters(prefix="patch_embed")),
                           *(f"encoder.{name}" for name, _ in vit.blocks[0].named_parameters(prefix="blocks.0"))}


def test_every_stage_reads_the_rotary_embedding_on_its_own_device():
    """The rotary embedding is made on the first stage (its periods' device); a later block given
    it there would compute on two devices. Over the host and meta, that is an error; handed over,
    the logits come out on the last stage."""
    model = tiny()
    model.split([CPU, META], [2])
    with torch.no_grad():
        logits = model(images())
    assert logits.device == META and logits.shape == (2, 5, 64, 64)


def test_the_model_is_splittable_as_placement_asks_and_refuses_bad_boundaries():
    model, reference = tiny(), tiny()
    assert can_split(model) and model.pipeline_devices == () and not is_split(model)
    model.split([CPU, CPU])
    assert is_split(model) and model.placement.blocks == (CPU,) * 4
    with torch.no_grad():
        assert torch.equal(model(images()), reference(images()))
    for bad, match in [([0], r"need 1 increasing block indices between 1 and 3"), ([4], r"between 1 and 3")]:
        with pytest.raises(UserError, match=match):
            tiny().split([CPU, CPU], bad)
    with pytest.raises(UserError, match="5 devices for an encoder of 4 blocks"):
        tiny().split([CPU] * 5)


@pytest.mark.cuda
def test_split_over_cpu_and_cuda_moves_activations_the_rotary_embedding_and_gradients():
    model = tiny().train()
    split = copy.deepcopy(model)
    split.split([CPU, torch.device("cuda:0")])
    cuda = torch.device("cuda:0")
    assert split.encoder.rope.periods.device == CPU and split.encoder.blocks[3].attn.qkv.weight.device == cuda
    out, grads = loss_and_grads(model, images())
    out_s, grads_s = loss_and_grads(split, images())
    assert out_s.device == cuda
    torch.testing.assert_close(out_s.cpu(), out, rtol=1e-4, atol=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(grads_s[name].cpu(), grad, rtol=1e-3, atol=1e-5, msg=name)
