"""``georep demo``: run the scenario with live progress, audit the ledger, print the verdict."""

from __future__ import annotations

__all__ = ["log_to", "progress_table", "run_demo"]

import asyncio
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from georep.cli._scenario import ScenarioConfig, ScenarioProgress, ScenarioResult, run_scenario


def progress_table(progress: ScenarioProgress, config: ScenarioConfig) -> Table:
    """The live view: one row per region, plus the phase and totals."""
    table = Table(
        title=f"georep demo: {config.mode} replication, {progress.elapsed:5.1f} s, "
        f"phase: {progress.phase}",
        title_justify="left",
    )
    for column in ("region", "accepted sends", "copies received", "duplicates suppressed"):
        table.add_column(column, justify="left" if column == "region" else "right")
    received, suppressed = progress.received, progress.suppressed
    for region in ("primary", "secondary"):
        table.add_row(
            region,
            f"{progress.accepted.get(region, 0):,}",
            f"{received.get(region, 0):,}",
            f"{suppressed.get(region, 0):,}",
        )
    table.caption = (
        f"sent {progress.sent:,}/{config.messages:,}, processed {progress.processed:,}, "
        f"failovers {progress.failovers}, queued in outbox {progress.queued}, "
        f"send retries {progress.send_errors}"
    )
    table.caption_justify = "left"
    return table


class _OncePerKind(logging.Filter):
    """Let one record per logger and message kind through every ``period`` seconds: a region
    that is down would otherwise print the same warning on every retry."""

    def __init__(self, period: float = 5.0) -> None:
        super().__init__()
        self._period = period
        self._last: dict[tuple[str, str], float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        kind = (record.name, str(record.msg)[:40])
        now = time.monotonic()
        if now - self._last.get(kind, -self._period) < self._period:
            return False
        self._last[kind] = now
        return True


def log_to(console: Console, file: Path | None = None) -> None:
    """Route georep's warnings through ``console``, each kind at most every 5 s; with
    ``file``, also every record from INFO up, unfiltered, to that file."""
    from rich.logging import RichHandler

    handler = RichHandler(console=console, show_path=False, level=logging.WARNING)
    handler.addFilter(_OncePerKind())
    logger = logging.getLogger("georep")
    logger.addHandler(handler)
    logger.propagate = False
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
        to_file = logging.FileHandler(file, encoding="utf-8")
        to_file.setLevel(logging.INFO)
        to_file.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        logger.addHandler(to_file)
        logger.setLevel(min(logger.getEffectiveLevel(), logging.INFO))


async def _run_live(config: ScenarioConfig, console: Console) -> ScenarioResult:
    progress = ScenarioProgress()
    with Live(console=console, refresh_per_second=4, transient=False) as live:

        async def refresh() -> None:
            while True:
                live.update(progress_table(progress, config))
                await asyncio.sleep(0.25)

        refresher = asyncio.create_task(refresh())
        try:
            result = await run_scenario(config, progress=progress)
        finally:
            refresher.cancel()
        live.update(progress_table(result.progress, config))
    return result


#: What ``georep demo --audit`` accepts: Spark (the product's audit), or pyarrow (the
#: same report and files from the single-machine reference audit, no Java needed).
AUDIT_ENGINES = ("spark", "pyarrow")


def _audit(
    result: ScenarioResult, out_dir: Path, console: Console, engine: str
) -> dict[str, Any] | None:
    try:
        from georep.adapters.spark import audit, reference_audit, report_table
    except ImportError as exc:
        console.print(f"[yellow]audit skipped[/]: {exc}")
        return None
    report: dict[str, Any]
    if engine == "pyarrow":
        with console.status("auditing the ledger with pyarrow ..."):
            report = reference_audit(
                result.ledger_dir, out_dir=out_dir, outage_windows=result.outage_windows
            )
    else:
        with console.status("auditing the ledger with Spark (local[*]) ..."):
            report = audit(result.ledger_dir, out_dir=out_dir, outage_windows=result.outage_windows)
    console.print(report_table(report))
    return report


def run_demo(config: ScenarioConfig, console: Console, *, audit: str = "spark") -> int:
    """Run the demo and audit its ledger with ``audit`` (:data:`AUDIT_ENGINES`); return the
    exit status (1 if anything was lost or processed twice)."""
    console.print(_headline(config))
    log_to(console, config.work_dir / "demo.log")
    if config.pipeline:
        from georep.cli._pipeline import run_pipeline_demo

        return run_pipeline_demo(config, console)
    result = asyncio.run(_run_live(config, console))
    out_dir = config.work_dir / "report"
    report = _audit(result, out_dir, console, audit)
    lost = report["lost"] if report is not None else result.lost
    twice = (
        report["processed_more_than_once"]
        if report is not None
        else (result.processed_more_than_once)
    )
    summary = Table(title="georep demo: verdict", title_justify="left")
    summary.add_column("")
    summary.add_column("value", justify="right")
    for row in _verdict_rows(result, report, lost, twice):
        summary.add_row(*row)
    console.print(summary)
    if report is not None:
        for name in ("timeline.png", "latency_cdf.png"):
            path = out_dir / name
            if path.exists():
                console.print(f"plot: {path}")
        console.print(f"report: {out_dir / 'report.json'}")
    out_of_order = _out_of_order(result, report)
    healthy = lost == 0 and twice == 0 and out_of_order == 0
    ordered = ", 0 out of session order" if config.sessions else ""
    console.print(
        Group(
            Text(f"OK: nothing lost, nothing processed twice{ordered}.", style="green")
            if healthy
            else Text(
                f"FAILED: {lost} lost, {twice} processed twice"
                + (f", {out_of_order} out of session order" if config.sessions else "")
                + ".",
                style="red",
            )
        )
    )
    return 0 if healthy else 1


def _out_of_order(result: ScenarioResult, report: dict[str, Any] | None) -> int:
    """Messages handled out of session order: the audit's count, else the scenario's."""
    if report is not None and "sessions" in report:
        return int(report["sessions"]["out_of_order"])
    return result.progress.out_of_session_order


def _headline(config: ScenarioConfig) -> str:
    """The demo's first line: where it runs, how many receivers and messages, the outage."""
    return (
        "[bold]georep demo[/]: "
        + (
            "two emulated Service Bus regions on loopback"
            if config.primary is None
            else "your two namespaces"
        )
        + (
            ", a Spark streaming query (its driver killed once) into a Parquet table"
            if config.pipeline
            else f", {config.receivers} receivers"
        )
        + " with a Redis seen-set, "
        f"{config.messages:,} messages at {config.rate:g}/s"
        + (f" over {config.sessions} sessions" if config.sessions else "")
        + (
            f", primary outage at {config.outage_at:g} s for {config.outage_for:g} s"
            if config.outage_at is not None
            else ""
        )
    )


def _verdict_rows(
    result: ScenarioResult, report: dict[str, Any] | None, lost: int, twice: int
) -> list[tuple[str, str]]:
    """The verdict table's rows (latency only when the Spark audit ran)."""
    rows = [
        ("sent (acknowledged)", f"{len(result.acknowledged):,}"),
        ("processed", f"{len(result.processed):,}"),
        ("lost", str(lost)),
        ("processed twice", str(twice)),
        (
            "duplicates suppressed",
            ", ".join(f"{r} {n:,}" for r, n in sorted(result.progress.suppressed.items())) or "0",
        ),
        (
            "failover time",
            f"{result.failover_seconds * 1000:,.0f} ms"
            if result.failover_seconds is not None
            else "n/a",
        ),
    ]
    if result.config.sessions:
        figures = report.get("sessions", {}) if report is not None else {}
        rows.append(("sessions", f"{figures.get('sessions', result.config.sessions):,}"))
        rows.append(("out of session order", str(_out_of_order(result, report))))
        if figures:
            rows.append(("order gaps", str(sum(figures["order_gaps"].values()))))
            rows.append(("time waiting for order", f"{figures['order_wait_s']['total']:,.1f} s"))
    if report is not None:
        latency = report.get("latency_ms", {}).get("overall", {})
        if latency.get("p50") is not None and latency.get("p99") is not None:
            rows.append(("latency p50 / p99", f"{latency['p50']:,.0f} / {latency['p99']:,.0f} ms"))
    return rows


def default_work_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="georep-demo-"))
