"""DINOv2-g (timm's ``vit_giant_patch14[_reg4]_dinov2``): UniMatch V2's head on it (blocks 9, 19,
29, 39; fusion width 384, four 1536-wide projections), built on the meta device at full size, and
the official layout of its SwiGLU MLP (``mlp.w12`` / ``mlp.w3``) loading strictly into a
narrow, 2-block stand-in."""

import pytest
import torch
from dinov2_tiny import images, tiny_model
from test_dinov2_weights import logits, official_layout

from segadv.config.schema import GeneratorConfig
from segadv.models.dinov2.dpt import DinoV2DPT
from segadv.models.dinov2.weights import load_encoder_weights


@pytest.mark.parametrize("encoder", ["vit_giant_patch14_dinov2", "vit_giant_patch14_reg4_dinov2"])
def test_the_full_giant_takes_unimatch_v2s_layers_and_widths(encoder):
    cfg = GeneratorConfig(arch="dinov2", encoder=encoder, layers=[9, 19, 29, 39], depth=40)
    assert cfg.encoder == encoder
    with torch.device("meta"):
        model = DinoV2DPT(encoder, 19)
    assert len(model.encoder.blocks) == 40 and model.encoder.embed_dim == 1536
    assert model.layers == (9, 19, 29, 39)
    assert [p.out_channels for p in model.head.projects] == [1536] * 4
    assert model.head.scratch.layer1_rn.out_channels == 384
    assert type(model.encoder.blocks[0].mlp).__name__ == "GluMlp"  # SwiGLU, packed
    assert 1.13e9 < sum(p.numel() for p in model.encoder.parameters()) < 1.14e9


def meta_layout(vit, seed=0):
    """The official layout of a giant: its SwiGLU's packed input projection as ``w12``, its
    output projection as ``w3``."""
    state = official_layout(vit, seed)
    return {k.replace("mlp.fc1.", "mlp.w12.").replace("mlp.fc2.", "mlp.w3."): v for k, v in state.items()}


@pytest.mark.parametrize("encoder", ["vit_giant_patch14_dinov2", "vit_giant_patch14_reg4_dinov2"])
def test_an_official_giant_file_with_w12_and_w3_loads_strictly(encoder, tmp_path):
    source, target = tiny_model(encoder, seed=0, depth=2), tiny_model(encoder, seed=1, depth=2)
    target.head.load_state_dict(source.head.state_dict())
    state = meta_layout(source.encoder)
    assert "blocks.1.mlp.w12.weight" in state and "blocks.1.mlp.w3.bias" in state
    path = tmp_path / "dinov2_vitg14_pretrain.pth"
    torch.save(state, path)
    report = load_encoder_weights(target, path)
    assert report.layout == "official"
    torch.testing.assert_close(logits(target, images()), logits(source, images()), rtol=1e-5, atol=1e-5)
