"""The audit, the georep source and sink, and the foreachBatch sink on a Spark standalone
cluster (a master and two workers on loopback), each driver in a process of its own: Spark
allows one session per process, and the rest of the suite runs local mode."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from _helpers import REDIS_URL, REPO, drain_ids, eventually, progressing, stored
from _spark_cluster import SparkCluster, cluster_env, spark_standalone
from _spark_pipeline import start_driver, table
from azure.servicebus import ServiceBusMessage

from georep import GeoSender, ReplicationMode
from georep.adapters.emulator import Emulator
from georep.adapters.spark import SyntheticLedger, reference_audit, write_synthetic_ledger

pytestmark = [pytest.mark.integration, pytest.mark.heavy, pytest.mark.timeout(600)]

HERE = Path(__file__).resolve().parent
# What differs between two runs of one audit: where they wrote, and which engine ran.
_RUN_SPECIFIC = {"engine", "plots", "report_path"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    with spark_standalone(tmp_path_factory.mktemp("spark-cluster")) as running:
        yield running


def _driver(args: list[str], cluster: SparkCluster) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, *args],
        capture_output=True, text=True, env=cluster_env(), cwd=REPO, timeout=540, check=False,
    )  # fmt: skip
    assert result.returncode == 0, f"exited {result.returncode}:\n{result.stderr[-3000:]}"
    return result


# One driver application for the audit and both sinks: each application costs the lane a
# driver JVM and an executor JVM per worker (about 20 s of CPU on two cores), and what is
# tested is what runs on the executors, not how many applications did it. The audit is the
# CLI's own command (`georep audit --master spark://...`), run in the driver's process: it
# takes the session the driver started, as under spark-submit.
_CLUSTER_JOB = """
import sys
from georep import GeoSender
from georep.adapters.spark import foreach_batch_sink, register, spark_session
from georep.cli import app

master, ledger, out, primary, secondary, queue, source, checkpoint = sys.argv[1:]
spark = spark_session(master)
status = app(["audit", ledger, "--master", master, "--out", out, "--no-plots"],
             standalone_mode=False)
print("audit exit status:", status)
register(spark)
rows = [(f"k{i}", f"event {i}") for i in range(50)]
spark.createDataFrame(rows, "key string, body string").repartition(4).write.parquet(source)
sink = foreach_batch_sink(
    lambda: GeoSender.from_connection_strings(primary, secondary, queue_name=queue),
    scope="standalone-test",
)
query = (
    spark.readStream.schema("key string, body string").parquet(source)
    .writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
    .trigger(availableNow=True).start()
)
assert query.awaitTermination(120) and query.exception() is None
# The georep format's batch write: each task (on a worker) sends its rows.
rows = [(f"id-{i}", f"direct {i}") for i in range(20)]
spark.createDataFrame(rows, "message_id string, body string").repartition(2).write.format(
    "georep"
).options(
    primaryConnectionString=primary, secondaryConnectionString=secondary, queueName=queue
).mode("append").save()
print("executors:", spark.sparkContext.master)
"""


@dataclass(frozen=True)
class ClusterJob:
    """What the one driver application did: its output, the ledger it audited, where the
    audit wrote, and the queue its sinks sent to."""

    stdout: str
    ledger: SyntheticLedger
    out: Path
    queue: str


@pytest.fixture(scope="module")
def cluster_job(
    cluster: SparkCluster, georep_emulator: Emulator, tmp_path_factory: pytest.TempPathFactory
) -> ClusterJob:
    work = tmp_path_factory.mktemp("cluster-job")
    ledger = write_synthetic_ledger(work / "ledger", messages=20_000, chunk_size=6_000)
    queue = _new_queue(georep_emulator)
    result = _driver(
        ["-c", _CLUSTER_JOB, cluster.master_url, str(ledger.path), str(work / "audit"),
         georep_emulator.connection_string("primary"),
         georep_emulator.connection_string("secondary"), queue, str(work / "source"),
         str(work / "checkpoint")],
        cluster,
    )  # fmt: skip
    return ClusterJob(result.stdout, ledger, work / "audit", queue)


def test_the_audit_on_a_standalone_cluster_gives_the_reference_report(
    cluster: SparkCluster, cluster_job: ClusterJob
) -> None:
    # The synthetic ledger lost messages: the command's exit status says so.
    assert "audit exit status: 1" in cluster_job.stdout
    report = json.loads((cluster_job.out / "report.json").read_text())
    on_cluster = {key: value for key, value in report.items() if key not in _RUN_SPECIFIC}
    # The pyarrow reference in this process: test_spark_audit shows local Spark agrees
    # with it, and a second driver JVM would cost this lane about 20 s.
    local = reference_audit(cluster_job.ledger.path)
    assert on_cluster == {k: v for k, v in local.items() if k not in _RUN_SPECIFIC}
    assert (on_cluster["lost"], on_cluster["processed_more_than_once"]) == (
        cluster_job.ledger.lost,
        cluster_job.ledger.processed_more_than_once,
    )
    # The executors ran on the workers, not in the driver.
    assert "Launching executor" in cluster.logs() or "Asked to launch executor" in cluster.logs()


async def test_the_foreach_batch_sink_delivers_every_row_from_a_standalone_cluster(
    cluster: SparkCluster, cluster_job: ClusterJob, georep_emulator: Emulator
) -> None:
    assert f"executors: {cluster.master_url}" in cluster_job.stdout
    ids = await drain_ids(georep_emulator, "primary", cluster_job.queue)
    assert len(ids) == 70 and set(ids.values()) == {1}
    assert {f"id-{i}" for i in range(20)} <= set(ids)


def _new_queue(emulator: Emulator) -> str:
    queue = f"spark-standalone-{uuid.uuid4().hex[:8]}"
    for namespace in emulator.namespaces:
        emulator.namespace(namespace).create_queue(queue)
    return queue


async def test_the_georep_source_reads_both_regions_on_a_standalone_cluster(
    cluster: SparkCluster, georep_emulator: Emulator, tmp_path: Path
) -> None:
    queue = _new_queue(georep_emulator)
    ids = [f"m{i}" for i in range(60)]
    async with GeoSender.from_connection_strings(
        georep_emulator.connection_string("primary"),
        georep_emulator.connection_string("secondary"),
        queue_name=queue,
        mode=ReplicationMode.ACTIVE,
    ) as sender:
        await sender.send_messages([ServiceBusMessage(i, message_id=i) for i in ids])
    config = {
        "master": cluster.master_url,
        "primary": georep_emulator.connection_string("primary"),
        "secondary": georep_emulator.connection_string("secondary"),
        "queue": queue,
        "redis": REDIS_URL,
        "group": f"standalone-{uuid.uuid4().hex[:8]}",
        "staging": str(tmp_path / "checkpoint" / "georep-staging"),
        "checkpoint": str(tmp_path / "checkpoint"),
        "table": str(tmp_path / "table"),
        "stop_file": str(tmp_path / "stop"),
        "max_per_batch": 20,
    }
    log = tmp_path / "driver.log"
    driver = start_driver(config, log=log, env=cluster_env())

    def rows() -> int:
        assert driver.poll() is None, log.read_text()[-3000:]
        return sum(len(batch) for batch in table(config["table"]).values())

    try:
        # Executors start on the workers, then each micro-batch adds rows: wait while
        # the table grows, however slowly the machine runs.
        assert await progressing(rows, len(ids), stall=180), f"the table holds {rows()}"
        assert await eventually(lambda: stored(georep_emulator, queue) == 0, within=120), (
            f"{stored(georep_emulator, queue)} copies were never settled"
        )
    finally:
        (tmp_path / "stop").touch()
        try:
            driver.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(driver.pid, signal.SIGKILL)  # the driver, its JVM and Python workers
            driver.wait()
    read = [i for batch in table(config["table"]).values() for i in batch]
    assert sorted(read) == sorted(ids), "lost or repeated rows"
    # The staged batches were read by executors on the workers.
    assert "Asked to launch executor" in cluster.logs() or "Launching executor" in cluster.logs()
