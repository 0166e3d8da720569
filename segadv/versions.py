"""The torch releases segadv's features need beyond the floor (constraints/oldest.txt).

Each entry is a feature that does not work on every supported torch, with the first release it
works on (found by running its tests on each release: docs/dependencies.md "What a user on the
floor does not get"). A feature asked for on an older torch exits 2 naming itself and the release
it needs, before anything is built; everything else runs on the floor.
"""

from __future__ import annotations

import re

import torch

from segadv.errors import UserError

# feature (as the message names it) -> (first torch it works on, what goes wrong before it)
TORCH_NEEDED: dict[str, tuple[tuple[int, int], str]] = {
    "segadv-plan": ((2, 10), "its stand-in devices need torch.utils.backend_registration's Python backend"),
    "compile.generator=true with model.generator.activation_checkpointing=true": (
        (2, 9), "in older releases the compiled recompute of the checkpointed stages updates BatchNorm's running "
                "statistics a second time (seen on 2.5.1, 2.7.1 and 2.8.0)"),
}


def torch_version(version: str | None = None) -> tuple[int, int]:
    """(major, minor) of ``version`` (default: the running torch's; local tags like +cpu ignored)."""
    match = re.match(r"(\d+)\.(\d+)", version or torch.__version__)
    if match is None:
        raise ValueError(f"unreadable torch version {version or torch.__version__!r}")
    return int(match.group(1)), int(match.group(2))


def torch_supports(feature: str) -> bool:
    return torch_version() >= TORCH_NEEDED[feature][0]


def require_torch(feature: str, remedy: str) -> None:
    """Refuse ``feature`` (exit 2) on a torch older than it needs; ``remedy``: what else to do."""
    (major, minor), why = TORCH_NEEDED[feature]
    if torch_version() < (major, minor):
        raise UserError(f"{feature} needs torch {major}.{minor} or newer ({why}); this is torch {torch.__version__}: "
                        f"{remedy}")
