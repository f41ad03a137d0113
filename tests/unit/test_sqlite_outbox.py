"""What only the SQLite outbox promises: durability, sharing a file, refusing foreign files."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from georep.exceptions import ConfigurationError, OutboxFullError, OutboxUnavailableError
from georep.outbox.sql import MIGRATIONS, schema_statements
from georep.outbox.sqlite import SCHEMA_VERSION, SqliteOutbox

CHANNEL = "east+west/orders"
LEASE = 30.0
REPO_ROOT = Path(__file__).resolve().parents[2]

# Puts one entry per put and reports each payload only after its put returned. It keeps
# putting until killed (the cap only guards against an orphaned child filling the disk),
# so the kill lands while a put is in flight.
CRASHING_WRITER = """
import asyncio, sys
from georep.outbox.sqlite import SqliteOutbox

async def main():
    outbox = SqliteOutbox(sys.argv[1])
    for n in range(int(sys.argv[2])):
        payload = f"message-{n}".encode()
        await outbox.put("east+west/orders", [(None, payload)], now=float(n))
        sys.stdout.write(payload.decode() + "\\n")
        sys.stdout.flush()

asyncio.run(main())
"""
ACKNOWLEDGED_BEFORE_KILL = 100
WRITER_CAP = 100_000


async def test_entries_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "dir" / "outbox.db"  # missing parents are created
    async with SqliteOutbox(path) as outbox:
        ids = await outbox.put(CHANNEL, [(None, b"a"), ("secondary", b"b")], now=5.0)
        await outbox.claim(CHANNEL, limit=1, now=6.0, lease=LEASE)
        await outbox.retry_later(ids[:1], not_before=7.0)

    async with SqliteOutbox(path) as reopened:
        assert await reopened.depth() == 2
        assert reopened.last_known_depth == 2
        claimed = await reopened.claim(CHANNEL, limit=10, now=7.0, lease=LEASE)

    assert [(e.entry_id, e.region, e.payload, e.attempts) for e in claimed] == [
        (ids[0], None, b"a", 1),
        (ids[1], "secondary", b"b", 0),
    ]


async def test_two_instances_on_one_file_never_claim_the_same_entry(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    async with SqliteOutbox(path) as first, SqliteOutbox(path) as second:
        ids = await first.put(CHANNEL, [(None, bytes([n])) for n in range(60)], now=0.0)

        # Each instance has its own worker thread, so these claims really race for the lock.
        claims = await asyncio.gather(
            *(
                outbox.claim(CHANNEL, limit=7, now=1.0, lease=LEASE)
                for _ in range(6)
                for outbox in (first, second)
            )
        )

        claimed_ids = [entry.entry_id for batch in claims for entry in batch]
        assert len(claimed_ids) == len(set(claimed_ids)) == len(ids)
        assert sorted(claimed_ids) == ids
        # The other instance sees the leases too.
        assert await second.claim(CHANNEL, limit=100, now=1.0 + LEASE / 2, lease=LEASE) == []


async def test_the_total_bounds_cover_every_instance_on_the_file(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    async with (
        SqliteOutbox(path, max_entries=2) as first,
        SqliteOutbox(path, max_entries=2) as second,
    ):
        await first.put(CHANNEL, [(None, b"a"), (None, b"b")], now=0.0)

        with pytest.raises(OutboxFullError, match="max_entries=2"):
            await second.put(CHANNEL, [(None, b"c")], now=0.0)


def test_acknowledged_puts_survive_a_sigkill(tmp_path: Path) -> None:
    path = tmp_path / "crash.db"
    writer = subprocess.Popen(
        [sys.executable, "-c", CRASHING_WRITER, str(path), str(WRITER_CAP)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    acknowledged: list[str] = []
    try:
        assert writer.stdout is not None
        while len(acknowledged) < ACKNOWLEDGED_BEFORE_KILL:
            line = writer.stdout.readline()
            assert line, f"the writer exited early with code {writer.wait()}"
            acknowledged.append(line.rstrip("\n"))
        assert writer.poll() is None, "the writer must still be putting when killed"
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait(timeout=10)
        # Lines already in the pipe were acknowledged too; a cut-off last line was not.
        acknowledged += [line[:-1] for line in writer.stdout if line.endswith("\n")]
    finally:
        if writer.poll() is None:
            writer.kill()
        writer.wait(timeout=10)
        if writer.stdout is not None:
            writer.stdout.close()

    assert writer.returncode == -signal.SIGKILL

    async def stored_payloads() -> set[str]:
        async with SqliteOutbox(path) as reopened:
            assert await reopened.depth() >= len(acknowledged)
            entries = await reopened.claim(CHANNEL, limit=WRITER_CAP, now=1e9, lease=LEASE)
            return {entry.payload.decode() for entry in entries}

    assert set(acknowledged) <= asyncio.run(stored_payloads())


async def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"these are not the pages you are looking for\n" * 200)

    with pytest.raises(ConfigurationError, match=r"notes\.txt"):
        async with SqliteOutbox(path):
            pass


async def test_a_file_from_a_newer_georep_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    with sqlite3.connect(path) as connection:
        connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    connection.close()

    outbox = SqliteOutbox(path)
    try:
        with pytest.raises(ConfigurationError, match=rf"future\.db.*{SCHEMA_VERSION + 1}"):
            await outbox.depth()
    finally:
        await outbox.aclose()


@pytest.mark.parametrize(
    ("bounds", "name"),
    [({"max_entries": 0}, "max_entries"), ({"max_bytes": 0}, "max_bytes")],
)
def test_non_positive_bounds_are_refused_before_any_io(
    tmp_path: Path, bounds: dict[str, int], name: str
) -> None:
    with pytest.raises(ConfigurationError, match=rf"{name}.*pass {name} >= 1"):
        SqliteOutbox(tmp_path / "missing" / "outbox.db", **bounds)

    assert not (tmp_path / "missing").exists()


# Each worker opens outbox-0.db, outbox-1.db, ... at shared wall-clock instants, so several
# processes create and switch the same new file to WAL at once.
async def test_a_version_1_file_is_migrated_and_keeps_its_entries(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as connection:
        # A file as version 1 left it: today's schema without what migration 1 adds.
        for statement in schema_statements():
            connection.execute(statement)
        assert MIGRATIONS[1][0] == "ALTER TABLE outbox ADD COLUMN leased_by TEXT"
        connection.execute("ALTER TABLE outbox DROP COLUMN leased_by")
        assert "outbox_dead" in MIGRATIONS[1][1]
        connection.execute("DROP TABLE outbox_dead")
        connection.execute("DROP INDEX outbox_session")
        connection.execute("ALTER TABLE outbox DROP COLUMN session_id")
        connection.execute(
            "INSERT INTO outbox (channel, region, payload, enqueued_at, not_before)"
            " VALUES (?, NULL, ?, 1.0, 1.0)",
            (CHANNEL, b"old"),
        )
        connection.execute("PRAGMA user_version = 1")

    async with SqliteOutbox(path) as outbox:
        [entry] = await outbox.claim(CHANNEL, limit=5, now=2.0, lease=LEASE, owner="me")
        assert entry.payload == b"old" and await outbox.depth() == 1
        await outbox.dead_letter([(entry.entry_id, "InvalidMessageError")], now=3.0)
        assert await outbox.dead_depth() == 1
    with contextlib.closing(sqlite3.connect(path)) as connection:
        assert connection.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


async def test_a_version_2_file_is_migrated_and_its_entries_are_in_no_session(
    tmp_path: Path,
) -> None:
    path = tmp_path / "v2.db"
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as connection:
        # A file as version 2 left it: today's schema without what migration 2 adds.
        for statement in schema_statements():
            connection.execute(statement)
        assert "session_id" in MIGRATIONS[2][0]
        connection.execute("DROP INDEX outbox_session")
        connection.execute("ALTER TABLE outbox DROP COLUMN session_id")
        connection.execute("ALTER TABLE outbox_dead DROP COLUMN session_id")
        connection.execute(
            "INSERT INTO outbox (channel, region, payload, enqueued_at, not_before)"
            " VALUES (?, NULL, ?, 1.0, 1.0)",
            (CHANNEL, b"old"),
        )
        connection.execute("PRAGMA user_version = 2")

    async with SqliteOutbox(path) as outbox:
        await outbox.put(CHANNEL, [(None, b"new")], now=1.5, sessions=["s1"])
        entries = await outbox.claim(CHANNEL, limit=5, now=2.0, lease=LEASE, owner="me")
        assert [(e.payload, e.session_id) for e in entries] == [(b"old", None), (b"new", "s1")]
        assert await outbox.held_sessions(CHANNEL) == {"s1"}
    with contextlib.closing(sqlite3.connect(path)) as connection:
        assert connection.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


async def test_a_full_disk_raises_outbox_full_and_draining_goes_on(tmp_path: Path) -> None:
    # The seam: SQLite's own page limit makes the file unable to grow, which SQLite reports
    # exactly as a full disk (SQLITE_FULL). Before: a raw sqlite3.OperationalError.
    async with SqliteOutbox(tmp_path / "full.db") as outbox:
        ids = await outbox.put(CHANNEL, [(None, b"x" * 100) for _ in range(3)], now=0.0)
        pages = await outbox._run(
            lambda c: c.execute("PRAGMA page_count").fetchone()[0]  # type: ignore[no-any-return]
        )
        await outbox._run(lambda c: c.execute(f"PRAGMA max_page_count = {pages}"))

        with pytest.raises(OutboxFullError, match=r"full\.db.*disk is full") as raised:
            await outbox.put(CHANNEL, [(None, b"y" * 200_000)], now=1.0)
        assert not isinstance(raised.value, sqlite3.Error)
        assert await outbox.depth() == 3, "nothing of the refused put was stored"

        claimed = await outbox.claim(CHANNEL, limit=10, now=2.0, lease=LEASE, owner="me")
        assert [e.entry_id for e in claimed] == ids
        await outbox.delete(ids[:2])
        await outbox.dead_letter([(ids[2], "InvalidMessageError")], now=3.0)
        assert await outbox.depth() == 0


async def test_a_locked_file_raises_a_named_error_not_a_raw_sqlite_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import georep.outbox.sqlite as module

    path = tmp_path / "locked.db"
    async with SqliteOutbox(path) as outbox:
        await outbox.put(CHANNEL, [(None, b"a")], now=0.0)
    monkeypatch.setattr(module, "BUSY_TIMEOUT_SECONDS", 0.2)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        async with SqliteOutbox(path) as outbox:
            with pytest.raises(OutboxUnavailableError, match=r"locked\.db.*locked"):
                await outbox.put(CHANNEL, [(None, b"b")], now=1.0)
    except OutboxUnavailableError:
        pass  # opening may be the call that meets the lock: the same named error
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The usual umask, under which a plain open() makes files readable by every user."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.usefixtures("umask_022")
async def test_the_outbox_files_and_its_new_directory_are_the_owners_only(tmp_path: Path) -> None:
    path = tmp_path / "made-by-georep" / "outbox.db"
    async with SqliteOutbox(path) as outbox:
        await outbox.put(CHANNEL, [(None, b"card 4111 1111 1111 1111")], now=0.0)
        files = [path, path.with_name("outbox.db-wal"), path.with_name("outbox.db-shm")]
        assert all(file.exists() for file in files)
        assert {file.name: _mode(file) for file in files} == {file.name: 0o600 for file in files}
    assert _mode(path.parent) == 0o700


@pytest.mark.usefixtures("umask_022")
async def test_an_outbox_file_open_to_others_is_warned_about_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "shared.db"
    sqlite3.connect(path).close()  # made as an older georep did: 0644 under umask 022
    assert _mode(path) == 0o644
    caplog.set_level(logging.WARNING, "georep.outbox")
    for _ in range(2):
        async with SqliteOutbox(path) as outbox:
            await outbox.put(CHANNEL, [(None, b"x")], now=0.0)

    warnings = [r.getMessage() for r in caplog.records if str(path) in r.getMessage()]
    assert len([w for w in warnings if "shared.db is open" in w]) == 1
    [warning] = [w for w in warnings if "shared.db is open" in w]
    assert "mode 0644" in warning and "message bodies" in warning
    assert f"chmod 600 {path}" in warning
