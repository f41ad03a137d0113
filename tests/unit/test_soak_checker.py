"""The soak's checker on synthetic ledgers: a lost message, a duplicate and a session pair
out of order are each reported, for the entity they happened on; a clean ledger reports
none; rows a SIGKILL took from the ledger are recovered from the history."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from georep import ConfigurationError
from georep.cli.soak.checker import EntityVerdict, check_run, read_history
from georep.ledger.schema import receive_schema, send_schema

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
ENTITIES = {
    "orders": "orders",
    "events/Subscriptions/a": "events",
    "events/Subscriptions/b": "events",
}


def _send(message_id: str, entity: str, second: float = 0) -> dict[str, Any]:
    at = T0 + timedelta(seconds=second)
    return {
        "schema_version": 1, "message_id": message_id, "entity": entity, "mode": "passive",
        "outcome": "accepted", "accepted_region": "primary", "failover": False,
        "started_at": at, "finished_at": at, "process_id": 1,
    }  # fmt: skip


def _processed(
    message_id: str,
    entity: str,
    second: float,
    *,
    pid: int = 2,
    session: str | None = None,
    seq: int | None = None,
) -> dict[str, Any]:
    at = T0 + timedelta(seconds=second)
    return {
        "schema_version": 1, "message_id": message_id, "entity": entity, "region": "primary",
        "outcome": "processed", "received_at": at, "settled_at": at, "finished_at": at,
        "process_id": pid, "session_id": session, "order_writer": "w" if session else None,
        "order_seq": seq,
    }  # fmt: skip


def _ledger(root: Path, sends: list[dict[str, Any]], receives: list[dict[str, Any]]) -> Path:
    for name, rows, schema in (
        ("sends", sends, send_schema()),
        ("receives", receives, receive_schema()),
    ):
        (root / name).mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(rows, schema), root / name / "0.parquet")
    return root


def _clean() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    sends = [_send(f"o{i}", "orders") for i in range(3)] + [_send("e0", "events")]
    receives = [_processed(f"o{i}", "orders", i + 1, session="s", seq=i + 1) for i in range(3)]
    receives += [_processed("e0", f"events/Subscriptions/{s}", 1) for s in "ab"]
    return sends, receives


def _check(tmp_path: Path, sends: Any, receives: Any, **options: Any) -> dict[str, EntityVerdict]:
    ledger = _ledger(tmp_path / "ledger", sends, receives)
    verdicts = check_run(ledger, ENTITIES, work_dir=tmp_path / "check", **options)
    return {v.entity: v for v in verdicts}


def test_a_clean_ledger_reports_nothing(tmp_path: Path) -> None:
    verdicts = _check(tmp_path, *_clean())
    assert set(verdicts) == set(ENTITIES)
    assert all(v.violations == 0 for v in verdicts.values())
    assert verdicts["orders"].sent == verdicts["orders"].processed == 3
    assert verdicts["events/Subscriptions/b"].processed == 1


def test_a_message_one_subscription_never_processed_is_lost_there_only(tmp_path: Path) -> None:
    sends, receives = _clean()
    receives = [r for r in receives if r["entity"] != "events/Subscriptions/b"]
    verdicts = _check(tmp_path, sends, receives)
    assert verdicts["events/Subscriptions/b"].lost == 1
    assert verdicts["events/Subscriptions/b"].lost_ids == ["e0"]
    assert verdicts["events/Subscriptions/a"].violations == 0


def test_a_message_processed_twice_is_reported(tmp_path: Path) -> None:
    sends, receives = _clean()
    receives.append(_processed("o1", "orders", 9, pid=3, session="s", seq=2))
    verdict = _check(tmp_path, sends, receives)["orders"]
    assert (verdict.processed_twice, verdict.twice_after_kill) == (1, 0)
    assert verdict.twice_ids == ["o1"] and verdict.violations >= 1


def test_a_session_pair_handled_out_of_order_is_reported(tmp_path: Path) -> None:
    sends, receives = _clean()
    receives[1]["finished_at"] = T0 + timedelta(seconds=10)  # seq 2 after seq 3
    verdict = _check(tmp_path, sends, receives)["orders"]
    assert verdict.out_of_order == 1 and verdict.lost == verdict.processed_twice == 0


def test_rows_a_kill_took_from_the_ledger_come_back_from_the_history(tmp_path: Path) -> None:
    sends, receives = _clean()
    sends = [s for s in sends if s["message_id"] != "o2"]  # its sender was killed
    receives = [r for r in receives if r["message_id"] != "o2"]
    history = [
        {"ev": "ack", "entity": "orders", "id": "o2", "t": T0.timestamp(), "pid": 1},
        # The killed receiver's handler finished, georep had not committed it...
        {"ev": "handled", "entity": "orders", "id": "o2", "t": T0.timestamp() + 3, "pid": 7},
    ]
    # ...so another receiver processed it again: excused as a duplicate after a kill.
    receives.append(_processed("o2", "orders", 12, pid=8))
    verdict = _check(tmp_path, sends, receives, history=history, killed_pids=[7])["orders"]
    assert (verdict.sent, verdict.lost, verdict.recovered_rows) == (3, 0, 1)
    assert (verdict.processed_twice, verdict.twice_after_kill, verdict.violations) == (1, 1, 0)
    # The same history from a process nobody killed: a real duplicate.
    again = _check(tmp_path / "again", sends, receives, history=history)["orders"]
    assert again.violations == 1 and again.unexplained_missing_rows == 1


def test_the_history_reader_skips_a_torn_last_line(tmp_path: Path) -> None:
    (tmp_path / "w.0.jsonl").write_text('{"ev": "ack", "id": "a"}\n{"ev": "han')
    assert read_history(tmp_path) == [{"ev": "ack", "id": "a"}]


def test_no_ledger_or_an_unknown_engine_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="no ledger"):
        check_run(tmp_path, ENTITIES, work_dir=tmp_path / "c")
    with pytest.raises(ConfigurationError, match="'pyarrow' or 'spark'"):
        check_run(tmp_path, ENTITIES, work_dir=tmp_path / "c", engine="duckdb")
