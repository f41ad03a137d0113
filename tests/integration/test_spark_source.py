"""The georep Structured Streaming source and sink on local[2] Spark, against the emulator.

Each source test runs a streaming query that reads a queue's two regions into a Parquet
table (``_spark_pipeline.py``: one directory per micro-batch) and checks the table holds
every acknowledged message exactly once, and that both regions end up empty (every copy
settled). One SparkSession serves the module; the first test kills a driver of its own (a
subprocess with its own JVM) before it asks for that session, so this module never runs
two JVMs at once.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from _helpers import REDIS_URL, eventually, fault, on_emulator, progressing, stored
from _spark_pipeline import ENVIRONMENT, start_query
from azure.servicebus import ServiceBusMessage
from pyspark.sql import SparkSession

from georep import FailoverPolicy, GeoReceiver, GeoSender
from georep.adapters.emulator import Emulator
from georep.adapters.redis import RedisSeenSet
from georep.adapters.spark import register, spark_session

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

HERE = Path(__file__).resolve().parent
LOCK = 5  # seconds: a copy whose holder died is redelivered this soon


@pytest.fixture(scope="module")
def spark() -> SparkSession:
    session = spark_session("local[2]")
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
        "max_per_batch": 20,
        "lease": LOCK,
        **extra,
    }


def _table(root: str) -> dict[int, list[str]]:
    """The table's MessageIds by micro-batch (what a reader of the table sees now)."""
    batches: dict[int, list[str]] = {}
    for directory in Path(root).glob("batch=*"):
        try:
            files = sorted(directory.glob("part-*.parquet"))
            ids = [i for f in files for i in pq.read_table(f).column("message_id").to_pylist()]
        except (FileNotFoundError, OSError):  # Spark is rewriting it: read it next time
            continue
        batches[int(directory.name.split("=")[1])] = ids
    return batches


def _rows(root: str) -> Counter[str]:
    return Counter(i for ids in _table(root).values() for i in ids)


async def _until_all_read(query: Any, emu: Emulator, queue: str, config: dict[str, Any], n: int):
    """Wait until the table holds ``n`` MessageIds and every copy is settled; fail with the
    query's own error if it died."""

    def rows() -> int:
        error = query.exception()
        assert error is None, error
        return len(_rows(config["table"]))

    assert await progressing(rows, n, stall=60), f"the table holds {rows()} of {n}"
    assert await eventually(lambda: stored(emu, queue) == 0, within=60), (
        f"{stored(emu, queue)} copies were never settled"
    )


async def _send(emu: Emulator, queue: str, ids: list[str], **options: Any) -> None:
    async with on_emulator(GeoSender, emu, queue, **options) as sender:
        for start in range(0, len(ids), 50):
            chunk = ids[start : start + 50]
            await sender.send_messages(
                [ServiceBusMessage(f"body {i}", message_id=i) for i in chunk]
            )


def _assert_exactly_once(table: str, ids: list[str]) -> None:
    rows = _rows(table)
    assert sorted(rows) == sorted(ids), "lost or unexpected MessageIds"
    assert set(rows.values()) == {1}, [i for i, n in rows.items() if n > 1]


def _start_driver(config: dict[str, Any], *, log: Path, **hold: Any) -> subprocess.Popen[bytes]:
    """The pipeline's driver in a process group of its own (its JVM and Python workers
    with it), holding from micro-batch ``hold["hold_from"]`` on."""
    environment = {**os.environ, ENVIRONMENT: json.dumps({**config, **hold})}
    with log.open("w") as output:
        return subprocess.Popen(
            [sys.executable, str(HERE / "_spark_pipeline.py")],
            env=environment, stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def _planned_not_committed(staging: Path) -> list[str]:
    """The MessageIds of the first batch staged beyond the last one committed."""
    committed = json.loads((staging / "committed.json").read_text())["batch"]
    planned = [p for p in sorted(staging.glob("batch-*.parquet")) if int(p.stem[6:]) > committed]
    assert planned, "nothing staged beyond the committed batches"
    return [str(i) for i in pq.read_table(planned[0]).column("message_id").to_pylist()]


async def test_a_driver_killed_between_staging_and_commit_reads_the_same_batch_again(
    emu: Emulator, private_queue: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    queue = private_queue("crash", lock_duration=LOCK)
    held = tmp_path / "held"
    config = _config(emu, queue, tmp_path)
    ids = [f"c{i}" for i in range(60)]
    await _send(emu, queue, ids, mode="active")  # two copies of each

    driver = _start_driver(config, hold_from=1, held=str(held), log=tmp_path / "driver.log")
    try:
        assert await eventually(lambda: held.exists() or driver.poll() is not None, within=240)
        assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
        # Micro-batch 1 is planned and running, its rows staged; Spark never commits it.
        staged_ids = _planned_not_committed(Path(config["staging"]))
        assert 1 not in _table(config["table"]), "the held batch was written"
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver, its JVM and Python workers
        driver.wait()

    query = start_query(request.getfixturevalue("spark"), config)
    try:
        await _until_all_read(query, emu, queue, config, len(ids))
    finally:
        query.stop()
    _assert_exactly_once(config["table"], ids)
    assert sorted(_table(config["table"])[1]) == sorted(staged_ids), "batch 1 was not read again"


async def test_both_regions_copies_of_each_message_become_one_row(
    spark: SparkSession, emu: Emulator, private_queue: Any, tmp_path: Path
) -> None:
    queue = private_queue("active", lock_duration=LOCK)
    config = _config(emu, queue, tmp_path)
    ids = [f"a{i}" for i in range(100)]
    await _send(emu, queue, ids, mode="active")
    assert stored(emu, queue) == 200

    query = start_query(spark, config)
    try:
        await _until_all_read(query, emu, queue, config, len(ids))
    finally:
        query.stop()
    _assert_exactly_once(config["table"], ids)
    table = spark.read.parquet(config["table"])
    assert {r.region for r in table.select("region").distinct().collect()} <= {
        "primary",
        "secondary",
    }
    assert {bytes(r.body) for r in table.select("body").collect()} == {
        f"body {i}".encode() for i in ids
    }


async def test_an_outage_of_the_primary_mid_stream_loses_and_repeats_nothing(
    spark: SparkSession, emu: Emulator, private_queue: Any, tmp_path: Path
) -> None:
    queue = private_queue("outage", lock_duration=LOCK)
    config = _config(emu, queue, tmp_path)
    waves = [[f"w{wave}-{i}" for i in range(50)] for wave in range(3)]
    policy = FailoverPolicy(attempt_timeout=3)
    query = start_query(spark, config)
    try:
        async with on_emulator(GeoSender, emu, queue, policy=policy) as sender:
            for i in waves[0]:
                await sender.send_messages(ServiceBusMessage(f"body {i}", message_id=i))
            assert await eventually(lambda: len(_rows(config["table"])) >= 10, within=120)
            await fault(emu, "primary", "outage")  # copies staged, waiting, locked in it
            for i in waves[1]:  # passive: these fail over to the secondary
                await sender.send_messages(ServiceBusMessage(f"body {i}", message_id=i))
            assert await eventually(lambda: waves[1][-1] in _rows(config["table"]), within=120)
            await fault(emu, "primary", "restore")
            for i in waves[2]:
                await sender.send_messages(ServiceBusMessage(f"body {i}", message_id=i))
        await _until_all_read(query, emu, queue, config, 150)
    finally:
        query.stop()
    _assert_exactly_once(config["table"], [i for wave in waves for i in wave])


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
