"""The single-machine reference audit: pyarrow reads the ledger, numpy counts.

It computes the same :class:`~._report.Aggregates` as the Spark job, by a different route
(dictionary-encoded ids and sorts instead of a shuffle), so tests and the benchmark can hold
the two against each other. It holds the whole ledger in memory: fine up to tens of millions
of rows on one machine; Spark is for more.
"""

from __future__ import annotations

__all__ = ["reference_aggregates", "reference_audit"]

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from georep.ledger.schema import receive_schema, send_schema

from ._report import (
    ACKNOWLEDGED,
    BUCKETS_PER_UNIT,
    DEAD_LETTERED,
    DEFERRED,
    EXPIRED,
    UNKNOWN,
    Aggregates,
    build_report,
    ledger_files,
    write_report,
)

_SEND_COLUMNS = [
    "schema_version", "message_id", "mode", "outcome", "accepted_region", "failover",
    "started_at", "finished_at",
]  # fmt: skip
_RECEIVE_COLUMNS = [
    "schema_version", "message_id", "region", "outcome", "received_at", "settled_at",
    "session_id", "order_writer", "order_seq", "order_gap", "order_wait", "finished_at",
]  # fmt: skip


def _read(files: Sequence[Path], schema: pa.Schema, columns: list[str]) -> pa.Table:
    if not files:
        return schema.empty_table().select(columns)
    # The dataset's schema makes a column an older file lacks read as nulls.
    return ds.dataset([str(f) for f in files], schema=schema, format="parquet").to_table(
        columns=columns
    )


def _micros(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(microseconds since the epoch, is-valid mask) of a timestamp column."""
    valid = pc.is_valid(column).to_numpy(zero_copy_only=False)
    values = pc.fill_null(column.cast(pa.int64()), 0).to_numpy(zero_copy_only=False)
    return values.astype(np.int64), valid


def _labels(column: pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    """(rank of each row's label among the sorted labels, the sorted labels); null = UNKNOWN."""
    filled = pc.fill_null(column, UNKNOWN)
    names = sorted(pc.unique(filled).to_pylist())
    ranks = pc.index_in(filled, value_set=pa.array(names, type=pa.string()))
    return ranks.to_numpy(zero_copy_only=False).astype(np.int64), names


def _first_per_id(codes: np.ndarray, times: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """Row index of the earliest row per id code (ties: smallest label rank)."""
    order = np.lexsort((ranks, times, codes))
    sorted_codes = codes[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = sorted_codes[1:] != sorted_codes[:-1]
    firsts: np.ndarray = order[first]
    return firsts


def _earliest_per_id(
    codes: np.ndarray, times: np.ndarray, ranks: np.ndarray, usable: np.ndarray, id_count: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per id code: the time and label rank of its earliest usable row (rank -1: none)."""
    candidates = np.flatnonzero(usable)
    first = candidates[_first_per_id(codes[candidates], times[candidates], ranks[candidates])]
    earliest = np.zeros(id_count, dtype=np.int64)
    rank = np.full(id_count, -1, dtype=np.int64)
    earliest[codes[first]] = times[first]
    rank[codes[first]] = ranks[first]
    return earliest, rank


def latency_buckets(latency_ms: np.ndarray) -> np.ndarray:
    """The histogram bucket of each latency (see ``BUCKETS_PER_UNIT``)."""
    scaled = np.sign(latency_ms) * np.log1p(np.abs(latency_ms)) * BUCKETS_PER_UNIT
    buckets: np.ndarray = np.floor(scaled + 0.5).astype(np.int64)
    return buckets


def _histogram(values_ms: np.ndarray) -> dict[int, int]:
    buckets, counts = np.unique(latency_buckets(values_ms), return_counts=True)
    return {int(b): int(c) for b, c in zip(buckets, counts, strict=True)}


def _per_second(
    micros: np.ndarray, ranks: np.ndarray, names: list[str]
) -> dict[tuple[int, str], int]:
    if not len(micros):
        return {}
    seconds = micros // 1_000_000
    first = int(seconds.min())
    # One dense counter per (second, label): cheaper than a unique over row pairs.
    counts = np.bincount((seconds - first) * len(names) + ranks)
    return {
        (first + int(k) // len(names), names[int(k) % len(names)]): int(counts[k])
        for k in np.flatnonzero(counts)
    }


def _count_by(column: pa.ChunkedArray, mask: pa.ChunkedArray) -> dict[str, int]:
    counts = pc.value_counts(pc.fill_null(column.filter(mask), UNKNOWN))
    return {str(row["values"]): int(row["counts"]) for row in counts.to_pylist() if row["counts"]}


def reference_aggregates(ledger_dir: str | Path) -> Aggregates:
    """Reduce a ledger to :class:`Aggregates` with pyarrow and numpy (no Spark)."""
    send_files, receive_files = ledger_files(ledger_dir)
    sends = _read(send_files, send_schema(), _SEND_COLUMNS)
    receives = _read(receive_files, receive_schema(), _RECEIVE_COLUMNS)
    result = Aggregates()
    versions = [pc.max(t["schema_version"]).as_py() for t in (sends, receives) if t.num_rows]
    result.max_schema_version = max([v for v in versions if v is not None] or [1])

    is_processed = pc.equal(receives["outcome"], "processed")
    processed = receives.filter(is_processed)
    # One dictionary over both datasets' ids: every id gets a dense integer code.
    ids = pa.chunked_array(
        sends["message_id"].chunks + processed["message_id"].chunks, type=pa.string()
    ).combine_chunks()
    encoded = ids.dictionary_encode()
    codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    id_count = len(encoded.dictionary)
    send_codes, processed_codes = codes[: sends.num_rows], codes[sends.num_rows :]

    # Sends: acknowledged per id, and the earliest acknowledged send (its time and mode).
    acked_rows = pc.fill_null(
        pc.is_in(sends["outcome"], value_set=pa.array(ACKNOWLEDGED, type=pa.string())), False
    ).to_numpy(zero_copy_only=False)
    has_send = np.zeros(id_count, dtype=bool)
    has_send[send_codes] = True
    sent = np.zeros(id_count, dtype=bool)
    sent[send_codes[acked_rows]] = True
    started, started_valid = _micros(sends["started_at"])
    mode_ranks, modes = _labels(sends["mode"])
    first_send_time, first_send_mode = _earliest_per_id(
        send_codes, started, mode_ranks, acked_rows & started_valid, id_count
    )

    # Processed copies: how many per id, and the earliest (its time and region).
    copies = np.bincount(processed_codes, minlength=id_count)
    received, received_valid = _micros(processed["received_at"])
    region_ranks, regions = _labels(processed["region"])
    first_copy_time, first_copy_region = _earliest_per_id(
        processed_codes, received, region_ranks, received_valid, id_count
    )

    # Ids the handler settled otherwise (dead-lettered, deferred) or the outbox dropped as
    # expired: held by the broker or dropped as the broker would have, not lost.
    unprocessed = sent & (copies == 0)
    dead_lettered = _ids_with(receives, DEAD_LETTERED, encoded.dictionary, id_count)
    deferred = _ids_with(receives, DEFERRED, encoded.dictionary, id_count)
    expired = _ids_with(sends, EXPIRED, encoded.dictionary, id_count)
    result.dead_lettered = int((unprocessed & dead_lettered).sum())
    result.deferred = int((unprocessed & deferred & ~dead_lettered).sum())
    result.expired = int((unprocessed & expired & ~dead_lettered & ~deferred).sum())

    result.sent = int(sent.sum())
    result.processed = int((copies > 0).sum())
    result.lost = int((unprocessed & ~dead_lettered & ~deferred & ~expired).sum())
    result.processed_more_than_once = int((copies >= 2).sum())
    result.send_failed = int((has_send & ~sent).sum())

    measured = np.flatnonzero((first_send_mode >= 0) & (first_copy_region >= 0))
    latency_ms = (first_copy_time[measured] - first_send_time[measured]) / 1000.0
    group = first_send_mode[measured] * len(regions) + first_copy_region[measured]
    for key in np.unique(group):
        values = latency_ms[group == key]
        label = (modes[int(key) // len(regions)], regions[int(key) % len(regions)])
        result.latency[label] = _histogram(values)
        result.latency_max[label] = float(values.max())

    _receive_side(receives, is_processed, processed, received, received_valid, result)
    _send_side(sends, started, started_valid, result)
    _session_side(processed, result)
    return result


def _session_side(processed: pa.Table, result: Aggregates) -> None:
    """Sessions, messages handed on out of their session's order (and by how far), gaps
    and the time waited for order, over processed copies (docs/audit.md)."""
    rows = processed.filter(pc.is_valid(processed["session_id"]))
    result.sessions = len(pc.unique(rows["session_id"]))
    result.session_messages = rows.num_rows
    gaps = pc.is_valid(rows["order_gap"])
    result.order_gaps = _count_by(rows["order_gap"], gaps) if rows.num_rows else {}
    waits = np.floor(
        pc.fill_null(rows["order_wait"], 0.0).to_numpy(zero_copy_only=False) * 1e6
    ).astype(np.int64)
    result.order_wait_us = int(waits.sum())
    result.order_wait_max_us = int(waits.max()) if len(waits) else 0

    stamped = rows.filter(pc.is_valid(rows["order_seq"]))
    if not stamped.num_rows:
        return
    # One group per (session, writer); within it, copies in the order they were handled.
    groups = pc.binary_join_element_wise(
        stamped["session_id"], pc.fill_null(stamped["order_writer"], ""), "\n"
    ).dictionary_encode()
    codes = groups.combine_chunks().indices.to_numpy(zero_copy_only=False).astype(np.int64)
    handled = pc.coalesce(stamped["finished_at"], stamped["settled_at"], stamped["received_at"])
    times, _ = _micros(handled)
    seq = np.maximum(stamped["order_seq"].to_numpy(zero_copy_only=False).astype(np.int64), 0)
    order = np.lexsort((seq, times, codes))
    codes, seq = codes[order], seq[order]
    # The highest seq handled before each copy of its group: a running maximum over the
    # sorted rows, each group lifted above the previous ones.
    base = codes * (int(seq.max()) + 1)
    running = np.maximum.accumulate(base + seq)
    same = np.zeros(len(seq), dtype=bool)
    same[1:] = codes[1:] == codes[:-1]
    before = np.full(len(seq), -1, dtype=np.int64)
    before[1:] = running[:-1]
    before = np.where(same, before - base, -1)
    late = before > seq
    distances, counts = np.unique(before[late] - seq[late], return_counts=True)
    result.out_of_session_order = {int(d): int(c) for d, c in zip(distances, counts, strict=True)}


def _ids_with(table: pa.Table, outcome: str, ids: pa.Array, id_count: int) -> np.ndarray:
    """A mask over the dense id codes: ids with a row of ``outcome`` in ``table``."""
    mask = np.zeros(id_count, dtype=bool)
    rows = table.filter(pc.fill_null(pc.equal(table["outcome"], outcome), False))
    if rows.num_rows:
        # Ids absent from the dictionary (no send, no processed copy) come back null.
        found = pc.fill_null(pc.index_in(rows["message_id"], value_set=ids), -1)
        codes = found.to_numpy(zero_copy_only=False).astype(np.int64)
        mask[codes[codes >= 0]] = True
    return mask


def _receive_side(
    receives: pa.Table,
    is_processed: pa.ChunkedArray,
    processed: pa.Table,
    received: np.ndarray,
    received_valid: np.ndarray,
    result: Aggregates,
) -> None:
    result.suppressed_by_region = _count_by(
        receives["region"], pc.equal(receives["outcome"], "suppressed")
    )
    result.receive_failed_by_region = _count_by(
        receives["region"], pc.equal(receives["outcome"], "failed")
    )
    ranks, names = _labels(processed["region"])
    result.processed_per_second = _per_second(
        received[received_valid], ranks[received_valid], names
    )


def _send_side(
    sends: pa.Table, started: np.ndarray, started_valid: np.ndarray, result: Aggregates
) -> None:
    has_region = pc.is_valid(sends["accepted_region"]).to_numpy(zero_copy_only=False)
    ranks, names = _labels(sends["accepted_region"])
    rows = has_region & started_valid
    result.sends_per_second = _per_second(started[rows], ranks[rows], names)
    failover = pc.fill_null(sends["failover"], False).to_numpy(zero_copy_only=False)
    result.failover_sends = int(failover.sum())
    finished, finished_valid = _micros(sends["finished_at"])
    timed = failover & started_valid & finished_valid
    if timed.any():
        durations = (finished[timed] - started[timed]) / 1000.0
        result.failover_duration = _histogram(durations)
        result.failover_duration_max = float(durations.max())
    dated = failover & started_valid
    if dated.any():
        seconds = started[dated] // 1_000_000
        result.failover_seconds = (int(seconds.min()), int(seconds.max()))


def reference_audit(
    ledger_dir: str | Path,
    *,
    out_dir: str | Path | None = None,
    outage_windows: Iterable[Sequence[Any]] = (),
    plots: bool = True,
) -> dict[str, Any]:
    """Audit a ledger without Spark: the same report as :func:`audit`, and the same files.

    Args:
        ledger_dir: The ledger directory.
        out_dir: Where to write ``report.json`` (and the PNGs); ``None`` writes nothing.
        outage_windows: (start, end) UTC datetimes to carry into the report.
        plots: Write ``timeline.png`` and ``latency_cdf.png`` into ``out_dir``.

    Raises:
        ConfigurationError: ``ledger_dir`` holds no ledger.
    """
    report = build_report(
        reference_aggregates(ledger_dir),
        ledger_dir=ledger_dir,
        engine="pyarrow",
        outage_windows=outage_windows,
    )
    if out_dir is not None:
        write_report(report, out_dir, plots=plots)
    return report
