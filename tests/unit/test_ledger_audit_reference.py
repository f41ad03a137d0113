"""The single-machine audit (pyarrow + numpy) and the synthetic ledgers it is checked on."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from georep import ConfigurationError
from georep.adapters.spark import (
    reference_audit,
    sink_message_id,
    write_session_ledger,
    write_synthetic_ledger,
)
from georep.ledger.schema import receive_schema, send_schema

REQUIRED_KEYS = {
    "sent",
    "processed",
    "lost",
    "processed_more_than_once",
    "suppressed_by_region",
    "latency_ms",
    "timeline",
    "failover",
    "ledger_rows_dropped",
}
T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def _send(message_id: str, *, mode: str = "passive", outcome: str = "accepted",
          started_ms: int = 0, region: str | None = "east") -> dict[str, object]:  # fmt: skip
    started = pa.scalar(int(T0.timestamp() * 1e6) + started_ms * 1000, pa.timestamp("us", "UTC"))
    return {
        "schema_version": 1, "message_id": message_id, "entity": "q", "mode": mode,
        "outcome": outcome, "accepted_region": region, "failover": False, "regions": [],
        "started_at": started.as_py(), "finished_at": started.as_py(), "process_id": 1,
        "host": "h",
    }  # fmt: skip


def _receive(message_id: str, *, region: str = "east", outcome: str = "processed",
             received_ms: int = 0) -> dict[str, object]:  # fmt: skip
    received = pa.scalar(
        int(T0.timestamp() * 1e6) + received_ms * 1000, pa.timestamp("us", "UTC")
    ).as_py()
    return {
        "schema_version": 1, "message_id": message_id, "entity": "q", "region": region,
        "outcome": outcome, "delivery_count": 1, "enqueued_at": None, "received_at": received,
        "settled_at": None, "process_id": 2, "host": "h",
    }  # fmt: skip


def _ledger(root: Path, sends: list[dict[str, object]], receives: list[dict[str, object]]) -> Path:
    (root / "sends").mkdir(parents=True)
    (root / "receives").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(sends, schema=send_schema()), root / "sends" / "a.parquet")
    pq.write_table(
        pa.Table.from_pylist(receives, schema=receive_schema()), root / "receives" / "a.parquet"
    )
    return root


def test_reference_reports_exactly_the_injected_loss_and_double_processing(
    tmp_path: Path,
) -> None:
    ledger = write_synthetic_ledger(tmp_path / "ledger", messages=20_000, chunk_size=7_000)
    report = reference_audit(ledger.path)
    assert ledger.lost == 20 and ledger.processed_more_than_once == 10  # 0.1 %, 0.05 %
    # Each count the audit reports is the number the synthetic ledger injected.
    for count in ("lost", "processed_more_than_once", "sent", "processed", "send_failed"):
        assert report[count] == getattr(ledger, count), count
    assert report["suppressed_by_region"] == ledger.suppressed_by_region
    assert report["failover"]["sends"] == ledger.failover_sends
    assert report.keys() >= REQUIRED_KEYS


def test_with_an_out_dir_the_reference_writes_the_report_and_plots_as_spark_does(
    tmp_path: Path,
) -> None:
    ledger = write_synthetic_ledger(tmp_path / "ledger", messages=2_000, duration=20.0)
    report = reference_audit(ledger.path, out_dir=tmp_path / "report", plots=True)
    written = json.loads((tmp_path / "report" / "report.json").read_text())
    assert written == report and written["engine"] == "pyarrow"
    assert written["report_path"] == str(tmp_path / "report" / "report.json")
    for plot in ("timeline.png", "latency_cdf.png"):
        assert (tmp_path / "report" / plot).stat().st_size > 10_000
    assert reference_audit(ledger.path).get("report_path") is None  # no out_dir: no files


def test_synthetic_ledger_marks_a_failover_window_inside_the_outage(tmp_path: Path) -> None:
    ledger = write_synthetic_ledger(tmp_path / "ledger", messages=5_000, duration=100.0)
    failover = reference_audit(ledger.path)["failover"]
    start, end = ledger.outage_window
    first = datetime.fromisoformat(failover["first_second"].replace("Z", "+00:00"))
    last = datetime.fromisoformat(failover["last_second"].replace("Z", "+00:00"))
    assert start <= first <= last < end
    assert 1000 <= failover["duration_ms"]["p50"] <= failover["duration_ms"]["max"] < 1100


def test_latency_is_measured_from_the_first_acknowledged_send_to_the_first_processed_copy(
    tmp_path: Path,
) -> None:
    sends = [
        _send("a", started_ms=0),
        _send("a", started_ms=5),  # a resend: the first send counts
        _send("b", mode="active", started_ms=0),
        _send("c", outcome="failed", started_ms=0, region=None),
    ]
    receives = [
        _receive("a", received_ms=20),
        _receive("b", region="west", received_ms=40),
        _receive("b", region="east", received_ms=90),  # processed twice
        _receive("b", region="west", outcome="suppressed", received_ms=95),
    ]
    report = reference_audit(_ledger(tmp_path / "l", sends, receives))
    assert (report["sent"], report["processed"], report["lost"]) == (2, 2, 0)
    assert report["processed_more_than_once"] == 1
    assert report["send_failed"] == 1
    assert report["suppressed_by_region"] == {"west": 1}
    latency = report["latency_ms"]
    assert latency["by_mode"]["passive"]["p50"] == pytest.approx(20, rel=1e-3)
    assert latency["by_mode"]["active"]["max"] == pytest.approx(40)
    assert set(latency["by_region"]) == {"east", "west"}


def test_an_acknowledged_message_without_a_processed_copy_is_lost(tmp_path: Path) -> None:
    sends = [_send("a"), _send("b", outcome="queued", region=None)]
    receives = [_receive("a", received_ms=3), _receive("b", outcome="failed", received_ms=4)]
    report = reference_audit(_ledger(tmp_path / "l", sends, receives))
    assert report["lost"] == 1
    assert report["receive_failed_by_region"] == {"east": 1}


def test_rows_dropped_by_writers_are_summed_and_make_loss_a_bound(tmp_path: Path) -> None:
    ledger = write_synthetic_ledger(
        tmp_path / "ledger", messages=1_000, dropped_sends=3, dropped_receives=4
    )
    (ledger.path / "meta" / "other.json").write_text(
        json.dumps({"schema_version": 1, "dropped_sends": 1, "dropped_receives": 0})
    )
    report = reference_audit(ledger.path)
    assert report["ledger_rows_dropped"] == 8
    assert report["loss_is_bound"] is True
    assert any("dropped 8 rows" in w for w in report["warnings"])


def test_temporary_files_of_a_writer_are_not_read(tmp_path: Path) -> None:
    root = _ledger(tmp_path / "l", [_send("a")], [_receive("a", received_ms=1)])
    pq.write_table(
        pa.Table.from_pylist([_send("x")], schema=send_schema()),
        root / "sends" / ".b.parquet.tmp",
    )
    pq.write_table(
        pa.Table.from_pylist([_send("y")], schema=send_schema()), root / "sends" / "_c.parquet"
    )
    assert reference_audit(root)["sent"] == 1


def test_a_missing_ledger_directory_is_named_in_the_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="does not exist"):
        reference_audit(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigurationError, match="holds no ledger"):
        reference_audit(tmp_path / "empty")


def test_outage_windows_need_time_zones(tmp_path: Path) -> None:
    root = _ledger(tmp_path / "l", [_send("a")], [_receive("a", received_ms=1)])
    window = (datetime(2026, 3, 1, 12, 0), datetime(2026, 3, 1, 12, 1))
    with pytest.raises(ConfigurationError, match="no time zone"):
        reference_audit(root, outage_windows=[window])
    report = reference_audit(root, outage_windows=[("2026-03-01T12:00:00Z", T0)])
    assert report["outage_windows"] == [
        {"start": "2026-03-01T12:00:00Z", "end": "2026-03-01T12:00:00Z"}
    ]


def test_synthetic_generator_refuses_to_overwrite_a_ledger(tmp_path: Path) -> None:
    write_synthetic_ledger(tmp_path / "l", messages=10)
    with pytest.raises(ConfigurationError, match="already holds a ledger"):
        write_synthetic_ledger(tmp_path / "l", messages=10)


def test_sink_message_ids_depend_on_scope_batch_and_key_only() -> None:
    assert sink_message_id("q", 3, "k") == sink_message_id("q", 3, "k")
    assert sink_message_id("q", 3, "k") != sink_message_id("q", 4, "k")
    assert sink_message_id("q", 3, "k") != sink_message_id("other", 3, "k")


def test_messages_settled_otherwise_or_expired_are_counted_apart_not_lost(
    tmp_path: Path,
) -> None:
    sends = [
        _send("dead"),
        _send("deferred"),
        _send("expired", outcome="queued", region=None),
        _send("expired", outcome="expired", region=None),
        _send("gone"),
        _send("ok"),
    ]
    receives = [
        _receive("dead", outcome="failed"),
        _receive("dead", outcome="dead_lettered", received_ms=5),
        _receive("dead", region="west", outcome="dead_lettered", received_ms=6),  # its twin
        _receive("deferred", outcome="deferred"),
        _receive("ok", received_ms=3),
    ]
    report = reference_audit(_ledger(tmp_path / "l", sends, receives))
    assert (report["sent"], report["processed"]) == (5, 1)
    assert (report["dead_lettered"], report["deferred"], report["expired"]) == (1, 1, 1)
    assert report["lost"] == 1, "only 'gone' was acknowledged and never settled"
    assert report["send_failed"] == 0


def test_the_reference_reports_sessions_out_of_order_copies_gaps_and_waits(
    tmp_path: Path,
) -> None:
    ledger = tmp_path / "ledger"
    expected = write_session_ledger(ledger)
    assert reference_audit(ledger)["sessions"] == expected


def test_a_ledger_without_sessions_reports_none(tmp_path: Path) -> None:
    root = _ledger(tmp_path, [_send("m1")], [_receive("m1")])
    assert reference_audit(root)["sessions"] == {
        "sessions": 0,
        "messages": 0,
        "out_of_order": 0,
        "out_of_order_by_distance": {},
        "max_out_of_order_distance": 0,
        "order_gaps": {},
        "order_wait_s": {"total": 0.0, "max": 0.0},
    }
