"""The streaming query of ``georep demo --pipeline``, as a driver process of its own.

It reads a queue's two regions with the georep source and writes them to a Parquet table
with Spark's file sink (exactly once: a reader of the table sees only the files of
committed micro-batches, through the table's ``_spark_metadata`` log). The demo starts
it, kills it with SIGKILL partway through, and starts it again on the same checkpoint
and staging location::

    GEOREP_PIPELINE='{"primary": ..., "secondary": ..., "queue": ..., ...}' \\
        python -m georep.adapters.spark.pipeline_job

The settings travel in the environment, not in a file or the command line: they hold
connection strings. The query runs until the file named by ``stop_file`` appears (then it
stops cleanly), or until the process is killed. Stopped, with ``audit_ledger`` and
``audit_out`` set, it audits the table against that ledger's acknowledged sends
(:func:`~georep.adapters.spark._table_audit.table_audit`, in the same JVM: the demo starts
no other) and writes the figures to ``audit_out`` as JSON.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

# Absolute imports: the job may be run as a script, outside its package.
from georep.adapters.spark._register import register
from georep.adapters.spark._session import spark_session
from georep.adapters.spark._table_audit import table_audit

ENVIRONMENT = "GEOREP_PIPELINE"
"""The environment variable holding the job's settings (JSON)."""


def pipeline_options(settings: dict[str, Any]) -> dict[str, str]:
    """The georep source's options for the job's ``settings``."""
    return {
        "primaryConnectionString": settings["primary"],
        "secondaryConnectionString": settings["secondary"],
        "queueName": settings["queue"],
        "seenSetUrl": settings["redis"],
        "seenSetGroup": settings["group"],
        "stagingLocation": settings["staging"],
        "maxMessagesPerBatch": str(settings.get("max_per_batch", 200)),
        "leaseSeconds": str(settings.get("lease", 5)),
        "maxWaitSeconds": str(settings.get("max_wait", 0.5)),
        "maxBytesPerBatch": str(settings.get("max_bytes_per_batch", 16 * 1024 * 1024)),
    }


def start(spark: Any, settings: dict[str, Any]) -> Any:
    """Start the pipeline's query in ``spark`` (the georep format registered)."""
    return (
        spark.readStream.format("georep")
        .options(**pipeline_options(settings))
        .load()
        .writeStream.format("parquet")
        .option("path", settings["table"])
        .option("checkpointLocation", settings["checkpoint"])
        .trigger(processingTime=settings.get("trigger", "500 milliseconds"))
        .start()
    )


def main() -> int:
    """Run the query until the stop file appears; 1 if the query failed."""
    settings = json.loads(os.environ[ENVIRONMENT])
    spark = spark_session("local[2]", app_name="georep-pipeline")
    register(spark)
    query = start(spark, settings)
    stop_file = Path(settings["stop_file"])
    while not query.awaitTermination(0.5):
        if stop_file.exists():
            query.stop()
    error = query.exception()
    if error is not None:
        print(f"the pipeline's query failed: {error}", file=sys.stderr)
    elif settings.get("audit_out"):
        figures = table_audit(spark, settings["audit_ledger"], settings["table"])
        Path(settings["audit_out"]).write_text(json.dumps(figures))
    spark.stop()
    return 1 if error is not None else 0


if __name__ == "__main__":
    sys.exit(main())
