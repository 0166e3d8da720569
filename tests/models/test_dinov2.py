"""The DINOv2 + DPT generator: shapes, the patch rule, the attention kernels, the features timm
computes, the head's widths, its blocks split over devices and checkpointed, and ONNX export."""

import copy
import io

import pytest
import torch
from dinov2_tiny import images, tiny_model

from segadv.errors import UserError
from segadv.models.dinov2.dpt import DinoV2DPT
from segadv.models.dinov2.encoder import SIZES, create_encoder, default_layers, embed, position_embedding
from segadv.models.vit.encoder import check_input_size, patch_tokens
from segadv.models.vit.split import even_boundaries, split_blocks
from segadv.parallel.activation_checkpoint import checkpointed


@pytest.mark.parametrize("encoder", ["vit_small_patch14_dinov2", "vit_base_patch14_reg4_dinov2"])
@pytest.mark.parametrize("height, width", [(56, 56), (70, 70), (112, 112), (56, 112)])
def test_logits_have_the_classes_at_the_input_size(encoder, height, width):
    model = tiny_model(encoder).eval()
    with torch.no_grad():
        out = model(images(2, height, width))
    assert out.shape == (2, 5, height, width) and out.dtype == torch.float32
    assert torch.isfinite(out).all()


def test_the_position_embedding_is_resampled_so_the_logits_depend_on_the_grid():
    """The same 56 x 56 content at the top left of a 112 px input sees other positions: were the
    position embedding not resampled the 8 x 8 grid could not run at all (4 x 4 built)."""
    model = tiny_model().eval()
    x = images(1, 112, 112)
    with torch.no_grad():
        big = model(x)
        small = model(x[..., :56, :56])
    assert not torch.allclose(big[..., :56, :56], small, atol=1e-3)


@pytest.mark.parametrize("height, width", [(520, 518), (518, 520), (55, 56)])
def test_a_size_that_is_not_a_multiple_of_the_patch_is_one_user_error_naming_it(height, width):
    model = tiny_model(input_name="data.crop_size")
    with pytest.raises(UserError) as err:
        model(torch.zeros(1, 3, height, width))
    message = str(err.value)
    assert "data.crop_size" in message and f"{height}x{width}" in message and "(14)" in message
    assert "\n" not in message
    check_input_size(518, 798, "the input", 14)  # multiples pass


def test_fused_and_math_attention_give_the_same_logits_and_gradients():
    fused = tiny_model(attention="fused")
    math = copy.deepcopy(fused)
    math.set_attention("math")
    assert all(not b.attn.fused_attn for b in math.encoder.blocks)
    assert all(b.attn.fused_attn for b in fused.encoder.blocks)
    x = images()
    out_f, out_m = fused(x), math(x)
    torch.testing.assert_close(out_f, out_m, rtol=1e-5, atol=1e-5)
    out_f.square().mean().backward()
    out_m.square().mean().backward()
    for (name, p_f), p_m in zip(fused.named_parameters(), math.parameters()):
        torch.testing.assert_close(p_f.grad, p_m.grad, rtol=1e-4, atol=1e-6, msg=name)
    with pytest.raises(UserError, match="'flash'"):
        fused.set_attention("flash")


def test_the_head_reads_what_timm_computes_for_those_blocks():
    """Our walk over the blocks (which the device split needs) gives timm's own intermediates,
    the final norm applied and the prefix tokens dropped (UniMatch V2's get_intermediate_layers)."""
    model = tiny_model("vit_small_patch14_reg4_dinov2", layers=(0, 2, 2, 3)).eval()
    assert model.encoder.patch_embed.grid_size == (4, 4)  # the built grid: no resampling, timm's exactly
    vit, x = model.encoder, images(1, 56, 56)
    with torch.no_grad():
        ours, tokens = [], embed(vit, x)
        for block in vit.blocks:
            tokens = block(tokens)
            ours.append(patch_tokens(vit, tokens))
        timm_ = vit.forward_intermediates(x, indices=[0, 2, 3], norm=True, output_fmt="NLC", intermediates_only=True)
    for got, want in zip([ours[0], ours[2], ours[3]], timm_):
        assert got.shape == (1, 4 * 4, 32)
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("encoder", ["vit_small_patch14_dinov2", "vit_small_patch14_reg4_dinov2"])
def test_the_position_embedding_is_resampled_as_the_official_dinov2_code_does(encoder):
    """DINOv2's interpolate_pos_encoding: the patch positions as a built-grid image, bicubic with
    scale factors (grid + 0.1) / built grid, no antialiasing; the class position kept."""
    vit = tiny_model(encoder).encoder
    with torch.no_grad():
        for grid in [(5, 4), (8, 8), (2, 3)]:
            got = position_embedding(vit, grid)
            prefix = 0 if vit.no_embed_class else 1
            patches = vit.pos_embed[:, prefix:].reshape(1, 4, 4, 32).permute(0, 3, 1, 2)
            want = torch.nn.functional.interpolate(patches, scale_factor=((grid[0] + 0.1) / 4, (grid[1] + 0.1) / 4),
                                                   mode="bicubic", antialias=False)
            want = torch.cat([vit.pos_embed[:, :prefix], want.permute(0, 2, 3, 1).reshape(1, -1, 32)], dim=1)
            assert got.shape == (1, prefix + grid[0] * grid[1], 32)
            assert torch.equal(got, want)
        assert position_embedding(vit, (4, 4)) is vit.pos_embed


def test_every_parameter_takes_part_in_the_loss():
    """No parameter outside the loss (the reference's unused refinenet4.resConfUnit1 is not
    built), so DDP runs with find_unused_parameters=False."""
    model = tiny_model("vit_small_patch14_reg4_dinov2")
    model(images()).mean().backward()
    assert [name for name, p in model.named_parameters() if p.grad is None] == []
    assert not hasattr(model.head.scratch.refinenet4, "resConfUnit1")


def test_layers_default_to_unimatch_v2s_and_are_spread_evenly_over_a_shallower_encoder():
    assert default_layers("vit_small_patch14_dinov2", 12) == (2, 5, 8, 11)
    assert default_layers("vit_base_patch14_reg4_dinov2.lvd142m", 12) == (2, 5, 8, 11)
    assert default_layers("vit_large_patch14_dinov2", 24) == (4, 11, 17, 23)
    assert default_layers("vit_large_patch14_dinov2", 12) == (2, 5, 8, 11)
    assert default_layers("vit_small_patch14_dinov2", 4) == (0, 1, 2, 3)
    assert default_layers("vit_small_patch14_dinov2", 2) == (0, 0, 1, 1)
    with pytest.raises(UserError, match="intermediate layer 4 is not a block of this 4-block encoder"):
        tiny_model(layers=(0, 1, 2, 4))
    with pytest.raises(UserError, match=r"end before the encoder's last block \(3\).*set the depth to 3"):
        tiny_model(layers=(0, 1, 1, 2))
    with pytest.raises(UserError, match="exactly 4"):
        tiny_model(layers=(0, 1, 2))
    with pytest.raises(UserError, match="not a DINOv2 encoder"):
        DinoV2DPT("vit_small_patch16_224", 5)


def test_layers_out_of_order_are_refused_by_the_schema_naming_the_key():
    """The head reads its blocks shallow to deep; only the last index is the encoder's to check."""
    from segadv.config import load_config

    with pytest.raises(UserError, match=r"model\.generator\.layers: \[3, 2, 1, 0\] is not in order: the head reads "
                                        r"its four blocks shallow to deep.*e\.g\. \[0, 1, 2, 3\]"):
        load_config("dinov2_tiny", ["model.generator.layers=[3,2,1,0]"])
    with pytest.raises(UserError, match="model.generator.layers: .* is not in order"):
        load_config("dinov2_tiny", ["model.generator.layers=[0,2,1,3]"])
    # A shallow encoder's default repeats a block (0, 0, 1, 1): a repeat is in order.
    assert load_config("dinov2_tiny", ["model.generator.layers=[0,0,1,3]"]).model.generator.layers == [0, 0, 1, 3]


def test_the_head_widths_are_unimatch_v2s_per_size():
    assert (SIZES["small"].features, SIZES["small"].out_channels) == (64, (48, 96, 192, 384))
    assert (SIZES["base"].features, SIZES["base"].out_channels) == (128, (96, 192, 384, 768))
    assert (SIZES["large"].features, SIZES["large"].out_channels) == (256, (256, 512, 1024, 1024))
    # The real ViT-S width at one block: the head's projections are the table's.
    model = DinoV2DPT("vit_small_patch14_dinov2", 3, depth=1, img_size=56)
    assert model.encoder.embed_dim == 384
    assert [p.out_channels for p in model.head.projects] == [48, 96, 192, 384]
    assert model.head.scratch.output_conv[0].out_channels == 64
    assert model.layers == (0, 0, 0, 0)


def test_the_encoder_is_built_at_dinov2s_grid_with_the_requested_depth_and_drop_path():
    vit = create_encoder("vit_small_patch14_reg4_dinov2", depth=2, drop_path_rate=0.2,
                         overrides=dict(embed_dim=32, num_heads=2))
    assert vit.patch_embed.grid_size == (37, 37) and vit.pos_embed.shape == (1, 37 * 37, 32)
    assert vit.reg_token.shape == (1, 4, 32) and len(vit.blocks) == 2
    assert vit.blocks[1].drop_path1.drop_prob == pytest.approx(0.2)
    with pytest.raises(UserError, match="not a multiple of the patch"):
        create_encoder("vit_small_patch14_dinov2", img_size=225)


# ---- the split over devices and activation checkpointing ----------------------------------------

def loss_and_grads(model, x):
    out = model(x)
    (out.square().mean() + out.mean()).backward()
    return out.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("boundaries", [None, [1], [3]])
def test_split_over_two_devices_equals_the_unsplit_model_bitwise(boundaries):
    model = tiny_model(drop_path_rate=0.0)
    split = copy.deepcopy(model)
    placement = split_blocks(split, ["cpu", "cpu"], boundaries)
    assert split.placement is placement and len(placement.blocks) == 4
    assert list(split.state_dict()) == list(model.state_dict())
    x = images()
    out, grads = loss_and_grads(model, x)
    out_s, grads_s = loss_and_grads(split, x)
    assert torch.equal(out, out_s)
    assert grads.keys() == grads_s.keys()
    assert all(torch.equal(grads[k], grads_s[k]) for k in grads)


def test_split_places_each_stage_and_refuses_bad_boundaries():
    assert even_boundaries(4, 2) == [2]
    assert even_boundaries(12, 2) == [6]
    assert even_boundaries(24, 3) == [8, 16]
    assert even_boundaries(5, 3) == [2, 4]  # runs of 2, 2, 1
    model = tiny_model()
    assert [name for name, _ in model.stages()] == ["embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "head"]
    placement = split_blocks(model, [torch.device("cpu"), torch.device("cpu")], [1])
    assert placement.blocks == (torch.device("cpu"),) * 4
    assert placement.embed == placement.head == torch.device("cpu")
    for bad, match in [([0], r"need 1 increasing block indices between 1 and 3"), ([4], r"between 1 and 3"),
                       ([1, 2], "2 stages of 4 blocks need 1")]:
        with pytest.raises(UserError, match=match):
            split_blocks(tiny_model(), ["cpu", "cpu"], bad)
    with pytest.raises(UserError, match="5 devices for an encoder of 4 blocks"):
        split_blocks(tiny_model(), ["cpu"] * 5)


@pytest.mark.cuda
def test_split_over_cpu_and_cuda_moves_activations_and_gradients_between_them():
    model = tiny_model()
    split = copy.deepcopy(model)
    split_blocks(split, ["cpu", "cuda:0"])
    cuda = torch.device("cuda:0")
    assert split.encoder.pos_embed.device.type == "cpu" and split.encoder.blocks[0].attn.qkv.weight.device.type == "cpu"
    assert split.encoder.blocks[3].attn.qkv.weight.device == cuda and split.head.projects[0].weight.device == cuda
    split.set_attention("math"), model.set_attention("math")  # one kernel on both devices
    x = images()
    out, grads = loss_and_grads(model, x)
    out_s, grads_s = loss_and_grads(split, x)
    assert out_s.device == cuda
    torch.testing.assert_close(out_s.cpu(), out, rtol=1e-4, atol=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(grads_s[name].cpu(), grad, rtol=1e-3, atol=1e-5, msg=name)


def test_checkpointing_each_block_keeps_the_keys_the_logits_and_the_gradients():
    model = tiny_model()
    wrapped = copy.deepcopy(model)
    units = wrapped.checkpoint_units()
    assert units == ["encoder.blocks.0", "encoder.blocks.1", "encoder.blocks.2", "encoder.blocks.3", "head"]
    for name in units:
        checkpointed(wrapped.get_submodule(name))
    assert type(wrapped.encoder.blocks[0]).__name__ == "CheckpointedBlock"
    split_blocks(wrapped, ["cpu", "cpu"])  # both at once, as a large model would run
    assert list(wrapped.state_dict()) == list(model.state_dict())
    x = images()
    out, grads = loss_and_grads(model, x)
    out_w, grads_w = loss_and_grads(wrapped, x)
    assert torch.equal(out, out_w)
    assert all(torch.equal(grads[k], grads_w[k]) for k in grads)
    model.load_state_dict(wrapped.state_dict(), strict=True)


# ---- export --------------------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore::DeprecationWarning")
@pytest.mark.parametrize("attention", ["fused", "math"])
def test_onnx_export_at_opset_17_matches_torch(attention):
    ort = pytest.importorskip("onnxruntime")
    model = tiny_model("vit_small_patch14_reg4_dinov2", attention=attention).eval()
    x = images(1, 70, 56)
    buffer = io.BytesIO()
    torch.onnx.export(model, (x,), buffer, opset_version=17, input_names=["image"], output_names=["logits"],
                      dynamo=False)
    session = ort.InferenceSession(buffer.getvalue(), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"image": x.numpy()})
    with torch.no_grad():
        want = model(x)
    assert got.shape == (1, 5, 70, 56)
    torch.testing.assert_close(torch.from_numpy(got), want, rtol=1e-4, atol=1e-4)


def test_the_model_is_splittable_as_placement_asks():
    """The protocol segadv/parallel/pipeline.py places by: split over the stages' devices (one may
    repeat), each stage's device reported in order, outputs equal to the unsplit model's."""
    from segadv.parallel.pipeline import can_split, is_split

    torch.manual_seed(0)
    model = tiny_model()
    reference = tiny_model()
    reference.load_state_dict(model.state_dict())
    assert can_split(model) and model.pipeline_devices == ()
    model.split([torch.device("cpu"), torch.device("cpu")])
    assert model.pipeline_devices == (torch.device("cpu"), torch.device("cpu")) and is_split(model)
    assert list(model.state_dict()) == list(reference.state_dict())
    x = torch.randn(1, 3, 56, 56)
    assert torch.equal(model(x), reference(x))
