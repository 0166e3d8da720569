"""A generator arch as a folder of its own, outside segadv: its section (config.py, torch-free), its
network and builder (model.py), and the one line that adds its row to segadv's arch table. Importing
the package registers it (tests/models/test_extra_arch.py)."""

from segadv.models.registry import GeneratorArch, register_arch
from tinyconv.config import TinyConvConfig

ROW = register_arch(GeneratorArch("tinyconv", TinyConvConfig, "tinyconv.model:build_tiny", backbone="body"))
