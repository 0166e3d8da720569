"""Inference export: the bare generator as ONNX or TorchScript, verified against PyTorch eager.

Modules (import the one you need; this package imports nothing itself, so the torch-free parts
stay torch-free):

- ``sidecar``: the JSON metadata written next to an export (torch-free, used by segadv-predict);
- ``loading``: the generator from any checkpoint the strict loader accepts, plus its config;
- ``wrapper``: the exported module (optional in-graph normalisation and argmax);
- ``onnx_export`` / ``torchscript_export``: writing the files;
- ``verify``: exported file vs PyTorch eager on random inputs at several sizes;
- ``deps``: the optional ``onnx`` / ``onnxruntime`` imports, with an install hint;
- ``cli``: ``segadv-export``.
"""
