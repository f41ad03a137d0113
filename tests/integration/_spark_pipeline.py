"""A streaming query that reads the georep source into a Parquet table (test_spark_source.py).

The table is written by ``foreachBatch``, one directory per micro-batch overwritten when the
batch runs again (``table/batch=N``): an idempotent sink, so the table holds exactly what
the source's batches held, each once, however often Spark ran them.

Run as a script it is the driver a test kills::

    GEOREP_PIPELINE='{"primary": ..., "hold_from": 1, ...}' python _spark_pipeline.py

It runs the query until killed; from micro-batch ``hold_from`` on, ``foreachBatch`` writes
the batch id to ``held`` and waits for ever instead of writing: the batch is staged and
planned (in the checkpoint's offset log) but never committed. The settings travel in the
environment, not in a file: they hold connection strings.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENVIRONMENT = "GEOREP_PIPELINE"


def source_options(config: dict[str, Any]) -> dict[str, str]:
    """The georep source's options for ``config``."""
    return {
        "primaryConnectionString": config["primary"],
        "secondaryConnectionString": config["secondary"],
        "queueName": config["queue"],
        "seenSetUrl": config["redis"],
        "seenSetGroup": config["group"],
        "stagingLocation": config["staging"],
        "maxMessagesPerBatch": str(config.get("max_per_batch", 20)),
        "leaseSeconds": str(config.get("lease", 5)),
    }


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


def start_query(spark: Any, config: dict[str, Any], **hold: Any) -> Any:
    """Start the pipeline's streaming query in ``spark`` (the georep format registered)."""
    return (
        spark.readStream.format("georep")
        .options(**source_options(config))
        .load()
        .writeStream.foreachBatch(batch_writer(config["table"], **hold))
        .option("checkpointLocation", config["checkpoint"])
        .trigger(processingTime="200 milliseconds")
        .start()
    )


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from georep.adapters.spark import register, spark_session

    config = json.loads(os.environ[ENVIRONMENT])
    spark = spark_session("local[2]", app_name="georep-pipeline")
    register(spark)
    query = start_query(spark, config, hold_from=config["hold_from"], held=config["held"])
    query.awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main())
