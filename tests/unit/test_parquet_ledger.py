"""ParquetLedger: files readers can trust, a bounded buffer, never blocking the caller."""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from georep import ConfigurationError, ParquetLedger
from georep.ledger.parquet import schema_tables
from georep.ledger.schema import receive_schema, send_schema
from georep.ports import ReceiveRecord, RegionAttempt, SendRecord
from georep.testing import FakeClock, InMemoryLedger, settle

T0 = 1_700_000_000.123456


def send(*ids: str, offset: float = 0.0) -> SendRecord:
    return SendRecord(
        message_ids=ids,
        entity="orders",
        mode="passive",
        outcome="accepted",
        accepted_region="secondary",
        failover=True,
        regions=(
            RegionAttempt("primary", "failed", "RegionUnavailableError"),
            RegionAttempt("secondary", "accepted"),
        ),
        started_at=T0 + offset,
        finished_at=T0 + offset + 0.0125,
    )


def receive(message_id: str, outcome: str = "processed") -> ReceiveRecord:
    return ReceiveRecord(
        message_id=message_id,
        entity="orders",
        region="primary",
        outcome=outcome,
        delivery_count=2,
        enqueued_at=None if outcome == "failed" else T0 - 1,
        received_at=T0,
        settled_at=None if outcome == "failed" else T0 + 0.5,
    )


def parts(directory: Path, dataset: str) -> list[Path]:
    return sorted((directory / dataset).glob("*.parquet"))


def meta(ledger: ParquetLedger) -> dict[str, Any]:
    [path] = (ledger.directory / "meta").glob("*.json")
    assert path.name == f"{ledger.writer_id}.json"
    result: dict[str, Any] = json.loads(path.read_text())
    return result


async def test_rows_read_back_with_the_schemas_and_the_values_recorded(tmp_path: Path) -> None:
    ledger = ParquetLedger(tmp_path, clock=FakeClock())
    expected = InMemoryLedger()
    expected.process_id, expected.host = ledger.process_id, ledger.host  # type: ignore[misc]
    records = [send("a", "b"), send("c", offset=1)]
    copies = [receive("a"), receive("b", "suppressed"), receive("c", "failed")]
    for record in records:
        ledger.record_send(record)
        expected.record_send(record)
    for copy in copies:
        ledger.record_receive(copy)
        expected.record_receive(copy)

    await ledger.aclose()

    [sends] = parts(tmp_path, "sends")
    [receives] = parts(tmp_path, "receives")
    # Parquet names a list's item "element" (the standard layout Spark reads); apart from
    # that the stored schema is the contract's, metadata included.
    stored = pq.read_schema(sends)
    assert stored.metadata == send_schema().metadata
    assert [(f.name, f.nullable) for f in stored] == [(f.name, f.nullable) for f in send_schema()]
    assert pq.read_schema(receives).equals(receive_schema(), check_metadata=True)
    send_table = pq.read_table(sends, schema=send_schema())
    receive_table = pq.read_table(receives, schema=receive_schema())
    assert send_table.schema.equals(send_schema(), check_metadata=True)
    assert ds.dataset(tmp_path / "sends", schema=send_schema()).to_table().equals(send_table)
    assert send_table.to_pylist() == expected.send_rows
    assert receive_table.to_pylist() == expected.receive_rows
    assert send_table.column("message_id").to_pylist() == ["a", "b", "c"]
    assert str(send_table.column("started_at")[0]) == "2023-11-14 22:13:20.123456+00:00"


async def test_each_flush_rolls_to_a_new_file_named_after_the_writer(tmp_path: Path) -> None:
    ledger = ParquetLedger(tmp_path, clock=FakeClock())
    ledger.record_send(send("a"))
    await ledger.flush()
    ledger.record_send(send("b"))
    ledger.record_receive(receive("b"))
    await ledger.flush()
    await ledger.flush()  # nothing buffered: no empty file
    await ledger.aclose()

    names = [path.name for path in parts(tmp_path, "sends")]
    assert names == [
        f"part-{ledger.writer_id}-000000.parquet",
        f"part-{ledger.writer_id}-000001.parquet",
    ]
    assert len(parts(tmp_path, "receives")) == 1
    assert ledger.writer_id.split("-")[-2] == str(ledger.process_id)
    ids = [pq.read_table(p).column("message_id").to_pylist() for p in parts(tmp_path, "sends")]
    assert ids == [["a"], ["b"]]


async def test_reaching_flush_rows_starts_a_flush_without_waiting(tmp_path: Path) -> None:
    clock = FakeClock()
    ledger = ParquetLedger(tmp_path, flush_rows=3, flush_interval=60, clock=clock)
    ledger.record_send(send("a", "b"))
    await settle()
    assert ledger.buffered_rows == 2, "below flush_rows: waits for the interval"

    ledger.record_receive(receive("a"))
    await settle()

    assert ledger.buffered_rows == 0, "the flusher took the buffer"
    await ledger.aclose()
    assert len(parts(tmp_path, "sends")) == len(parts(tmp_path, "receives")) == 1


async def test_the_flush_interval_writes_a_few_rows(tmp_path: Path) -> None:
    clock = FakeClock()
    ledger = ParquetLedger(tmp_path, flush_interval=5, clock=clock)
    ledger.record_receive(receive("a"))
    await clock.advance(4.9)
    assert ledger.buffered_rows == 1

    await clock.advance(0.1)

    assert ledger.buffered_rows == 0
    await ledger.aclose()
    assert len(parts(tmp_path, "receives")) == 1


async def test_a_full_buffer_drops_counts_and_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    ledger = ParquetLedger(tmp_path, max_buffer_rows=4, flush_rows=4, clock=clock)
    caplog.set_level(logging.WARNING, logger="georep.ledger")

    ledger.record_send(send("a", "b", "c"))
    ledger.record_send(send("d", "e"))  # 5 > 4: dropped whole
    ledger.record_receive(receive("a"))  # the 4th row
    ledger.record_receive(receive("b"))  # dropped
    ledger.record_receive(receive("c"))  # dropped

    assert ledger.dropped_sends == 2 and ledger.dropped_receives == 2
    warnings = [r for r in caplog.records if "dropping" in r.getMessage()]
    assert len(warnings) == 1
    await ledger.aclose()
    assert meta(ledger) == {"schema_version": 1, "dropped_sends": 2, "dropped_receives": 2}
    [sends] = parts(tmp_path, "sends")
    assert pq.read_table(sends).num_rows == 3


async def test_meta_is_written_on_every_flush(tmp_path: Path) -> None:
    ledger = ParquetLedger(tmp_path, clock=FakeClock())
    ledger.record_send(send("a"))
    await ledger.flush()
    assert meta(ledger) == {"schema_version": 1, "dropped_sends": 0, "dropped_receives": 0}
    await ledger.aclose()


async def test_close_flushes_is_idempotent_and_later_rows_are_counted_as_dropped(
    tmp_path: Path,
) -> None:
    async with ParquetLedger(tmp_path, clock=FakeClock()) as ledger:
        ledger.record_send(send("a"))
    await ledger.aclose()

    assert len(parts(tmp_path, "sends")) == 1
    ledger.record_send(send("late"))
    assert ledger.dropped_sends == 1 and ledger.buffered_rows == 0


async def test_files_appear_only_complete_under_their_final_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written_to: list[Path] = []
    visible_while_writing: list[list[Path]] = []
    real_write = pq.write_table

    def spying_write(table: Any, where: Any, **kwargs: Any) -> None:
        written_to.append(Path(where))
        visible_while_writing.append(parts(tmp_path, "sends"))
        real_write(table, where, **kwargs)

    monkeypatch.setattr(pq, "write_table", spying_write)
    ledger = ParquetLedger(tmp_path, clock=FakeClock())
    ledger.record_send(send("a"))
    await ledger.aclose()

    [temporary] = written_to
    assert temporary.name.startswith(".") and not temporary.name.endswith(".parquet")
    assert visible_while_writing == [[]]
    assert [p.name for p in (tmp_path / "sends").iterdir()] == [
        f"part-{ledger.writer_id}-000000.parquet"
    ], "no temporary file left behind"


async def test_a_failed_write_counts_the_rows_as_dropped_and_never_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "sends").write_text("not a directory")
    ledger = ParquetLedger(tmp_path, clock=FakeClock())
    ledger.record_send(send("a", "b"))
    ledger.record_receive(receive("a"))

    with caplog.at_level(logging.ERROR, logger="georep.ledger"):
        await ledger.aclose()

    assert ledger.dropped_sends == 2 and ledger.dropped_receives == 0
    assert meta(ledger)["dropped_sends"] == 2
    assert len(parts(tmp_path, "receives")) == 1
    assert any("counted as dropped" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"flush_rows": 10, "max_buffer_rows": 5}, "flush_rows"),
        ({"max_buffer_rows": 0}, "max_buffer_rows"),
        ({"flush_interval": 0}, "flush_interval"),
    ],
)
def test_bad_settings_are_refused_by_name(
    tmp_path: Path, options: dict[str, Any], named: str
) -> None:
    with pytest.raises(ConfigurationError, match=named):
        ParquetLedger(tmp_path, **options)


def test_a_file_as_directory_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "ledger"
    target.write_text("")
    with pytest.raises(ConfigurationError, match="is a file"):
        ParquetLedger(target)


def test_the_docs_show_the_schema_as_defined() -> None:
    docs = Path(__file__).resolve().parents[2] / "docs" / "ledger.md"
    assert schema_tables() in docs.read_text(encoding="utf-8"), (
        "docs/ledger.md is out of date: paste the output of georep.ledger.parquet.schema_tables()"
    )


async def test_ledger_files_and_the_directories_it_makes_are_the_owners_only(
    tmp_path: Path,
) -> None:
    previous = os.umask(0o022)  # the usual umask: a plain open() makes 0644 files
    try:
        directory = tmp_path / "ledger"
        ledger = ParquetLedger(directory, clock=FakeClock())
        ledger.record_send(send("a"))
        ledger.record_receive(receive("a"))
        await ledger.aclose()
    finally:
        os.umask(previous)

    files = [path for path in directory.rglob("*") if path.is_file()]
    folders = [directory, *(path for path in directory.rglob("*") if path.is_dir())]
    assert len(files) == 3  # sends, receives, meta
    assert {str(p): stat.S_IMODE(p.stat().st_mode) for p in files} == {str(p): 0o600 for p in files}
    assert {str(p): stat.S_IMODE(p.stat().st_mode) for p in folders} == {
        str(p): 0o700 for p in folders
    }
