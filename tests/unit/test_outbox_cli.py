"""``georep outbox list|replay|purge`` on a real SQLite outbox file."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from georep import SqliteOutbox
from georep.cli import app

CHANNEL = "east|west|orders"
REASON = "MessageTooLargeError (message-too-large)"


def make_outbox(path: Path) -> list[int]:
    """Four entries: two queued, two dead-lettered; returns their ids in order."""

    async def fill() -> list[int]:
        async with SqliteOutbox(path) as outbox:
            ids = await outbox.put(
                CHANNEL, [(None, b"a"), ("west", b"bb"), (None, b"ccc"), (None, b"dddd")], now=10.0
            )
            await outbox.dead_letter([(ids[0], REASON), (ids[2], "InvalidMessageError")], now=20.0)
            return ids

    return asyncio.run(fill())


def listing(path: Path) -> dict[str, object]:
    result = CliRunner().invoke(app, ["outbox", "list", str(path), "--json"])
    assert result.exit_code == 0, result.output
    document: dict[str, object] = json.loads(result.output)
    return document


def test_list_shows_counts_and_rows_of_both_states(tmp_path: Path) -> None:
    path = tmp_path / "outbox.db"
    ids = make_outbox(path)

    document = listing(path)

    assert (document["queued"], document["dead"]) == (2, 2)
    rows = {(row["entry_id"], row["state"]) for row in document["entries"]}  # type: ignore[attr-defined]
    assert rows == {(ids[1], "queued"), (ids[3], "queued"), (ids[0], "dead"), (ids[2], "dead")}
    [dead] = [r for r in document["entries"] if r["entry_id"] == ids[0]]  # type: ignore[attr-defined]
    assert (dead["reason"], dead["attempts"], dead["dead_at"], dead["size"]) == (REASON, 1, 20.0, 1)

    table = CliRunner().invoke(app, ["outbox", "list", str(path)])
    assert table.exit_code == 0 and "2 queued, 2 dead-lettered" in table.output


def test_replay_by_id_then_all(tmp_path: Path) -> None:
    path = tmp_path / "outbox.db"
    ids = make_outbox(path)
    runner = CliRunner()

    one = runner.invoke(app, ["outbox", "replay", str(path), "--id", str(ids[2])])
    assert one.exit_code == 0 and "replayed 1 entry" in one.output
    assert (listing(path)["queued"], listing(path)["dead"]) == (3, 1)

    rest = runner.invoke(app, ["outbox", "replay", str(path), "--all"])
    assert rest.exit_code == 0 and "replayed 1 entry" in rest.output
    assert (listing(path)["queued"], listing(path)["dead"]) == (4, 0)


def test_purge_needs_a_selection_and_a_confirmation(tmp_path: Path) -> None:
    path = tmp_path / "outbox.db"
    ids = make_outbox(path)
    runner = CliRunner()

    unconfirmed = runner.invoke(app, ["outbox", "purge", str(path), "--all"])
    assert unconfirmed.exit_code == 2 and "--yes" in unconfirmed.output
    unselected = runner.invoke(app, ["outbox", "purge", str(path), "--yes"])
    assert unselected.exit_code == 2 and "--all" in unselected.output
    assert listing(path)["dead"] == 2

    one = runner.invoke(app, ["outbox", "purge", str(path), "--id", str(ids[0]), "--yes"])
    assert one.exit_code == 0 and "purged 1 entry" in one.output
    assert listing(path)["dead"] == 1
    every = runner.invoke(app, ["outbox", "purge", str(path), "--all", "--yes"])
    assert every.exit_code == 0 and "purged 1 entry" in every.output
    assert (listing(path)["queued"], listing(path)["dead"]) == (2, 0)


@pytest.mark.parametrize("name", ["missing.db", "[/x]missing.db", "[bold]missing.db"])
def test_a_missing_file_is_an_error_and_is_not_created(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    result = CliRunner(env={"COLUMNS": "400"}).invoke(app, ["outbox", "list", str(path)])
    # The path is quoted as given (brackets are not rich markup).
    assert result.exit_code == 2 and f"no outbox file at {path}" in result.output
    assert not path.exists()


def test_a_file_that_is_not_an_outbox_exits_2_without_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"not a database\n" * 200)
    result = CliRunner().invoke(app, ["outbox", "list", str(path)])
    assert result.exit_code == 2 and "notes.txt" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("command", [["list"], ["purge", "--all", "--yes"], ["replay", "--all"]])
def test_a_file_that_is_not_an_outbox_is_refused_and_left_as_it_was(
    tmp_path: Path, command: list[str]
) -> None:
    """Opened as an outbox, an application's own SQLite database got the outbox's tables
    and WAL mode written into it, and an empty file became an outbox, exit status 0."""
    import sqlite3

    database, empty = tmp_path / "app.db", tmp_path / "empty.db"
    with sqlite3.connect(database) as connection:
        connection.execute("CREATE TABLE customers (id INTEGER)")
    empty.touch()
    for path in (database, empty):
        before = path.read_bytes()
        result = CliRunner().invoke(app, ["outbox", command[0], str(path), *command[1:]])
        assert result.exit_code == 2, result.output
        assert "is not a georep outbox" in result.output
        assert path.read_bytes() == before and not Path(f"{path}-wal").exists()
