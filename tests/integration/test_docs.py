"""Every Python block in the docs runs (tests/docs/run_doc.py), against the emulator, and so
does every shell block marked ``<!-- doc-run -->`` (the runbook's commands)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from _helpers import REPO, run_python

pytestmark = pytest.mark.integration

DOCS = sorted([*REPO.glob("docs/*.md"), REPO / "README.md"])
sys.path.insert(0, str(REPO / "tests" / "docs"))
from run_doc import blocks  # noqa: E402


def _runs_code(path: Path) -> bool:
    return any(block.skip is None for block in blocks(path.read_text()))


#: Pages that start many processes (the runbook's commands) or outages with receivers:
#: heavy, so the scheduler runs only a few such units at once (tests/conftest.py).
HEAVY_PAGES = frozenset({"operations.md", "receiver.md", "README.md"})


# The hang guard above the doc's own 240 s bound (pytest's default, 120 s, cut the runbook
# and the receiver page off on a loaded machine while they were still making progress).
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "path",
    [
        pytest.param(p, marks=[pytest.mark.heavy] if p.name in HEAVY_PAGES else [])
        for p in DOCS
        if _runs_code(p)
    ],
    ids=lambda p: p.name,
)
def test_the_python_in_each_doc_runs(path: Path) -> None:
    completed = run_python(str(REPO / "tests" / "docs" / "run_doc.py"), str(path), timeout=240)
    output = f"stdout:\n{completed.stdout[-3000:]}\nstderr:\n{completed.stderr[-5000:]}"
    assert completed.returncode == 0, output
    assert "SharedAccessKey=" not in completed.stdout + completed.stderr, "a secret was printed"


def test_skipped_blocks_are_few_and_say_why() -> None:
    skipped = [
        (path.name, block.line, block.skip)
        for path in DOCS
        for block in blocks(path.read_text())
        if block.skip is not None
    ]
    assert all(len(reason) > 10 for _, _, reason in skipped), skipped
    total = sum(1 for path in DOCS for _ in blocks(path.read_text()))
    assert len(skipped) * 5 <= total, f"more than a fifth of the blocks are skipped: {skipped}"
