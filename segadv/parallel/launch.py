"""``segadv-train --nproc-per-node N``: the same command, re-launched through torchrun."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def strip_option(argv: list[str], option: str) -> list[str]:
    """argv without ``option VALUE`` / ``option=VALUE``."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == option:
            skip = True
        elif not arg.startswith(option + "="):
            out.append(arg)
    return out


def launch_with_torchrun(nproc_per_node: int, argv: list[str]) -> int:
    """Run ``python -m segadv.train ARGV`` in N processes via torch.distributed.run (standalone
    rendezvous on this node). Returns the first failed worker's exit code, 0 if all succeeded."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    args = ["--standalone", f"--nproc-per-node={nproc_per_node}", "-m", "segadv.train",
            *strip_option(argv, "--nproc-per-node")]
    try:
        torchrun_main(args)
    except ChildFailedError as err:
        codes = [f.exitcode for f in err.failures.values() if f.exitcode]
        return codes[0] if codes else 1
    return 0
