"""The outbox's SQL: the schema, the statements and the row mapping.

Every function here takes the connection and runs on the outbox's worker thread
(:class:`georep.outbox.sqlite.SqliteOutbox` calls them through its ``_run``); none opens, closes
or retries anything. Each write is one ``BEGIN IMMEDIATE`` transaction, so a retry after a
failure is safe.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Final

from georep.ports import OutboxEntry

RoomCheck = Callable[[sqlite3.Connection, int, int], None]
"""``check(connection, new_entries, new_bytes)``: raises when the queue has no room."""

# The totals row is kept by triggers rather than computed per put: COUNT(*) and
# SUM(length(payload)) would scan the whole table (up to max_bytes of pages) on every put,
# exactly when the outbox is large because a region is down. Triggers also keep it right
# when several processes write the same file.
SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS outbox (
    entry_id INTEGER PRIMARY KEY AUTOINCREMENT,
    channel TEXT NOT NULL,
    region TEXT,
    payload BLOB NOT NULL,
    enqueued_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    not_before REAL NOT NULL,
    leased_until REAL NOT NULL DEFAULT 0,
    leased_by TEXT,
    session_id TEXT
);
CREATE INDEX IF NOT EXISTS outbox_due ON outbox (channel, not_before, entry_id);
CREATE INDEX IF NOT EXISTS outbox_session
    ON outbox (channel, session_id, not_before, leased_until, region, entry_id)
    WHERE session_id IS NOT NULL;
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
CREATE TABLE IF NOT EXISTS outbox_dead (
    entry_id INTEGER PRIMARY KEY,
    channel TEXT NOT NULL,
    region TEXT,
    payload BLOB NOT NULL,
    enqueued_at REAL NOT NULL,
    attempts INTEGER NOT NULL,
    reason TEXT NOT NULL,
    dead_at REAL NOT NULL,
    session_id TEXT
);
"""

# Statements that bring a file of the key's version to the next one.
MIGRATIONS: Final = {
    1: (
        "ALTER TABLE outbox ADD COLUMN leased_by TEXT",
        "CREATE TABLE IF NOT EXISTS outbox_dead (entry_id INTEGER PRIMARY KEY,"
        " channel TEXT NOT NULL, region TEXT, payload BLOB NOT NULL, enqueued_at REAL NOT NULL,"
        " attempts INTEGER NOT NULL, reason TEXT NOT NULL, dead_at REAL NOT NULL)",
    ),
    2: (
        "ALTER TABLE outbox ADD COLUMN session_id TEXT",
        "ALTER TABLE outbox_dead ADD COLUMN session_id TEXT",
        "CREATE INDEX IF NOT EXISTS outbox_session"
        " ON outbox (channel, session_id, not_before, leased_until, region, entry_id)"
        " WHERE session_id IS NOT NULL",
    ),
}

_ENTRY_COLUMNS: Final = "entry_id, channel, region, payload, enqueued_at, attempts, session_id"


def schema_statements() -> list[str]:
    """:data:`SCHEMA` as single statements.

    executescript() would COMMIT the caller's open transaction first, so the statements
    run one by one.
    """
    statements: list[str] = []
    pending = ""
    for line in SCHEMA.strip().splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            statements.append(pending.strip())
            pending = ""
    return statements


@contextmanager
def immediate_transaction(connection: sqlite3.Connection) -> Iterator[None]:
    """One transaction that takes the write lock before its first read."""
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


def totals(connection: sqlite3.Connection) -> tuple[int, int]:
    """Queued entries and their payload bytes, across all channels."""
    entries, payload_bytes = connection.execute(
        "SELECT entries, payload_bytes FROM outbox_totals WHERE singleton = 1"
    ).fetchone()
    return int(entries), int(payload_bytes)


def id_filter(entry_ids: Sequence[int] | None) -> tuple[str, tuple[int, ...]]:
    """A WHERE clause (with its parameters) for ``entry_ids``; None means every row."""
    if entry_ids is None:
        return "", ()
    ids = tuple(int(entry_id) for entry_id in entry_ids)
    if not ids:
        return " WHERE 0", ()
    return f" WHERE entry_id IN ({', '.join('?' * len(ids))})", ids


def _entry(row: tuple[int, str, str | None, bytes, float, int, str | None]) -> OutboxEntry:
    entry_id, channel, region, payload, enqueued_at, attempts, session_id = row
    return OutboxEntry(
        entry_id=entry_id,
        channel=channel,
        region=region,
        payload=bytes(payload),
        enqueued_at=enqueued_at,
        attempts=attempts,
        session_id=session_id,
    )


# ------------------------------------------------------------------------ the queue


def insert(
    connection: sqlite3.Connection,
    rows: Sequence[tuple[str, str | None, bytes, float, float, str | None]],
    check_room: RoomCheck,
) -> tuple[list[int], int]:
    """Store ``(channel, region, payload, enqueued_at, not_before, session_id)`` rows.

    Returns:
        Their ids, in order, and the queue's depth after the insert.
    """
    new_bytes = sum(len(row[2]) for row in rows)
    with immediate_transaction(connection):
        check_room(connection, len(rows), new_bytes)
        # One INSERT per row: lastrowid is only defined for single-row inserts.
        entry_ids: list[int] = []
        for row in rows:
            cursor = connection.execute(
                "INSERT INTO outbox (channel, region, payload, enqueued_at, not_before,"
                " session_id) VALUES (?, ?, ?, ?, ?, ?)",
                row,
            )
            assert cursor.lastrowid is not None
            entry_ids.append(cursor.lastrowid)
        depth = totals(connection)[0]
    return entry_ids, depth


def lease_due(
    connection: sqlite3.Connection,
    channel: str,
    *,
    limit: int,
    now: float,
    lease: float,
    owner: str | None,
) -> list[OutboxEntry]:
    """Lease up to ``limit`` due, unleased entries of ``channel`` to ``owner``, oldest
    first; an entry of a session only while no earlier entry of its session that could
    reach the same region (the same target, or either of them any region) is leased or not
    due. So a session's entries leave in order, and never two drainers hold one session's
    next entries."""
    # IMMEDIATE takes the write lock before reading, so a second process cannot select
    # the same rows between our SELECT and UPDATE.
    with immediate_transaction(connection):
        due = connection.execute(
            "SELECT entry_id, region, session_id FROM outbox"
            " WHERE channel = ? AND not_before <= ? AND leased_until <= ? ORDER BY entry_id",
            (channel, now, now),
        )
        chosen: list[int] = []
        waiting: dict[str, dict[str | None, int]] = {}
        # One pass in entry order, stopped at ``limit``: each session's waiting entries are
        # read once (from the covering index), not once per candidate.
        for entry_id, region, session_id in due:
            if session_id is not None:
                first = waiting.get(session_id)
                if first is None:
                    first = waiting[session_id] = _first_waiting(
                        connection, channel, session_id, now
                    )
                if any(
                    earliest < entry_id and (target is None or region is None or target == region)
                    for target, earliest in first.items()
                ):
                    continue
            chosen.append(entry_id)
            if len(chosen) == limit:
                break
        due.close()
        where, ids = id_filter(chosen)
        rows = connection.execute(
            f"SELECT {_ENTRY_COLUMNS} FROM outbox{where} ORDER BY entry_id", ids
        ).fetchall()
        connection.executemany(
            "UPDATE outbox SET leased_until = ?, leased_by = ? WHERE entry_id = ?",
            [(now + lease, owner, row[0]) for row in rows],
        )
    return [_entry(row) for row in rows]


def _first_waiting(
    connection: sqlite3.Connection, channel: str, session_id: str, now: float
) -> dict[str | None, int]:
    """Per target region, the first entry of the session that is leased or not due."""
    rows = connection.execute(
        "SELECT region, MIN(entry_id) FROM outbox WHERE channel = ? AND session_id = ?"
        " AND (not_before > ? OR leased_until > ?) GROUP BY region",
        (channel, session_id, now, now),
    )
    return {region: int(first) for region, first in rows}


def extend_leases(
    connection: sqlite3.Connection, entry_ids: Sequence[int], *, owner: str, until: float
) -> list[int]:
    """Extend ``owner``'s leases to ``until``; the ids it still holds, in order."""
    held: list[int] = []
    with immediate_transaction(connection):
        for entry_id in entry_ids:
            cursor = connection.execute(
                "UPDATE outbox SET leased_until = ? WHERE entry_id = ? AND leased_by = ?",
                (until, entry_id, owner),
            )
            if cursor.rowcount:
                held.append(entry_id)
    return held


def delete(connection: sqlite3.Connection, entry_ids: Sequence[int]) -> int:
    """Remove queued entries (ids no longer stored are ignored); the depth after."""
    with immediate_transaction(connection):
        connection.executemany(
            "DELETE FROM outbox WHERE entry_id = ?", [(entry_id,) for entry_id in entry_ids]
        )
        return totals(connection)[0]


def unlease(
    connection: sqlite3.Connection,
    entry_ids: Sequence[int],
    *,
    owner: str | None,
    attempts: int,
    not_before: float | None,
) -> None:
    """Drop the leases (only ``owner``'s, when given), adding ``attempts`` to each.

    ``not_before`` None keeps the due time (a release: the entry was due when claimed).
    """
    sql = (
        "UPDATE outbox SET attempts = attempts + ?, leased_until = 0, leased_by = NULL,"
        " not_before = COALESCE(?, not_before) WHERE entry_id = ?"
    )
    rows: list[tuple[object, ...]] = [(attempts, not_before, i) for i in entry_ids]
    if owner is not None:
        sql += " AND leased_by = ?"
        rows = [(*row, owner) for row in rows]
    with immediate_transaction(connection):
        connection.executemany(sql, rows)


def held_sessions(
    connection: sqlite3.Connection, channel: str, session_ids: Sequence[str] | None
) -> set[str]:
    """The sessions (of ``session_ids``, or all) with an entry queued in ``channel``."""
    sql = "SELECT DISTINCT session_id FROM outbox WHERE channel = ? AND session_id IS NOT NULL"
    if session_ids is None:
        return {row[0] for row in connection.execute(sql, (channel,))}
    held: set[str] = set()
    wanted = list(dict.fromkeys(session_ids))
    # In slices: SQLite bounds the parameters of one statement.
    for start in range(0, len(wanted), 500):
        part = wanted[start : start + 500]
        marks = ", ".join("?" * len(part))
        rows = connection.execute(f"{sql} AND session_id IN ({marks})", (channel, *part))
        held.update(row[0] for row in rows)
    return held


def count(connection: sqlite3.Connection, channel: str) -> int:
    """Entries stored for ``channel``, leased ones included."""
    row = connection.execute("SELECT COUNT(*) FROM outbox WHERE channel = ?", (channel,))
    return int(row.fetchone()[0])


# ------------------------------------------------------------------ the dead letters


def bury(connection: sqlite3.Connection, entries: Sequence[tuple[int, str]], now: float) -> int:
    """Move ``(entry_id, reason)`` entries from the queue to the dead-letter table.

    Returns:
        The queue's depth after the move.
    """
    with immediate_transaction(connection):
        for entry_id, reason in entries:
            connection.execute(
                "INSERT OR REPLACE INTO outbox_dead (entry_id, channel, region, payload,"
                " enqueued_at, attempts, reason, dead_at, session_id) SELECT entry_id, channel,"
                " region, payload, enqueued_at, attempts + 1, ?, ?, session_id FROM outbox"
                " WHERE entry_id = ?",
                (reason, now, entry_id),
            )
            connection.execute("DELETE FROM outbox WHERE entry_id = ?", (entry_id,))
        return totals(connection)[0]


def records(connection: sqlite3.Connection, *, dead: bool, limit: int) -> list[tuple[object, ...]]:
    """Rows for :class:`georep.outbox.sqlite.OutboxRecord`, oldest first, without payloads."""
    sql = (
        "SELECT entry_id, 'dead', channel, region, length(payload), enqueued_at, attempts,"
        " reason, dead_at FROM outbox_dead ORDER BY entry_id LIMIT ?"
        if dead
        else "SELECT entry_id, 'queued', channel, region, length(payload), enqueued_at,"
        " attempts, NULL, NULL FROM outbox ORDER BY entry_id LIMIT ?"
    )
    return [tuple(row) for row in connection.execute(sql, (limit,))]


def dead_count(connection: sqlite3.Connection) -> int:
    """Dead-lettered entries in the file."""
    return int(connection.execute("SELECT COUNT(*) FROM outbox_dead").fetchone()[0])


def revive(
    connection: sqlite3.Connection,
    entry_ids: Sequence[int] | None,
    *,
    now: float,
    check_room: RoomCheck,
) -> tuple[int, int]:
    """Move dead-lettered entries (all, or ``entry_ids``) back to the queue, due at ``now``.

    They keep their id and enqueue time; their attempts restart from 0.

    Returns:
        How many moved, and the queue's depth after.
    """
    where, parameters = id_filter(entry_ids)
    with immediate_transaction(connection):
        moved, size = connection.execute(
            f"SELECT COUNT(*), COALESCE(SUM(length(payload)), 0) FROM outbox_dead{where}",
            parameters,
        ).fetchone()
        check_room(connection, int(moved), int(size))
        connection.execute(
            "INSERT INTO outbox (entry_id, channel, region, payload, enqueued_at,"
            " attempts, not_before, session_id) SELECT entry_id, channel, region, payload,"
            f" enqueued_at, 0, ?, session_id FROM outbox_dead{where}",
            (now, *parameters),
        )
        connection.execute(f"DELETE FROM outbox_dead{where}", parameters)
        depth = totals(connection)[0]
    return int(moved), depth


def purge(connection: sqlite3.Connection, entry_ids: Sequence[int] | None) -> int:
    """Delete dead-lettered entries (all, or ``entry_ids``) for good; how many."""
    where, parameters = id_filter(entry_ids)
    with immediate_transaction(connection):
        cursor = connection.execute(f"DELETE FROM outbox_dead{where}", parameters)
    return cursor.rowcount
