"""Checkpoint files: what they hold, how they are written, read and loaded into networks, and the
manager that decides when a run writes them."""

from segadv.checkpoint.io import read_checkpoint, save_checkpoint
from segadv.checkpoint.loader import CheckpointMismatchError, LoadReport, load_encoder_weights, load_weights
from segadv.checkpoint.manager import CheckpointManager
from segadv.checkpoint.state import NetworkWeights, Stateful, restore, snapshot

__all__ = [
    "CheckpointManager", "CheckpointMismatchError", "LoadReport", "NetworkWeights", "Stateful", "load_encoder_weights",
    "load_weights", "read_checkpoint", "restore", "save_checkpoint", "snapshot",
]
