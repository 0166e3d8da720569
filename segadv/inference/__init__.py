"""Inference outside training: segadv-predict's and segadv-eval's library.

Modules (import the one you need; this package imports nothing itself, so predict's ONNX path,
``inputs``, ``outputs``, ``tiling``, ``backends`` and ``segment``, stays torch-free):

- ``inputs``: the images an ``--input`` names, their headers checked, their pixels read;
- ``outputs``: where masks may be written (nothing the user did not name is replaced);
- ``backends``: the model that runs the windows (onnxruntime, TorchScript or a checkpoint's G);
- ``tiling``: an image as windows of the model's size, and the windows' outputs as one mask;
- ``segment``: images to palette masks (and overlays) on a backend;
- ``show_dir``: segadv-eval --show-dir's masks and overlays;
- ``scoring``: segadv-eval's scores, of a checkpoint's G or of a folder of predicted masks.
"""
