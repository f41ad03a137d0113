"""The embedded durable outbox: one SQLite file, safe to share between processes.

Every entry is committed with ``synchronous=FULL`` before :meth:`SqliteOutbox.put`
returns, because the core acknowledges a message to its caller as "queued" on the strength
of that commit. All SQLite work runs on one dedicated thread, so the event loop never waits
on the disk and the connection is only ever touched by the thread that created it.
"""

from __future__ import annotations

__all__ = ["OutboxRecord", "SqliteOutbox", "check_existing_outbox"]

import asyncio
import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Final, TypeVar

from georep._lifecycle import AsyncResource
from georep._private_files import create_private_file, make_private_directory, warn_if_shared
from georep.exceptions import (
    ClosedError,
    ConfigurationError,
    OutboxFullError,
    OutboxUnavailableError,
)
from georep.outbox import sql as sql
from georep.ports import OutboxEntry, OutboxItems, OutboxSessions

_Result = TypeVar("_Result")
_log = logging.getLogger("georep.outbox")

SCHEMA_VERSION: Final = 3
"""Stored in ``PRAGMA user_version``; bump it (and migrate) whenever the schema changes.

Version 2 added ``outbox.leased_by`` (the claiming drainer) and the ``outbox_dead`` table;
version 3 the entries' ``session_id`` (a session's entries are claimed in order).
"""

BUSY_TIMEOUT_SECONDS: Final = 5.0
"""How long a statement waits for another process's write lock before failing."""

DISK_HEADROOM_MIN_BYTES: Final = 16 << 20
DISK_HEADROOM_MAX_BYTES: Final = 256 << 20
"""A put is refused when it would leave less than 5% of the disk free (at least 16 MiB, at
most 256 MiB): the write-ahead log grows up to ~4 MiB before it is folded into the
database, and claims and deletes need room in it too; without it a full disk would stop
the drain, not just new puts."""

# Errors that mean "this path cannot hold an outbox", as opposed to a transient failure.
_UNUSABLE_FILE_ERRORS: Final = frozenset(
    {sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_CANTOPEN}
)
# Another connection holds a lock: worth retrying (primary result codes).
_BUSY_ERRORS: Final = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})


@dataclass(frozen=True, slots=True)
class OutboxRecord:
    """One stored entry as :meth:`SqliteOutbox.records` lists it (no payload).

    Attributes:
        entry_id: The entry's id (kept when it is dead-lettered and replayed).
        state: ``"queued"`` or ``"dead"`` (dead-lettered).
        channel: The sender it belongs to (namespace pair and entity).
        region: Its target namespace, or None for whichever region accepts it.
        size: Payload bytes.
        enqueued_at: Wall-clock seconds when it was first stored.
        attempts: Failed delivery attempts.
        reason: Why it was dead-lettered (error class and kind); None while queued.
        dead_at: Wall-clock seconds when it was dead-lettered; None while queued.
    """

    entry_id: int
    state: str
    channel: str
    region: str | None
    size: int
    enqueued_at: float
    attempts: int
    reason: str | None = None
    dead_at: float | None = None


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


def item_sessions(
    items: Sequence[object], sessions: Sequence[str | None] | None
) -> list[str | None]:
    """One session id per put item (None for each when ``sessions`` is not given).

    Raises:
        ConfigurationError: ``sessions`` does not have one id per item.
    """
    if sessions is None:
        return [None] * len(items)
    if len(sessions) != len(items):
        raise ConfigurationError(
            f"put got {len(items)} items and {len(sessions)} session ids: pass one session "
            "id (or None) per item"
        )
    return list(sessions)


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


class SqliteOutbox(AsyncResource):
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

    async def _open(self) -> None:
        """Open the file now, so a bad path fails here rather than on first use."""
        await self._run(lambda connection: None)

    async def put(
        self, channel: str, items: OutboxItems, *, now: float, sessions: OutboxSessions = None
    ) -> list[int]:
        """Store ``(region, payload)`` items in one transaction; return their entry ids.

        Args:
            channel: The sender they belong to.
            items: ``(region or None, encoded message)`` pairs, kept in this order.
            now: Wall-clock seconds; the entries' enqueue time and first due time.
            sessions: Each item's session id (None: not in a session); default none.

        Returns:
            The new entry ids, in the order of ``items``.

        Raises:
            OutboxFullError: Storing them would exceed ``max_entries`` or ``max_bytes``,
                or the disk is full; none is stored.
            ClosedError: The outbox was closed.
            OutboxUnavailableError: The file could not be used just now (locked by another
                process past the busy timeout, I/O error); none is stored.
        """
        session_ids = item_sessions(items, sessions)
        rows = [
            (channel, region, bytes(payload), now, now, session)
            for (region, payload), session in zip(items, session_ids, strict=True)
        ]
        new_bytes = sum(len(row[2]) for row in rows)

        def insert(connection: sqlite3.Connection) -> list[int]:
            self._check_disk(new_bytes)
            entry_ids, self._last_known_depth = sql.insert(connection, rows, self._check_room)
            return entry_ids

        if not rows:
            self._check_open()
            return []
        # A put refused for lack of disk is not retried: the headroom is the drain's.
        return await self._run(insert, retry_when_full=False)

    async def claim(
        self, channel: str, *, limit: int, now: float, lease: float, owner: str | None = None
    ) -> list[OutboxEntry]:
        """Lease up to ``limit`` due, unleased entries of ``channel``, oldest first.

        Args:
            channel: Whose entries.
            limit: Most entries returned; at least 1.
            now: Wall-clock seconds; entries due at or before it qualify.
            lease: Seconds the entries stay invisible to other claims; positive.
            owner: Who holds the lease (for :meth:`renew`, :meth:`release`).

        Raises:
            ConfigurationError: ``limit`` or ``lease`` is out of range.
            ClosedError: The outbox was closed.
            OutboxUnavailableError: The file could not be used just now.
        """
        check_claim_arguments(limit=limit, lease=lease)
        return await self._run(
            partial(sql.lease_due, channel=channel, limit=limit, now=now, lease=lease, owner=owner)
        )

    async def held_sessions(
        self, channel: str, session_ids: Sequence[str] | None = None
    ) -> set[str]:
        """The sessions of ``channel`` with an entry still queued (dead letters not counted),
        among ``session_ids`` (None: every session).

        Raises:
            ClosedError: The outbox was closed.
            OutboxUnavailableError: The file could not be used just now.
        """
        ids = None if session_ids is None else list(session_ids)
        if ids == []:
            self._check_open()
            return set()
        return await self._run(partial(sql.held_sessions, channel=channel, session_ids=ids))

    async def renew(
        self, entry_ids: Sequence[int], *, owner: str, now: float, lease: float
    ) -> list[int]:
        """Extend ``owner``'s leases on ``entry_ids`` to ``now + lease``.

        Returns:
            The ids ``owner`` still holds (another drainer took the others over after
            their lease ran out, or they are gone), in the order given.

        Raises:
            ClosedError: The outbox was closed.
            OutboxUnavailableError: The file could not be used just now.
        """
        ids = list(entry_ids)
        if not ids:
            self._check_open()
            return []
        return await self._run(
            partial(sql.extend_leases, entry_ids=ids, owner=owner, until=now + lease)
        )

    async def release(self, entry_ids: Sequence[int], *, owner: str | None = None) -> None:
        """Hand leased entries back unsent: due at once, no attempt counted.

        With ``owner``, only entries it still holds are released.

        Raises:
            ClosedError: The outbox was closed.
            OutboxUnavailableError: The file could not be used just now.
        """
        await self._unlease(entry_ids, owner=owner, attempts=0, not_before=None)

    async def delete(self, entry_ids: Sequence[int]) -> None:
        """Remove delivered entries; ids no longer stored are ignored.

        Raises:
            ClosedError: The outbox was closed.
            OutboxUnavailableError: The file could not be used just now.
        """
        ids = list(entry_ids)

        def remove(connection: sqlite3.Connection) -> None:
            self._last_known_depth = sql.delete(connection, ids)

        if not ids:
            self._check_open()
            return
        await self._run(remove)

    async def retry_later(
        self, entry_ids: Sequence[int], *, not_before: float, owner: str | None = None
    ) -> None:
        """Count a failed attempt, drop the lease, and make them due again at ``not_before``.

        Args:
            entry_ids: Entries whose delivery failed; ids no longer stored are ignored.
            not_before: Wall-clock seconds before which no claim returns them.
            owner: When given, only entries this owner still holds are changed.

        Raises:
            ClosedError: The outbox was closed.
            OutboxUnavailableError: The file could not be used just now.
        """
        await self._unlease(entry_ids, owner=owner, attempts=1, not_before=not_before)

    async def _unlease(
        self,
        entry_ids: Sequence[int],
        *,
        owner: str | None,
        attempts: int,
        not_before: float | None,
    ) -> None:
        ids = list(entry_ids)
        if not ids:
            self._check_open()
            return
        await self._run(
            partial(
                sql.unlease, entry_ids=ids, owner=owner, attempts=attempts, not_before=not_before
            )
        )

    async def dead_letter(self, entries: Sequence[tuple[int, str]], *, now: float) -> None:
        """Move ``(entry_id, reason)`` entries from the queue to the dead-letter table.

        They stop counting against the bounds and stay in the file until
        :meth:`replay` or :meth:`purge` (``georep outbox replay|purge``). Ids no longer
        queued are ignored.

        Raises:
            ClosedError: The outbox was closed.
            OutboxUnavailableError: The file could not be used just now.
        """
        rows = list(entries)

        def move(connection: sqlite3.Connection) -> None:
            self._last_known_depth = sql.bury(connection, rows, now)

        if not rows:
            self._check_open()
            return
        await self._run(move)

    async def records(self, *, dead: bool, limit: int = 1000) -> list[OutboxRecord]:
        """Stored entries without their payloads, oldest first (for ``georep outbox list``).

        Args:
            dead: List dead-lettered entries instead of queued ones.
            limit: Most rows returned.

        Raises:
            ClosedError: The outbox was closed.
            OutboxUnavailableError: The file could not be used just now.
        """
        rows = await self._run(partial(sql.records, dead=dead, limit=limit))
        return [OutboxRecord(*row) for row in rows]  # type: ignore[arg-type]

    async def dead_depth(self) -> int:
        """Dead-lettered entries in the file.

        Raises:
            ClosedError: The outbox was closed.
            OutboxUnavailableError: The file could not be used just now.
        """
        return await self._run(sql.dead_count)

    async def replay(self, entry_ids: Sequence[int] | None = None, *, now: float) -> int:
        """Move dead-lettered entries (all, or ``entry_ids``) back to the queue, due at once.

        They keep their id (so their place in the order) and their enqueue time (so a
        message whose time-to-live ran out is dropped as expired, not delivered late);
        their attempts restart from 0.

        Returns:
            How many entries were moved back.

        Raises:
            OutboxFullError: The queue has no room for them; none is moved.
            ClosedError: The outbox was closed.
            OutboxUnavailableError: The file could not be used just now.
        """

        def move_back(connection: sqlite3.Connection) -> int:
            moved, self._last_known_depth = sql.revive(
                connection, entry_ids, now=now, check_room=self._check_room
            )
            return moved

        return await self._run(move_back)

    async def purge(self, entry_ids: Sequence[int] | None = None) -> int:
        """Delete dead-lettered entries (all, or ``entry_ids``) for good.

        Returns:
            How many were deleted.

        Raises:
            ClosedError: The outbox was closed.
            OutboxUnavailableError: The file could not be used just now.
        """
        return await self._run(partial(sql.purge, entry_ids=entry_ids))

    def _check_disk(self, new_bytes: int) -> None:
        """Refuse a put that would eat into the room the drain needs (see DISK_HEADROOM_*)."""
        try:
            disk = os.statvfs(self._path.parent)
        except OSError:  # pragma: no cover - not every platform has statvfs
            return
        free = disk.f_bavail * disk.f_frsize
        total = disk.f_blocks * disk.f_frsize
        headroom = min(max(DISK_HEADROOM_MIN_BYTES, total // 20), DISK_HEADROOM_MAX_BYTES)
        # The log and then the database each hold a copy of new pages.
        if free - 2 * new_bytes < headroom:
            raise OutboxFullError(
                f"outbox {self._path}: the disk is full for new entries: {free} bytes free, "
                f"and georep keeps {headroom} free so that the entries already stored can "
                "still be drained; this call stored nothing. Free space on that disk or move "
                "the outbox to a larger one"
            )

    def _check_room(self, connection: sqlite3.Connection, new_entries: int, new_bytes: int) -> None:
        entries, payload_bytes = sql.totals(connection)
        if entries + new_entries > self._max_entries or payload_bytes + new_bytes > self._max_bytes:
            self._last_known_depth = entries
            raise outbox_full_error(
                store=f"outbox {self._path}",
                entries=entries,
                payload_bytes=payload_bytes,
                new_entries=new_entries,
                new_bytes=new_bytes,
                max_entries=self._max_entries,
                max_bytes=self._max_bytes,
            )

    async def depth(self, channel: str | None = None) -> int:
        """Entries stored for ``channel``, or in total (leased ones included).

        Raises:
            ClosedError: The outbox was closed.
        """

        def count(connection: sqlite3.Connection) -> int:
            if channel is not None:
                return sql.count(connection, channel)
            self._last_known_depth = sql.totals(connection)[0]
            return self._last_known_depth

        return await self._run(count)

    async def aclose(self) -> None:
        """Close the connection and stop the worker thread; idempotent.

        The close is shielded: cancelling the caller does not leave the file open.
        """
        await super().aclose()

    async def _close(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            await asyncio.shield(loop.run_in_executor(self._worker, self._close_on_worker))
        finally:
            # Work already queued (including the close) still runs; nothing new is accepted.
            self._worker.shutdown(wait=False)

    def _check_open(self) -> None:
        self._check_process()
        if self._closed:
            raise ClosedError(f"outbox {self._path} is closed; create a new SqliteOutbox")

    async def _run(
        self, operation: Callable[[sqlite3.Connection], _Result], *, retry_when_full: bool = True
    ) -> _Result:
        self._check_open()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._worker, self._run_on_worker, operation, retry_when_full
        )

    def _run_on_worker(
        self, operation: Callable[[sqlite3.Connection], _Result], retry_when_full: bool
    ) -> _Result:
        try:
            if self._connection is None:
                self._connection = _open(self._path)
            try:
                return operation(self._connection)
            except sqlite3.OperationalError as error:
                if _primary_code(error) != sqlite3.SQLITE_FULL:
                    raise
                # The write-ahead log may hold the space: fold it into the database and
                # truncate it, so that claims and deletes (which free space) can go on.
                # Operations are single transactions, rolled back on failure: a retry is safe.
                _truncate_log(self._connection)
                if not retry_when_full:
                    raise
                return operation(self._connection)
        except sqlite3.Error as error:
            # Callers get a georep error naming the file, never a raw sqlite3 error.
            raise _named_error(self._path, error) from error

    def _close_on_worker(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def _open(path: Path) -> sqlite3.Connection:
    """Open (creating if needed) the outbox at ``path`` and check its schema version."""
    try:
        make_private_directory(path.parent)
    except OSError as error:
        raise ConfigurationError(
            f"cannot create the outbox directory {path.parent} ({error.strerror}); "
            "pass a path in a writable directory"
        ) from error
    # Message bodies: the file is the owner's only. SQLite gives the -wal and -shm files
    # the database file's mode, so creating it 0600 covers all three. A failure here is
    # left to sqlite3.connect below, whose error names the path.
    with contextlib.suppress(OSError):
        create_private_file(path)
    try:
        # Autocommit mode (isolation_level=None): transactions are explicit, so claims can
        # use BEGIN IMMEDIATE rather than the module's implicit deferred BEGIN.
        connection = sqlite3.connect(path, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None)
    except sqlite3.Error as error:
        raise _unusable_file_error(path, error) from error
    try:
        _prepare_when_free(connection, path)
    except sqlite3.Error as error:
        connection.close()
        if _primary_code(error) in _UNUSABLE_FILE_ERRORS:
            raise _unusable_file_error(path, error) from error
        raise
    except BaseException:
        connection.close()
        raise
    warn_if_shared(
        [path, *(path.with_name(path.name + suffix) for suffix in ("-wal", "-shm"))],
        what=f"outbox {path}",
        holds="message bodies",
        log=_log,
    )
    return connection


def _prepare_when_free(connection: sqlite3.Connection, path: Path) -> None:
    """:func:`_prepare`, retried while another process holds the lock it needs.

    Switching a new file to WAL takes an exclusive lock and SQLite does not call the busy
    handler for it: several processes opening one new file at once would otherwise fail
    with a raw "database is locked". The retries stop after :data:`BUSY_TIMEOUT_SECONDS`.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_SECONDS
    pause = 0.005
    while True:
        try:
            _prepare(connection, path)
            return
        except sqlite3.OperationalError as error:
            if _primary_code(error) not in _BUSY_ERRORS or time.monotonic() >= deadline:
                raise
        # On the outbox's worker thread (never the event loop): a short blocking pause.
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


def _prepare(connection: sqlite3.Connection, path: Path) -> None:
    _check_schema_version(connection, path)
    # WAL lets readers and one writer proceed together across processes; FULL syncs the
    # log on every commit, which is what makes put's acknowledgement durable.
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=FULL")
    with sql.immediate_transaction(connection):
        # Re-read under the write lock: another process may have created the schema.
        version = _check_schema_version(connection, path)
        if version == 0:
            for statement in sql.schema_statements():
                connection.execute(statement)
        else:
            for step in range(version, SCHEMA_VERSION):
                for statement in sql.MIGRATIONS[step]:
                    connection.execute(statement)
        if version != SCHEMA_VERSION:
            connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _truncate_log(connection: sqlite3.Connection) -> None:
    with contextlib.suppress(sqlite3.Error):
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()


def _primary_code(error: sqlite3.Error) -> int | None:
    code = getattr(error, "sqlite_errorcode", None)
    # Extended codes (SQLITE_BUSY_SNAPSHOT, SQLITE_IOERR_WRITE...) keep the primary code in
    # their low byte.
    return None if code is None else int(code) & 0xFF


def _named_error(path: Path, error: sqlite3.Error) -> OutboxFullError | OutboxUnavailableError:
    # SQLite's messages ("database or disk is full", "database is locked") hold no row data.
    if _primary_code(error) == sqlite3.SQLITE_FULL:
        return OutboxFullError(
            f"outbox {path}: the disk is full ({error}); this call stored and changed "
            "nothing. Free space on that disk or move the outbox to a larger one; the "
            "entries already stored are kept, and drain once there is room"
        )
    return OutboxUnavailableError(
        f"outbox {path} could not be used just now ({error}); this call stored and changed "
        "nothing. Retry; if it persists, check the disk and the file's permissions"
    )


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


def check_existing_outbox(path: Path) -> None:
    """Check that ``path`` is an outbox file, read without writing (opening a file as a
    :class:`SqliteOutbox` creates it, or writes the outbox's tables into it): what an
    inspection (``georep outbox``, ``georep status --outbox``) checks first.

    Raises:
        ConfigurationError: No file there, or one that is no SQLite database with an
            outbox table (an application's own database, an empty file).
    """
    if not path.is_file():
        raise ConfigurationError(f"no outbox file at {path}; pass the SqliteOutbox path")
    try:
        with contextlib.closing(
            sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        ) as database:
            found = database.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'outbox'"
            ).fetchone()
    except sqlite3.DatabaseError:  # not a database at all (or unreadable)
        found = None
    if found is None:
        raise ConfigurationError(
            f"{path} is not a georep outbox (no outbox table in it); pass the SqliteOutbox path"
        )
