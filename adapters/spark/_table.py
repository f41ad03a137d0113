"""The audit report as a rich Table (for ``georep audit`` and ``georep demo``)."""

from __future__ import annotations

__all__ = ["report_table"]

from typing import Any


def _latency_row(label: str, stats: dict[str, Any]) -> tuple[str, str]:
    if not stats.get("count"):
        return f"latency {label}", "no processed message has a send row"
    return (
        f"latency {label}: p50 / p95 / p99 / max ms (n={stats['count']:,})",
        f"{stats['p50']:,.1f} / {stats['p95']:,.1f} / {stats['p99']:,.1f} / {stats['max']:,.1f}",
    )


def report_table(report: dict[str, Any]) -> Any:
    """Render an audit report (from ``audit`` or ``reference_audit``) as a ``rich.table.Table``.

    Raises:
        ImportError: rich is not installed.
    """
    try:
        from rich.table import Table
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError("the audit table needs rich: pip install 'georep[spark]'") from exc

    table = Table(title=f"Ledger audit ({report['engine']}): {report['ledger_dir']}")
    table.add_column("measure")
    table.add_column("value", justify="right")

    def bad(count: int) -> str:
        return f"[red]{count:,}[/]" if count else f"[green]{count:,}[/]"

    bound = " (bound: rows dropped)" if report.get("loss_is_bound") else ""
    table.add_row("sent (acknowledged)", f"{report['sent']:,}")
    table.add_row("processed", f"{report['processed']:,}")
    table.add_row(f"lost{bound}", bad(report["lost"]))
    table.add_row(f"processed more than once{bound}", bad(report["processed_more_than_once"]))
    table.add_row("send failed (caller got an error)", f"{report['send_failed']:,}")
    for key, label in (
        ("dead_lettered", "dead-lettered by the handler (not processed, held)"),
        ("deferred", "deferred by the handler (not processed, held)"),
        ("expired", "expired in the outbox (time to live ran out)"),
    ):
        if report.get(key):
            table.add_row(label, f"{report[key]:,}")
    for region, count in report["suppressed_by_region"].items():
        table.add_row(f"duplicates suppressed in {region}", f"{count:,}")
    for region, count in report["receive_failed_by_region"].items():
        table.add_row(f"handler failures in {region}", f"{count:,}")
    latency = report["latency_ms"]
    table.add_row(*_latency_row("all", latency["overall"]))
    for grouping in ("by_mode", "by_region"):
        for label, stats in latency.get(grouping, {}).items():
            table.add_row(*_latency_row(label, stats))
    failover = report["failover"]
    if failover["sends"]:
        duration = failover.get("duration_ms", {})
        table.add_row("failover sends", f"{failover['sends']:,}")
        if duration:
            table.add_row(
                "failover send duration: p50 / max ms",
                f"{duration['p50']:,.1f} / {duration['max']:,.1f}",
            )
        if "first_second" in failover:
            table.add_row("failovers from", failover["first_second"])
            table.add_row("failovers until", failover["last_second"])
    for window in report["outage_windows"]:
        table.add_row("outage (given)", f"{window['start']} to {window['end']}")
    if report["ledger_rows_dropped"]:
        table.add_row("ledger rows dropped", f"[yellow]{report['ledger_rows_dropped']:,}[/]")
    return table
