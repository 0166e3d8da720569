#!/usr/bin/env python
"""Export a checkpoint's generator to ONNX, torch.export (.pt2) or TorchScript, verified: the same as
``segadv-export``.

    python tools/export.py --checkpoint RUN/checkpoints/last.pt --output model.onnx [options]

See ``segadv-export --help`` and docs/inference.md.
"""

from __future__ import annotations

import sys

from segadv.cli.export import main

if __name__ == "__main__":
    sys.exit(main())
