"""Inference export: the bare generator as ONNX, a torch.export program (.pt2) or TorchScript,
verified against PyTorch eager.

Modules (import the one you need; this package imports nothing itself, so the torch-free parts
stay torch-free):

- ``sidecar``: the JSON metadata written next to an export (torch-free, used by segadv-predict);
- ``settings``: the format, example input size, verification shapes and tolerances (torch-free);
- ``wrapper``: the exported module (optional in-graph normalisation and argmax);
- ``onnx_export`` / ``pt2_export`` / ``torchscript_export``: writing the files (``pt2_export``
  also decides which shapes a program takes, dynamic where the network allows);
- ``verify``: exported file vs PyTorch eager on random inputs at several sizes;
- ``verified``: an export written, verified, put in place and given its sidecar;
- ``deps``: the optional ``onnx`` / ``onnxruntime`` imports, with an install hint.

The generator comes from segadv/checkpoint/inference.py; the command is segadv/cli/export.py.
"""
