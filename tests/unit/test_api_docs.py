"""docs/api.md is what scripts/api_docs.py writes from the code today."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_api_reference_is_current() -> None:
    completed = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "api_docs.py"), "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr


def test_every_public_name_is_in_the_reference() -> None:
    import georep

    text = (REPO / "docs" / "api.md").read_text()
    missing = [name for name in georep.__all__ if not name.startswith("__") and name not in text]
    assert not missing
