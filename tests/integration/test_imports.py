"""The package's import graph: no layer imports the one above it, no library module imports a
command-line module, no import cycle, and every module imports on its own."""

import ast
import graphlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "segadv"
# (package, what it must never import): models are pure nn.Modules, loaded by checkpoint/; the config
# finds the arch table by its module name (the config sits below the models that hold the sections); the
# data pipeline knows nothing of the training methods that consume it.
FORBIDDEN = [("models", "segadv.checkpoint"), ("data", "segadv.methods"), ("config", "segadv.models")]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path) -> set[str]:
    """Every module an import statement in ``path`` names (function-local imports included)."""
    names = set()
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # from segadv import checkpoint
    return names


@pytest.mark.parametrize("package, forbidden", FORBIDDEN)
def test_a_layer_never_imports_the_one_above(package, forbidden):
    offenders = {
        str(path.relative_to(PACKAGE.parent)): sorted(n for n in imported_names(path)
                                                      if n == forbidden or n.startswith(forbidden + "."))
        for path in sorted((PACKAGE / package).rglob("*.py"))
    }
    assert {path: names for path, names in offenders.items() if names} == {}


def test_the_check_sees_every_kind_of_import():
    probe = PACKAGE / "models" / "generator.py"
    names = imported_names(probe)
    assert "segadv.config.schema.GeneratorConfig" in names and "torch.nn.functional" in names


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def is_cli(path: Path) -> bool:
    """A command-line module: its ``main`` is wrapped by ``cli_entry`` (the exit-code contract), it
    runs as ``python -m`` (an ``if __name__ == "__main__"`` block), or it is a package's ``__main__``."""
    if path.name == "__main__.py":
        return True
    body = ast.parse(path.read_text(), str(path)).body
    return any((isinstance(node, ast.FunctionDef) and node.name == "main"
                and any(isinstance(d, ast.Name) and d.id == "cli_entry" for d in node.decorator_list))
               or (isinstance(node, ast.If) and "__main__" in ast.unparse(node.test))
               for node in body)


def cli_modules() -> set[str]:
    return {name for name, path in modules().items() if is_cli(path)}


def import_graph() -> dict[str, set[str]]:
    """segadv module -> the segadv modules it imports (function-local imports included; a name
    imported from a module counts as that module)."""
    known = modules()

    def target(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    return {module: {t for n in imported_names(path) if (t := target(n)) not in (None, module)}
            for module, path in known.items()}


def test_the_console_scripts_are_the_cli_modules():
    """What the import rules below call a CLI module is what pyproject.toml installs as a command."""
    scripts = (PACKAGE.parent / "pyproject.toml").read_text().split("[project.scripts]")[1].split("\n[")[0]
    installed = set(re.findall(r'^\S+\s*=\s*"([\w.]+):main"', scripts, re.M))
    assert installed and installed <= cli_modules()
    assert {"segadv.cli.train", "segadv.cli.plan"} <= installed


def test_no_library_module_imports_a_cli_module():
    """The training loop, the planner's library and the other shared code never reach into a
    command's module: what two commands share lives in a library module (segadv/training/run_data.py holds what
    segadv-train and segadv-plan both run). Nothing under segadv/plan/ imports another command."""
    clis = cli_modules()
    graph = import_graph()
    offenders = {module: sorted(graph[module] & (clis - {module})) for module in graph
                 if module not in clis or module.startswith("segadv.plan.")}
    assert {module: names for module, names in offenders.items() if names} == {}


def test_the_layers_show_in_the_folders():
    """Every command lives in segadv/cli/ (a package's ``__main__`` hands over to one), nothing
    outside it imports from there, and the top folder keeps only what every layer shares."""
    graph = import_graph()
    outside = {module: sorted(n for n in graph[module] if n.startswith("segadv.cli"))
               for module, path in modules().items()
               if not module.startswith("segadv.cli") and path.name != "__main__.py"}
    assert {module: names for module, names in outside.items() if names} == {}
    assert {m for m in cli_modules() if not m.startswith("segadv.cli.")} == {"segadv.export.__main__"}
    assert len(list(PACKAGE.glob("*.py"))) <= 6


def test_no_import_cycle():
    """No segadv module reaches itself through the modules it imports, function-local imports
    included (a cycle hidden in a function is one all the same)."""
    graph = import_graph()
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as err:
        pytest.fail(f"import cycle: {' -> '.join(reversed(err.args[1]))}")
    assert graph["segadv.training.loop"] >= {"segadv.training.build", "segadv.training.run_data"}  # the graph sees the imports


# The third-party modules segadv names are imported once, then each segadv module is imported in a
# forked child with no segadv module loaded yet: an import circle fails however the others are reached.
IMPORT_EACH = """
import importlib, json, os, sys, traceback
names, third_party = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for other in third_party:
    try:
        importlib.import_module(other)
    except Exception:
        pass  # an extra that is not installed: the module needing it says so below
assert not [m for m in sys.modules if m.split(".")[0] == "segadv"]
failed = {}
for name in names:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            importlib.import_module(name)
            code = 0
        except BaseException:
            os.write(write, traceback.format_exc(limit=-4).encode())
            code = 1
        os._exit(code)
    os.close(write)
    with os.fdopen(read) as fh:
        message = fh.read()
    if os.waitpid(pid, 0)[1] != 0:
        failed[name] = message or "no message"
print(json.dumps(failed))
"""


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_every_module_imports_on_its_own():
    paths = [p for p in sorted(PACKAGE.rglob("*.py")) if p.name != "__main__.py"]
    names = [module_name(p) for p in paths]
    third_party = sorted({n for p in paths for n in imported_names(p) if n and n.split(".")[0] != "segadv"})
    result = subprocess.run([sys.executable, "-c", IMPORT_EACH, json.dumps(names), json.dumps(third_party)],
                            capture_output=True, text=True, timeout=300, cwd=PACKAGE.parent)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {}
    assert len(names) > 60  # the walk found the package
