"""Checkpoint files: what they hold, how they are written and read."""

from segadv.checkpoint.io import read_checkpoint, read_weights, save_checkpoint
from segadv.checkpoint.state import Checkpointer, restore_training_state, training_state

__all__ = [
    "Checkpointer", "read_checkpoint", "read_weights", "restore_training_state", "save_checkpoint",
    "training_state",
]
