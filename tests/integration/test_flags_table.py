"""docs/methods.md "From the references' flags to segadv's keys" names only keys the config has.

Every dotted key in backticks in a table row's segadv-key column (the second column; the last
table's key column) must be a setting of segadv's config schema: a leaf of the flattened defaults,
or a field of a section that defaults to null (``target_data.*``, ``init.generator.*``), walked
through its pydantic model. Method sections are under ``method.<name>.*``.
"""

import re
import typing
from pathlib import Path

from pydantic import BaseModel

from segadv.config import Config, config_to_dict
from segadv.config.resume import flatten

ROOT = Path(__file__).resolve().parents[2]
METHODS = ROOT / "docs" / "methods.md"
HEADING = "## From the references' flags to segadv's keys"
KEY = re.compile(r"`([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)+)`")


def _models(annotation) -> list[type[BaseModel]]:
    """The pydantic models an annotation names (through Optional, unions, Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _walk(model, prefix: str, keys: set[str]) -> None:
    """Every section and leaf path of ``model`` (an instance, or a class for a null section)."""
    cls = model if isinstance(model, type) else type(model)
    for name, field in cls.model_fields.items():
        path = f"{prefix}{name}"
        keys.add(path)
        value = None if isinstance(model, type) else getattr(model, name)
        if isinstance(value, BaseModel):
            _walk(value, path + ".", keys)
        else:
            for sub in _models(field.annotation):
                _walk(sub, path + ".", keys)


def schema_keys() -> set[str]:
    cfg = Config()
    keys = set(flatten(config_to_dict(cfg)))
    _walk(cfg, "", keys)
    return keys


def section_rows() -> list[list[str]]:
    text = METHODS.read_text(encoding="utf-8")
    assert HEADING in text, f"docs/methods.md lacks the section {HEADING!r}"
    body = text.split(HEADING, 1)[1]
    body = re.split(r"^## ", body, maxsplit=1, flags=re.M)[0]
    rows = []
    for line in body.splitlines():
        if line.startswith("|") and not re.match(r"^\|\s*-", line):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def table_keys() -> list[str]:
    return [key for cells in section_rows() if len(cells) >= 2 for key in KEY.findall(cells[1])]


def test_schema_walk_sees_method_and_null_sections():
    keys = schema_keys()
    for key in ("loss.lambda_adv", "method.s4gan.lambda_fm", "method.adaptsegnet.lambda_adv_aux",
                "target_data.root", "init.generator.path", "optim.discriminator_aux.lr"):
        assert key in keys
    assert "method.s4gan.lambda_adv" not in keys
    assert "method.adaptsegnet.lambda_adv_main" not in keys  # renamed: loss.lambda_adv (issue 50)


def test_every_key_in_the_flag_tables_exists():
    keys = table_keys()
    assert len(set(keys)) >= 60, f"the tables name too few keys: {sorted(set(keys))}"
    missing = sorted({key for key in keys if key not in schema_keys()})
    assert not missing, f"docs/methods.md names keys the config does not have: {missing}"


def test_one_table_per_reference_and_the_adversarial_weight_table():
    text = METHODS.read_text(encoding="utf-8").split(HEADING, 1)[1]
    text = re.split(r"^## ", text, maxsplit=1, flags=re.M)[0]
    for reference in ("AdvSemiSeg", "AdaptSegNet", "ADVENT", "s4GAN", "DACS",
                      "The adversarial weight, method by method"):
        assert re.search(rf"^### {re.escape(reference)}", text, re.M), reference
    for method in ("supervised", "advsemiseg", "s4gan", "adaptsegnet", "advent", "minent", "mean_teacher"):
        assert re.search(rf"^\| `{method}` \|", text, re.M), method
