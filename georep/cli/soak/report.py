"""The soak's report: ``report.json``, ``report.md`` and, when matplotlib is installed,
``timeline.png`` (throughput, failovers and faults over time)."""

from __future__ import annotations

__all__ = ["write_report"]

import importlib.util
import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .checker import read_history

if TYPE_CHECKING:
    from .runner import SoakResult


def write_report(
    result: SoakResult, run_dir: Path, *, faults_began: float, faults_ended: float
) -> dict[str, Any]:
    """Write the report files into ``run_dir``; return what ``report.json`` holds."""
    from .runner import config_dict

    config = result.config
    report: dict[str, Any] = {
        "passed": result.passed,
        "seed": config.seed,
        "config": config_dict(config),
        "replay": replay_command(result),
        "messages": result.messages,
        "faults_by_kind": dict(sorted(Counter(f["kind"] for f in result.faults).items())),
        "faults_refused": [f for f in result.faults if "error" in f or "end_error" in f],
        "faults": result.faults,
        "entities": [v.as_dict() for v in result.verdicts],
        "totals": {
            key: sum(getattr(v, key) for v in result.verdicts)
            for key in ("lost", "processed_twice", "twice_after_kill", "out_of_order")
        },
        "seconds_of_faults": round(faults_ended - faults_began, 1),
        "seconds_from_faults_end_to_quiet": (
            round(result.seconds_to_quiet, 1) if result.seconds_to_quiet is not None else None
        ),
        "liveness": result.liveness,
        "hung": result.hung,
        "seconds_to_close": _closing(run_dir),
    }
    (run_dir / "report.json").write_text(json.dumps(report, indent=1, default=str))
    plot = _plot(run_dir, result, faults_began, faults_ended)
    (run_dir / "report.md").write_text(_markdown(report, plot))
    return report


def _closing(run_dir: Path) -> dict[str, float]:
    """Each worker's seconds from SIGTERM to the end of its main (slowest first)."""
    closing = {}
    for path in (run_dir / "status").glob("*.json"):
        try:
            status = json.loads(path.read_text())
        except ValueError:
            continue
        if "stopping" in status and "stopped" in status:
            closing[path.stem] = round(status["stopped"] - status["stopping"], 1)
    return dict(sorted(closing.items(), key=lambda item: -item[1]))


def replay_command(result: SoakResult) -> str:
    config = result.config
    kinds = ",".join(config.kinds)
    seen = f" --seen-set {config.seen_set}" if config.seen_set != "redis" else ""
    seen += "" if config.spark is None else (" --spark" if config.spark else " --no-spark")
    return (
        f"georep soak --seconds {config.seconds:g} --seed {config.seed} --processes "
        f"{config.processes} --rate {config.rate:g} --faults {kinds}{seen} "
        f"--report {config.report_dir}"
    )


def _markdown(report: dict[str, Any], plot: str | None) -> str:
    verdict = "PASSED" if report["passed"] else "FAILED"
    lines = [
        f"# georep soak, seed {report['seed']}: {verdict}",
        "",
        f"Replay: `{report['replay']}`",
        "",
        f"- faults for {report['seconds_of_faults']} s; quiet "
        + (
            f"{report['seconds_from_faults_end_to_quiet']} s after the last fault ended"
            if report["seconds_from_faults_end_to_quiet"] is not None
            else "NEVER (liveness failed: see below)"
        ),
        f"- totals: {report['totals']}",
        f"- hung processes: {', '.join(report['hung']) or 'none'}",
        "",
        "## Per entity",
        "",
        "| entity | sent | processed | lost | twice | twice after a kill | out of order "
        "| sessions | recovered rows |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for e in report["entities"]:
        lines.append(
            f"| {e['entity']} | {e['sent']} | {e['processed']} | {e['lost']} | "
            f"{e['processed_twice']} | {e['twice_after_kill']} | {e['out_of_order']} | "
            f"{e['sessions']} | {e['recovered_rows']} |"
        )
    lines += ["", "## Faults by kind", "", "| kind | injected | refused |", "| --- | ---: | ---: |"]
    refused = Counter(f["kind"] for f in report["faults_refused"])
    for kind, count in report["faults_by_kind"].items():
        lines.append(f"| {kind} | {count} | {refused[kind]} |")
    lines += ["", "## Messages", ""]
    lines += [f"- {key}: {count}" for key, count in report["messages"].items()]
    broken = {k: v for k, v in report["liveness"].items() if v}
    lines += ["", "## Liveness", "", f"`{json.dumps(broken)}`" if broken else "quiet"]
    for e in report["entities"]:
        if e["lost_ids"] or e["twice_ids"]:
            lines += ["", f"{e['entity']}: lost {e['lost_ids']}, twice {e['twice_ids']}"]
    if plot:
        lines += ["", f"![throughput and faults]({plot})"]
    return "\n".join(lines) + "\n"


def _plot(run_dir: Path, result: SoakResult, began: float, ended: float) -> str | None:
    """``timeline.png``: acknowledged and handled per second, failovers per second (from
    the ledger), and each fault as a bar; None without matplotlib."""
    if importlib.util.find_spec("matplotlib") is None:
        return None
    from matplotlib.figure import Figure

    history = read_history(run_dir / "history")
    if not history:
        return None
    start = min(float(e["t"]) for e in history)
    acked: Counter[int] = Counter()
    handled: Counter[int] = Counter()
    for event in history:
        second = int(float(event["t"]) - start)
        (acked if event["ev"] == "ack" else handled)[second] += 1
    failovers = _failovers_per_second(run_dir / "ledger", start)
    last = max([*acked, *handled, *failovers, 0]) + 1
    x = list(range(last))
    figure = Figure(figsize=(11, 6), dpi=100)
    top, bottom = figure.subplots(2, 1, sharex=True, height_ratios=(2, 1))
    top.plot(x, [acked[s] for s in x], linewidth=1.0, label="acknowledged / s")
    top.plot(x, [handled[s] for s in x], linewidth=1.0, label="handled / s")
    top.bar(x, [failovers[s] for s in x], color="orange", alpha=0.6, label="failover sends / s")
    top.axvline(ended - start, color="green", linestyle="--", label="faults end")
    top.set_ylabel("messages per second")
    top.legend(loc="upper right", fontsize="small")
    kinds = sorted({f["kind"] for f in result.faults})
    for fault in result.faults:
        row = kinds.index(fault["kind"])
        span = float(fault.get("ended", fault["began"])) - float(fault["began"])
        bottom.barh(row, max(span, 0.3), left=float(fault["began"]) - start, color="red", alpha=0.4)
    bottom.set_yticks(range(len(kinds)), kinds, fontsize="small")
    bottom.set_xlabel(f"seconds since the first message (seed {result.config.seed})")
    figure.tight_layout()
    figure.savefig(run_dir / "timeline.png")
    return "timeline.png"


def _failovers_per_second(ledger: Path, start: float) -> Counter[int]:
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    from georep.ledger.schema import send_schema

    files = sorted(str(p) for p in (ledger / "sends").glob("*.parquet"))
    if not files:
        return Counter()
    table = ds.dataset(files, schema=send_schema(), format="parquet").to_table(
        columns=["failover", "started_at"]
    )
    table = table.filter(pc.fill_null(table["failover"], False))
    return Counter(int(t.timestamp() - start) for t in table["started_at"].to_pylist() if t)
