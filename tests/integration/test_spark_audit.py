"""The Spark ledger audit on local[2]: counts, report.json, plots, CLI, spark-submit, sink.

One SparkSession serves the whole module (and the process): starting Spark costs seconds.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _helpers import on_emulator
from pyspark.sql import SparkSession
from typer.testing import CliRunner

from georep import ConfigurationError, GeoReceiver, GeoSender
from georep.adapters.emulator import Emulator
from georep.adapters.redis import RedisSeenSet
from georep.adapters.spark import (
    SyntheticLedger,
    audit,
    audit_job,
    foreach_batch_sink,
    reference_audit,
    spark_aggregates,
    spark_session,
    write_session_ledger,
    write_synthetic_ledger,
)
from georep.cli import app

# The module's first test starts the lane's Spark (a JVM): on a loaded two-core machine
# that alone has taken over the default 120 s, and a start cut short by the timeout left
# a half-started gateway that failed every later Spark test of the lane.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def spark() -> SparkSession:
    return spark_session("local[2]")


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> SyntheticLedger:
    root = tmp_path_factory.mktemp("spark-audit") / "ledger"
    return write_synthetic_ledger(root, messages=20_000, chunk_size=6_000, duration=120.0)


@pytest.fixture(scope="module")
def report(
    spark: SparkSession, ledger: SyntheticLedger, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("spark-audit-out")
    return audit(ledger.path, out_dir=out, master="local[2]", outage_windows=[ledger.outage_window])


def test_spark_reports_exactly_the_injected_loss_and_double_processing(
    ledger: SyntheticLedger, report: dict[str, Any]
) -> None:
    assert (ledger.lost, ledger.processed_more_than_once) == (20, 10)  # 0.1 %, 0.05 %
    for count in ("lost", "processed_more_than_once", "sent", "processed", "suppressed_by_region"):
        assert report[count] == getattr(ledger, count), count
    assert report["failover"]["sends"] == ledger.failover_sends


def test_spark_and_the_pyarrow_reference_give_the_same_report(
    ledger: SyntheticLedger, report: dict[str, Any]
) -> None:
    reference = reference_audit(ledger.path, outage_windows=[ledger.outage_window])
    only_spark = {"engine", "plots", "report_path"}
    assert {k: v for k, v in report.items() if k not in only_spark} == {
        k: v for k, v in reference.items() if k != "engine"
    }


def _settled_otherwise_ledger(root: Path) -> Path:
    """A ledger written by ParquetLedger with dead-lettered, deferred and expired ids."""
    from georep import ParquetLedger
    from georep.ports import ReceiveRecord, RegionAttempt, SendRecord

    def send(ids: tuple[str, ...], outcome: str) -> SendRecord:
        accepted = "primary" if outcome == "accepted" else None
        attempts = [RegionAttempt(accepted, outcome)] if accepted else []
        return SendRecord(ids, "q", "passive", outcome, accepted, False, attempts, 1.0, 1.1)

    def receive(message_id: str, outcome: str, region: str = "primary") -> ReceiveRecord:
        return ReceiveRecord(message_id, "q", region, outcome, 1, 1.2, 1.3, 1.4)

    async def write() -> None:
        async with ParquetLedger(root) as ledger:
            ledger.record_send(send(("dead", "deferred", "gone", "ok"), "accepted"))
            ledger.record_send(send(("expired",), "queued"))
            ledger.record_send(send(("expired",), "expired"))
            for record in (
                receive("dead", "failed"),
                receive("dead", "dead_lettered"),
                receive("dead", "dead_lettered", "secondary"),
                receive("deferred", "deferred"),
                receive("ok", "processed"),
            ):
                ledger.record_receive(record)

    asyncio.run(write())
    return root


def test_the_id_shuffle_has_one_partition_per_two_million_rows() -> None:
    from georep.adapters.spark._audit import _partitions_for

    assert _partitions_for(10_000, floor=2) == 2  # at least one per core
    assert _partitions_for(20_000_000, floor=2) == 10
    assert _partitions_for(200_000_001, floor=2) == 101


def test_the_id_shuffle_rows_are_counted_by_the_first_jobs_and_partitions_do_not_matter(
    spark: SparkSession, ledger: SyntheticLedger
) -> None:
    from georep.adapters.spark._audit import (
        _per_message,
        _read_ledger,
        _receives_side,
        _sends_side,
    )
    from georep.adapters.spark._report import Aggregates

    sends, receives = _read_ledger(spark, ledger.path)
    modes, send_rows = _sends_side(sends, Aggregates())
    regions, copy_rows = _receives_side(receives, Aggregates())
    assert send_rows == ledger.messages
    # Every processed copy (the doubles' second copies too); suppressed and failed: not.
    assert copy_rows == ledger.processed + ledger.processed_more_than_once

    def rows(partitions: int) -> list[str]:
        frame = _per_message(sends, receives, modes, regions, partitions)
        return sorted(repr(row) for row in frame.collect())

    assert rows(1) == rows(7)


def test_dead_lettered_deferred_and_expired_ids_are_not_lost_in_either_engine(
    spark: SparkSession, tmp_path: Path
) -> None:
    ledger = _settled_otherwise_ledger(tmp_path / "ledger")
    report = audit(ledger, out_dir=tmp_path / "out", master="local[2]")
    reference = reference_audit(ledger)
    counts = ("sent", "processed", "lost", "dead_lettered", "deferred", "expired")
    assert [report[k] for k in counts] == [5, 1, 1, 1, 1, 1]
    assert [reference[k] for k in counts] == [report[k] for k in counts]


def test_both_engines_report_the_session_order_figures(spark: SparkSession, tmp_path: Path) -> None:
    from georep.adapters.spark._report import _sessions

    ledger = tmp_path / "ledger"
    expected = write_session_ledger(ledger)
    assert _sessions(spark_aggregates(spark, ledger)) == expected
    assert reference_audit(ledger)["sessions"] == expected


def test_report_json_holds_the_returned_report_and_the_plots_are_pngs(
    report: dict[str, Any],
) -> None:
    written = json.loads(Path(report["report_path"]).read_text())
    assert written == json.loads(json.dumps(report))
    for key in ("sent", "processed", "lost", "processed_more_than_once",
                "suppressed_by_region", "latency_ms"):  # fmt: skip
        assert key in written
    assert set(written["latency_ms"]) == {"overall", "by_mode", "by_region"}
    assert set(written["latency_ms"]["by_mode"]) == {"active", "passive", "paired"}
    assert written["outage_windows"] and written["timeline"]["seconds"] >= 120
    for name in ("timeline", "latency_cdf"):
        path = Path(report["plots"][name])
        assert path.name == f"{name}.png"
        assert path.read_bytes()[:8] == PNG


def test_cli_exits_1_on_loss_and_0_on_a_clean_ledger(
    spark: SparkSession, ledger: SyntheticLedger, tmp_path: Path
) -> None:
    runner = CliRunner()
    faulty = runner.invoke(app, ["audit", str(ledger.path), "--master", "local[2]", "--no-plots"])
    assert faulty.exit_code == 1, faulty.output
    assert "lost" in faulty.output
    clean = write_synthetic_ledger(tmp_path / "clean", messages=2_000, loss_rate=0, double_rate=0)
    out = tmp_path / "out"
    result = runner.invoke(
        app, ["audit", str(clean.path), "--master", "local[2]", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert f"report: {out / 'report.json'}" in result.output
    assert (out / "timeline.png").exists() and (out / "latency_cdf.png").exists()


def test_cli_exits_2_naming_a_missing_ledger(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["audit", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert "does not exist" in result.output


def test_audit_job_main_returns_1_when_messages_were_lost(
    spark: SparkSession, ledger: SyntheticLedger, tmp_path: Path
) -> None:
    assert audit_job.main([str(ledger.path), "--out", str(tmp_path), "--no-plots"]) == 1
    assert json.loads((tmp_path / "report.json").read_text())["lost"] == ledger.lost


def test_audit_job_runs_under_spark_submit(ledger: SyntheticLedger, tmp_path: Path) -> None:
    spark_submit = Path(sys.executable).with_name("spark-submit")
    if not spark_submit.exists():
        spark_submit = Path(shutil.which("spark-submit") or "spark-submit")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    result = subprocess.run(
        [
            str(spark_submit), "--master", "local[1]",
            "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
            "--conf", "spark.ui.enabled=false",
            audit_job.__file__, str(ledger.path), "--out", str(tmp_path), "--no-plots",
        ],
        capture_output=True, text=True, env=env, timeout=240, check=False,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-2000:]
    assert json.loads((tmp_path / "report.json").read_text())["lost"] == ledger.lost


def test_a_ledger_given_as_a_uri_is_read_through_spark_with_its_meta(
    spark: SparkSession, tmp_path: Path
) -> None:
    ledger = write_synthetic_ledger(tmp_path / "ledger", messages=3_000, dropped_receives=2)
    report = audit(ledger.path.as_uri(), master="local[2]", plots=False)
    assert (report["lost"], report["sent"]) == (ledger.lost, ledger.sent)
    assert report["ledger_rows_dropped"] == 2 and report["loss_is_bound"]
    with pytest.raises(ConfigurationError, match="holds no ledger"):
        audit((tmp_path / "missing").as_uri(), master="local[2]", plots=False)


@pytest.fixture
def sink_queue(georep_emulator_factory: Callable[..., Emulator]) -> Iterator[tuple[Emulator, str]]:
    emulator = georep_emulator_factory(queues=("spark-sink",))
    yield emulator, "spark-sink"


def _stored(emu: Emulator, queue: str) -> int:
    return sum(emu.namespace(n).message_count(queue) for n in emu.namespaces)


def _sink(emu: Emulator, queue: str, batch_size: int = 100) -> Callable[[Any, int], None]:
    return foreach_batch_sink(
        lambda: on_emulator(GeoSender, emu, queue),
        body_col="body", key_col="key", scope=f"test-{uuid.uuid4().hex[:8]}",
        batch_size=batch_size,
    )  # fmt: skip


async def _receive_all(emu: Emulator, queue: str) -> tuple[Counter[str], set[str], int]:
    """Run a GeoReceiver with a Redis seen-set until the queue is empty.

    Returns:
        Handler calls per MessageId, the bodies handled, and the copies suppressed.
    """
    processed: Counter[str] = Counter()
    bodies: set[str] = set()

    async def handle(message: Any) -> None:
        processed[str(message.message_id)] += 1
        bodies.add(str(message))

    seen = RedisSeenSet(REDIS_URL, group=f"spark-sink-{uuid.uuid4().hex[:8]}", window=600)
    try:
        async with on_emulator(GeoReceiver, emu, queue, seen=seen) as receiver:
            task = asyncio.create_task(receiver.run(handle))
            deadline = time.monotonic() + 60
            # Polls the broker's message count, which no event signals.
            while _stored(emu, queue) and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            await receiver.aclose()
            await task
    finally:
        await seen.aclose()
    assert _stored(emu, queue) == 0
    return processed, bodies, sum(receiver.stats.suppressed.values())


async def test_a_replayed_micro_batch_is_processed_once(
    spark: SparkSession, sink_queue: tuple[Emulator, str]
) -> None:
    emu, queue = sink_queue
    rows = [(f"order-{i}", f"body {i}") for i in range(40)]
    df = spark.createDataFrame(rows, "key string, body string")
    sink = _sink(emu, queue, batch_size=16)
    # Spark calls foreachBatch on a thread of its own; a replay repeats the batch id.
    await asyncio.to_thread(sink, df, 7)
    await asyncio.to_thread(sink, df, 7)
    assert _stored(emu, queue) == 80, "both attempts reached the broker"

    processed, bodies, suppressed = await _receive_all(emu, queue)
    assert len(processed) == 40 and set(processed.values()) == {1}
    assert bodies == {body for _, body in rows}
    assert suppressed == 40


# 30 rows put the replays of rows 1 and 2 in the same receive turn as their originals
# (concurrency 32); 40 rows keep every replay out of its original's turn.
@pytest.mark.parametrize("row_count", [30, 40])
async def test_a_streaming_query_rerun_from_a_lost_checkpoint_delivers_each_row_once(
    spark: SparkSession, sink_queue: tuple[Emulator, str], tmp_path: Path, row_count: int
) -> None:
    emu, queue = sink_queue
    source = tmp_path / "source"
    rows = [(f"k{i}", f"event {i}") for i in range(row_count)]
    spark.createDataFrame(rows, "key string, body string").write.parquet(str(source))
    sink = _sink(emu, queue)

    def run_query(checkpoint: Path) -> None:
        query = (
            spark.readStream.schema("key string, body string")
            .parquet(str(source))
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(120), "the streaming query did not finish"
        assert query.exception() is None

    # A lost checkpoint makes Spark start over at batch 0 with the same rows.
    await asyncio.to_thread(run_query, tmp_path / "checkpoint-1")
    await asyncio.to_thread(run_query, tmp_path / "checkpoint-2")
    assert _stored(emu, queue) == 2 * row_count

    processed, bodies, _ = await _receive_all(emu, queue)
    assert len(processed) == row_count and set(processed.values()) == {1}
    assert bodies == {body for _, body in rows}


async def test_a_row_without_a_key_fails_the_batch(
    spark: SparkSession, sink_queue: tuple[Emulator, str]
) -> None:
    emu, queue = sink_queue
    df = spark.createDataFrame([("a", "x"), (None, "y")], "key string, body string")
    with pytest.raises(ConfigurationError, match="null 'key'"):
        await asyncio.to_thread(_sink(emu, queue), df, 1)
    with pytest.raises(ConfigurationError, match="no column 'body'"):
        await asyncio.to_thread(_sink(emu, queue), df.drop("body"), 2)
