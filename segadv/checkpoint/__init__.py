"""Checkpoint files: what they hold, how they are written, read and loaded into networks."""

from segadv.checkpoint.io import read_checkpoint, save_checkpoint
from segadv.checkpoint.loader import CheckpointMismatchError, LoadReport, load_encoder_weights, load_weights
from segadv.checkpoint.state import Checkpointer, restore_training_state, training_state

__all__ = [
    "CheckpointMismatchError", "Checkpointer", "LoadReport", "load_encoder_weights", "load_weights", "read_checkpoint",
    "restore_training_state", "save_checkpoint", "training_state",
]
