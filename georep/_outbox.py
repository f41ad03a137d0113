"""The embedded durable outbox: one SQLite file, safe to share between processes.

Every entry is committed with ``synchronous=FULL`` before :meth:`SqliteOutbox.put`
returns, because the core acknowledges a message to its caller as "queued" on the strength
of that commit. All SQLite work runs on one dedicated thread, so the event loop never waits
on the disk and the connection is only ever touched by the thread that created it.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Final, TypeVar

from georep.exceptions import ClosedError, ConfigurationError, OutboxFullError
from georep.ports import OutboxEntry

__all__ = ["SqliteOutbox"]

_Result = TypeVar("_Result")

SCHEMA_VERSION: Final = 1
"""Stored in ``PRAGMA user_version``; bump it (and migrate) whenever the schema changes."""

BUSY_TIMEOUT_SECONDS: Final = 5.0
"""How long a statement waits for another process's write lock before failing."""

# The totals row is kept by triggers rather than computed per put: COUNT(*) and
# SUM(length(payload)) would scan the whole table (up to max_bytes of pages) on every put,
# exactly when the outbox is large because a region is down. Triggers also keep it right
# when several processes write the same file.
_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS outbox (
    entry_id INTEGER PRIMARY KEY AUTOINCREMENT,
    channel TEXT NOT NULL,
    region TEXT,
    payload BLOB NOT NULL,
    enqueued_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    not_before REAL NOT NULL,
    leased_until REAL NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS outbox_due ON outbox (channel, not_before, entry_id);
CREATE TABLE IF NOT EXISTS outbox_totals (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    entries INTEGER NOT NULL,
    payload_bytes INTEGER NOT NULL
);
INSERT OR IGNORE INTO outbox_totals (singleton, entries, payload_bytes) VALUES (1, 0, 0);
CREATE TRIGGER IF NOT EXISTS outbox_totals_after_insert AFTER INSERT ON outbox BEGIN
    UPDATE outbox_totals
    SET entries = entries + 1, payload_bytes = payload_bytes + length(NEW.payload)
    WHERE singleton = 1;
END;
CREATE TRIGGER IF NOT EXISTS outbox_totals_after_delete AFTER DELETE ON outbox BEGIN
    UPDATE outbox_totals
    SET entries = entries - 1, payload_bytes = payload_bytes - length(OLD.payload)
    WHERE singleton = 1;
END;
"""

# Errors that mean "this path cannot hold an outbox", as opposed to a transient failure.
_UNUSABLE_FILE_ERRORS: Final = frozenset(
    {sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_CANTOPEN}
)


def check_outbox_bounds(*, max_entries: int, max_bytes: int) -> None:
    """Reject bounds an outbox cannot work with.

    Raises:
        ConfigurationError: ``max_entries`` or ``max_bytes`` is not a positive integer.
    """
    if max_entries <= 0:
        raise ConfigurationError(
            f"max_entries must be a positive number of entries, got {max_entries}; "
            "pass max_entries >= 1 (the default is 100_000)"
        )
    if max_bytes <= 0:
        raise ConfigurationError(
            f"max_bytes must be a positive number of payload bytes, got {max_bytes}; "
            "pass max_bytes >= 1 (the default is 1 GiB)"
        )


def check_claim_arguments(*, limit: int, lease: float) -> None:
    """Reject a claim that could never return anything or would never expire.

    Raises:
        ConfigurationError: ``limit`` is below 1 or ``lease`` is not positive.
    """
    if limit < 1:
        raise ConfigurationError(f"claim limit must be at least 1, got {limit}")
    if lease <= 0:
        raise ConfigurationError(f"claim lease must be positive seconds, got {lease}")


def outbox_full_error(
    *,
    store: str,
    entries: int,
    payload_bytes: int,
    new_entries: int,
    new_bytes: int,
    max_entries: int,
    max_bytes: int,
) -> OutboxFullError:
    """The error for a put that would push ``store`` past a bound (never shows payloads)."""
    return OutboxFullError(
        f"{store} is full: it holds {entries} entries ({payload_bytes} payload bytes) and "
        f"{new_entries} more ({new_bytes} bytes) would exceed max_entries={max_entries} or "
        f"max_bytes={max_bytes}; nothing was stored. Raise max_entries/max_bytes, or restore "
        "a region so the backlog drains"
    )


class SqliteOutbox:
    """A durable :class:`georep.ports.Outbox` in one SQLite file.

    Several instances, in this process or others, may share the file: claims take the
    write lock (``BEGIN IMMEDIATE``), so no two of them lease the same entry. The file is
    opened on first use (or by ``async with``), so constructing one does no I/O.

    A cancelled call may still complete on the worker thread (a thread cannot be
    interrupted), so a cancelled :meth:`put` may have stored its entries.

    Args:
        path: The database file. Its parent directory is created if missing.
        max_entries: Most entries stored at once, across all channels. Default 100_000.
        max_bytes: Most payload bytes stored at once, across all channels. Default 1 GiB.

    Raises:
        ConfigurationError: A bound is not positive. Opening the file (first call or
            ``async with``) raises it when the path is not a SQLite database, cannot be
            opened, or was written by a newer georep.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_entries: int = 100_000,
        max_bytes: int = 1 << 30,
    ) -> None:
        check_outbox_bounds(max_entries=max_entries, max_bytes=max_bytes)
        self._path = Path(path)
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._closed = False
        self._last_known_depth: int | None = None
        # Touched only on the worker thread.
        self._connection: sqlite3.Connection | None = None
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="georep-outbox")

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    @property
    def last_known_depth(self) -> int | None:
        """Total entries as of this instance's last call, or None before the first.

        Cheap and synchronous (for gauges); other processes sharing the file may have
        changed it since.
        """
        return self._last_known_depth

    async def __aenter__(self) -> SqliteOutbox:
        """Open the file now, so a bad path fails here rather than on first use."""
        await self._run(lambda connection: None)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def put(
        self, channel: str, items: Sequence[tuple[str | None, bytes]], *, now: float
    ) -> list[int]:
        """Store ``(region, payload)`` items in one transaction; return their entry ids.

        Args:
            channel: The sender they belong to.
            items: ``(region or None, encoded message)`` pairs, kept in this order.
            now: Wall-clock seconds; the entries' enqueue time and first due time.

        Returns:
            The new entry ids, in the order of ``items``.

        Raises:
            OutboxFullError: Storing them would exceed ``max_entries`` or ``max_bytes``;
                none is stored.
            ClosedError: The outbox was closed.
        """
        rows = [(channel, region, bytes(payload), now, now) for region, payload in items]
        new_bytes = sum(len(row[2]) for row in rows)

        def insert(connection: sqlite3.Connection) -> list[int]:
            with _immediate_transaction(connection):
                entries, payload_bytes = _totals(connection)
                if (
                    entries + len(rows) > self._max_entries
                    or payload_bytes + new_bytes > self._max_bytes
                ):
                    self._last_known_depth = entries
                    raise outbox_full_error(
                        store=f"outbox {self._path}",
                        entries=entries,
                        payload_bytes=payload_bytes,
                        new_entries=len(rows),
                        new_bytes=new_bytes,
                        max_entries=self._max_entries,
                        max_bytes=self._max_bytes,
                    )
                # One INSERT per row: lastrowid is only defined for single-row inserts.
                entry_ids: list[int] = []
                for row in rows:
                    cursor = connection.execute(
                        "INSERT INTO outbox (channel, region, payload, enqueued_at, not_before)"
                        " VALUES (?, ?, ?, ?, ?)",
                        row,
                    )
                    assert cursor.lastrowid is not None
                    entry_ids.append(cursor.lastrowid)
            self._last_known_depth = entries + len(rows)
            return entry_ids

        if not rows:
            self._ensure_open()
            return []
        return await self._run(insert)

    async def claim(
        self, channel: str, *, limit: int, now: float, lease: float
    ) -> list[OutboxEntry]:
        """Lease up to ``limit`` due, unleased entries of ``channel``, oldest first.

        Args:
            channel: Whose entries.
            limit: Most entries returned; at least 1.
            now: Wall-clock seconds; entries due at or before it qualify.
            lease: Seconds the entries stay invisible to other claims; positive.

        Raises:
            ConfigurationError: ``limit`` or ``lease`` is out of range.
            ClosedError: The outbox was closed.
        """
        check_claim_arguments(limit=limit, lease=lease)

        def lease_due_entries(connection: sqlite3.Connection) -> list[OutboxEntry]:
            # IMMEDIATE takes the write lock before reading, so a second process cannot
            # select the same rows between our SELECT and UPDATE.
            with _immediate_transaction(connection):
                rows = connection.execute(
                    "SELECT entry_id, channel, region, payload, enqueued_at, attempts"
                    " FROM outbox WHERE channel = ? AND not_before <= ? AND leased_until <= ?"
                    " ORDER BY entry_id LIMIT ?",
                    (channel, now, now, limit),
                ).fetchall()
                connection.executemany(
                    "UPDATE outbox SET leased_until = ? WHERE entry_id = ?",
                    [(now + lease, row[0]) for row in rows],
                )
            return [
                OutboxEntry(
                    entry_id=entry_id,
                    channel=entry_channel,
                    region=region,
                    payload=bytes(payload),
                    enqueued_at=enqueued_at,
                    attempts=attempts,
                )
                for entry_id, entry_channel, region, payload, enqueued_at, attempts in rows
            ]

        return await self._run(lease_due_entries)

    async def delete(self, entry_ids: Sequence[int]) -> None:
        """Remove delivered entries; ids no longer stored are ignored.

        Raises:
            ClosedError: The outbox was closed.
        """
        ids = [(entry_id,) for entry_id in entry_ids]

        def remove(connection: sqlite3.Connection) -> None:
            with _immediate_transaction(connection):
                connection.executemany("DELETE FROM outbox WHERE entry_id = ?", ids)
                self._last_known_depth = _totals(connection)[0]

        if not ids:
            self._ensure_open()
            return
        await self._run(remove)

    async def retry_later(self, entry_ids: Sequence[int], *, not_before: float) -> None:
        """Count a failed attempt, drop the lease, and make them due again at ``not_before``.

        Args:
            entry_ids: Entries whose delivery failed; ids no longer stored are ignored.
            not_before: Wall-clock seconds before which no claim returns them.

        Raises:
            ClosedError: The outbox was closed.
        """
        rows = [(not_before, entry_id) for entry_id in entry_ids]

        def reschedule(connection: sqlite3.Connection) -> None:
            with _immediate_transaction(connection):
                connection.executemany(
                    "UPDATE outbox SET attempts = attempts + 1, leased_until = 0,"
                    " not_before = ? WHERE entry_id = ?",
                    rows,
                )

        if not rows:
            self._ensure_open()
            return
        await self._run(reschedule)

    async def depth(self, channel: str | None = None) -> int:
        """Entries stored for ``channel``, or in total (leased ones included).

        Raises:
            ClosedError: The outbox was closed.
        """

        def count(connection: sqlite3.Connection) -> int:
            if channel is None:
                total = _totals(connection)[0]
                self._last_known_depth = total
                return total
            row = connection.execute(
                "SELECT COUNT(*) FROM outbox WHERE channel = ?", (channel,)
            ).fetchone()
            return int(row[0])

        return await self._run(count)

    async def aclose(self) -> None:
        """Close the connection and stop the worker thread; idempotent.

        The close is shielded: cancelling the caller does not leave the file open.
        """
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        try:
            await asyncio.shield(loop.run_in_executor(self._worker, self._close_on_worker))
        finally:
            # Work already queued (including the close) still runs; nothing new is accepted.
            self._worker.shutdown(wait=False)

    def _ensure_open(self) -> None:
        if self._closed:
            raise ClosedError(f"outbox {self._path} is closed; create a new SqliteOutbox")

    async def _run(self, operation: Callable[[sqlite3.Connection], _Result]) -> _Result:
        self._ensure_open()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._worker, self._run_on_worker, operation)

    def _run_on_worker(self, operation: Callable[[sqlite3.Connection], _Result]) -> _Result:
        if self._connection is None:
            self._connection = _open(self._path)
        return operation(self._connection)

    def _close_on_worker(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def _open(path: Path) -> sqlite3.Connection:
    """Open (creating if needed) the outbox at ``path`` and check its schema version."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigurationError(
            f"cannot create the outbox directory {path.parent} ({error.strerror}); "
            "pass a path in a writable directory"
        ) from error
    try:
        # Autocommit mode (isolation_level=None): transactions are explicit, so claims can
        # use BEGIN IMMEDIATE rather than the module's implicit deferred BEGIN.
        connection = sqlite3.connect(path, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None)
    except sqlite3.Error as error:
        raise _unusable_file_error(path, error) from error
    try:
        _prepare(connection, path)
    except sqlite3.Error as error:
        connection.close()
        if getattr(error, "sqlite_errorcode", None) in _UNUSABLE_FILE_ERRORS:
            raise _unusable_file_error(path, error) from error
        raise
    except BaseException:
        connection.close()
        raise
    return connection


def _prepare(connection: sqlite3.Connection, path: Path) -> None:
    _check_schema_version(connection, path)
    # WAL lets readers and one writer proceed together across processes; FULL syncs the
    # log on every commit, which is what makes put's acknowledgement durable.
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=FULL")
    with _immediate_transaction(connection):
        # Re-read under the write lock: another process may have created the schema.
        if _check_schema_version(connection, path) == 0:
            for statement in _schema_statements():
                connection.execute(statement)
            connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _schema_statements() -> list[str]:
    # executescript() would COMMIT our open transaction first, so run statements one by one.
    statements: list[str] = []
    pending = ""
    for line in _SCHEMA.strip().splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            statements.append(pending.strip())
            pending = ""
    return statements


def _check_schema_version(connection: sqlite3.Connection, path: Path) -> int:
    version = int(connection.execute("PRAGMA user_version").fetchone()[0])
    if version > SCHEMA_VERSION:
        # Imported here: georep/__init__.py re-exports this module, possibly before it
        # defines __version__.
        from georep import __version__

        raise ConfigurationError(
            f"outbox file {path} has schema version {version}, which georep {__version__} "
            f"does not know (it reads version {SCHEMA_VERSION}): a newer georep wrote it. "
            "Upgrade georep, or point SqliteOutbox at another file"
        )
    return version


def _unusable_file_error(path: Path, error: sqlite3.Error) -> ConfigurationError:
    # The SQLite message ("file is not a database", ...) never contains row data.
    return ConfigurationError(
        f"cannot use {path} as an outbox: {error}; pass the path of a georep outbox file, "
        "or of a file that does not exist yet"
    )


def _totals(connection: sqlite3.Connection) -> tuple[int, int]:
    entries, payload_bytes = connection.execute(
        "SELECT entries, payload_bytes FROM outbox_totals WHERE singleton = 1"
    ).fetchone()
    return int(entries), int(payload_bytes)


@contextmanager
def _immediate_transaction(connection: sqlite3.Connection) -> Iterator[None]:
    connection.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        # SQLite rolls back by itself after some errors (disk full, ...); a second
        # ROLLBACK would then fail and hide the original error.
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")
