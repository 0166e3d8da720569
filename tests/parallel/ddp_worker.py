"""Run under torchrun by tests/parallel/test_distributed.py (not collected by pytest).

    torchrun --standalone --nproc-per-node 2 tests/parallel/ddp_worker.py MODE OUT_DIR [key=value ...]
"""

import json
import sys
from pathlib import Path

import torch
from torch import nn

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[1])]  # its folder and tests/ (conftest, helpers)
from conftest import TINY_OVERRIDES  # noqa: E402

from segadv.training.build import build_training  # noqa: E402
from segadv.config import load_config  # noqa: E402
from segadv.data import build_dataloaders  # noqa: E402
from segadv.engine.evaluate import evaluate  # noqa: E402
from segadv.parallel import distributed, parse_device_map, unwrap  # noqa: E402
from segadv.data.streams import iterate_epochs  # noqa: E402
from segadv.training.run_data import generator_for_evaluation  # noqa: E402
from segadv.training.build import start_copies  # noqa: E402


class RankStream:
    """A stream of fresh random batches, different on each rank (seeded by rank and stream), so
    that each rank's BatchNorm statistics, pseudo labels and mixing differ: what the teacher's
    cross-rank equality has to survive."""

    def __init__(self, cfg, rank: int, word: int, labeled: bool) -> None:
        self.generator = torch.Generator().manual_seed(1000 * rank + word)
        self.size, self.batch, self.labeled = cfg.data.synthetic.image_size, cfg.data.batch_size, labeled
        self.num_classes = cfg.data.num_classes

    def next(self):
        images = torch.randn(self.batch, 3, self.size, self.size, generator=self.generator)
        if not self.labeled:
            return images
        return images, torch.randint(0, self.num_classes, (self.batch, self.size, self.size), generator=self.generator)


def train_mean_teacher(parts, cfg, env, out: Path, steps: int = 3) -> None:
    """``steps`` DDP iterations of mean_teacher; each rank saves its teacher (every tensor) and G,
    and rank 0 also the EMA of G it computes itself after each step, written out plainly:
    ``decay * ema + (1 - decay) * g`` over G's parameters (and, with
    ``teacher_batchnorm: running``, its floating buffers), decay DACS's warm-up."""
    start_copies(parts)  # the teacher starts as G (the loop does this after the initial weights)
    settings = cfg.method.mean_teacher
    averaged = lambda module: {k: v for k, v in module.state_dict().items()  # noqa: E731
                               if k in dict(module.named_parameters()) or
                               (settings.teacher_batchnorm == "running" and v.is_floating_point())}
    ema = {k: v.detach().clone() for k, v in averaged(parts.g.bare).items()}
    streams = {spec.name: RankStream(cfg, env.rank, index, labeled=spec.name not in ("unlabeled", "target"))
               for index, spec in enumerate(type(parts.method).data_streams(cfg))}
    for step in range(steps):
        parts.step(streams, step=step)
        decay = min(1.0 - 1.0 / (step + 1), settings.ema_decay) if settings.ema_warmup else settings.ema_decay
        for k, v in averaged(parts.g.bare).items():
            ema[k] = decay * ema[k] + (1.0 - decay) * v.detach()
    saved = {"teacher": parts.network("teacher").bare.state_dict(), "g": parts.g.bare.state_dict()}
    if env.is_main:
        saved["ema"] = ema
    torch.save(saved, out / f"rank{env.rank}.pt")


def train_unimatch(parts, cfg, env, out: Path, steps: int = 3) -> None:
    """``steps`` DDP iterations of unimatch on each rank's own random batches; each rank saves its
    G, D and (V2) teacher, every tensor."""
    start_copies(parts)
    streams = {spec.name: RankStream(cfg, env.rank, index, labeled=spec.pool == "labeled")
               for index, spec in enumerate(type(parts.method).data_streams(cfg))}
    for step in range(steps):
        parts.step(streams, step=step)
    saved = {net.role: net.bare.state_dict() for net in parts.every_network()}
    torch.save(saved, out / f"rank{env.rank}.pt")


def freeze_batch_statistics(module: nn.Module) -> None:
    """BatchNorm and Dropout in eval mode at every forward: per-rank batch statistics differ from
    the full batch's by design, which is not what the equivalence test is about."""
    def hook(mod, args):
        for m in mod.modules():
            if isinstance(m, (nn.BatchNorm2d, nn.Dropout)):
                m.eval()
    module.register_forward_pre_hook(hook)


def main(mode: str, out: Path, overrides: list[str]) -> None:
    env = distributed.env_from()
    cfg = load_config(None, [*TINY_OVERRIDES, "data.batch_size=2", "loss.lambda_adv=0.1", *overrides])
    device_map = parse_device_map("cpu")
    distributed.init_process_group(env, device_map)
    torch.manual_seed(0)  # same init everywhere (DDP would broadcast rank 0's anyway)
    parts = build_training(cfg, device_map, env)
    if mode == "train":
        train_loader, _ = build_dataloaders(cfg.data, seed=0, pin_memory=False, rank=env.rank, world_size=env.world_size)
        batches = iterate_epochs(train_loader)
        for step in range(20):
            parts.method.iteration(*next(batches), step=step)
        torch.save({"g": unwrap(parts.g.module).state_dict(), "d": unwrap(parts.d.module).state_dict()},
                   out / f"rank{env.rank}.pt")
    elif mode == "train_then_eval":
        # A few steps with per-rank BatchNorm statistics, then G as the loop evaluates it.
        train_loader, _ = build_dataloaders(cfg.data, seed=0, pin_memory=False, rank=env.rank, world_size=env.world_size)
        batches = iterate_epochs(train_loader)
        for step in range(cfg.train.max_steps):
            parts.method.iteration(*next(batches), step=step)
        evaluated = generator_for_evaluation(parts)
        torch.save({"g": unwrap(evaluated).state_dict(), "d": unwrap(parts.d.module).state_dict()},
                   out / f"rank{env.rank}.pt")
    elif mode == "equivalence":
        freeze_batch_statistics(unwrap(parts.g.module))
        data = torch.load(out / "batch.pt", weights_only=True)
        half = data["images"].shape[0] // env.world_size
        rows = slice(env.rank * half, (env.rank + 1) * half)
        parts.method.iteration(data["images"][rows], data["labels"][rows], step=0)
        if env.is_main:
            torch.save({"g": unwrap(parts.g.module).state_dict(), "d": unwrap(parts.d.module).state_dict()},
                       out / "ddp_step.pt")
    elif mode == "mean_teacher":
        train_mean_teacher(parts, cfg, env, out)
    elif mode == "unimatch":
        train_unimatch(parts, cfg, env, out)
    elif mode == "eval":
        _, val_loader = build_dataloaders(cfg.data, seed=0, pin_memory=False, rank=env.rank, world_size=env.world_size)
        metrics = evaluate(unwrap(parts.g.module), val_loader, device_map.generator, cfg.data.num_classes).metrics
        if env.is_main:
            (out / "eval.json").write_text(json.dumps(metrics))
    distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3:])
