"""Where the georep source keeps what it planned: one Parquet file per micro-batch.

Service Bus cannot replay: a message received is gone from the broker's order, and a
restarted query that asked for "batch 7 again" would get other messages. So the source
writes batch N's rows to ``batch-N.parquet`` (atomically: a temporary file, fsync,
rename) *before* it reports offset N to Spark, and a batch is read back from that file
however often Spark runs it. ``committed.json`` holds the last batch Spark committed; the
files of committed batches are deleted once their messages are recorded as done.

Layout of ``stagingLocation``::

    committed.json              {"batch": 41}
    batch-000000000042.parquet  planned, not yet committed
    .batch-...parquet.tmp       a write cut short (removed on start)
"""

from __future__ import annotations

__all__ = ["ARROW_SCHEMA", "SOURCE_SCHEMA", "Staging", "read_staged", "staging_path"]

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.parquet as pq

from georep.exceptions import ConfigurationError

SOURCE_SCHEMA = (
    "message_id string, body binary, content_type string, "
    "application_properties map<string,string>, enqueued_time timestamp, region string, "
    "session_id string, dead_letter_reason string"
)
"""The rows the source produces (Spark DDL)."""
ARROW_SCHEMA = pa.schema(
    [
        ("message_id", pa.string()),
        ("body", pa.binary()),
        ("content_type", pa.string()),
        ("application_properties", pa.map_(pa.string(), pa.string())),
        ("enqueued_time", pa.timestamp("us", tz="UTC")),
        ("region", pa.string()),
        ("session_id", pa.string()),
        ("dead_letter_reason", pa.string()),
    ]
)
"""The source's rows as Arrow batches (what Spark expects for :data:`SOURCE_SCHEMA`)."""

_COMMITTED = "committed.json"


def staging_path(location: str) -> Path:
    """``location`` (a path or a ``file:`` URI) as a local path.

    Raises:
        ConfigurationError: Another scheme (the source writes and renames files itself:
            it needs a file system the driver and the executors mount).
    """
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        return Path(parsed.path if parsed.scheme else location).expanduser().resolve()
    raise ConfigurationError(
        f"option 'stagingLocation' must be a local or mounted path, not a {parsed.scheme}: "
        "URI; the source writes and renames files there from the driver and reads them "
        "on the executors (on a cluster: a shared mount, e.g. next to the checkpoint)"
    )


def _batch_file(root: Path, batch: int) -> Path:
    return root / f"batch-{batch:012d}.parquet"


def _fsync_directory(root: Path) -> None:
    descriptor = os.open(root, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _write_atomically(target: Path, write: Any) -> None:
    """Call ``write(temporary_path)``, then make it ``target`` in one rename, durably."""
    temporary = target.with_name(f".{target.name}.tmp")
    write(temporary)
    with open(temporary, "rb+") as handle:
        os.fsync(handle.fileno())
    os.replace(temporary, target)
    _fsync_directory(target.parent)


class Staging:
    """The staged batches of one query (its ``stagingLocation``), used on the driver.

    Args:
        root: The directory; created if missing.
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    def open(self) -> int:
        """Create the directory, drop writes cut short; the last committed batch."""
        self.root.mkdir(parents=True, exist_ok=True)
        for leftover in self.root.glob(".batch-*.tmp"):
            leftover.unlink(missing_ok=True)
        return self.committed()

    def committed(self) -> int:
        """The last batch Spark committed (0: none)."""
        try:
            return int(json.loads((self.root / _COMMITTED).read_text())["batch"])
        except FileNotFoundError:
            return 0

    def set_committed(self, batch: int) -> None:
        """Record, durably, that Spark committed every batch up to ``batch``."""
        body = json.dumps({"batch": batch}).encode()
        _write_atomically(self.root / _COMMITTED, lambda path: path.write_bytes(body))

    def batches(self) -> list[int]:
        """The batches staged and not yet dropped, in order."""
        return sorted(int(path.stem.split("-")[1]) for path in self.root.glob("batch-*.parquet"))

    def path(self, batch: int) -> Path:
        return _batch_file(self.root, batch)

    def has(self, batch: int) -> bool:
        return self.path(batch).exists()

    def write(self, batch: int, table: pa.Table) -> None:
        """Stage ``table`` as ``batch``, durably, before its offset is reported."""
        _write_atomically(self.path(batch), lambda path: pq.write_table(table, path))

    def message_ids(self, batch: int) -> list[str]:
        """The MessageIds staged in ``batch`` (rows without one left out)."""
        column = pq.read_table(self.path(batch), columns=["message_id"]).column(0)
        return [str(value) for value in column.to_pylist() if value is not None]

    def drop_through(self, batch: int) -> None:
        """Delete the files of every batch up to ``batch`` (committed and recorded)."""
        for staged in self.batches():
            if staged <= batch:
                self.path(staged).unlink(missing_ok=True)


def read_staged(path: str, batch: int) -> Iterator[pa.RecordBatch]:
    """Batch ``batch``'s rows from its staged file (on an executor).

    Raises:
        FileNotFoundError: The file is gone (the staging location was lost or is not
            mounted on this executor); the message says which and what to do.
    """
    try:
        table = pq.read_table(path)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"the georep source's staged batch {batch} is missing ({path}): the "
            "stagingLocation must be reachable at the same path from the driver and every "
            "executor, and kept with the checkpoint; without it the batch cannot be read "
            "again identically"
        ) from None
    yield from table.cast(ARROW_SCHEMA).to_batches(max_chunksize=10_000)
