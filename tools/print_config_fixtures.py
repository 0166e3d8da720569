#!/usr/bin/env python
"""Regenerate tests/config/fixtures/print_config/ (what every shipped config resolves to) and say how
each fixture changed: keys added, keys removed, values changed.

Adding a key (a new setting, a built-in role, a method with settings) adds lines to every fixture;
that is the one change this writes without being asked. A removed key or a changed value means a
shipped experiment would run differently: refused (exit 1, nothing written) unless
``--allow-changes``, which the commit should then explain.

    python tools/print_config_fixtures.py [--allow-changes] [--check]

``--check``: write nothing, exit 1 where a fixture differs (what tests/config/test_print_config_fixture.py
asserts, with the differences named).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "config" / "fixtures" / "print_config"
# The fixtures are this checkout's: its segadv, whatever segadv the environment installs.
sys.path.insert(0, str(ROOT))


def printed(name: str) -> str:
    from segadv.cli.train import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["--config", name, "--print-config"])
    if code != 0:
        raise SystemExit(f"segadv-train --config {name} --print-config exited {code}")
    return out.getvalue()


def differences(old: Any, new: Any, key: str = "") -> dict[str, list[str]]:
    """Dotted keys added, removed and changed from ``old`` to ``new``."""
    found: dict[str, list[str]] = {"added": [], "removed": [], "changed": []}
    if isinstance(old, dict) and isinstance(new, dict):
        for name in sorted(set(old) | set(new), key=str):
            path = f"{key}.{name}" if key else str(name)
            if name not in old:
                found["added"].append(path)
            elif name not in new:
                found["removed"].append(path)
            else:
                for kind, paths in differences(old[name], new[name], path).items():
                    found[kind] += paths
    elif old != new:
        found["changed"].append(key or "(the whole config)")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--allow-changes", action="store_true", help="write fixtures whose keys vanish or values change")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 where a fixture differs")
    args = parser.parse_args(argv)
    from segadv.config.shipped import config_names

    refused, writes = False, {}
    for name in config_names():
        path = FIXTURES / f"{name}.yaml"
        text = printed(name)
        old = yaml.safe_load(path.read_text()) if path.is_file() else {}
        diff = differences(old, yaml.safe_load(text))
        if not any(diff.values()):
            continue
        for kind, paths in diff.items():
            if paths:
                print(f"{name}: {kind} {', '.join(paths)}")
        if args.check or ((diff["removed"] or diff["changed"]) and not args.allow_changes):
            refused = True
        writes[path] = text
    if refused:
        if not args.check:
            print("nothing written: keys removed or values changed (--allow-changes writes them)", file=sys.stderr)
        return 1
    for path, text in writes.items():
        path.write_text(text)
    print(f"{len(writes)} fixtures written" if writes else "every fixture is current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
