"""The DINOv3 generator (segadv/models/dinov3): timm's Eva with the DPT head of segadv/models/vit.
Tiny models (4 blocks of width 32): milliseconds a forward on one CPU thread."""

import pytest
import torch
from dinov3_tiny import images, tiny

from segadv.config.schema import GeneratorConfig
from segadv.errors import UserError
from segadv.models import build_generator
from segadv.models.dinov3.encoder import SIZES, meta_layers, rope_embed
from segadv.models.dinov3.model import DinoV3DPT
from segadv.models.dinov3.weights import load_encoder_weights


def test_the_config_builds_g_with_metas_layers_at_full_depth_and_evenly_spaced_ones_when_reduced():
    assert meta_layers(12) == (2, 5, 8, 11) and meta_layers(24) == (4, 11, 17, 23)
    assert meta_layers(32) == (7, 15, 23, 31) and meta_layers(40) == (9, 19, 29, 39)
    cfg = GeneratorConfig(arch="dinov3", depth=2, head_features=16, head_out_channels=[8, 16, 32, 64])
    assert cfg.input_divisor == 16
    model = build_generator(cfg, num_classes=3)
    assert model.layers == (0, 0, 1, 1) and model.generator_arch == "dinov3"
    assert model(images()).shape == (2, 3, 64, 64)


@pytest.mark.parametrize("size", sorted(SIZES))
def test_every_full_size_builds_on_the_meta_device_with_its_layers_and_widths(size):
    encoder = f"vit_{size}_patch16_dinov3"
    with torch.device("meta"):
        model = DinoV3DPT(encoder, 19)
    assert model.layers == SIZES[size].layers and len(model.encoder.blocks) == SIZES[size].depth
    assert [p.out_channels for p in model.head.projects] == list(SIZES[size].out_channels)


@pytest.mark.parametrize("height, width", [(64, 64), (48, 80)])
def test_the_features_are_timms_intermediates_at_any_patch_multiple(height, width):
    """The head reads what timm's own ``forward_intermediates`` gives (RoPE at the input's grid, the
    final norm applied, prefix tokens dropped), at two sizes whose grids differ."""
    model = tiny()
    x = images(height, width)
    seen = []
    hook = model.head.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    with torch.no_grad():
        logits = model(x)
        theirs = model.encoder.forward_intermediates(x, indices=list(model.layers), norm=True, output_fmt="NLC",
                                                     intermediates_only=True)
    hook.remove()
    assert logits.shape == (2, 5, height, width) and torch.isfinite(logits).all()
    for ours, timm_own in zip(seen[0], theirs):
        torch.testing.assert_close(ours, timm_own)


@pytest.mark.parametrize("rows, columns", [(1, 1), (3, 5), (7, 4), (32, 64)])
def test_the_rotary_embedding_is_timms_bitwise_made_on_the_periods_device(rows, columns):
    """rope_embed makes the grid where the embedding's periods are (timm makes it on the host and
    copies it: tests/plan/test_plan.py's dinov3_tiny on two stand-in GPUs refuses that): the same
    values, bit for bit."""
    rope = tiny().encoder.rope
    assert torch.equal(rope_embed(rope, rows, columns), rope.get_embed(shape=[rows, columns]))


def test_a_size_that_is_no_multiple_of_16_is_refused_naming_the_input_and_the_config_key():
    with pytest.raises(UserError, match=r"the input: 56x64 is not a multiple of the ViT patch \(16\)"):
        tiny()(images(56, 64))
    cfg = GeneratorConfig(arch="dinov3")
    with pytest.raises(UserError, match=r"data.crop_size: 56x64 is not a multiple of DINOv3's patch size 16 "
                                        r"\(model.generator.arch=dinov3\)"):
        cfg.check_input_size(56, 64, "data.crop_size")


def test_a_timm_layout_file_round_trips_strictly(tmp_path):
    source, target = tiny(seed=0), tiny(seed=1)
    target.head.load_state_dict(source.head.state_dict())
    path = tmp_path / "encoder.pth"
    torch.save(source.encoder.state_dict(), path)
    assert not torch.equal(source(images()), target(images()))
    report = load_encoder_weights(target, path)
    assert report.layout == "timm"
    assert torch.equal(source(images()), target(images()))
    state = source.encoder.state_dict()
    del state["blocks.1.attn.qkv.weight"]
    with pytest.raises(UserError, match="'blocks.1.attn.qkv.weight' is missing"):
        load_encoder_weights(target, state)


def meta_layout(encoder, qkv_bias=None):
    """``encoder``'s weights as facebookresearch/dinov3 stores them: ``storage_tokens``, ``ls1`` /
    ``ls2``, a fused ``qkv.bias`` with its ``bias_mask``, ``mask_token`` and the RoPE periods."""
    state = {}
    dim = encoder.embed_dim
    for key, value in encoder.state_dict().items():
        key = key.replace("reg_token", "storage_tokens").replace("gamma_1", "ls1.gamma").replace("gamma_2", "ls2.gamma")
        state[key] = value.clone()
    for i in range(len(encoder.blocks)):
        attn = f"blocks.{i}.attn."
        if attn + "q_bias" in state:
            q, v = state.pop(attn + "q_bias"), state.pop(attn + "v_bias")
            state[attn + "qkv.bias"] = torch.cat([q, torch.zeros_like(q), v])
        else:
            state[attn + "qkv.bias"] = torch.zeros(3 * dim) if qkv_bias is None else qkv_bias.clone()
        state[attn + "qkv.bias_mask"] = torch.cat([torch.ones(dim), torch.zeros(dim), torch.ones(dim)])
    state["mask_token"] = torch.zeros(1, dim)
    state["rope_embed.periods"] = torch.ones(dim // 2 // 4 // 2 or 1)
    return state


@pytest.mark.parametrize("encoder", ["vit_small_patch16_dinov3", "vit_small_patch16_dinov3_qkvb"])
def test_a_meta_layout_file_loads_strictly_as_timm_maps_it(encoder, tmp_path):
    source, target = tiny(encoder, seed=0), tiny(encoder, seed=1)
    target.head.load_state_dict(source.head.state_dict())
    path = tmp_path / "dinov3_vits16_pretrain.pth"
    torch.save({"model": meta_layout(source.encoder)}, path)
    report = load_encoder_weights(target, path)
    assert report.layout == "meta"
    for key, value in source.encoder.state_dict().items():
        assert torch.equal(target.encoder.state_dict()[key], value), key
    assert torch.equal(source(images()), target(images()))


def test_non_zero_attention_biases_for_an_encoder_without_them_are_refused_naming_the_qkvb_variant():
    source = tiny()
    state = meta_layout(source.encoder, qkv_bias=torch.ones(96))
    with pytest.raises(UserError, match=r"blocks.0.attn.qkv.bias.*_qkvb"):
        load_encoder_weights(tiny(seed=1), state)


def test_the_blocks_and_head_are_checkpoint_units_and_the_head_takes_feature_scales():
    model = tiny()
    assert model.checkpoint_units() == [f"encoder.blocks.{i}" for i in range(4)] + ["head"]
    assert model.feature_channels() == (32,) * 4
    scales = [torch.ones(2, 32)] * 4
    with torch.no_grad():
        clean, perturbed = model(images(), feature_scales=scales, with_unperturbed=True)
    torch.testing.assert_close(clean, perturbed)


def test_the_encoder_layers_number_blocks_for_layer_decay():
    from segadv.models.dinov3.builder import encoder_layers

    layers, last = encoder_layers(tiny())
    assert last == 5 and layers["cls_token"] == 0 and layers["blocks.3.mlp.fc1.weight"] == 4
    assert layers["norm.weight"] == 5
