"""`georep demo`, the README's first command, end to end: emulator, outage, Redis seen-set,
ledger and the Spark audit (a real local Spark)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from _helpers import run_python

pytestmark = [pytest.mark.integration, pytest.mark.heavy, pytest.mark.timeout(300)]


def run_demo(work_dir: Path, *options: str, timeout: float = 300) -> tuple[str, dict[str, Any]]:
    """``georep demo *options`` in ``work_dir``, which must succeed: its output, and the
    audit's report (report/report.json)."""
    completed = run_python(
        "-m", "georep.cli", "demo", *options, "--work-dir", str(work_dir),
        timeout=timeout, env={**os.environ, "COLUMNS": "120"},
    )  # fmt: skip
    output = completed.stdout + completed.stderr
    log = work_dir / "demo.log"
    logged = log.read_text(encoding="utf-8") if log.exists() else ""
    assert "SharedAccessKey=" not in logged, "a secret was logged"
    if completed.returncode != 0:  # the log's session lines tell what order waited for
        lines = [line for line in logged.splitlines() if "session" in line]
        pytest.fail(output[-5000:] + "\ndemo.log (session lines):\n" + "\n".join(lines[-80:]))
    return output, json.loads((work_dir / "report" / "report.json").read_text())


def test_passive_demo_through_an_outage_loses_nothing_and_the_timeline_shows_the_switch(
    tmp_path: Path,
) -> None:
    output, report = run_demo(
        tmp_path, "--messages", "900", "--rate", "150", "--outage-at", "2", "--outage-for", "2"
    )
    assert "OK: nothing lost, nothing processed twice." in output
    assert "SharedAccessKey=" not in output, "a secret was printed"
    assert report["sent"] == report["processed"] == 900
    assert report["lost"] == 0 and report["processed_more_than_once"] == 0
    assert report["failover"]["sends"] >= 1
    assert len(report["outage_windows"]) == 1
    # Sends move from the primary to the secondary and stay there (no switch-back).
    sends = report["timeline"]["sends"]
    first_secondary = next(i for i, n in enumerate(sends["secondary"]) if n)
    assert sum(sends["primary"][:first_secondary]) > 0
    assert sum(sends["primary"][first_secondary + 1 :]) == 0
    assert sum(sends["secondary"]) > 0
    for plot in ("timeline.png", "latency_cdf.png"):
        assert (tmp_path / "report" / plot).stat().st_size > 10_000


def test_the_sessions_demo_keeps_fifty_sessions_in_order_through_an_outage(
    tmp_path: Path,
) -> None:
    # The audit by the pyarrow reference (the same report): the passive demo above runs
    # the Spark one, and a second Java VM here would cost the suite half a minute of CPU.
    output, report = run_demo(
        tmp_path, "--sessions", "--messages", "1000", "--rate", "250", "--outage-at", "1",
        "--outage-for", "3", "--audit", "pyarrow",
    )  # fmt: skip
    assert report["engine"] == "pyarrow"
    assert "OK: nothing lost, nothing processed twice, 0 out of session order." in output
    assert report["sent"] == report["processed"] == 1000 and report["lost"] == 0
    assert report["sessions"]["sessions"] == 50
    assert report["sessions"]["out_of_order"] == 0
    # Sending lasts four seconds (1,000 at 250/s; flat out, a quiet machine had sent them
    # all before the outage began), so the outage hits sends: they failed over, or (the
    # emulator, one process for both regions, busy dropping the primary's hundred session
    # links on a loaded machine, let the secondary miss the 5 s attempt deadline) were
    # queued in the outbox and delivered later. Both keep the promise checked above; which
    # one is the machine's.
    queued = re.findall(r"queued in outbox (\d+)", output)
    assert report["failover"]["sends"] + (int(queued[-1]) if queued else 0) >= 1, output[-2000:]


@pytest.mark.parametrize(
    ("option", "named"), [("--mode", "geo"), ("--audit", "hive")], ids=["mode", "audit"]
)
def test_a_bad_option_is_exit_status_2_and_named(tmp_path: Path, option: str, named: str) -> None:
    completed = run_python(
        "-m", "georep.cli", "demo", option, named, "--work-dir", str(tmp_path), timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert completed.returncode == 2
    assert repr(named) in completed.stdout + completed.stderr
    assert "one of" in completed.stdout  # the valid choices are listed


@pytest.mark.timeout(900)  # two driver JVMs start, one after the other
def test_the_pipeline_demo_kills_the_query_driver_and_the_table_holds_each_message_once(
    tmp_path: Path,
) -> None:
    output, report = run_demo(
        tmp_path, "--pipeline", "--messages", "300", "--rate", "60", "--outage-at", "1",
        "--outage-for", "2", timeout=840,
    )  # fmt: skip
    assert "OK: nothing lost, nothing twice in the table." in output
    assert report["acknowledged"] == report["rows"] == 300
    assert report["lost"] == report["more_than_once"] == report["unexpected"] == 0
    # The driver was killed partway, with rows in the table and more to come, and ran again.
    assert report["driver_runs"] == 2 and 0 < report["killed_at_rows"] < 300
    assert report["failovers"] + report["queued"] >= 1, "the outage hit no send"
    assert "SharedAccessKey=" not in "".join(
        p.read_text(errors="replace") for p in tmp_path.glob("driver-*.log")
    ), "a driver logged a secret"
