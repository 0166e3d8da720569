"""The tiny ViT runs the command-line tests train on the CPU (tests/integration/test_dinov2_run.py,
test_dinov3_run.py, tests/models/test_freeze_encoder.py): a shipped ``*_tiny`` config under the mean
teacher with an adversarial D, shrunk by overrides to 2 blocks, a narrow DPT head, 8 samples per
domain, batches of 2 and 4 steps with a checkpoint every 2."""

from __future__ import annotations

from pathlib import Path

from segadv.cli import train as train_cli


def command(config: str) -> list[str]:
    """``segadv-train``'s arguments for ``config`` (``dinov2_tiny``) with G, D and the teacher on the host."""
    return ["--config", config, "method.name=mean_teacher", "loss.lambda_adv=0.001", "--device-map", "g:cpu,d:cpu,t:cpu"]


def small(size: int, depth: int = 2) -> list[str]:
    """The overrides that shrink the run: images of ``size`` px (a multiple of the patch), ``depth`` blocks."""
    return [f"data.synthetic.image_size={size}", f"target_data.synthetic.image_size={size}",
            "data.synthetic.train_size=8", "target_data.synthetic.train_size=8",
            "data.synthetic.val_size=4", "target_data.synthetic.val_size=4",
            "data.batch_size=2", "data.val_batch_size=4", "data.num_workers=0",
            f"model.generator.depth={depth}", "model.generator.head_features=16",
            "model.generator.head_out_channels=[8,16,32,64]", "model.discriminator.ndf=8",
            "train.max_steps=4", "train.eval_every=4", "train.log_every=1", "checkpoint.every=2",
            "train.deterministic=true", "log.tensorboard=false"]


def train(command: list[str], overrides: list[str], run_dir: Path, *extra: str) -> int:
    """One run of ``segadv-train`` into ``run_dir``; its exit code."""
    return train_cli.main([*command, "--run-dir", str(run_dir), *overrides, *extra])


def trained(run_dir: Path, command: list[str], overrides: list[str]) -> Path:
    """``run_dir`` after a run that ended with exit 0 (a module's shared run)."""
    assert train(command, overrides, run_dir) == 0
    return run_dir
