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


def test_every_metric_and_span_georep_records_is_in_the_telemetry_reference() -> None:
    import re

    text = (REPO / "docs" / "telemetry.md").read_text()
    core = [p for p in (REPO / "georep").rglob("*.py") if "adapters" not in p.parts]
    source = "\n".join(p.read_text() for p in core)
    source += "\n".join(p.read_text() for p in (REPO / "adapters").rglob("*.py"))
    # create_counter(...) on a meter, georep's shared Instruments.counter(...) & co, or an
    # InstrumentSpec(...) in a table of counters.
    pattern = (
        r'(?:create_[a-z_]+|\.counter|\.histogram|\.gauge|InstrumentSpec)\(\s*"(georep\.[a-z_.]+)"'
    )
    metrics = set(re.findall(pattern, source))
    assert len(metrics) >= 15
    assert not sorted(m for m in metrics if f"`{m}`" not in text)
    events = set(re.findall(r'add_event\(\s*"(georep\.[a-z_.]+)"', source))
    assert events and not sorted(e for e in events if f"`{e}`" not in text)
