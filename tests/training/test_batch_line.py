"""The start's line on the global batch: what a config written for more GPUs keeps on fewer (a larger
per-process batch in micro-batches) and the learning rates it runs at."""

from segadv.config import load_config
from segadv.training.build import batch_line


def test_the_global_batch_and_its_learning_rates_are_said():
    cfg = load_config("dinov2_tiny", ["data.batch_size=16", "train.accumulation_steps=4"])
    assert batch_line(cfg, 1) == ("global batch: 16 labeled images a step (16 a process x 1 process, in 4 "
                                  "micro-batches of 4); G's lr 5e-05, its head 0.002, as the config sets it for "
                                  "that batch")
    cfg = load_config("dinov2_tiny", ["data.batch_size=4", "train.lr_scaling=linear"])
    line = batch_line(cfg, 4)
    assert "16 labeled images a step (4 a process x 4 processes, in 1 micro-batch of 4)" in line
    assert "G's lr 0.0002, its head 0.008 (train.lr_scaling: linear)" in line
