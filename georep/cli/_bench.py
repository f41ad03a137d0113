"""``georep bench``: benchmark scenarios on the emulator, each audited from its ledger.

Every scenario runs :func:`georep.cli._scenario.run_scenario`, writes a delivery ledger, has the
Spark audit turn it into ``report.json`` and PNGs under ``OUT/<scenario>/``, and adds what
the client measured itself (send rate, failover time) under the report's ``scenario`` key.
``OUT/SUMMARY.md`` puts every scenario on one page.
"""

from __future__ import annotations

__all__ = ["SCENARIOS", "BenchScenario", "run_bench"]

import asyncio
import json
import platform
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from georep.cli._scenario import ScenarioConfig, ScenarioResult, run_scenario


@dataclass(frozen=True)
class BenchScenario:
    """One named run: what it shows, and how to configure it for ``messages`` messages."""

    name: str
    purpose: str
    configure: Callable[[Path, int, float], ScenarioConfig]


def _scenario(
    name: str, purpose: str, *, mode: str, rate: float, receivers: int, outage: bool = False
) -> BenchScenario:
    """A scenario at ``rate`` msg/s (0: flat out); with ``outage``, the primary goes down a
    third of the way through for the run's outage seconds."""

    def configure(work: Path, messages: int, outage_for: float) -> ScenarioConfig:
        if not outage:
            return ScenarioConfig(work_dir=work, mode=mode, messages=messages, rate=rate,
                                  outage_at=None, receivers=receivers)  # fmt: skip
        return ScenarioConfig(work_dir=work, mode=mode, messages=messages, rate=rate,
                              outage_at=messages / rate / 3, outage_for=outage_for,
                              receivers=receivers)  # fmt: skip

    return BenchScenario(name=name, purpose=purpose, configure=configure)


def _throughput(mode: str) -> BenchScenario:
    return _scenario(
        f"throughput-{mode}",
        f"{mode} sends as fast as one sender can, one receiver, no fault",
        mode=mode,
        rate=0,
        receivers=1,
    )


SCENARIOS: dict[str, BenchScenario] = {
    scenario.name: scenario
    for scenario in (
        _throughput("raw"),
        _throughput("passive"),
        _throughput("active"),
        _scenario(
            "failover",
            "passive at 200 msg/s, the primary down mid-run, two receivers",
            mode="passive",
            rate=200,
            receivers=2,
            outage=True,
        ),
        _scenario(
            "dedup",
            "active at full speed, four receivers sharing one seen-set",
            mode="active",
            rate=0,
            receivers=4,
        ),
    )
}


def _scenario_figures(result: ScenarioResult) -> dict[str, Any]:
    progress = result.progress
    return {
        "mode": result.config.mode,
        "messages": result.config.messages,
        "rate_target": result.config.rate,
        "receivers": result.config.receivers,
        "acknowledged": len(result.acknowledged),
        "send_seconds": round(result.send_seconds, 3),
        "send_rate": round(result.send_rate, 1),
        "failover_seconds": result.failover_seconds,
        "failovers": progress.failovers,
        "queued_in_outbox": progress.queued,
        "send_retries": progress.send_errors,
        "suppressed_by_region": dict(progress.suppressed),
        "outage_windows": [[a.isoformat(), b.isoformat()] for a, b in result.outage_windows],
        "client_lost": result.lost,
        "client_processed_more_than_once": result.processed_more_than_once,
    }


def _summary(reports: dict[str, dict[str, Any]], command: str) -> str:
    lines = [
        "# georep bench: summary",
        "",
        f"Made by `{command.strip()}` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
        f"{platform.machine()}, Python {platform.python_version()}, against the bundled "
        "emulator on loopback (one machine: sender, receivers, emulator and Redis share its "
        "cores, so read the ratios between rows rather than the absolute rates).",
        "",
        "| scenario | what it shows | sent | send msg/s | processed | lost | processed twice "
        "| suppressed | failover | latency p50 / p99 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, report in reports.items():
        figures = report.get("scenario", {})
        latency = report.get("latency_ms", {}).get("overall", {})
        failover = figures.get("failover_seconds")
        lines.append(
            f"| {name} | {SCENARIOS[name].purpose} | {report.get('sent', 0):,} "
            f"| {figures.get('send_rate', 0):,.0f} | {report.get('processed', 0):,} "
            f"| {report.get('lost')} | {report.get('processed_more_than_once')} "
            f"| {sum(report.get('suppressed_by_region', {}).values()):,} "
            f"| {f'{failover * 1000:,.0f} ms' if failover is not None else '-'} "
            f"| {latency.get('p50', 0):,.0f} / {latency.get('p99', 0):,.0f} ms |"
        )
    raw = reports.get("throughput-raw", {}).get("scenario", {}).get("send_rate")
    if raw:
        lines += ["", "Send rate against the raw SDK sender measured in the same run:", ""]
        for mode in ("passive", "active"):
            rate = reports.get(f"throughput-{mode}", {}).get("scenario", {}).get("send_rate")
            if rate:
                lines.append(f"- {mode}: {rate / raw:.2f}x")
        lines += [
            "",
            "These runs receive in the same process as they send, so the receivers compete "
            "with the sender for the CPU, and active mode receives twice the copies: its "
            "ratio here is below the sender-only figure of `benchmarks/sender.py`.",
        ]
    lines += ["", "Per scenario: `report.json` (the audit, plus the client's own figures under "
              "`scenario`), `timeline.png` (sends and processing per region per second, the "
              "outage shaded) and `latency_cdf.png`."]  # fmt: skip
    return "\n".join(lines) + "\n"


def run_bench(
    names: list[str],
    *,
    out: Path,
    messages: int,
    outage_for: float,
    master: str = "local[*]",
    on_result: Callable[[str, dict[str, Any]], None] | None = None,
    command: str = "georep bench",
) -> dict[str, dict[str, Any]]:
    """Run the named scenarios one after another; return their reports.

    Raises:
        KeyError: An unknown scenario name.
    """
    from georep.adapters.spark import audit

    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise KeyError(f"unknown scenario {', '.join(unknown)}: use {', '.join(SCENARIOS)}")
    reports: dict[str, dict[str, Any]] = {}
    for name in names:
        work = Path(tempfile.mkdtemp(prefix=f"georep-bench-{name}-"))
        try:
            config = SCENARIOS[name].configure(work, messages, outage_for)
            result = asyncio.run(run_scenario(config))
            target = out / name
            target.mkdir(parents=True, exist_ok=True)
            report: dict[str, Any] = audit(
                result.ledger_dir,
                out_dir=target,
                master=master,
                outage_windows=result.outage_windows,
            )
            report["scenario"] = _scenario_figures(result)
            (target / "report.json").write_text(json.dumps(report, indent=2, default=str))
            reports[name] = report
            if on_result is not None:
                on_result(name, report)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    summary = out / "SUMMARY.md"
    kept = _record_block(summary.read_text()) if summary.exists() else ""
    summary.write_text(_summary(reports, command) + (f"\n{kept}\n" if kept else ""))
    return reports


def _record_block(text: str) -> str:
    """The benchmark record's block of a SUMMARY.md (``benchmarks/check.py --summary``
    writes it between these markers), which a new scenario summary keeps; or ``""``."""
    begin, end = (
        text.find("<!-- benchmark-record:begin"),
        text.find("<!-- benchmark-record:end -->"),
    )
    if begin == -1 or end < begin:
        return ""
    return text[begin : end + len("<!-- benchmark-record:end -->")]
