"""A streaming query that reads the georep source into a Parquet table (test_spark_source.py).

The table is written by ``foreachBatch``, one directory per micro-batch overwritten when the
batch runs again (``table/batch=N``): an idempotent sink, so the table holds exactly what
the source's batches held, each once, however often Spark ran them.

Run as a script it is the driver a test kills::

    GEOREP_PIPELINE='{"primary": ..., "hold_from": 1, ...}' python _spark_pipeline.py

It runs the query until killed (or, with ``stop_file``, until that file appears); from
micro-batch ``hold_from`` on, ``foreachBatch`` writes the batch id to ``held`` and waits for
ever instead of writing: the batch is staged and planned (in the checkpoint's offset log)
but never committed. ``master`` (default local[2]) and ``trigger`` (default 200 ms) may be
given. The settings travel in the environment, not in a file: they hold connection
strings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENVIRONMENT = "GEOREP_PIPELINE"


def batch_writer(
    table: str, *, hold_from: int | None = None, held: str | None = None
) -> Callable[[Any, int], None]:
    """``foreachBatch`` function writing each micro-batch to ``table/batch=N`` (overwrite)."""

    def write(df: Any, batch_id: int) -> None:
        if hold_from is not None and held is not None and batch_id >= hold_from:
            Path(held).write_text(str(batch_id))
            while True:  # until the test kills this process
                time.sleep(1)
        df.write.mode("overwrite").parquet(f"{table}/batch={batch_id}")

    return write


def fail_first_attempts(marker: str) -> Callable[[Any], Any]:
    """A column function whose task fails on its first attempt (an executor's task
    failure: Spark runs it again, up to ``spark.task.maxFailures``), touching ``marker``."""
    from pyspark import TaskContext
    from pyspark.sql.functions import udf

    @udf("string")
    def checked(message_id: str) -> str:
        context = TaskContext.get()
        if context is not None and context.attemptNumber() == 0:
            Path(marker).touch()
            raise RuntimeError("an executor's task fails (the test's injected failure)")
        return message_id

    return checked


def start_query(spark: Any, config: dict[str, Any], **hold: Any) -> Any:
    """Start the pipeline's streaming query in ``spark`` (the georep format registered):
    with ``config["fail_marker"]``, each batch's first task attempt fails."""
    from georep.adapters.spark.pipeline_job import pipeline_options

    rows = spark.readStream.format("georep").options(**pipeline_options(config)).load()
    if config.get("fail_marker"):
        rows = rows.withColumn(
            "message_id", fail_first_attempts(config["fail_marker"])("message_id")
        )
    return (
        rows.writeStream.foreachBatch(batch_writer(config["table"], **hold))
        .option("checkpointLocation", config["checkpoint"])
        .trigger(processingTime=config.get("trigger", "200 milliseconds"))
        .start()
    )


def table(root: str) -> dict[int, list[str]]:
    """The table's MessageIds by micro-batch (what a reader of the table sees now)."""
    import pyarrow.parquet as pq

    batches: dict[int, list[str]] = {}
    for directory in Path(root).glob("batch=*"):
        try:
            files = sorted(directory.glob("part-*.parquet"))
            ids = [i for f in files for i in pq.read_table(f).column("message_id").to_pylist()]
        except (FileNotFoundError, OSError):  # Spark is rewriting it: read it next time
            continue
        batches[int(directory.name.split("=")[1])] = ids
    return batches


def start_driver(
    config: dict[str, Any], *, log: Path, env: dict[str, str] | None = None, **hold: Any
) -> subprocess.Popen[bytes]:
    """This script as the pipeline's driver, in a process group of its own (its JVM and
    Python workers with it), holding from micro-batch ``hold["hold_from"]`` on."""
    environment = {**(env or os.environ), ENVIRONMENT: json.dumps({**config, **hold})}
    with log.open("w") as output:
        return subprocess.Popen(
            [sys.executable, __file__],
            env=environment, stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from georep.adapters.spark import register, spark_session

    config = json.loads(os.environ[ENVIRONMENT])
    spark = spark_session(config.get("master", "local[2]"), app_name="georep-pipeline")
    register(spark)
    query = start_query(spark, config, hold_from=config.get("hold_from"), held=config.get("held"))
    stop_file = Path(config["stop_file"]) if config.get("stop_file") else None
    while not query.awaitTermination(0.5):
        if stop_file is not None and stop_file.exists():
            query.stop()
    return 1 if query.exception() is not None else 0


if __name__ == "__main__":
    sys.exit(main())
