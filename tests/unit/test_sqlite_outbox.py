"""What only the SQLite outbox promises: durability, sharing a file, refusing foreign files."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from georep._outbox import SCHEMA_VERSION, SqliteOutbox
from georep.exceptions import ConfigurationError, OutboxFullError

CHANNEL = "east+west/orders"
LEASE = 30.0
REPO_ROOT = Path(__file__).resolve().parents[2]

# Puts one entry per put and reports each payload only after its put returned. It keeps
# putting until killed (the cap only guards against an orphaned child filling the disk),
# so the kill lands while a put is in flight.
CRASHING_WRITER = """
import asyncio, sys
from georep._outbox import SqliteOutbox

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
