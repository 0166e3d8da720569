"""What the ViT generator archs (``dinov2/``, ``dinov3/``) share: their config sections' checks
(``config.py``, torch-free), the encoder table and the rules on its blocks (``encoder.py``),
UniMatch V2's DPT head (``head.py``), G as an encoder and that head with its blocks over devices
(``model.py``, ``split.py``), the weight file's reading and strict load (``weights.py``) and the
row's callables both builders take (``builder.py``). An arch folder holds what its family alone
has: timm's encoder names and sizes, the patch, how the tokens are embedded (a position embedding
or RoPE) and the key layout of its published weights. This package imports no torch, its modules
(but ``config.py``) do."""
