"""Every link between the docs lands: the page exists and so does the heading it names.

Pages move (the demo, cost and bench sections left operations.md for tools.md); a link to
``operations.md#georep-cost`` would then open the top of the wrong page without a word.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted([*REPO.glob("docs/*.md"), REPO / "README.md"])
LINK = re.compile(r"\]\(([^)\s]*?\.md)?(?:#([^)\s]+))?\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for the page's headings (code blocks left out)."""
    text = FENCE.sub("", page.read_text())
    found = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def test_github_anchors_are_computed_as_github_does() -> None:
    assert "georep-doctor" in anchors(REPO / "docs" / "operations.md")
    assert "8-when-redis-is-unreachable" in anchors(REPO / "docs" / "receiver.md")


def test_every_link_to_a_page_and_heading_lands() -> None:
    broken = []
    for page in PAGES:
        for target, anchor in LINK.findall(FENCE.sub("", page.read_text())):
            if target.startswith(("http://", "https://")):
                continue
            linked = (page.parent / target).resolve() if target else page
            if not linked.is_file():
                broken.append(f"{page.name}: {target} does not exist")
            elif anchor and anchor not in anchors(linked):
                broken.append(f"{page.name}: {target}#{anchor} names no heading there")
    assert not broken, "\n".join(broken)
