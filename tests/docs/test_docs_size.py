"""The docs stay navigable: docs/architecture.md is a page a newcomer reads in one sitting (at most 400 lines, the
rest in docs/guides/), and every relative link in docs/ points to a file that exists (and, for a link to a heading
of a Markdown page, to a heading that exists)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
#: [text](target): the text may run over lines; the target is a path, an anchor or both, with no spaces
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)


def links(page: Path) -> list[str]:
    """The relative targets of the Markdown links of `page`, code spans and blocks left out."""
    text = CODE.sub("", page.read_text(encoding="utf-8"))
    return [target for target in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", target)]


def anchor(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = CODE.sub("", page.read_text(encoding="utf-8"))
    return {anchor(title) for title in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def test_the_architecture_page_is_at_most_400_lines():
    lines = len((DOCS / "architecture.md").read_text(encoding="utf-8").splitlines())
    assert lines <= 400, f"docs/architecture.md has {lines} lines: move detail to a page under docs/guides/"


def test_the_docs_have_links_to_check():
    assert len(PAGES) > 10 and sum(len(links(page)) for page in PAGES) > 20


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_every_relative_link_points_to_an_existing_file(page):
    broken = []
    for target in links(page):
        path, _, fragment = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no {file.relative_to(REPO) if file.is_relative_to(REPO) else file}")
        elif fragment and file.suffix == ".md" and fragment not in anchors(file):
            broken.append(f"{target}: no heading #{fragment} in {file.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)
