"""The DINOv2 arch (``model.generator.arch: dinov2``): what DINOv2 alone has, on the shared ViT
module (segadv/models/vit: the DPT head, the model, its split over devices, the weight file's
reading). Its config section (``config.py``, torch-free), G on a DINOv2 ViT (timm) with its
position embedding and attention kernel (``dpt.py``), its encoder table and construction
(``encoder.py``), the official DINOv2 weight layout (``weights.py``) and the builder its row names
(``builder.py``). Its row is in segadv/models/registry.py; this package imports no torch, its
modules do."""
