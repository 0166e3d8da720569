"""The DeepLab archs (``model.generator.arch``: deeplabv3, deeplabv3plus, deeplabv3plus_unimatch,
deeplabv2): their config section (``config.py``, torch-free), what a DeepLab G offers segadv
(``base.py``), the networks and their builders on smp's encoders (``model.py``), UniMatch's
DeepLabV3+ head (``unimatch.py``), DeepLab-v2's classifier (``deeplabv2.py``), the Caffe ResNet
layout (``caffe_resnet.py``) and smp's named weights (``weights.py``). Its rows are in
segadv/models/registry.py."""
