"""The DINOv3 arch (``model.generator.arch: dinov3``): its config section (``config.py``, torch-free),
G on a DINOv3 ViT (timm's Eva with RoPE and 4 register tokens, patch 16) with the DPT head of
segadv/models/dinov2 (``model.py``), its encoder's construction and sizes (``encoder.py``), its
weights from a local file in timm's or Meta's layout (``weights.py``) and the builder its row names
(``builder.py``). Its row is in segadv/models/registry.py; this package imports no torch, its
modules do."""
