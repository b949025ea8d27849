"""Every link in the docs leads somewhere: relative files exist, anchors name a heading.

The README, ``docs/``, ``bench/`` and ``deploy/`` Markdown files are read;
a link ``[text](path#anchor)`` to a file of the repository must name one
that exists and, with an anchor, a heading of that file (GitHub's slugs:
lower case, punctuation dropped, spaces to hyphens, ``-1``... for repeats).
Links to other sites are not fetched (CI has no internet).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted([REPO / "README.md", *REPO.glob("docs/**/*.md"), *REPO.glob("bench/**/*.md"),
               *REPO.glob("deploy/**/*.md")])
_LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_IMAGE = re.compile(r"!\[[^\]\n]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~)")


def _prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code (links there are not links)."""
    out, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def slugs(path: Path) -> set[str]:
    """The anchors GitHub gives ``path``'s headings."""
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in path.read_text().splitlines():
        if _FENCE.match(line.strip()):
            fenced = not fenced
        if fenced or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip()
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(path: Path) -> list[str]:
    text = _prose(path.read_text())
    return _LINK.findall(text) + _IMAGE.findall(text)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_resolves(doc: Path):
    broken = []
    for target in links(doc):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in slugs(dest):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{doc.relative_to(REPO)}: " + "; ".join(broken)


def test_the_checker_sees_a_broken_link(tmp_path: Path):
    """The check can fail: a missing file and a missing anchor are both found."""
    (tmp_path / "a.md").write_text("# Title here\n\n[x](b.md) [y](a.md#nope) [z](#title-here)\n")
    found = links(tmp_path / "a.md")
    assert found == ["b.md", "a.md#nope", "#title-here"]
    assert "title-here" in slugs(tmp_path / "a.md") and "nope" not in slugs(tmp_path / "a.md")
