"""The audit's PNGs: a per-second timeline with outages shaded, and latency CDFs."""

from __future__ import annotations

__all__ = ["write_plots"]

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any


def _figure_class() -> Any:
    # A bare Figure renders with the Agg canvas and leaves pyplot's global state alone.
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError("the audit plots need matplotlib: pip install 'georep[spark]'") from exc
    return Figure


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _timeline(report: dict[str, Any], path: Path, figure_class: Any) -> None:
    timeline = report["timeline"]
    figure = figure_class(figsize=(11, 4.5), dpi=100)
    axes = figure.subplots()
    if timeline["start"] is not None:
        start = _time(timeline["start"])
        x = [start + timedelta(seconds=i) for i in range(timeline["seconds"])]
        for region, counts in timeline["sends"].items():
            axes.plot(x, counts, linewidth=1.0, label=f"sends accepted by {region}")
        for region, counts in timeline["processed"].items():
            axes.plot(x, counts, linewidth=1.0, linestyle="--", label=f"processed in {region}")
    for index, window in enumerate(report["outage_windows"]):
        axes.axvspan(
            _time(window["start"]), _time(window["end"]), color="red", alpha=0.15,
            label="outage" if index == 0 else None,
        )  # fmt: skip
    failover = report["failover"]
    if "first_second" in failover:
        axes.axvspan(
            _time(failover["first_second"]),
            _time(failover["last_second"]) + timedelta(seconds=1),
            color="orange",
            alpha=0.2,
            label=f"failovers ({failover['sends']} sends)",
        )
    axes.set_title("Sends and processing per second")
    axes.set_xlabel("time (UTC)")
    axes.set_ylabel("messages per second")
    axes.legend(loc="upper right", fontsize="small")
    figure.autofmt_xdate()
    figure.tight_layout()
    figure.savefig(path)


def _latency_cdf(report: dict[str, Any], path: Path, figure_class: Any) -> None:
    figure = figure_class(figsize=(8, 4.5), dpi=100)
    axes = figure.subplots()
    cdf = report["latency_cdf_ms"]
    curves = dict(cdf.get("by_mode", {}))
    if "overall" in cdf:
        curves["all modes"] = cdf["overall"]
    positive = True
    for label, points in curves.items():
        xs = [p[0] for p in points]
        positive = positive and min(xs) > 0
        axes.step(xs, [p[1] for p in points], where="post", label=label)
    if curves and positive:
        axes.set_xscale("log")
    axes.set_title("End-to-end latency (send started -> first processed copy)")
    axes.set_xlabel("latency (ms)")
    axes.set_ylabel("fraction of messages")
    axes.grid(True, alpha=0.3)
    if curves:
        axes.legend(loc="lower right", fontsize="small")
    figure.tight_layout()
    figure.savefig(path)


def write_plots(report: dict[str, Any], out_dir: str | Path) -> dict[str, str]:
    """Write ``timeline.png`` and ``latency_cdf.png`` for a report.

    Returns:
        ``{"timeline": path, "latency_cdf": path}``.
    """
    figure_class = _figure_class()
    target = Path(out_dir)
    target.mkdir(parents=True, exist_ok=True)
    paths = {"timeline": target / "timeline.png", "latency_cdf": target / "latency_cdf.png"}
    _timeline(report, paths["timeline"], figure_class)
    _latency_cdf(report, paths["latency_cdf"], figure_class)
    return {name: str(path) for name, path in paths.items()}
