"""ParquetLedger: the delivery ledger written as rolling Parquet files (SPEC §6).

The format (columns, value sets, layout) is fixed in :mod:`georep.ledger.schema`; this
module buffers records and writes them.

How it stays off the hot path:

- ``record_send``/``record_receive`` append one tuple to a list: no I/O, no pyarrow, no
  lock, no await. A send of N messages is one record, expanded to N rows by the writer.
- The buffer is bounded (``max_buffer_rows``). When it is full, new rows are dropped and
  counted, never waited for; the counts go to ``meta/<writer>.json`` and a warning is
  logged once.
- A flusher task wakes every ``flush_interval`` seconds, or as soon as ``flush_rows`` rows
  are buffered, swaps the buffer for an empty one and hands the old one to a worker thread
  (``asyncio.to_thread``), which builds the Arrow tables and writes the files. One write
  runs at a time; rows recorded meanwhile go to the new buffer.
- Each flush writes a new file per dataset (``sends``, ``receives``), under a hidden
  temporary name first, then renamed: readers globbing ``*.parquet`` never see half a file.
"""

from __future__ import annotations

__all__ = ["ParquetLedger", "receive_rows", "schema_tables", "send_rows"]

import asyncio
import contextlib
import importlib.util
import itertools
import json
import logging
import os
import re
import socket
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from georep._clock import SystemClock
from georep._lifecycle import AsyncResource
from georep._policy import Seconds, positive_seconds
from georep._private_files import make_private_directory, open_private_for_writing
from georep.exceptions import ConfigurationError
from georep.ledger.schema import (
    ORDER_GAPS,
    RECEIVE_COLUMNS,
    RECEIVE_OUTCOMES,
    RECEIVES_DIR,
    REGION_OUTCOMES,
    SCHEMA_VERSION,
    SEND_COLUMNS,
    SEND_MODES,
    SEND_OUTCOMES,
    SENDS_DIR,
    receive_schema,
    send_schema,
)
from georep.ports import Clock, ReceiveRecord, SendRecord

if TYPE_CHECKING:
    import pyarrow as pa

_log = logging.getLogger("georep.ledger")

META_DIR = "meta"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _micros(seconds: float | None) -> int | None:
    """Wall-clock seconds → integer microseconds (the files' resolution)."""
    return None if seconds is None else round(seconds * 1_000_000)


def _utc(seconds: float | None) -> datetime | None:
    micros = _micros(seconds)
    return None if micros is None else _EPOCH + timedelta(microseconds=micros)


def send_rows(record: SendRecord, *, process_id: int, host: str) -> list[dict[str, Any]]:
    """The rows one send record becomes, as ``sends`` files hold them (one per message id).

    Values are what pyarrow reads back: timestamps as UTC datetimes, ``regions`` as dicts.
    """
    regions = [{"region": a.region, "outcome": a.outcome, "error": a.error} for a in record.regions]
    return [
        {
            "schema_version": SCHEMA_VERSION,
            "message_id": message_id,
            "entity": record.entity,
            "mode": record.mode,
            "outcome": record.outcome,
            "accepted_region": record.accepted_region,
            "failover": record.failover,
            "regions": [dict(region) for region in regions],
            "started_at": _utc(record.started_at),
            "finished_at": _utc(record.finished_at),
            "process_id": process_id,
            "host": host,
        }
        for message_id in record.message_ids
    ]


def receive_rows(record: ReceiveRecord, *, process_id: int, host: str) -> list[dict[str, Any]]:
    """The row one received copy becomes, as ``receives`` files hold it."""
    return [
        {
            "schema_version": SCHEMA_VERSION,
            "message_id": record.message_id,
            "entity": record.entity,
            "region": record.region,
            "outcome": record.outcome,
            "delivery_count": record.delivery_count,
            "enqueued_at": _utc(record.enqueued_at),
            "received_at": _utc(record.received_at),
            "settled_at": _utc(record.settled_at),
            "process_id": process_id,
            "host": host,
            "session_id": record.session_id,
            "order_writer": record.order_writer,
            "order_seq": record.order_seq,
            "order_gap": record.order_gap,
            "order_wait": record.order_wait if record.session_id is not None else None,
            "finished_at": _utc(record.finished_at),
        }
    ]


def schema_tables() -> str:
    """The Markdown tables of both datasets' columns and value sets, as ``docs/ledger.md``
    shows them.

    Regenerate the docs' tables with
    ``python -c "from georep.ledger.parquet import schema_tables; print(schema_tables())"``.
    """
    parts = []
    for dataset, columns in ((SENDS_DIR, SEND_COLUMNS), (RECEIVES_DIR, RECEIVE_COLUMNS)):
        lines = [f"`{dataset}/*.parquet`", "", "| column | type | meaning |", "|---|---|---|"]
        lines += [f"| `{name}` | `{kind}` | {meaning} |" for name, kind, meaning in columns]
        parts.append("\n".join(lines))
    value_sets = [
        ("SEND_MODES", "sends.mode", SEND_MODES),
        ("SEND_OUTCOMES", "sends.outcome", SEND_OUTCOMES),
        ("REGION_OUTCOMES", "sends.regions[].outcome", REGION_OUTCOMES),
        ("RECEIVE_OUTCOMES", "receives.outcome", RECEIVE_OUTCOMES),
        ("ORDER_GAPS", "receives.order_gap", ORDER_GAPS),
    ]
    lines = ["| value set | column | values |", "|---|---|---|"]
    lines += [
        f"| `{name}` | `{column}` | {', '.join(f'`{v}`' for v in values)} |"
        for name, column, values in value_sets
    ]
    parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def _send_table(records: Sequence[SendRecord], process_id: int, host: str) -> pa.Table:
    import pyarrow as pa

    schema = send_schema()
    # One entry per row: a record of N messages repeats N times.
    rows = [record for record in records for _ in record.message_ids]
    count = len(rows)
    timestamp = schema.field("started_at").type
    columns = [
        pa.array([SCHEMA_VERSION] * count, pa.int16()),
        pa.array([m for record in records for m in record.message_ids], pa.string()),
        pa.array([r.entity for r in rows], pa.string()),
        pa.array([r.mode for r in rows], pa.string()),
        pa.array([r.outcome for r in rows], pa.string()),
        pa.array([r.accepted_region for r in rows], pa.string()),
        pa.array([r.failover for r in rows], pa.bool_()),
        # RegionAttempt is a tuple in field order: pyarrow takes it as the struct as is.
        pa.array([r.regions for r in rows], schema.field("regions").type),
        pa.array([_micros(r.started_at) for r in rows], timestamp),
        pa.array([_micros(r.finished_at) for r in rows], timestamp),
        pa.array([process_id] * count, pa.int32()),
        pa.array([host] * count, pa.string()),
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def _receive_table(records: Sequence[ReceiveRecord], process_id: int, host: str) -> pa.Table:
    import pyarrow as pa

    schema = receive_schema()
    count = len(records)
    timestamp = schema.field("received_at").type
    columns = [
        pa.array([SCHEMA_VERSION] * count, pa.int16()),
        pa.array([r.message_id for r in records], pa.string()),
        pa.array([r.entity for r in records], pa.string()),
        pa.array([r.region for r in records], pa.string()),
        pa.array([r.outcome for r in records], pa.string()),
        pa.array([r.delivery_count for r in records], pa.int32()),
        pa.array([_micros(r.enqueued_at) for r in records], timestamp),
        pa.array([_micros(r.received_at) for r in records], timestamp),
        pa.array([_micros(r.settled_at) for r in records], timestamp),
        pa.array([process_id] * count, pa.int32()),
        pa.array([host] * count, pa.string()),
        pa.array([r.session_id for r in records], pa.string()),
        pa.array([r.order_writer for r in records], pa.string()),
        pa.array([r.order_seq for r in records], pa.int64()),
        pa.array([r.order_gap for r in records], pa.string()),
        pa.array(
            [r.order_wait if r.session_id is not None else None for r in records], pa.float64()
        ),
        pa.array([_micros(r.finished_at) for r in records], timestamp),
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def _positive_int(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{name} must be a whole number of rows >= 1, got {value!r}")
    return value


class ParquetLedger(AsyncResource):
    """Record every send and received copy in Parquet files under ``directory``.

    Layout (format version :data:`georep.ledger.schema.SCHEMA_VERSION`, see
    ``docs/ledger.md``)::

        directory/sends/part-<host>-<pid>-<start>-<seq>.parquet
        directory/receives/part-<host>-<pid>-<start>-<seq>.parquet
        directory/meta/<host>-<pid>-<start>.json   {"schema_version", "dropped_sends", ...}

    Give it to :class:`georep.GeoSender`, :class:`georep.GeoReceiver` or
    ``@georep.receiver`` as ``ledger=``; they flush it when they close, the caller closes
    it. Several senders and receivers (and processes) can share a directory: every writer
    has its own file names. One ParquetLedger serves one event loop; call ``record_*`` on
    that loop's thread (georep's senders and receivers do).

    Args:
        directory: The ledger directory (created if missing).
        max_buffer_rows: Rows held in memory, at most, waiting for the writer. Beyond it new
            rows are dropped and counted (never waited for). Default 100,000.
        flush_rows: Buffered rows that start a flush at once. Default 10,000.
        flush_interval: Seconds (or ``timedelta``) between flushes when fewer rows come in.
            Default 5 s. Each flush with rows writes new files (rolling files).
        clock: Time source for the flush interval (tests inject ``FakeClock``).

    Raises:
        ConfigurationError: A setting is out of range, or ``directory`` is a file.
        ImportError: pyarrow is not installed (``pip install 'georep[ledger]'``).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_buffer_rows: int = 100_000,
        flush_rows: int = 10_000,
        flush_interval: Seconds = 5.0,
        clock: Clock | None = None,
    ) -> None:
        if importlib.util.find_spec("pyarrow") is None:
            raise ImportError("ParquetLedger writes Parquet: pip install 'georep[ledger]'")
        self.max_buffer_rows = _positive_int(max_buffer_rows, "max_buffer_rows")
        self.flush_rows = _positive_int(flush_rows, "flush_rows")
        if self.flush_rows > self.max_buffer_rows:
            raise ConfigurationError(
                f"flush_rows={flush_rows} exceeds max_buffer_rows={max_buffer_rows}: the buffer "
                "would drop rows before a flush starts; lower flush_rows"
            )
        self.flush_interval = positive_seconds(flush_interval, "flush_interval")
        self.directory = Path(directory)
        if self.directory.exists() and not self.directory.is_dir():
            raise ConfigurationError(
                f"ledger directory {str(self.directory)!r} is a file: give a directory path"
            )
        self._clock: Clock = clock or SystemClock()
        self.process_id = os.getpid()
        self.host = socket.gethostname()
        started = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        # File names must stay file names whatever the host is called.
        self.writer_id = f"{re.sub(r'[^A-Za-z0-9_.-]', '_', self.host)}-{self.process_id}-{started}"
        self._sends: list[SendRecord] = []
        self._receives: list[ReceiveRecord] = []
        self._buffered = 0
        # Rows refused by a full buffer (counted on the loop's thread) and rows whose write
        # failed (counted in the writer thread): separate counters, so neither thread
        # ever updates a number the other one is updating.
        self._refused = [0, 0]  # sends, receives
        self._unwritten = [0, 0]
        self.files_written = 0
        self._sequence = itertools.count()
        self._warned = False
        self._wake = asyncio.Event()
        self._write_lock = asyncio.Lock()
        self._flusher: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ recording

    def record_send(self, record: SendRecord) -> None:
        """Buffer one send call (one row per message id); drop and count when full."""
        rows = len(record.message_ids)
        if self._closed or self._buffered + rows > self.max_buffer_rows:
            self._refused[0] += rows
            self._dropped()
            return
        self._sends.append(record)
        self._buffered += rows
        if self._buffered >= self.flush_rows or self._flusher is None:
            self._wake_flusher()

    def record_receive(self, record: ReceiveRecord) -> None:
        """Buffer one received copy; drop and count when full."""
        if self._closed or self._buffered >= self.max_buffer_rows:
            self._refused[1] += 1
            self._dropped()
            return
        self._receives.append(record)
        self._buffered += 1
        if self._buffered >= self.flush_rows or self._flusher is None:
            self._wake_flusher()

    @property
    def dropped_sends(self) -> int:
        """Send rows lost so far: refused by a full buffer, or whose write failed."""
        return self._refused[0] + self._unwritten[0]

    @property
    def dropped_receives(self) -> int:
        """Receive rows lost so far: refused by a full buffer, or whose write failed."""
        return self._refused[1] + self._unwritten[1]

    @property
    def buffered_rows(self) -> int:
        """Rows waiting for the next flush."""
        return self._buffered

    def _dropped(self) -> None:
        if not self._warned:
            self._warned = True
            reason = "it is closed" if self._closed else f"{self.max_buffer_rows} rows are waiting"
            _log.warning(
                "ledger %s is dropping rows (%s); they are counted in %s",
                self.directory,
                reason,
                self._meta_path(),
            )

    def _wake_flusher(self) -> None:
        if self._flusher is None:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                return  # no event loop (yet): flush() or aclose() writes what is buffered
            self._flusher = asyncio.create_task(self._flush_periodically(), name="georep-ledger")
        if self._buffered >= self.flush_rows:
            self._wake.set()

    # -------------------------------------------------------------------- writing

    async def _flush_periodically(self) -> None:
        while not self._closed:
            with contextlib.suppress(TimeoutError), self._clock.deadline(self.flush_interval):
                await self._wake.wait()
            self._wake.clear()
            try:
                await self.flush()
            except Exception:  # e.g. the default executor is gone at interpreter exit
                _log.exception("ledger: flush failed; retrying in %g s", self.flush_interval)

    async def flush(self) -> None:
        """Write every buffered row now (in a worker thread), then the meta file.

        Never raises for a failed write: the rows are counted as dropped and the error is
        logged, as a full buffer would be.
        """
        async with self._write_lock:
            sends, self._sends = self._sends, []
            receives, self._receives = self._receives, []
            self._buffered = 0
            # Shielded: a cancelled caller must not leave the swapped-out rows unwritten.
            await asyncio.shield(asyncio.to_thread(self._write, sends, receives))

    def _write(self, sends: list[SendRecord], receives: list[ReceiveRecord]) -> None:
        """Runs in a worker thread."""
        if sends:
            rows = sum(len(record.message_ids) for record in sends)
            if not self._write_dataset(SENDS_DIR, rows, _send_table, sends):
                self._unwritten[0] += rows
        if receives and not self._write_dataset(
            RECEIVES_DIR, len(receives), _receive_table, receives
        ):
            self._unwritten[1] += len(receives)
        try:
            self._write_meta()
        except OSError:
            _log.exception("ledger: writing %s failed", self._meta_path())

    def _write_dataset(
        self,
        dataset: str,
        rows: int,
        build: Callable[[Any, int, str], pa.Table],
        records: Sequence[Any],
    ) -> bool:
        try:
            self._write_file(dataset, build(records, self.process_id, self.host))
        except Exception:
            _log.exception("ledger: writing %d %s rows failed; counted as dropped", rows, dataset)
            return False
        return True

    def _write_file(self, dataset: str, table: pa.Table) -> None:
        import pyarrow.parquet as pq

        folder = self.directory / dataset
        make_private_directory(folder)
        name = f"part-{self.writer_id}-{next(self._sequence):06d}.parquet"
        # Hidden and not *.parquet until complete: Spark and pyarrow skip dot files.
        temporary = folder / f".{name}.tmp"
        # Message ids and timings: the owner's only. pyarrow truncates the empty 0600 file
        # made here and keeps its mode, whatever the umask.
        os.close(open_private_for_writing(temporary))
        pq.write_table(table, temporary)
        os.replace(temporary, folder / name)
        self.files_written += 1

    def _meta_path(self) -> Path:
        return self.directory / META_DIR / f"{self.writer_id}.json"

    def _write_meta(self) -> None:
        path = self._meta_path()
        make_private_directory(path.parent)
        # Per thread: a write left running by a cancelled flush may overlap the next one.
        temporary = path.with_name(f".{path.name}.{threading.get_ident()}.tmp")
        meta = {
            "schema_version": SCHEMA_VERSION,
            "dropped_sends": self.dropped_sends,
            "dropped_receives": self.dropped_receives,
        }
        with os.fdopen(open_private_for_writing(temporary), "w", encoding="utf-8") as file:
            file.write(json.dumps(meta))
        os.replace(temporary, path)

    # ------------------------------------------------------------------ lifecycle

    async def aclose(self) -> None:
        """Flush what is buffered, write the meta file and stop. Idempotent.

        Rows recorded after this are dropped and counted (in memory only).
        """
        await super().aclose()

    async def _close(self) -> None:
        flusher = self._flusher
        if flusher is not None:
            self._wake.set()  # it finishes its flush and sees _closing
            with contextlib.suppress(Exception):
                await flusher
        await self.flush()
