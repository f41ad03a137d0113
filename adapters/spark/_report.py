"""What both audit engines share: definitions, the report's shape, ledger files and meta.

The Spark job (:mod:`._audit`) and the single-machine reference (:mod:`._reference`) each
reduce a ledger to the same small :class:`Aggregates`; :func:`build_report` turns them into
the ``report.json`` dictionary, so the two can only differ in how they count, never in what
they report.

Latency percentiles come from a histogram with logarithmic buckets of 0.1 % width
(:func:`latency_bucket`): exact counts per bucket, so per-mode, per-region and overall
percentiles merge exactly, and a percentile is off by at most 0.05 % of (1 + its value in ms).
"""

from __future__ import annotations

__all__ = [
    "ACKNOWLEDGED",
    "BUCKETS_PER_UNIT",
    "DEAD_LETTERED",
    "DEFERRED",
    "EXPIRED",
    "SETTLED_UNPROCESSED",
    "UNKNOWN",
    "Aggregates",
    "OutageWindow",
    "bucket_value",
    "build_report",
    "ledger_files",
    "read_meta",
    "write_report",
]

import json
import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from georep.exceptions import ConfigurationError
from georep.ledger.schema import RECEIVES_DIR, SCHEMA_VERSION, SENDS_DIR

_log = logging.getLogger("georep.audit")

ACKNOWLEDGED = ("accepted", "queued")
"""Send outcomes that acknowledged the message to the caller."""
EXPIRED = "expired"
"""The send outcome the outbox drainer writes for a queued message whose time to live ran
out while it waited: dropped as the broker would have dropped it, so not lost."""
DEAD_LETTERED, DEFERRED = "dead_lettered", "deferred"
SETTLED_UNPROCESSED = (DEAD_LETTERED, DEFERRED)
"""Receive outcomes the handler (or georep on its behalf: ``max_attempts``, the twin of a
dead-lettered copy) chose instead of processing: the message is held by the broker (its
dead-letter queue, or deferred), so not lost."""
UNKNOWN = "unknown"
"""Label for a null mode or region."""
BUCKETS_PER_UNIT = 1000
"""Latency bucket ``b`` holds ``x`` ms where ``b = floor(sign(x) * ln(1 + |x|) * 1000 + 0.5)``."""
_QUANTILES = {"p50": 0.50, "p95": 0.95, "p99": 0.99}
_CDF_POINTS = 200

OutageWindow = tuple[datetime, datetime]
Histogram = dict[int, int]


def bucket_value(bucket: int) -> float:
    """The latency in ms a bucket stands for (its centre)."""
    magnitude = math.expm1(abs(bucket) / BUCKETS_PER_UNIT)
    return math.copysign(magnitude, bucket) if bucket else 0.0


@dataclass(kw_only=True)
class Aggregates:
    """A ledger reduced to what the report needs; filled by an audit engine.

    Seconds are UTC Unix seconds; latencies are ms; histograms map bucket -> count.
    """

    sent: int = 0
    processed: int = 0
    lost: int = 0
    processed_more_than_once: int = 0
    send_failed: int = 0
    dead_lettered: int = 0
    deferred: int = 0
    expired: int = 0
    latency: dict[tuple[str, str], Histogram] = field(default_factory=dict)
    latency_max: dict[tuple[str, str], float] = field(default_factory=dict)
    suppressed_by_region: dict[str, int] = field(default_factory=dict)
    receive_failed_by_region: dict[str, int] = field(default_factory=dict)
    sends_per_second: dict[tuple[int, str], int] = field(default_factory=dict)
    processed_per_second: dict[tuple[int, str], int] = field(default_factory=dict)
    failover_sends: int = 0
    failover_duration: Histogram = field(default_factory=dict)
    failover_duration_max: float | None = None
    failover_seconds: tuple[int, int] | None = None
    max_schema_version: int = SCHEMA_VERSION
    sessions: int = 0
    session_messages: int = 0
    out_of_session_order: Histogram = field(default_factory=dict)
    """Processed copies handed on after a later message of their session and writer, by
    how far (the highest seq handled before them minus theirs)."""
    order_gaps: dict[str, int] = field(default_factory=dict)
    order_wait_us: int = 0
    order_wait_max_us: int = 0


def ledger_files(ledger_dir: str | Path) -> tuple[list[Path], list[Path]]:
    """The complete Parquet files of a ledger's sends and receives.

    Files whose name starts with ``.`` or ``_`` are a writer's temporary files and skipped.

    Raises:
        ConfigurationError: ``ledger_dir`` is not a directory or has neither dataset.
    """
    root = Path(ledger_dir)
    if not root.is_dir():
        raise ConfigurationError(
            f"ledger directory {root} does not exist: pass the directory a ParquetLedger "
            f"wrote (it holds {SENDS_DIR}/ and {RECEIVES_DIR}/)"
        )
    found = []
    for name in (SENDS_DIR, RECEIVES_DIR):
        found.append(
            sorted(
                p
                for p in (root / name).rglob("*.parquet")
                if not any(part.startswith((".", "_")) for part in p.relative_to(root).parts)
            )
        )
    if not found[0] and not found[1]:
        raise ConfigurationError(
            f"{root} holds no ledger: expected Parquet files in {root / SENDS_DIR} "
            f"and {root / RECEIVES_DIR}"
        )
    return found[0], found[1]


def _sessions(aggregates: Aggregates) -> dict[str, Any]:
    """The report's ``sessions`` figures (docs/audit.md)."""
    late = aggregates.out_of_session_order
    return {
        "sessions": aggregates.sessions,
        "messages": aggregates.session_messages,
        "out_of_order": sum(late.values()),
        "out_of_order_by_distance": {str(d): late[d] for d in sorted(late)},
        "max_out_of_order_distance": max(late, default=0),
        "order_gaps": dict(sorted(aggregates.order_gaps.items())),
        "order_wait_s": {
            "total": round(aggregates.order_wait_us / 1e6, 6),
            "max": round(aggregates.order_wait_max_us / 1e6, 6),
        },
    }


def read_meta(ledger_dir: str | Path) -> tuple[int, list[str]]:
    """Sum ``dropped_sends + dropped_receives`` over ``LEDGER_DIR/meta/*.json``.

    Returns:
        The rows writers dropped, and warnings about unreadable meta files.
    """
    dropped = 0
    warnings: list[str] = []
    for path in sorted((Path(ledger_dir) / "meta").glob("*.json")):
        try:
            meta = json.loads(path.read_text())
            dropped += int(meta.get("dropped_sends", 0)) + int(meta.get("dropped_receives", 0))
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            warnings.append(f"meta file {path.name} unreadable ({type(exc).__name__}); skipped")
    return dropped, warnings


def _quantile(histogram: Mapping[int, int], q: float) -> float:
    """The smallest bucket value with at least ``ceil(q * n)`` values at or below it."""
    total = sum(histogram.values())
    rank = max(1, math.ceil(q * total))
    seen = 0
    for bucket in sorted(histogram):
        seen += histogram[bucket]
        if seen >= rank:
            return bucket_value(bucket)
    raise ValueError("empty histogram")  # pragma: no cover - callers pass non-empty ones


def _summary(histogram: Mapping[int, int], maximum: float | None) -> dict[str, Any]:
    summary: dict[str, Any] = {"count": sum(histogram.values())}
    for name, q in _QUANTILES.items():
        summary[name] = round(_quantile(histogram, q), 3)
    summary["max"] = None if maximum is None else round(maximum, 3)
    return summary


def _merge(parts: Iterable[Mapping[int, int]]) -> Histogram:
    merged: Histogram = defaultdict(int)
    for part in parts:
        for bucket, count in part.items():
            merged[bucket] += count
    return dict(merged)


def _cdf(histogram: Mapping[int, int]) -> list[list[float]]:
    """Up to ~200 (latency ms, fraction <= it) points, for the CDF plot."""
    total = sum(histogram.values())
    buckets = sorted(histogram)
    step = max(1, len(buckets) // _CDF_POINTS)
    points, seen = [], 0
    for position, bucket in enumerate(buckets):
        seen += histogram[bucket]
        if position % step == 0 or position == len(buckets) - 1:
            points.append([round(bucket_value(bucket), 3), round(seen / total, 6)])
    return points


def _latency(aggregates: Aggregates) -> tuple[dict[str, Any], dict[str, Any]]:
    groups: dict[str, dict[str, list[tuple[str, str]]]] = {
        "by_mode": defaultdict(list),
        "by_region": defaultdict(list),
    }
    for key in aggregates.latency:
        groups["by_mode"][key[0]].append(key)
        groups["by_region"][key[1]].append(key)
    every = list(aggregates.latency)
    latency: dict[str, Any] = {}
    cdf: dict[str, Any] = {}

    def describe(keys: Sequence[tuple[str, str]]) -> tuple[dict[str, Any], Histogram]:
        histogram = _merge(aggregates.latency[k] for k in keys)
        maximum = max(aggregates.latency_max[k] for k in keys)
        return _summary(histogram, maximum), histogram

    if every:
        latency["overall"], overall = describe(every)
        cdf["overall"] = _cdf(overall)
    else:
        latency["overall"] = {"count": 0}
    for grouping, members in groups.items():
        latency[grouping] = {}
        for label in sorted(members):
            latency[grouping][label], histogram = describe(members[label])
            if grouping == "by_mode":
                cdf.setdefault("by_mode", {})[label] = _cdf(histogram)
    return latency, cdf


def _iso(second: float) -> str:
    return datetime.fromtimestamp(second, UTC).isoformat().replace("+00:00", "Z")


def _timeline(aggregates: Aggregates) -> dict[str, Any]:
    seconds = [s for s, _ in aggregates.sends_per_second] + [
        s for s, _ in aggregates.processed_per_second
    ]
    if not seconds:
        return {"start": None, "seconds": 0, "sends": {}, "processed": {}}
    first, last = min(seconds), max(seconds)
    length = last - first + 1
    timeline: dict[str, Any] = {"start": _iso(first), "seconds": length}
    for name, counts in (
        ("sends", aggregates.sends_per_second),
        ("processed", aggregates.processed_per_second),
    ):
        series: dict[str, list[int]] = {}
        for (second, region), count in counts.items():
            series.setdefault(region, [0] * length)[second - first] += count
        timeline[name] = dict(sorted(series.items()))
    return timeline


def _windows(outage_windows: Iterable[Sequence[Any]]) -> list[dict[str, str]]:
    windows = []
    for window in outage_windows:
        if len(window) != 2:
            raise ConfigurationError(
                f"outage window {window!r} is not a (start, end) pair of UTC datetimes"
            )
        start, end = (_as_utc(value) for value in window)
        if end < start:
            raise ConfigurationError(f"outage window ends before it starts: {window!r}")
        windows.append({"start": _iso(start.timestamp()), "end": _iso(end.timestamp())})
    return windows


def _as_utc(value: Any) -> datetime:
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if isinstance(value, (int, float)):
        return datetime.fromtimestamp(value, UTC)
    if not isinstance(value, datetime):
        raise ConfigurationError(
            f"outage window bound {value!r} is not a datetime, ISO string or Unix seconds"
        )
    if value.tzinfo is None:
        raise ConfigurationError(
            f"outage window bound {value.isoformat()} has no time zone: pass UTC datetimes"
        )
    return value.astimezone(UTC)


def build_report(
    aggregates: Aggregates,
    *,
    ledger_dir: str | Path,
    engine: str,
    outage_windows: Iterable[Sequence[Any]] = (),
    meta: tuple[int, list[str]] | None = None,
) -> dict[str, Any]:
    """The ``report.json`` dictionary (see docs/audit.md for every key).

    ``meta`` is (rows dropped, warnings) when the engine read ``meta/*.json`` itself;
    ``None`` reads them from the local ``ledger_dir``.
    """
    windows = _windows(outage_windows)
    dropped, warnings = read_meta(ledger_dir) if meta is None else (meta[0], list(meta[1]))
    if dropped:
        warnings.append(
            f"ledger writers dropped {dropped} rows (meta/*.json): the loss and duplicate "
            "figures are bounds, not exact counts"
        )
    if aggregates.max_schema_version > SCHEMA_VERSION:
        warnings.append(
            f"ledger rows of schema version {aggregates.max_schema_version} found; this "
            f"audit reads version {SCHEMA_VERSION} columns and ignores newer ones"
        )
    for warning in warnings:
        _log.warning("%s", warning)
    latency, cdf = _latency(aggregates)
    failover: dict[str, Any] = {"sends": aggregates.failover_sends}
    if aggregates.failover_duration:
        failover["duration_ms"] = {
            "p50": round(_quantile(aggregates.failover_duration, 0.5), 3),
            "max": round(aggregates.failover_duration_max or 0.0, 3),
        }
    if aggregates.failover_seconds is not None:
        failover["first_second"] = _iso(aggregates.failover_seconds[0])
        failover["last_second"] = _iso(aggregates.failover_seconds[1])
    return {
        "schema_version": 1,
        "engine": engine,
        "ledger_dir": str(ledger_dir),
        "sent": aggregates.sent,
        "processed": aggregates.processed,
        "lost": aggregates.lost,
        "processed_more_than_once": aggregates.processed_more_than_once,
        "send_failed": aggregates.send_failed,
        "dead_lettered": aggregates.dead_lettered,
        "deferred": aggregates.deferred,
        "expired": aggregates.expired,
        "suppressed_by_region": dict(sorted(aggregates.suppressed_by_region.items())),
        "receive_failed_by_region": dict(sorted(aggregates.receive_failed_by_region.items())),
        "sessions": _sessions(aggregates),
        "latency_ms": latency,
        "latency_cdf_ms": cdf,
        "failover": failover,
        "outage_windows": windows,
        "timeline": _timeline(aggregates),
        "ledger_rows_dropped": dropped,
        "loss_is_bound": dropped > 0,
        "warnings": warnings,
    }


def write_report(report: dict[str, Any], out_dir: str | Path, *, plots: bool) -> dict[str, Any]:
    """Write ``report.json`` (and, with ``plots``, ``timeline.png`` and ``latency_cdf.png``)
    into ``out_dir``; both audits end here, so their files are the same. Returns ``report``
    with ``report_path`` (and ``plots``) added."""
    target = Path(out_dir)
    target.mkdir(parents=True, exist_ok=True)
    if plots:
        from ._plots import write_plots

        report["plots"] = write_plots(report, target)
    report_path = target / "report.json"
    report["report_path"] = str(report_path)
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    return report
