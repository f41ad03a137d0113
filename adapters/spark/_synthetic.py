"""Synthetic ledgers with exactly known faults, for tests and ``benchmarks/audit.py``.

The generator writes a ledger (format v1, :mod:`georep.ledger.schema`) as a two-region run
would: sends spread evenly over ``duration`` seconds in three modes, a primary outage during
which sends fail over to the secondary (1 s attempt timeout), a few sends queued in the
outbox during the outage, and receives with twin copies suppressed in the secondary (active
mode), redeliveries suppressed in the processing region, and then the injected faults:

* **lost**: acknowledged, never processed (the handler failed once, the copy was never
  redelivered: one ``failed`` receive row);
* **processed more than once**: a second ``processed`` copy from the other region;
* **send failed**: the caller got an error (not acknowledged, so never "lost"); half of them
  arrived anyway and were processed.

Everything is vectorised with numpy and written in chunks (one Parquet file per chunk and
dataset), so 10M messages take about a minute and a bounded amount of memory.
"""

from __future__ import annotations

__all__ = ["SyntheticLedger", "write_session_ledger", "write_synthetic_ledger"]

import asyncio
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from georep.exceptions import ConfigurationError
from georep.ledger.schema import (
    RECEIVES_DIR,
    SCHEMA_VERSION,
    SENDS_DIR,
    receive_schema,
    send_schema,
)

_PRIMARY, _SECONDARY = 0, 1
_MODES = ("passive", "active", "paired")
_K1 = np.uint64(0x9E3779B97F4A7C15)
_K2 = np.uint64(0xD6E8FEB86659FD93)
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_US = 1_000_000


@dataclass(frozen=True, kw_only=True)
class SyntheticLedger:
    """What :func:`write_synthetic_ledger` wrote: the counts an audit must report.

    Attributes:
        path: The ledger directory.
        messages: Logical messages (one send row each).
        sent: Acknowledged messages (outcome ``accepted`` or ``queued``).
        send_failed: Messages whose send failed (never acknowledged).
        processed: Distinct messages with at least one ``processed`` receive row.
        lost: Acknowledged messages never processed (exactly the injected number).
        processed_more_than_once: Messages with two ``processed`` rows (injected number).
        suppressed_by_region: ``suppressed`` receive rows per region.
        failover_sends: Send rows with ``failover=true``.
        outage_window: The injected primary outage, UTC (start, end).
        receive_rows: Rows written to ``receives``.
    """

    path: Path
    messages: int
    sent: int
    send_failed: int
    processed: int
    lost: int
    processed_more_than_once: int
    suppressed_by_region: dict[str, int] = field(default_factory=dict)
    failover_sends: int = 0
    outage_window: tuple[datetime, datetime]
    receive_rows: int = 0


def _no_session(rows: int) -> list[pa.Array]:
    """The session columns of ``rows`` copies without a session (all null)."""
    schema = receive_schema()
    return [
        pa.nulls(rows, schema.field(name).type)
        for name in (
            "session_id",
            "order_writer",
            "order_seq",
            "order_gap",
            "order_wait",
            "finished_at",
        )
    ]


def _message_ids(index: np.ndarray, seed: int) -> pa.StringArray:
    """UUID-shaped, unique ids (``index * _K2`` is a bijection on 64 bits), built as bytes."""
    idx = index.astype(np.uint64)
    high = (idx * _K1) ^ np.uint64(seed * 0x5851F42D4C957F2D % 2**64)
    low = idx * _K2 + np.uint64(seed % 2**64)
    count = len(index)
    digits = np.empty((count, 32), dtype=np.uint8)
    for k in range(16):
        shift = np.uint64(60 - 4 * k)
        digits[:, k] = _HEX[((high >> shift) & np.uint64(15)).astype(np.intp)]
        digits[:, 16 + k] = _HEX[((low >> shift) & np.uint64(15)).astype(np.intp)]
    text = np.full((count, 36), ord("-"), dtype=np.uint8)
    for start, stop, offset in ((0, 8, 0), (9, 13, 8), (14, 18, 12), (19, 23, 16), (24, 36, 20)):
        text[:, start:stop] = digits[:, offset : offset + stop - start]
    offsets = np.arange(0, 36 * (count + 1), 36, dtype=np.int32)
    return pa.StringArray.from_buffers(
        count, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(text))
    )


def _timestamps(micros: np.ndarray) -> pa.Array:
    return pa.array(micros.astype("datetime64[us]"), type=pa.timestamp("us", tz="UTC"))


def _labels(codes: np.ndarray, names: tuple[str, ...]) -> pa.Array:
    """Strings from small integer codes (-1 = null)."""
    mask = codes < 0
    dictionary = pa.DictionaryArray.from_arrays(
        pa.array(np.where(mask, 0, codes).astype(np.int32), mask=mask), pa.array(names)
    )
    return dictionary.cast(pa.string())


def _regions_tried(
    tried_secondary_only: np.ndarray, both: np.ndarray, primary_outcome: np.ndarray,
    secondary_outcome: np.ndarray, regions: tuple[str, str],
) -> pa.Array:  # fmt: skip
    """The ``regions`` list: primary first (unless skipped), then secondary when tried."""
    n = len(both)
    has_primary = ~tried_secondary_only
    has_secondary = both | tried_secondary_only
    lengths = has_primary.astype(np.int32) + has_secondary.astype(np.int32)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    region = np.empty(total, dtype=np.int32)
    outcome = np.empty(total, dtype=np.int32)
    first = offsets[:-1]
    region[first[has_primary]] = _PRIMARY
    outcome[first[has_primary]] = primary_outcome[has_primary]
    second = first + has_primary.astype(np.int32)
    region[second[has_secondary]] = _SECONDARY
    outcome[second[has_secondary]] = secondary_outcome[has_secondary]
    outcomes = ("accepted", "failed", "skipped", "queued")
    error = np.where(outcome == 1, 0, -1)
    entries = pa.StructArray.from_arrays(
        [
            _labels(region, regions),
            _labels(outcome, outcomes),
            _labels(error, ("RegionUnavailableError",)),
        ],
        names=["region", "outcome", "error"],
    )
    return pa.ListArray.from_arrays(pa.array(offsets), entries)


def _write(table: pa.Table, directory: Path, name: str) -> None:
    """Write under a temporary (hidden) name, then rename, as the ledger writer does.

    With pyarrow's defaults, as ``ParquetLedger`` writes (Snappy, dictionary pages, row
    groups of 1Mi rows): the audit reads files like the ones it meets in production.
    """
    directory.mkdir(parents=True, exist_ok=True)
    temporary = directory / f".{name}.tmp"
    pq.write_table(table, temporary)
    temporary.rename(directory / name)


def write_synthetic_ledger(
    ledger_dir: str | Path,
    *,
    messages: int,
    loss_rate: float = 0.001,
    double_rate: float = 0.0005,
    send_failure_rate: float = 0.0002,
    duration: float = 600.0,
    outage: tuple[float, float] = (0.4, 0.5),
    regions: tuple[str, str] = ("primary", "secondary"),
    start: datetime = datetime(2026, 1, 1, tzinfo=UTC),
    seed: int = 7,
    chunk_size: int = 1_000_000,
    dropped_sends: int = 0,
    dropped_receives: int = 0,
) -> SyntheticLedger:
    """Write a ledger of ``messages`` logical messages with exactly injected faults.

    Args:
        ledger_dir: Directory to create (``sends/``, ``receives/``, ``meta/``); must not
            already hold a ledger.
        messages: Logical messages, at least 1.
        loss_rate: Fraction of messages lost; the count is ``round(messages * loss_rate)``.
        double_rate: Fraction processed twice; count ``round(messages * double_rate)``.
        send_failure_rate: Fraction whose send failed; count ``round(messages * rate)``.
        duration: Seconds the sends are spread over.
        outage: The primary outage as fractions (start, end) of ``duration``.
        regions: Labels of the primary and secondary regions.
        start: UTC time of the first send.
        seed: Random seed; the same arguments write the same ledger.
        chunk_size: Messages per Parquet file (bounds memory).
        dropped_sends: ``dropped_sends`` written to ``meta/synthetic.json`` (0: no file).
        dropped_receives: ``dropped_receives`` written to ``meta/synthetic.json``.

    Returns:
        The counts an audit of this ledger must report.

    Raises:
        ConfigurationError: An argument is out of range or the directory holds a ledger.
    """
    path = Path(ledger_dir)
    if messages < 1:
        raise ConfigurationError(f"messages must be at least 1, got {messages}")
    if chunk_size < 1:
        raise ConfigurationError(f"chunk_size must be at least 1, got {chunk_size}")
    if not 0 <= outage[0] <= outage[1] <= 1:
        raise ConfigurationError(f"outage must be fractions 0 <= start <= end <= 1: {outage}")
    n_lost = round(messages * loss_rate)
    n_double = round(messages * double_rate)
    n_failed = round(messages * send_failure_rate)
    if n_lost + n_double + n_failed > messages:
        raise ConfigurationError("loss_rate + double_rate + send_failure_rate must be <= 1")
    if (path / SENDS_DIR).exists() or (path / RECEIVES_DIR).exists():
        raise ConfigurationError(f"{path} already holds a ledger: pass a new directory")

    rng = np.random.default_rng(seed)
    special = rng.choice(messages, size=n_lost + n_double + n_failed, replace=False)
    role = np.zeros(messages, dtype=np.int8)  # 0 normal, 1 lost, 2 double, 3 send failed
    role[special[:n_lost]] = 1
    role[special[n_lost : n_lost + n_double]] = 2
    role[special[n_lost + n_double :]] = 3

    t0 = int(start.timestamp() * _US)
    span = int(duration * _US)
    outage_start, outage_end = t0 + int(span * outage[0]), t0 + int(span * outage[1])
    counts: dict[str, Any] = {"sent": 0, "failed": 0, "processed": 0, "failover": 0, "rows": 0}
    suppressed = np.zeros(2, dtype=np.int64)

    for chunk, first in enumerate(range(0, messages, chunk_size)):
        index = np.arange(first, min(messages, first + chunk_size), dtype=np.int64)
        n = len(index)
        crng = np.random.default_rng([seed, chunk])
        kind = role[index]
        hashed = (index.astype(np.uint64) * _K2) >> np.uint64(40)
        bucket = (hashed % np.uint64(100)).astype(np.int64)
        mode = np.where(bucket < 60, 0, np.where(bucket < 90, 1, 2))  # passive/active/paired
        active = mode == 1
        started = t0 + (index * span) // messages + crng.integers(0, 1000, n)
        down = (started >= outage_start) & (started < outage_end)
        failed = kind == 3
        queued = down & ~failed & (((hashed >> np.uint64(8)) % np.uint64(100)) == 0) & ~active
        acked = ~failed
        failover = down & acked & ~queued
        accepted_region = np.where(failed | queued, -1, np.where(down, _SECONDARY, _PRIMARY))
        finished = started + np.where(down | failed, 1_000_000, 3_000) + crng.integers(0, 2000, n)
        outcome = np.where(failed, 2, np.where(queued, 1, 0))  # accepted/queued/failed

        # Regions tried: the primary (failed while down), then the secondary when active
        # mode, when the primary failed, or when the send failed everywhere.
        tried_both = active | down | failed
        primary_outcome = np.where(down | failed, 1, 0)
        secondary_outcome = np.where(failed, 1, np.where(queued, 1, 0))
        regions_list = _regions_tried(
            np.zeros(n, dtype=bool), tried_both, primary_outcome, secondary_outcome, regions
        )
        sends = pa.Table.from_arrays(
            [
                pa.array(np.full(n, SCHEMA_VERSION, dtype=np.int16)),
                _message_ids(index, seed),
                pa.array(np.full(n, "orders", dtype=object), type=pa.string()),
                _labels(mode, _MODES),
                _labels(outcome, ("accepted", "queued", "failed")),
                _labels(accepted_region, regions),
                pa.array(failover),
                regions_list,
                _timestamps(started),
                _timestamps(finished),
                pa.array(np.full(n, 4242, dtype=np.int32)),
                pa.array(np.full(n, "synthetic", dtype=object), type=pa.string()),
            ],
            schema=send_schema(),
        )
        _write(sends, path / SENDS_DIR, f"sends-{chunk:05d}.parquet")
        counts["sent"] += int(acked.sum())
        counts["failed"] += int(failed.sum())
        counts["failover"] += int(failover.sum())

        # Receives: (index, region, outcome, received_at, delivery_count) per copy.
        latency = np.exp(crng.normal(np.log(15_000), 0.6, n)).astype(np.int64)
        arrive = np.where(queued, np.maximum(started, outage_end) + 500_000, started) + latency
        region = np.where(accepted_region < 0, _PRIMARY, accepted_region)
        processed_once = (acked & (kind != 1)) | (failed & (index % 2 == 0))
        lost = kind == 1
        twin = active & acked & ~down  # the secondary's copy of an active send
        redelivered = processed_once & ((hashed % np.uint64(1000)) == 7)
        double = kind == 2
        parts = [
            (processed_once, region, 0, arrive, 1),
            (double, 1 - region, 0, arrive + 50_000, 1),
            (twin, np.full(n, _SECONDARY), 1, arrive + 2_000, 1),
            (redelivered, region, 1, arrive + 30_000_000, 2),
            (lost, region, 2, arrive, 1),
        ]
        ids = _message_ids(index, seed)
        tables = []
        for mask, copy_region, copy_outcome, received, delivery in parts:
            rows = np.flatnonzero(mask)
            m = len(rows)
            if copy_outcome == 1:
                suppressed += np.bincount(copy_region[rows], minlength=2)
            tables.append(
                pa.Table.from_arrays(
                    [
                        pa.array(np.full(m, SCHEMA_VERSION, dtype=np.int16)),
                        ids.take(pa.array(rows)),
                        pa.array(np.full(m, "orders", dtype=object), type=pa.string()),
                        _labels(copy_region[rows], regions),
                        _labels(np.full(m, copy_outcome), ("processed", "suppressed", "failed")),
                        pa.array(np.full(m, delivery, dtype=np.int32)),
                        _timestamps(received[rows] - 1_000),
                        _timestamps(received[rows]),
                        _timestamps(received[rows] + 500),
                        pa.array(np.full(m, 4343, dtype=np.int32)),
                        pa.array(np.full(m, "synthetic", dtype=object), type=pa.string()),
                        *_no_session(m),
                    ],
                    schema=receive_schema(),
                )
            )
        receives = pa.concat_tables(tables)
        # A receiver writes in arrival order.
        receives = receives.take(pa.array(np.argsort(receives["received_at"].to_numpy())))
        _write(receives, path / RECEIVES_DIR, f"receives-{chunk:05d}.parquet")
        counts["processed"] += int(processed_once.sum())
        counts["rows"] += receives.num_rows

    if dropped_sends or dropped_receives:
        meta = path / "meta"
        meta.mkdir(parents=True, exist_ok=True)
        (meta / "synthetic.json").write_text(
            json.dumps(
                {
                    "schema_version": SCHEMA_VERSION,
                    "dropped_sends": dropped_sends,
                    "dropped_receives": dropped_receives,
                }
            )
        )
    return SyntheticLedger(
        path=path,
        messages=messages,
        sent=counts["sent"],
        send_failed=counts["failed"],
        processed=counts["processed"],
        lost=n_lost,
        processed_more_than_once=n_double,
        suppressed_by_region={
            label: int(count) for label, count in zip(regions, suppressed, strict=True) if count
        },
        failover_sends=counts["failover"],
        outage_window=(
            datetime.fromtimestamp(outage_start / _US, UTC),
            datetime.fromtimestamp(outage_end / _US, UTC),
        ),
        receive_rows=counts["rows"],
    )


def write_session_ledger(root: str | Path) -> dict[str, Any]:
    """A small ledger of session copies whose audit figures are known; those figures.

    Two sessions, each with copies handed on out of order by a known distance, a second
    writer on one session (its own order), two gaps, a suppressed copy and a copy without a
    session: the ``sessions`` key of the report both engines must produce.
    """
    from georep import ParquetLedger
    from georep.ports import ReceiveRecord

    def copy(message_id: str, session: str | None, writer: str, seq: int, at: float,
             gap: str | None = None, wait: float = 0.0,
             outcome: str = "processed") -> ReceiveRecord:  # fmt: skip
        return ReceiveRecord(
            message_id, "q", "primary", outcome, 1, at - 1, at - 0.5, at,
            session, writer if session else None, seq if session else None, gap, wait,
        )  # fmt: skip

    records = [
        copy("a1", "A", "w", 1, 10.0),
        copy("a3", "A", "w", 3, 11.0, gap="timeout", wait=2.5),
        copy("a2", "A", "w", 2, 12.0),  # after seq 3: 1 behind
        copy("a4", "A", "w", 4, 13.0)._replace(settled_at=None, finished_at=13.0),
        copy("a4", "A", "w", 4, 13.5, outcome="suppressed"),  # not handled: not counted
        copy("b1", "B", "w", 1, 10.0),
        copy("b5", "B", "w", 5, 11.0, gap="absent", wait=0.25),
        copy("b2", "B", "w", 2, 12.0),  # 3 behind
        copy("b3", "B", "w", 3, 13.0),  # 2 behind
        copy("c1", "B", "v", 1, 14.0),  # another writer: its own order
        copy("plain", None, "", 0, 10.0),
    ]

    async def write() -> None:
        async with ParquetLedger(root) as ledger:
            for record in records:
                ledger.record_receive(record)

    asyncio.run(write())
    return {
        "sessions": 2,
        "messages": 9,
        "out_of_order": 3,
        "out_of_order_by_distance": {"1": 1, "2": 1, "3": 1},
        "max_out_of_order_distance": 3,
        "order_gaps": {"absent": 1, "timeout": 1},
        "order_wait_s": {"total": 2.75, "max": 2.5},
    }
