"""The DINOv2 arch (``model.generator.arch: dinov2``): its config section (``config.py``, torch-free),
G on a DINOv2 ViT (timm) with UniMatch V2's DPT head (``dpt.py``), its encoder's construction
(``encoder.py``), its blocks split over devices (``split.py``), its weights from a local file in
timm's or the official DINOv2 layout (``weights.py``) and the builder its row names
(``builder.py``). Its row is in segadv/models/registry.py; this package imports no torch, its
modules do."""
