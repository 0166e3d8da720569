"""DINOv2 encoder weights from a local file: timm's layout and the official one (with and without
registers), strictly; every way a file can fail to fit is one UserError naming the key or file."""

import pytest
import torch
from dinov2_tiny import images, tiny_model
from safetensors.torch import save_file

from segadv.errors import UserError
from segadv.models.dinov2.weights import load_encoder_weights
from segadv.models.vit.weights import read_weights


def official_layout(vit, seed=0):
    """``vit``'s weights as facebookresearch/dinov2 stores them: ``mask_token``; for the register
    models ``register_tokens`` and a class-token position in ``pos_embed`` (which timm folds into
    its class token, so it is split back out here by any amount)."""
    state = {k: v.clone() for k, v in vit.state_dict().items()}
    dim = state["cls_token"].shape[-1]
    state["mask_token"] = torch.zeros(1, dim)
    if "reg_token" in state:
        cls_pos = torch.randn(1, 1, dim, generator=torch.Generator().manual_seed(seed))
        state["register_tokens"] = state.pop("reg_token")
        state["cls_token"] = state["cls_token"] - cls_pos
        state["pos_embed"] = torch.cat([cls_pos, state["pos_embed"]], dim=1)
    return state


def logits(model, x):
    with torch.no_grad():
        return model.eval()(x)


@pytest.mark.parametrize("encoder", ["vit_small_patch14_dinov2", "vit_small_patch14_reg4_dinov2"])
@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
def test_a_timm_layout_file_loads_exactly(encoder, fmt, tmp_path):
    source, target = tiny_model(encoder, seed=0), tiny_model(encoder, seed=1)
    target.head.load_state_dict(source.head.state_dict())
    path = tmp_path / f"encoder.{fmt}"
    state = {k: v.contiguous() for k, v in source.encoder.state_dict().items()}
    save_file(state, str(path)) if fmt == "safetensors" else torch.save(state, path)
    x = images()
    assert not torch.equal(logits(source, x), logits(target, x))
    report = load_encoder_weights(target, path)
    assert (report.layout, report.tensors, report.resampled_pos_embed) == ("timm", len(state), False)
    for key, value in source.encoder.state_dict().items():
        assert torch.equal(target.encoder.state_dict()[key], value), key
    assert torch.equal(logits(source, x), logits(target, x))


@pytest.mark.parametrize("encoder", ["vit_small_patch14_dinov2", "vit_small_patch14_reg4_dinov2"])
def test_an_official_layout_file_loads_as_timm_maps_it(encoder, tmp_path):
    source, target = tiny_model(encoder, seed=0), tiny_model(encoder, seed=1)
    target.head.load_state_dict(source.head.state_dict())
    path = tmp_path / "dinov2_vits14_pretrain.pth"
    torch.save({"model": official_layout(source.encoder)}, path)  # under a container key, too
    report = load_encoder_weights(target, path)
    assert report.layout == "official" and not report.resampled_pos_embed
    assert "mask_token" not in target.encoder.state_dict()
    torch.testing.assert_close(logits(target, images()), logits(source, images()), rtol=1e-5, atol=1e-5)


def test_a_position_embedding_of_another_grid_is_resampled_to_the_models(tmp_path):
    source = tiny_model(img_size=70)  # a 5 x 5 grid; the target's is 4 x 4
    target = tiny_model(seed=1)
    path = tmp_path / "w.pt"
    torch.save(official_layout(source.encoder), path)
    report = load_encoder_weights(target, path)
    assert report.resampled_pos_embed and target.encoder.pos_embed.shape == (1, 1 + 16, 32)
    assert torch.equal(target.encoder.blocks[2].attn.qkv.weight, source.encoder.blocks[2].attn.qkv.weight)


def save(tmp_path, state, name="w.pt"):
    path = tmp_path / name
    torch.save(state, path)
    return path


def test_a_missing_key_is_named_with_how_many_others_do_not_fit(tmp_path):
    model = tiny_model()
    state = model.encoder.state_dict()
    del state["blocks.1.attn.qkv.weight"]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(UserError) as err:
        load_encoder_weights(model, save(tmp_path, state))
    message = str(err.value)
    assert "'blocks.1.attn.qkv.weight' is missing from the file" in message and "other" not in message
    assert "w.pt" in message and "\n" not in message
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # nothing loaded
    del state["blocks.2.mlp.fc1.bias"]
    with pytest.raises(UserError, match=r"'blocks.1.attn.qkv.weight' is missing .*\(and 1 other key that does not fit\)"):
        load_encoder_weights(model, save(tmp_path, state))


def test_an_unexpected_key_and_a_wrong_shape_are_named(tmp_path):
    model = tiny_model()
    state = model.encoder.state_dict()
    with pytest.raises(UserError, match=r"key 'head.weight' is in the file but not in the encoder"):
        load_encoder_weights(model, {**state, "head.weight": torch.zeros(10, 32)})
    with pytest.raises(UserError, match=r"key 'norm.weight' has shape \[16\] where the encoder has \[32\]"):
        load_encoder_weights(model, {**state, "norm.weight": torch.zeros(16)})
    with pytest.raises(UserError, match=r"'patch_embed.proj.weight' has shape \[32, 3, 16, 16\]"):
        load_encoder_weights(model, {**state, "patch_embed.proj.weight": torch.zeros(32, 3, 16, 16)})


def test_weights_of_the_other_register_variant_do_not_fit(tmp_path):
    registers = tiny_model("vit_small_patch14_reg4_dinov2")
    with pytest.raises(UserError, match=r"key 'register_tokens' is in the file but not in the encoder .*_reg4_"):
        load_encoder_weights(tiny_model(), save(tmp_path, official_layout(registers.encoder)))
    with pytest.raises(UserError, match=r"key 'reg_token' is in the file but not in the encoder"):
        load_encoder_weights(tiny_model(), save(tmp_path, registers.encoder.state_dict()))
    with pytest.raises(UserError, match="'reg_token' is missing from the file"):
        load_encoder_weights(registers, save(tmp_path, tiny_model().encoder.state_dict()))


@pytest.mark.parametrize("bad, match", [
    (torch.zeros(32, dtype=torch.int64), r"tensor 'norm.bias' is torch.int64, not floating point"),
    (torch.full((32,), float("nan")), r"tensor 'norm.bias' holds non-finite values"),
    ("text", r"'norm.bias' is a str, not a tensor"),
])
def test_a_tensor_that_is_not_finite_floating_point_is_refused_by_name(bad, match, tmp_path):
    model = tiny_model()
    state = {**model.encoder.state_dict(), "norm.bias": bad}
    with pytest.raises(UserError, match=match):
        load_encoder_weights(model, save(tmp_path, state))


class Payload:
    """An object whose unpickling needs this module's code."""


def test_files_that_are_not_plain_weights_are_refused_naming_the_file(tmp_path):
    model = tiny_model()
    with pytest.raises(UserError, match=r"code.pt: holds objects that need code to load \(.*Payload\)"):
        load_encoder_weights(model, save(tmp_path, {"x": Payload()}, "code.pt"))
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"not a checkpoint at all")
    with pytest.raises(UserError, match=r"junk.pth: not a readable weight file"):
        load_encoder_weights(model, junk)
    with pytest.raises(UserError, match=r"absent.pt: no such file"):
        read_weights(tmp_path / "absent.pt")
    with pytest.raises(UserError, match=r"holds a list, not a mapping"):
        load_encoder_weights(model, save(tmp_path, [torch.zeros(1)], "list.pt"))
