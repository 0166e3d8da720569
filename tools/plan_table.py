"""docs/planning.md's table of which foundation-model generators fit which GPUs, and how.

    python tools/plan_table.py [--steps N] [--models L,g,...] [--out FILE]

For each generator (DINOv2-L/g, DINOv3-L/H+/7B) in UniMatch V2's Cityscapes regime
(configs/unimatch_v2_dinov2_cityscapes.yaml: crops of 798 px, 800 for DINOv3's 16 px patch, 2
labeled and 2 unlabeled images a process, the EMA teacher, AdamW, float32), the eight dry runs
``segadv-plan --advise --world-size N`` makes (one card and the split ``g:0/1``, without and with
activation checkpointing and a frozen encoder), each accounted for 1, 2, 4 and 8 processes under
DDP and FSDP (segadv/plan/launch.py); then VFM-UDA++'s setting (DINOv2-L, mean teacher GTA5 ->
Cityscapes, batch 2 a process, 4 x 80 GB). Prints markdown: each strategy's need per card, and the
best way that fits each card count and size. Nothing is downloaded: the networks are built on
``meta`` and planned on stand-in devices.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from segadv.config import load_config  # noqa: E402
from segadv.plan.fit import GiB  # noqa: E402
from segadv.plan.launch import LaunchOption, launch_options, variant_plans  # noqa: E402

log = logging.getLogger("plan_table")

CARDS = (1, 2, 4, 8)
# Each card's memory as nvidia-smi reports it (MiB / 1024): RTX 4090 24564 MiB, A100 40GB 40960,
# H100 80GB 81559, H200 143771.
SIZES = {"24 GB": 24564 / 1024, "40 GB": 40.0, "80 GB": 81559 / 1024, "141 GB": 143771 / 1024}
UNIMATCH = "unimatch_v2_dinov2_cityscapes"


def dinov3_crops(side: int) -> list[str]:
    """UniMatch V2's Cityscapes pipeline at a crop of ``side`` (a multiple of 16) and the val images
    padded to DINOv3's 16 px patch."""
    return [f"data.train_transforms=[{{name: RandomScale, scale_limit: [-0.5, 1.0], p: 1.0}}, "
            f"{{name: PadIfNeeded, min_height: {side}, min_width: {side}}}, "
            f"{{name: RandomCrop, height: {side}, width: {side}}}, {{name: HorizontalFlip, p: 0.5}}]",
            "data.val_transforms=[{name: PadIfNeeded, min_height: null, min_width: null, pad_height_divisor: 16, "
            "pad_width_divisor: 16, position: top_left}]"]


MODELS = {
    "DINOv2-L": ["model.generator.encoder=vit_large_patch14_dinov2"],
    "DINOv2-g": ["model.generator.encoder=vit_giant_patch14_dinov2"],
    "DINOv3-L": ["model.generator.arch=dinov3", "model.generator.encoder=vit_large_patch16_dinov3", *dinov3_crops(800)],
    "DINOv3-H+": ["model.generator.arch=dinov3", "model.generator.encoder=vit_huge_plus_patch16_dinov3",
                  *dinov3_crops(800)],
    "DINOv3-7B": ["model.generator.arch=dinov3", "model.generator.encoder=vit_7b_patch16_dinov3", *dinov3_crops(800)],
}


def short(option: LaunchOption) -> str:
    name = "1 card" if option.strategy == "ddp" and option.cards == 1 else option.strategy.upper() \
        if option.strategy != "split" else f"split x{option.processes}" if option.processes > 1 else "split"
    extra = [*(["ckpt"] if option.checkpointing else []), *(["frozen"] if option.frozen else [])]
    return name + (f" + {' + '.join(extra)}" if extra else "")


def need_table(name: str, plans: dict, cfg) -> list[str]:
    """Each strategy's largest need per card (GiB) for 1, 2, 4 and 8 cards."""
    rows = {}
    for cards in CARDS:
        for option in launch_options(cfg, plans, cards, budget=1 << 62):
            key = (option.strategy, option.checkpointing, option.frozen)
            rows.setdefault(key, {})[cards] = (max(option.needs.values()) / GiB if option.needs else None, option)
    headers = [f"{c} card" + ("s" if c > 1 else "") for c in CARDS]
    lines = [f"| {name} | {' | '.join(headers)} |",
             f"|---|{'---|' * len(CARDS)}"]
    for key in sorted(rows, key=lambda k: (k[2], k[0] == "split", k[1], k[0] == "fsdp")):
        cells = []
        for cards in CARDS:
            need, option = rows[key].get(cards, (None, None))
            cells.append("-" if option is None else "n/a" if need is None else f"{need:.1f}")
        label = {"ddp": "DDP", "fsdp": "FSDP", "split": "split g:0/1"}[key[0]]
        label += "".join([" + checkpointing" if key[1] else "", " + frozen encoder" if key[2] else ""])
        lines.append(f"| {label} | {' | '.join(cells)} |")
    return lines


def best_table(results: dict) -> list[str]:
    """The best way that fits each generator on N cards of each size (launch.py's ranking)."""
    lines = [f"| G | cards | {' | '.join(SIZES)} |", f"|---|---|{'---|' * len(SIZES)}"]
    for name, (cfg, plans) in results.items():
        for cards in CARDS:
            cells = []
            for size in SIZES.values():
                options = launch_options(cfg, plans, cards, int(size * GiB))
                best = next((o for o in options if o.fits), None)
                cells.append("no" if best is None else short(best))
            lines.append(f"| {name} | {cards} | {' | '.join(cells)} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1, help="the run's last N iterations planned (default 1)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--no-vfm-uda", action="store_true", help="leave out VFM-UDA++'s 4 x 80 GB setting")
    parser.add_argument("--out", type=Path, help="write the markdown here too")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    logging.getLogger("segadv").setLevel(logging.WARNING)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"--models: no {', '.join(unknown)} (of {', '.join(MODELS)})")
    start = time.perf_counter()
    results, seconds = {}, {}
    for name in names:
        began = time.perf_counter()
        config = (lambda extra, name=name: load_config(UNIMATCH, [*MODELS[name], *extra]))
        results[name] = (config([]), variant_plans(config, args.steps))
        seconds[name] = time.perf_counter() - began
        log.info("%s: 8 dry runs in %.0f s", name, seconds[name])
    out = [f"Generated {datetime.date.today().isoformat()} by `python tools/plan_table.py --steps {args.steps}` "
           f"({time.perf_counter() - start:.0f} s) on {platform.machine()} {platform.processor() or ''} "
           f"({torch.get_num_threads()} threads), torch {torch.__version__}; dry runs per generator: "
           + ", ".join(f"{n} {s:.0f} s" for n, s in seconds.items()) + ".", ""]
    out += ["Which fits (the best way by launch.py's ranking; ckpt: activation checkpointing, frozen: "
            "`model.generator.freeze_encoder`; split xN: N processes each splitting G over two cards; no: nothing fits):",
            "", *best_table(results), ""]
    for name, (cfg, plans) in results.items():
        out += [f"{name}: need per card, GiB (peak + allowance; the rank holding the most):", "",
                *need_table(name, plans, cfg), ""]
    if not args.no_vfm_uda:
        began = time.perf_counter()
        config = (lambda extra: load_config("mean_teacher_dinov2_gta5_cityscapes",
                                            ["model.generator.encoder=vit_large_patch14_dinov2", "data.batch_size=2",
                                             "method.mean_teacher.target_batch_size=2", *extra]))
        cfg, plans = config([]), variant_plans(config, args.steps)
        options = launch_options(cfg, plans, 4, int(SIZES["80 GB"] * GiB))
        out += [f"VFM-UDA++'s setting, DINOv2-L, mean teacher GTA5 -> Cityscapes at 798 px, batch 2 + 2 a process, "
                f"4 x 80 GB ({time.perf_counter() - began:.0f} s):", "",
                "| way | fits | need per card, GiB |", "|---|---|---|"]
        for option in options:
            need = f"{max(option.needs.values()) / GiB:.1f}" if option.needs else option.why
            out.append(f"| {short(option)} | {'yes' if option.fits else 'no'} | {need} |")
        out.append("")
    text = "\n".join(out)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
