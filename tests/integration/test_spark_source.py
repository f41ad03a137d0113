"""The georep Structured Streaming source and sink on local[2] Spark, against the emulator.

Each source test runs a streaming query that reads a queue's two regions into a Parquet
table (``_spark_pipeline.py``: one directory per micro-batch) and checks the table holds
every acknowledged message exactly once, and that both regions end up empty (every copy
settled). One SparkSession serves the module; the first two tests kill a driver of their
own (a subprocess with its own JVM), the first before that session starts, the second
while it idles, so this module never runs two busy JVMs at once.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from _helpers import REDIS_URL, eventually, fault, on_emulator, progressing, stored
from _spark_pipeline import start_driver, start_query, table
from azure.servicebus import ServiceBusMessage
from pyspark.sql import SparkSession

from georep import FailoverPolicy, GeoReceiver, GeoSender
from georep.adapters.emulator import Emulator
from georep.adapters.redis import RedisSeenSet
from georep.adapters.spark import register, spark_session

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

HERE = Path(__file__).resolve().parent
LOCK = 5  # seconds: a copy whose holder died is redelivered this soon


@pytest.fixture(scope="module")
def spark() -> SparkSession:
    # local[2, 2]: a failed task is run once more (local mode's default is never), as on
    # a cluster (spark.task.maxFailures).
    session = spark_session("local[2,2]")
    register(session)
    return session


def _config(emu: Emulator, queue: str, root: Path, **extra: Any) -> dict[str, Any]:
    return {
        "primary": emu.connection_string("primary"),
        "secondary": emu.connection_string("secondary"),
        "queue": queue,
        "redis": REDIS_URL,
        "group": f"spark-source-{uuid.uuid4().hex[:8]}",
        "staging": str(root / "staging"),
        "checkpoint": str(root / "checkpoint"),
        "table": str(root / "table"),
        "max_per_batch": 30,
        "lease": LOCK,
        **extra,
    }


def _rows(root: str) -> Counter[str]:
    return Counter(i for ids in table(root).values() for i in ids)


async def _until_all_read(query: Any, emu: Emulator, queue: str, config: dict[str, Any], n: int):
    """Wait until the table holds ``n`` MessageIds and every copy is settled; fail with the
    query's own error if it died."""

    def rows() -> int:
        error = query.exception()
        assert error is None, error
        return len(_rows(config["table"]))

    # The first rows wait for the query's start (Python processes for the source, the
    # planner, the workers): seconds each on a loaded machine, without a row to show.
    assert await progressing(rows, n, stall=180), f"the table holds {rows()} of {n}"
    assert await eventually(lambda: stored(emu, queue) == 0, within=60), (
        f"{stored(emu, queue)} copies were never settled"
    )


async def _send(emu: Emulator, queue: str, ids: list[str], pad: int = 0, **options: Any) -> None:
    async with on_emulator(GeoSender, emu, queue, **options) as sender:
        for start in range(0, len(ids), 50):
            chunk = ids[start : start + 50]
            await sender.send_messages(
                [ServiceBusMessage(f"body {i}".ljust(pad), message_id=i) for i in chunk]
            )


async def _read_all_once(
    spark: SparkSession, config: dict[str, Any], emu: Emulator, queue: str, ids: list[str]
) -> None:
    """Run the pipeline's query until it has read ``ids``; each must be in the table once."""
    query = start_query(spark, config)
    try:
        await _until_all_read(query, emu, queue, config, len(ids))
    finally:
        query.stop()
    _assert_exactly_once(config["table"], ids)


def _assert_exactly_once(table: str, ids: list[str]) -> None:
    rows = _rows(table)
    assert sorted(rows) == sorted(ids), "lost or unexpected MessageIds"
    assert set(rows.values()) == {1}, [i for i, n in rows.items() if n > 1]


def _staged_for(config: dict[str, Any], micro_batch: int) -> list[str]:
    """The MessageIds staged for Spark's ``micro_batch``: the source's offset in Spark's
    offset log names the staged file."""
    log = (Path(config["checkpoint"]) / "offsets" / str(micro_batch)).read_text()
    offset = json.loads(log.splitlines()[-1])
    offset = json.loads(offset) if isinstance(offset, str) else offset
    staged = Path(config["staging"]) / f"batch-{int(offset['batch']):012d}.parquet"
    return [str(i) for i in pq.read_table(staged).column("message_id").to_pylist()]


async def test_a_driver_killed_between_staging_and_commit_reads_the_same_batch_again(
    emu: Emulator, private_queue: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    queue = private_queue("crash", lock_duration=LOCK)
    held = tmp_path / "held"
    config = _config(emu, queue, tmp_path)
    ids = [f"c{i}" for i in range(60)]
    await _send(emu, queue, ids, mode="active")  # two copies of each

    driver = start_driver(config, hold_from=1, held=str(held), log=tmp_path / "driver.log")
    try:
        assert await eventually(lambda: held.exists() or driver.poll() is not None, within=240)
        assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
        # Micro-batch 1 is planned and running, its rows staged; Spark never commits it.
        staged_ids = _staged_for(config, 1)
        assert 1 not in table(config["table"]), "the held batch was written"
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver, its JVM and Python workers
        driver.wait()

    await _read_all_once(request.getfixturevalue("spark"), config, emu, queue, ids)
    assert sorted(table(config["table"])[1]) == sorted(staged_ids), "batch 1 was not read again"


async def test_a_driver_killed_between_commit_and_settle_settles_on_restart_and_repeats_nothing(
    emu: Emulator, private_queue: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    queue = private_queue("settle", lock_duration=LOCK)
    # One micro-batch, then none for an hour: the source settles a committed batch when
    # Spark asks for the next one, so the first batch stays committed and unsettled.
    config = _config(emu, queue, tmp_path, trigger="1 hour", max_wait=60)
    ids = [f"s{i}" for i in range(60)]
    await _send(emu, queue, ids, mode="active")
    commits = Path(config["checkpoint"]) / "commits"

    driver = start_driver(config, log=tmp_path / "driver.log")
    try:
        assert await eventually(
            lambda: (commits / "0").exists() or driver.poll() is not None, within=240
        )
        assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
        first = table(config["table"])[0]
        assert first, "the first micro-batch was empty"
        # Spark committed it; the source has not recorded it, nor settled a copy.
        recorded = Path(config["staging"]) / "committed.json"
        assert not recorded.exists() or json.loads(recorded.read_text())["batch"] == 0
        assert stored(emu, queue) == 2 * len(ids)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()

    restart = {**config, "trigger": "200 milliseconds", "max_wait": 1}
    await _read_all_once(request.getfixturevalue("spark"), restart, emu, queue, ids)
    assert sorted(table(config["table"])[0]) == sorted(first), "batch 0 was rewritten"


async def test_both_regions_copies_of_each_message_become_one_row(
    spark: SparkSession, emu: Emulator, private_queue: Any, tmp_path: Path
) -> None:
    queue = private_queue("active", lock_duration=LOCK)
    config = _config(emu, queue, tmp_path)
    ids = [f"a{i}" for i in range(100)]
    await _send(emu, queue, ids, mode="active")
    assert stored(emu, queue) == 200

    await _read_all_once(spark, config, emu, queue, ids)
    frame = spark.read.parquet(config["table"])
    assert {r.region for r in frame.select("region").distinct().collect()} <= {
        "primary",
        "secondary",
    }
    assert {bytes(r.body) for r in frame.select("body").collect()} == {
        f"body {i}".encode() for i in ids
    }


async def test_a_micro_batch_holds_no_more_body_bytes_than_max_bytes_per_batch(
    spark: SparkSession, emu: Emulator, private_queue: Any, tmp_path: Path
) -> None:
    queue = private_queue("bytes", lock_duration=LOCK)
    config = _config(emu, queue, tmp_path, max_bytes_per_batch=2500)
    ids = [f"b{i}" for i in range(12)]
    await _send(emu, queue, ids, pad=1000, mode="active")  # two copies of 1,000 bytes each

    await _read_all_once(spark, config, emu, queue, ids)
    sizes = sorted(len(rows) for rows in table(config["table"]).values() if rows)
    assert sizes and sizes[-1] <= 2, sizes


@pytest.mark.parametrize("failure", ["outage", "blackhole"])
async def test_a_failure_of_the_primary_mid_stream_loses_and_repeats_nothing(
    spark: SparkSession, emu: Emulator, private_queue: Any, tmp_path: Path, failure: str
) -> None:
    queue = private_queue(failure, lock_duration=LOCK)
    config = _config(emu, queue, tmp_path)
    waves = [[f"w{wave}-{i}" for i in range(40)] for wave in range(3)]
    policy = FailoverPolicy(attempt_timeout=3)
    query = start_query(spark, config)
    try:
        async with on_emulator(GeoSender, emu, queue, policy=policy) as sender:
            for i in waves[0]:
                await sender.send_messages(ServiceBusMessage(f"body {i}", message_id=i))
            assert await eventually(lambda: len(_rows(config["table"])) >= 10, within=120)
            await fault(emu, "primary", failure)  # copies staged, waiting, locked in it
            for i in waves[1]:  # passive: these fail over to the secondary
                await sender.send_messages(ServiceBusMessage(f"body {i}", message_id=i))
            assert await eventually(lambda: waves[1][-1] in _rows(config["table"]), within=120)
            await fault(emu, "primary", "restore")
            for i in waves[2]:
                await sender.send_messages(ServiceBusMessage(f"body {i}", message_id=i))
        await _until_all_read(query, emu, queue, config, 120)
    finally:
        query.stop()
    _assert_exactly_once(config["table"], [i for wave in waves for i in wave])


async def test_an_executor_task_that_fails_is_run_again_on_the_same_rows(
    spark: SparkSession, emu: Emulator, private_queue: Any, tmp_path: Path
) -> None:
    queue = private_queue("task", lock_duration=LOCK)
    failed = tmp_path / "failed"
    config = _config(emu, queue, tmp_path, fail_marker=str(failed))
    ids = [f"t{i}" for i in range(60)]
    await _send(emu, queue, ids)

    await _read_all_once(spark, config, emu, queue, ids)  # each batch's first task fails
    assert failed.exists(), "no task failed"


async def _processed(emu: Emulator, queue: str) -> Counter[str]:
    """Each MessageId a GeoReceiver with a Redis seen-set handled, and how often, once the
    queue is empty in both regions."""
    handled: Counter[str] = Counter()

    async def handle(message: Any) -> None:
        handled[str(message.message_id)] += 1

    group = f"sink-{uuid.uuid4().hex[:8]}"
    async with (
        RedisSeenSet.from_url(REDIS_URL, group=group) as seen,
        on_emulator(GeoReceiver, emu, queue, seen=seen) as receiver,
    ):
        task = asyncio.create_task(receiver.run(handle))
        assert await eventually(lambda: stored(emu, queue) == 0, within=60)
        await receiver.aclose()
        await task
    return handled


async def test_the_sink_sends_a_replayed_batch_once(
    spark: SparkSession, emu: Emulator, private_queue: Any, tmp_path: Path
) -> None:
    queue = private_queue("sink")
    options = {
        "primaryConnectionString": emu.connection_string("primary"),
        "secondaryConnectionString": emu.connection_string("secondary"),
        "queueName": queue,
    }
    source = str(tmp_path / "rows")
    rows = [(f"k{i}", f"event {i}") for i in range(40)]
    spark.createDataFrame(rows, "key string, body string").coalesce(1).write.parquet(source)

    async def run_stream(checkpoint: str) -> None:
        # Started from this thread: Spark finds a Python data source through the active
        # session of the thread that starts the query (a new thread has none).
        query = (
            spark.readStream.schema("key string, body string").parquet(source)
            .writeStream.format("georep").options(**options, keyColumn="key", scope="orders")
            .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
        )  # fmt: skip
        assert await asyncio.to_thread(query.awaitTermination, 120)
        assert query.exception() is None

    # A lost checkpoint: Spark starts over at batch 0 with the same rows, the same ids.
    await run_stream(str(tmp_path / "checkpoint-1"))
    await run_stream(str(tmp_path / "checkpoint-2"))
    # A batch write run twice: its message_id column is the MessageId.
    batch = spark.createDataFrame(
        [(f"id-{i}", f"b {i}") for i in range(10)], "message_id string, body string"
    )
    for _ in range(2):
        batch.coalesce(1).write.format("georep").options(**options).mode("append").save()
    assert stored(emu, queue) == 2 * (40 + 10)

    handled = await _processed(emu, queue)
    assert len(handled) == 50 and set(handled.values()) == {1}
    assert {f"id-{i}" for i in range(10)} <= set(handled)


def test_a_query_killed_while_writing_its_first_offsets_starts_again_once_the_leftovers_go(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The soak's Spark sender, as a supervisor: Spark refuses a checkpoint with no offsets
    but a leftover ``offsets/.0.<uuid>.tmp`` (a kill mid-write); without it, it starts."""
    from georep.cli.soak.worker import discard_interrupted_writes

    inbox, checkpoint = tmp_path / "inbox", tmp_path / "checkpoint"
    inbox.mkdir()
    (inbox / "a.json").write_text('{"message_id": "a"}\n')

    def start() -> Any:
        return (
            spark.readStream.schema("message_id string")
            .json(str(inbox))
            .writeStream.format("parquet")
            .option("path", str(tmp_path / "out"))
            .option("checkpointLocation", str(checkpoint))
            .start()
        )

    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "offsets" / f".0.{uuid.uuid4()}.tmp").write_text("v1\n{")
    (checkpoint / "offsets" / f"..0.{uuid.uuid4()}.tmp.crc").write_bytes(b"crc")
    with pytest.raises(Exception, match="STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY"):
        start().awaitTermination(120)

    assert len(discard_interrupted_writes(checkpoint)) == 2
    query = start()
    try:
        query.processAllAvailable()
        assert query.exception() is None
        assert pq.read_table(tmp_path / "out").column("message_id").to_pylist() == ["a"]
        assert (checkpoint / "commits" / "0").exists()
    finally:
        query.stop()
