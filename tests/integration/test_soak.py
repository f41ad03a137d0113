"""``georep soak`` end to end: a short soak with every fault kind, checked.

Every sender, receiver and the syphon run in their own processes against a two-region
emulator, with their own Redis; the nemesis draws every kind of fault over 20
seconds (seed 28, issue 28); the checker must find nothing lost, nothing processed twice
(but after a kill), nothing out of session order, and the system quiet afterwards.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from georep.cli.soak.runner import SoakConfig, run_soak
from georep.cli.soak.schedule import FAULT_KINDS

pytestmark = [
    pytest.mark.integration,
    pytest.mark.heavy,
    pytest.mark.timeout(600),
    # Fifteen processes for two minutes, at the start of a suite already short of CPU: it
    # timed the suite's Spark and Redis Cluster tests out. CI runs the same soak, longer
    # (scripts/soak.sh 60), right after the suite, alone on the machine.
    pytest.mark.skipif(
        os.environ.get("GEOREP_SOAK_IN_SUITE") != "1",
        reason="CI runs scripts/soak.sh 60 after the suite; GEOREP_SOAK_IN_SUITE=1 runs it here",
    ),
]


def test_a_short_soak_with_every_fault_loses_nothing_and_goes_quiet(tmp_path: Path) -> None:
    config = SoakConfig(
        seconds=20,
        seed=28,
        report_dir=tmp_path / "soak",
        processes=1,
        rate=2.0,
        # An upper bound, not a budget: the run ends as soon as the system is quiet.
        quiet_timeout=240,
    )
    result = asyncio.run(run_soak(config))
    report = json.loads((tmp_path / "soak" / "report.json").read_text())
    assert set(report["faults_by_kind"]) == set(FAULT_KINDS)
    broken = {k: v for k, v in result.liveness.items() if v}
    assert result.seconds_to_quiet is not None, f"not quiet: {broken}"
    assert report["totals"]["lost"] == 0, report["entities"]
    assert report["totals"]["out_of_order"] == 0, report["entities"]
    assert all(v.violations == 0 for v in result.verdicts), report["entities"]
    assert not result.hung
    # A send that raised may still have landed (a dropped answer): processed, never
    # acknowledged; so processed can exceed sent, never fall short (lost is 0).
    assert all(v.sent > 0 and v.processed >= v.sent for v in result.verdicts)
    assert result.passed
    assert (
        (tmp_path / "soak" / "report.md").read_text().startswith("# georep soak, seed 28: PASSED")
    )
