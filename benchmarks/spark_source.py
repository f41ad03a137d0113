"""The georep Spark source and sink against hand-written equivalents, in one run.

Source: active mode puts two copies of each of ``--messages`` logical messages in the two
regions of a queue (one queue per variant, filled alike). Timed, from the start of reading
until every logical message is in a Parquet table:

- raw SDK: one peek-lock receiver per region, ``receive_messages(batch)``, the copies'
  MessageIds checked against an in-memory set, each batch's new rows written with pyarrow,
  then every copy completed (no durability across a crash, no shared dedup);
- georep source: ``spark.readStream.format("georep")`` (``maxMessagesPerBatch=batch``)
  into Spark's Parquet file sink, on local[2] (the session started before the clock).

Sink: ``--rows`` rows sent to a queue by ``df.write.format("georep")`` (from the
executors) and by ``foreach_batch_sink`` (from the driver), each timed.

Both are timed warm, as a long-running query runs: a first small query (source) and write
(sink) starts Spark's Python workers and imports georep and the SDK in them, and is timed
apart, as the cold start. Cold, the first 2,000-row write took 6.3 s, the next 0.8 s: a
ratio of cold against the driver's helper (whose process has everything imported) measured
the workers' start, not the sink.

Prints messages per second and the ratios (targets: source >= 0.8x raw, sink >= 1.0x
helper). The source gets two: over the whole run, and once rows flow (the messages after
the first write, over the time after it: a streaming query pays its start, seconds for
Spark's Python processes and the connections, once in a life of hours; the raw loop's
start is its connections). The defaults are the product's batch limit
(``maxMessagesPerBatch`` 10,000; ``maxBytesPerBatch`` left at its default) and 40,000
messages, enough that the query's start (about 2 s) is not most of the run; the raw loop
receives 100 per call, its fastest. Needs Redis (``REDIS_URL``, default
redis://127.0.0.1:6379/0).

    .venv/bin/python benchmarks/spark_source.py [--messages 40000] [--batch 10000] [--rows 2000]
        [--size BYTES]

It writes its figures to ``benchmarks/results/spark_source.json`` (``benchmarks/_record.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from _common import BODY, fill_active
from _record import write_record
from azure.servicebus.aio import ServiceBusClient

from georep import GeoSender
from georep.adapters.emulator import Emulator
from georep.adapters.spark import foreach_batch_sink, register, spark_session

WARM_UP = 100
"""Messages (rows) of the first query (write), which starts the Python workers."""
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


@dataclass(frozen=True)
class Timing:
    """How long putting ``count`` logical messages into a table took.

    Attributes:
        seconds: From the start (connecting; the query's start) until the last row.
        first_seconds: Until the first rows were written (the first file; the first
            micro-batch with rows committed).
        first_rows: How many rows that first write held.
    """

    count: int
    seconds: float
    first_seconds: float
    first_rows: int
    peak_mib: float | None = None
    """The source's driver process's peak resident memory (the source runner Spark
    starts for the query), when it could be read."""

    @property
    def per_second(self) -> float:
        return self.count / self.seconds

    @property
    def sustained_per_second(self) -> float:
        """The rate once rows flow: what follows the first write, over the time it took
        (a long-running query pays its start once)."""
        return (self.count - self.first_rows) / max(self.seconds - self.first_seconds, 1e-9)


async def raw_into_parquet(emu: Emulator, queue: str, count: int, batch: int, out: Path) -> Timing:
    """How long the raw SDK loop takes to put ``count`` logical messages into ``out`` (an
    existing directory)."""
    seen: set[str] = set()
    files = 0
    first: tuple[float, int] | None = None

    async def drain(connection: str) -> None:
        nonlocal files, first
        async with (
            ServiceBusClient.from_connection_string(connection) as client,
            client.get_queue_receiver(queue) as receiver,
        ):
            while len(seen) < count:
                copies = await receiver.receive_messages(max_message_count=batch, max_wait_time=1)
                rows = []
                for copy in copies:
                    message_id = str(copy.message_id)
                    if message_id not in seen:
                        seen.add(message_id)
                        rows.append({"message_id": message_id, "body": b"".join(copy.body)})
                if rows:
                    files += 1
                    table = pa.Table.from_pylist(rows)
                    await asyncio.to_thread(pq.write_table, table, out / f"part-{files}.parquet")
                    if first is None:
                        first = (time.perf_counter() - started, len(rows))
                for copy in copies:
                    await receiver.complete_message(copy)

    started = time.perf_counter()
    await asyncio.gather(*(drain(emu.connection_string(n)) for n in ("primary", "secondary")))
    seconds = time.perf_counter() - started
    assert first is not None
    return Timing(count, seconds, *first)


def source_into_parquet(spark: Any, emu: Emulator, queue: str, count: int, batch: int) -> Timing:
    """How long the georep source takes to put ``count`` logical messages into a table."""
    work = Path(tempfile.mkdtemp(prefix="georep-bench-spark-"))
    reader = (
        spark.readStream.format("georep")
        .option("primaryConnectionString", emu.connection_string("primary"))
        .option("secondaryConnectionString", emu.connection_string("secondary"))
        .option("queueName", queue)
        .option("seenSetUrl", REDIS_URL)
        .option("seenSetGroup", f"bench-{uuid.uuid4().hex[:8]}")
        .option("stagingLocation", str(work / "staging"))
        .option("maxMessagesPerBatch", batch)
    )
    started, wall_started = time.perf_counter(), time.time()
    query = (
        reader.load()
        .writeStream.format("parquet")
        .option("path", str(work / "table"))
        .option("checkpointLocation", str(work / "checkpoint"))
        .start()
    )
    try:
        while sum(p["numInputRows"] for p in query.recentProgress) < count:
            if query.exception() is not None:
                raise RuntimeError(f"the query failed: {query.exception()}")
            time.sleep(0.05)
        seconds = time.perf_counter() - started
        progress = query.recentProgress
        _print_phases(progress, seconds)
        report = next(p for p in progress if p["numInputRows"])
        began = datetime.fromisoformat(report["timestamp"].replace("Z", "+00:00")).timestamp()
        done = began + report["durationMs"]["triggerExecution"] / 1000 - wall_started
        return Timing(count, seconds, done, int(report["numInputRows"]), _runner_peak_mib())
    finally:
        query.stop()


def _runner_peak_mib() -> float | None:
    """The peak resident memory of the streaming source runner (the Python process on the
    driver that holds the source's copies), from Linux's ``/proc``; None elsewhere."""
    peaks: list[float] = []
    for process in Path("/proc").glob("[0-9]*"):
        try:
            if b"python_streaming_source_runner" not in (process / "cmdline").read_bytes():
                continue
            for line in (process / "status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peaks.append(int(line.split()[1]) / 1024)
        except OSError:
            continue
    return max(peaks, default=None)


def _print_phases(progress: list[dict[str, Any]], seconds: float) -> None:
    """Where the source's time went, from Spark's progress reports: the micro-batches
    with rows, and the seconds of each phase summed over every trigger (``latestOffset``
    includes the source's receiving and staging; ``addBatch`` the executors' reading and
    the Parquet writing; ``triggerExecution`` is each trigger whole: what the triggers do
    not cover of the total is the query's start)."""
    batches = [p for p in progress if p["numInputRows"]]
    phases: dict[str, float] = {}
    for report in progress:
        for phase, ms in report.get("durationMs", {}).items():
            phases[phase] = phases.get(phase, 0.0) + ms / 1000
    shown = ", ".join(f"{name} {value:.1f}" for name, value in sorted(phases.items()))
    print(
        f"  {len(batches)} micro-batches with rows, {len(progress)} triggers; seconds per "
        f"phase over all triggers: {shown} (of {seconds:.1f} s)"
    )


async def purge(emu: Emulator, queue: str) -> None:
    """Remove every message from ``queue`` in the primary (the sink runs send there)."""
    from azure.servicebus import ServiceBusReceiveMode

    async with (
        ServiceBusClient.from_connection_string(emu.connection_string("primary")) as client,
        client.get_queue_receiver(
            queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
        ) as receiver,
    ):
        while await receiver.receive_messages(max_message_count=500, max_wait_time=1):
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=40_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument(
        "--raw-batch",
        type=int,
        default=100,
        help="max_message_count of the raw loop's receives (its fastest of 100, 1000, 10000)",
    )
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument(
        "--size", type=int, default=len(BODY), help="body bytes of the source's messages"
    )
    args = parser.parse_args()

    with Emulator(queues=("raw", "source", "sink", "warm")) as emu:
        spark = spark_session("local[2]", app_name="georep-bench")
        register(spark)
        for queue in ("raw", "source"):
            asyncio.run(fill_active(emu, queue, args.messages, b"x" * args.size))
        asyncio.run(fill_active(emu, "warm", WARM_UP))
        print(f"cold start, a first query of {WARM_UP} messages:")
        cold_source = source_into_parquet(spark, emu, "warm", WARM_UP, args.batch).seconds
        out = Path(tempfile.mkdtemp(prefix="georep-bench-raw-"))
        raw = asyncio.run(raw_into_parquet(emu, "raw", args.messages, args.raw_batch, out))
        source = source_into_parquet(spark, emu, "source", args.messages, args.batch)
        print(
            f"source, {args.messages} messages x 2 copies, batch {args.batch} "
            f"(raw loop: {args.raw_batch} per receive):"
        )
        for name, timing in (("raw SDK loop + pyarrow", raw), ("georep source (Spark)", source)):
            print(
                f"  {name:22}  {timing.per_second:8.0f} msg/s  ({timing.seconds:.1f} s; first "
                f"rows after {timing.first_seconds:.1f} s, then "
                f"{timing.sustained_per_second:.0f} msg/s)"
            )
        if source.peak_mib is not None:
            print(f"  source driver's peak memory: {source.peak_mib:.0f} MiB (the runner process)")
        whole = source.per_second / raw.per_second
        sustained = source.sustained_per_second / raw.sustained_per_second
        print(f"  ratio                   {whole:8.2f}x whole run, {sustained:.2f}x once rows flow")

        def frame(count: int) -> Any:
            rows = spark.createDataFrame(
                [(f"r{i}", "x" * 200) for i in range(count)], "key string, body string"
            ).coalesce(2)
            rows.cache().count()
            return rows

        rows, warm = frame(args.rows), frame(WARM_UP)
        options = {
            "primaryConnectionString": emu.connection_string("primary"),
            "secondaryConnectionString": emu.connection_string("secondary"),
        }

        def write(frame: Any, queue: str, scope: str) -> float:
            started = time.perf_counter()
            frame.write.format("georep").options(
                **options, queueName=queue, keyColumn="key", scope=scope
            ).mode("append").save()
            return time.perf_counter() - started

        cold_sink = write(warm, "warm", "warm")
        sink = write(rows, "sink", "bench")
        asyncio.run(purge(emu, "sink"))

        def helper(queue: str) -> Any:
            return foreach_batch_sink(
                lambda: GeoSender.from_connection_strings(
                    options["primaryConnectionString"],
                    options["secondaryConnectionString"],
                    queue_name=queue,
                ),
                scope="bench",
            )

        helper("warm")(warm, 0)
        started = time.perf_counter()
        helper("sink")(rows, 0)
        driver = time.perf_counter() - started
        print(f"cold start: the first query {cold_source:.1f} s, the first write {cold_sink:.1f} s")
        print(f"sink, {args.rows} rows (passive):")
        print(f"  foreach_batch_sink      {args.rows / driver:8.0f} msg/s  ({driver:.1f} s)")
        print(f"  format('georep') write  {args.rows / sink:8.0f} msg/s  ({sink:.1f} s)")
        print(f"  ratio                   {driver / sink:8.2f}x (target >= 1.0)")
    write_record(
        "spark_source",
        quick=False,
        ratios={
            "source vs raw SDK + pyarrow": whole,
            "source vs raw SDK + pyarrow, once rows flow": sustained,
            "sink vs foreach_batch_sink": driver / sink,
        },
        figures={
            "master": "local[2]",
            "messages": args.messages,
            "rows": args.rows,
            "batch": args.batch,
            "raw_batch": args.raw_batch,
            "size": args.size,
            "source_per_s": round(source.per_second),
            "raw_per_s": round(raw.per_second),
            "source_sustained_per_s": round(source.sustained_per_second),
            "raw_sustained_per_s": round(raw.sustained_per_second),
            "source_first_rows_s": round(source.first_seconds, 2),
            "raw_first_rows_s": round(raw.first_seconds, 2),
            "sink_per_s": round(args.rows / sink),
            "foreach_batch_sink_per_s": round(args.rows / driver),
            "cold_first_query_s": round(cold_source, 2),
            "cold_first_write_s": round(cold_sink, 2),
            "source_runner_peak_mib": source.peak_mib and round(source.peak_mib),
        },
    )


if __name__ == "__main__":
    main()
