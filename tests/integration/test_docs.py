"""The README stays a short entry point and every relative link in the docs resolves.

Links are checked as GitHub renders them: a relative path from the linking file's directory must
exist, and a ``#fragment`` must name a heading of the target Markdown file by GitHub's slug rules.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
README_MAX_LINES = 250

FENCE = re.compile(r"^(```|~~~)")
INLINE_CODE = re.compile(r"`+[^`]*`+")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, in_fence = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            in_fence = not in_fence
            continue
        if not in_fence:
            lines.append(line)
    return lines


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lowercased, without punctuation other
    than hyphens and underscores, spaces turned into hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose_lines(path.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def relative_links(path: Path) -> list[str]:
    links = []
    for line in prose_lines(path.read_text(encoding="utf-8")):
        for target in LINK.findall(INLINE_CODE.sub("", line)):
            if not SCHEME.match(target):
                links.append(target)
    return links


def broken_links(path: Path) -> list[str]:
    """``"<link>: <why>"`` for every relative link of ``path`` that does not resolve."""
    broken = []
    for link in relative_links(path):
        target, _, fragment = link.partition("#")
        resolved = (path.parent / target).resolve() if target else path
        if not resolved.exists():
            broken.append(f"{link}: {resolved} does not exist")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{link}: no heading #{fragment} in {resolved}")
    return broken


def test_readme_is_short_and_names_the_two_commands():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    assert "make demo" in text
    assert "make test" in text


def test_docs_directory_holds_the_reference():
    names = {path.name for path in DOCS}
    assert {"architecture.md", "training.md", "checkpoints.md", "datasets.md"} <= names


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    assert broken_links(path) == []


def test_every_doc_is_linked_from_the_readme():
    linked = {(README.parent / link.partition("#")[0]).resolve() for link in relative_links(README)}
    assert [p.name for p in DOCS if p.resolve() not in linked] == []


def test_github_slug():
    assert github_slug("The demo (`make demo`)") == "the-demo-make-demo"
    assert github_slug("tools/bench.py") == "toolsbenchpy"
    assert github_slug("Domain adaptation (AdaptSegNet, ADVENT, MinEnt)") == "domain-adaptation-adaptsegnet-advent-minent"
    assert github_slug("The methods' iterations") == "the-methods-iterations"
    assert github_slug("segadv-data check") == "segadv-data-check"
    assert github_slug("a [link](x.md) and snake_case") == "a-link-and-snake_case"


def test_link_checker_catches_a_broken_link(tmp_path):
    (tmp_path / "other.md").write_text("# Real heading\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#real-heading) [gone](missing.md) [bad anchor](other.md#nope) "
        "[web](https://example.com) `[code](not-a-link.md)`\n```\n[fenced](nor-this.md)\n```\n",
        encoding="utf-8",
    )
    problems = [problem.split(":")[0] for problem in broken_links(page)]
    assert problems == ["missing.md", "other.md#nope"]



def test_every_scalar_a_method_logs_is_in_the_list_of_logged_scalars():
    """docs/training.md's "Logged scalars" names each ``train/<name>`` a method declares it logs
    (``Method.losses``; ``train/x[_aux]`` names both)."""
    from segadv.methods.registry import METHODS

    text = (ROOT / "docs" / "training.md").read_text()
    section = text.split("## Logged scalars", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"train/(\w+)", section))
    named |= {f"{name}_aux" for name in re.findall(r"train/(\w+)\[_aux\]", section)}
    missing = {method: [name for name in spec.losses if name not in named] for method, spec in METHODS.items()}
    assert {method: names for method, names in missing.items() if names} == {}
