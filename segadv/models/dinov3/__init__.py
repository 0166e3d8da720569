"""The DINOv3 arch (``model.generator.arch: dinov3``): what DINOv3 alone has, on the shared ViT
module (segadv/models/vit: the DPT head, the model, its split over devices, the weight file's
reading). Its config section (``config.py``, torch-free), G on a DINOv3 ViT (timm's Eva with RoPE
and 4 register tokens, patch 16: ``model.py``), its encoder table, construction and rotary
embedding (``encoder.py``), Meta's weight layout (``weights.py``) and the builder its row names
(``builder.py``). Its row is in segadv/models/registry.py; this package imports no torch, its
modules do."""
