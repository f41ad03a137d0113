"""``georep demo --pipeline``: the scenario's sends read by a Structured Streaming query.

The sender of the scenario (``_scenario.py``) sends through both regions, the primary has
an outage in the middle, and instead of GeoReceivers a streaming query, in a driver process
of its own (``georep.adapters.spark.pipeline_job``), reads both regions with the georep
source into a Parquet table. Partway through, once the table holds a third of the
messages, the driver is killed with SIGKILL (its JVM and Python workers with it) and
started again on the same checkpoint. When every acknowledged message is in the table and
both regions are empty, the query is stopped and the table is audited with Spark (by the
driver, in its JVM) against the ledger's acknowledged sends: 0 lost and 0 more than once
is success.
"""

from __future__ import annotations

__all__ = ["PipelineResult", "run_pipeline", "run_pipeline_demo"]

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from georep.cli._scenario import ScenarioConfig, ScenarioProgress, _Run, _Topology

_STOP_WAIT = 300.0
"""Seconds a driver asked to stop (and to audit the table) has before it is killed."""
_KILL_AT = 3
"""The driver is killed once the table holds 1/_KILL_AT of the messages."""


@dataclass
class _Driver:
    """The pipeline's driver process (and its JVM and Python workers: one process group)."""

    settings: dict[str, Any]
    log_dir: Path
    runs: int = 0
    process: subprocess.Popen[bytes] | None = None
    started_at: tuple[int, float] = (0, 0.0)

    @property
    def starting(self) -> bool:
        """The latest run has not yet written to the checkpoint (its JVM is starting)."""
        return _checkpoint_mark(self.settings["checkpoint"]) == self.started_at

    @property
    def log(self) -> Path:
        return self.log_dir / f"driver-{self.runs}.log"

    def start(self) -> None:
        from georep.adapters.spark.pipeline_job import ENVIRONMENT

        self.runs += 1
        self.started_at = _checkpoint_mark(self.settings["checkpoint"])
        environment = {**os.environ, ENVIRONMENT: json.dumps(self.settings)}
        with self.log.open("wb") as output:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "georep.adapters.spark.pipeline_job"],
                env=environment,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def check(self) -> None:
        """Raise if the driver exited on its own (it runs until stopped or killed)."""
        if self.process is not None and self.process.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the pipeline's driver exited ({self.process.returncode}):\n{tail}")

    def kill(self) -> None:
        """SIGKILL the driver's process group and reap it."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def audit(self) -> dict[str, Any]:
        """The table audit's figures the stopped driver wrote.

        Raises:
            RuntimeError: It wrote none (its log's end says why).
        """
        try:
            figures: dict[str, Any] = json.loads(Path(self.settings["audit_out"]).read_text())
        except FileNotFoundError:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the pipeline's driver did not audit the table:\n{tail}") from None
        return figures

    def stop(self) -> None:
        """Ask the query to stop; kill the group if it has not after ``_STOP_WAIT`` s."""
        if self.process is None or self.process.poll() is not None:
            return
        Path(self.settings["stop_file"]).touch()
        try:
            self.process.wait(timeout=_STOP_WAIT)
        except subprocess.TimeoutExpired:
            self.kill()
        with contextlib.suppress(ProcessLookupError):  # its Python workers, if left
            os.killpg(self.process.pid, signal.SIGKILL)


@dataclass
class PipelineResult:
    """What the run measured; the table audit's figures in ``audit``."""

    acknowledged: set[str]
    rows_seen: int
    killed_at_rows: int | None
    driver_runs: int
    send_seconds: float
    progress: ScenarioProgress
    ledger_dir: Path
    table: Path
    audit: dict[str, Any] = field(default_factory=dict)


def _checkpoint_mark(checkpoint: str) -> tuple[int, float]:
    """How many offset and commit log files the checkpoint has, and the latest's time."""
    files = [
        entry for log in ("offsets", "commits") for entry in (Path(checkpoint) / log).glob("[0-9]*")
    ]
    return len(files), max((f.stat().st_mtime for f in files), default=0.0)


def _view(progress: ScenarioProgress, config: ScenarioConfig, rows: int, driver: _Driver) -> Table:
    table = Table(
        title=f"georep demo --pipeline: {config.mode} sends, {progress.elapsed:5.1f} s, "
        f"phase: {progress.phase}",
        title_justify="left",
    )
    for column in ("region", "accepted sends"):
        table.add_column(column, justify="left" if column == "region" else "right")
    for region in ("primary", "secondary"):
        table.add_row(region, f"{progress.accepted.get(region, 0):,}")
    table.caption = (
        f"sent {progress.sent:,}/{config.messages:,}, rows in the table {rows:,}, "
        f"driver run {driver.runs}, failovers {progress.failovers}, "
        f"queued in outbox {progress.queued}"
    )
    table.caption_justify = "left"
    return table


async def run_pipeline(
    config: ScenarioConfig, *, on_progress: Any = None, redis_url: str | None = None
) -> PipelineResult:
    """Send, read through the streaming query (killed once partway), and wait until the
    table holds every acknowledged message and both regions are empty.

    Raises:
        RuntimeError: The driver exited on its own, or the table stopped growing for
            ``max(settle_timeout, 120)`` seconds (not counting a driver's start) before
            it held every message, or did not in ten times that.
    """
    from georep import ParquetLedger
    from georep.adapters.redis import embedded_redis_url
    from georep.adapters.spark._table_audit import CommittedRows

    work = config.work_dir / "pipeline"
    work.mkdir(parents=True, exist_ok=True)
    topology = _Topology(config)
    await topology.start()
    run = _Run(config, ScenarioProgress(), topology, ParquetLedger(config.work_dir / "ledger"))
    url = redis_url or config.redis_url or await asyncio.to_thread(embedded_redis_url)
    settings: dict[str, Any] = {
        "primary": topology.primary,
        "secondary": topology.secondary,
        "queue": config.queue,
        "redis": url,
        "group": f"pipeline-{run.run_id}",
        "checkpoint": str(work / "checkpoint"),
        "staging": str(work / "checkpoint" / "georep-staging"),
        "table": str(work / "table"),
        "stop_file": str(work / "stop"),
        "audit_ledger": str(config.work_dir / "ledger"),
        "audit_out": str(work / "audit.json"),
        # A few batches before the kill and after it, whatever the number of messages.
        "max_per_batch": min(500, max(50, config.messages // 6)),
        "lease": 30,  # renewed while held; a killed driver's claims lapse after it
    }
    driver = _Driver(settings, config.work_dir)
    table = CommittedRows(Path(settings["table"]))
    killed_at: int | None = None
    stall = max(config.settle_timeout, 120.0)

    def report() -> None:
        if on_progress is not None:
            on_progress(run.progress, len(table.ids), driver)

    async def watch() -> None:
        """Kill the driver once partway, restart it; return once everything is in."""
        nonlocal killed_at
        rows, moved = 0, time.monotonic()
        cap = moved + 10 * stall  # a driver that starts for ever is stuck too
        while True:
            driver.check()
            ids = await asyncio.to_thread(table.refresh)
            report()
            if killed_at is None and len(ids) >= max(1, config.messages // _KILL_AT):
                killed_at = len(ids)
                run.progress.phase = f"driver killed (SIGKILL) at {killed_at:,} rows; restarting"
                driver.kill()
                driver.start()
            if (
                sends_done.is_set()
                and run.acknowledged <= set(ids)
                and await topology.empty(_queues(config))
            ):
                return
            if len(ids) != rows or driver.starting:  # a JVM's start is not a stall
                rows, moved = len(ids), time.monotonic()
            if time.monotonic() - moved > stall or time.monotonic() > cap:
                raise RuntimeError(
                    f"the table stopped at {rows:,} of {len(run.acknowledged):,} messages "
                    f"(for {stall:.0f} s, or {10 * stall:.0f} s in all); see {driver.log}"
                )
            await asyncio.sleep(0.25)

    sends_done = asyncio.Event()

    async def send() -> float:
        seconds = await run.send_all()
        await run.sender.flush(time.monotonic() + stall)
        run.progress.phase = "settling"
        sends_done.set()
        return seconds

    try:
        driver.start()
        await run.sender.open()
        sending, watching = asyncio.create_task(send()), asyncio.create_task(watch())
        try:
            await asyncio.wait((sending, watching), return_when=asyncio.FIRST_EXCEPTION)
            for task in (sending, watching):
                error = task.exception() if task.done() else None
                if error is not None:
                    raise error
        finally:
            for task in (sending, watching):
                task.cancel()
            await asyncio.gather(sending, watching, return_exceptions=True)
        send_seconds = sending.result()
        run.progress.phase = "auditing the table (the driver, with Spark)"
        report()
        await run.ledger.flush()  # the acknowledged sends, for the driver's audit
    finally:
        await asyncio.to_thread(driver.stop)
        await run.close()
    audit = await asyncio.to_thread(driver.audit)
    return PipelineResult(
        acknowledged=run.acknowledged,
        rows_seen=sum(table.ids.values()),
        killed_at_rows=killed_at,
        driver_runs=driver.runs,
        send_seconds=send_seconds,
        progress=run.progress,
        ledger_dir=config.work_dir / "ledger",
        table=Path(settings["table"]),
        audit=audit,
    )


def _queues(config: ScenarioConfig) -> dict[str, list[str]]:
    return {"primary": [config.queue], "secondary": [config.queue]}


def run_pipeline_demo(config: ScenarioConfig, console: Console) -> int:
    """Run ``georep demo --pipeline``; the exit status (1 if the table lost or repeats any)."""
    with Live(console=console, refresh_per_second=4, transient=False) as live:

        def show(progress: ScenarioProgress, rows: int, driver: _Driver) -> None:
            live.update(_view(progress, config, rows, driver))

        result = asyncio.run(run_pipeline(config, on_progress=show))
    out = config.work_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    figures = {
        **result.audit,
        "driver_runs": result.driver_runs,
        "killed_at_rows": result.killed_at_rows,
        "failovers": result.progress.failovers,
        "queued": result.progress.queued,
        "table": str(result.table),
    }
    (out / "report.json").write_text(json.dumps(figures, indent=2))
    verdict = Table(title="georep demo --pipeline: the table's audit", title_justify="left")
    verdict.add_column("")
    verdict.add_column("value", justify="right")
    for name, value in (
        ("sent (acknowledged, per the ledger)", result.audit["acknowledged"]),
        ("rows in the table", result.audit["rows"]),
        ("lost (acknowledged, no row)", result.audit["lost"]),
        ("in the table twice or more", result.audit["more_than_once"]),
        ("rows never acknowledged", result.audit["unexpected"]),
        ("driver killed (SIGKILL) at rows", result.killed_at_rows),
        ("failovers / queued in outbox", f"{result.progress.failovers} / {result.progress.queued}"),
    ):
        verdict.add_row(name, f"{value:,}" if isinstance(value, int) else str(value))
    console.print(verdict)
    console.print(f"table: {result.table}\nreport: {out / 'report.json'}")
    healthy = result.audit["lost"] == 0 and result.audit["more_than_once"] == 0
    if healthy:
        console.print("[green]OK: nothing lost, nothing twice in the table.[/]")
    else:
        console.print(
            f"[red]FAILED: {result.audit['lost']} lost, {result.audit['more_than_once']} "
            "twice in the table.[/]"
        )
    return 0 if healthy else 1
