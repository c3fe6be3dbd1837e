"""The docs as a newcomer follows them: every relative link in README.md and docs/*.md names a
file of the repo and, where it has one, a heading of that file (as GitHub writes its anchors)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# [text](target), not ![image](...); a target has no spaces in these docs.
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _prose_lines(doc: Path) -> list[tuple[int, str]]:
    """The lines outside fenced code blocks, numbered from 1 (code may hold `[x](y)`)."""
    lines, fenced = [], False
    for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    return {_anchor(line.lstrip("#")) for _, line in _prose_lines(doc) if line.startswith("#")}


def _broken_links(doc: Path, root: Path = ROOT) -> list[str]:
    broken = []
    for number, line in _prose_lines(doc):
        for target in LINK.findall(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, fragment = target.partition("#")
            linked = (doc.parent / path) if path else doc
            where = f"{doc.relative_to(root)}:{number}: {target}"
            if not linked.exists():
                broken.append(f"{where} (no such file)")
            elif fragment and linked.suffix == ".md" and fragment not in _anchors(linked):
                broken.append(f"{where} (no such heading)")
    return broken


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_relative_link_resolves(doc):
    assert _broken_links(doc) == []


def test_the_checker_sees_a_broken_file_and_a_broken_heading(tmp_path):
    (tmp_path / "b.md").write_text("# Where it stands (2026-12-04)\n", encoding="utf-8")
    doc = tmp_path / "a.md"
    doc.write_text(
        "[ok](b.md#where-it-stands-2026-12-04) [gone](c.md) [moved](b.md#elsewhere)\n"
        "```\n[in code](nowhere.md)\n```\n[web](https://example.org/x) [self](#nowhere)\n",
        encoding="utf-8",
    )
    assert _broken_links(doc, root=tmp_path) == [
        "a.md:1: c.md (no such file)",
        "a.md:1: b.md#elsewhere (no such heading)",
        "a.md:5: #nowhere (no such heading)",
    ]
