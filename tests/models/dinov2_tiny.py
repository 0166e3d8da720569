"""Tiny DINOv2 + DPT models for the tests: 4 blocks of width 32 (2 heads), the position
embedding at a 4 x 4 grid, a narrow head: a few hundred thousand parameters, milliseconds a
forward on one CPU thread."""

import torch

from segadv.models.dinov2.dpt import DinoV2DPT

TINY = dict(depth=4, features=16, out_channels=(8, 16, 32, 64), img_size=56,
            encoder_overrides=dict(embed_dim=32, num_heads=2))


def tiny_model(encoder="vit_small_patch14_dinov2", num_classes=5, seed=0, **kwargs):
    torch.manual_seed(seed)
    model = DinoV2DPT(encoder, num_classes, **{**TINY, **kwargs})
    # timm initialises LayerScale at 1e-5 (DINOv2's init), which makes every block nearly the
    # identity; trained weights are far from it, and the tests should see the blocks matter.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("ls1.gamma", "ls2.gamma")):
                param.uniform_(0.5, 1.0)
            elif name.endswith(("cls_token", "reg_token")):
                param.normal_()
    return model


def images(batch=2, height=56, width=56, seed=1):
    return torch.randn(batch, 3, height, width, generator=torch.Generator().manual_seed(seed))
