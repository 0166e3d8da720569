"""Tiny DINOv3 + DPT models for the tests: 4 blocks of width 32 (2 heads), a narrow head:
milliseconds a forward on one CPU thread."""

import torch

from segadv.models.dinov3.model import DinoV3DPT

TINY = dict(depth=4, features=16, out_channels=(8, 16, 32, 64), encoder_overrides=dict(embed_dim=32, num_heads=2))


def tiny(encoder="vit_small_patch16_dinov3", seed=0, **kwargs):
    torch.manual_seed(seed)
    model = DinoV3DPT(encoder, 5, **{**TINY, **kwargs})
    # timm initialises the layer scales at 1e-5 (DINOv3's init), which makes every block nearly the
    # identity: the tests should see the blocks matter.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("gamma_1", "gamma_2")):
                param.uniform_(0.5, 1.0)
            elif name.endswith(("cls_token", "reg_token", "q_bias", "v_bias")):
                param.normal_()
    return model.eval()


def images(height=64, width=64, seed=1):
    return torch.randn(2, 3, height, width, generator=torch.Generator().manual_seed(seed))
