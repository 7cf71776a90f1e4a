"""Every relative link in the READMEs and docs/ leads somewhere: the file exists and, with `#anchor`, has a
heading of that anchor (GitHub's rule for heading anchors)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(
    [
        ROOT / "README.md",
        ROOT / "infra" / "README.md",
        ROOT / "images" / "README.md",
        *(ROOT / "docs").glob("*.md"),
    ]
)
# [text](target) outside code; the target ends at whitespace or ')'. Images are links too.
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
_CODE = re.compile(r"`[^`\n]*`")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation other than '-' and '_' dropped, each space a
    '-' (a repeated heading's '-1' suffix is not needed here)."""
    text = re.sub(r"[`*]", "", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def links(page: Path) -> list[str]:
    text = _CODE.sub("", _FENCE.sub("", page.read_text()))
    return [target for target in _LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:", target)]


def anchors(page: Path) -> set[str]:
    return {anchor(h) for h in _HEADING.findall(_FENCE.sub("", page.read_text()))}


def test_the_anchor_rule_matches_githubs():
    assert anchor("On AWS") == "on-aws"
    assert anchor("2026-12-02, commit 416b1c8, 2 cores: `make observe-check`") == (
        "2026-12-02-commit-416b1c8-2-cores-make-observe-check"
    )
    assert anchor("Only verified nodes train; what the job is doing") == (
        "only-verified-nodes-train-what-the-job-is-doing"
    )


def test_the_link_finder_sees_links_and_skips_code(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[a](a.md) `[b](b.md)`\n```\n[c](c.md)\n```\n[d](https://example.com) [e](#x)\n")
    assert links(page) == ["a.md", "#x"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{target}: no heading #{fragment} in {resolved.relative_to(ROOT)}")
    assert not broken, broken
