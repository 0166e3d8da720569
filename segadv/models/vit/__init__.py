"""G on a DINOv2 ViT (timm) with UniMatch V2's DPT head: the model (dpt.py), its encoder's
construction (encoder.py), its blocks split over devices (split.py) and its weights from a local
file in timm's or the official DINOv2 layout (weights.py). Pure nn.Modules: the wiring into the
config and the generator registry lives elsewhere (docs/generators.md)."""

from segadv.models.vit.dpt import DinoV2DPT, DPTHead
from segadv.models.vit.encoder import (ATTENTION_KERNELS, ENCODERS, PATCH, SIZES, check_input_size, default_layers,
                                       set_attention)
from segadv.models.vit.split import Placement, even_boundaries, split_blocks
from segadv.models.vit.weights import EncoderWeights, encoder_state_dict, load_encoder_weights, read_weights

__all__ = [
    "ATTENTION_KERNELS", "ENCODERS", "PATCH", "SIZES", "DPTHead", "DinoV2DPT", "EncoderWeights", "Placement",
    "check_input_size", "default_layers", "encoder_state_dict", "even_boundaries", "load_encoder_weights",
    "read_weights", "set_attention", "split_blocks",
]
