"""The Spark work whose classes scripts/spark_cds.sh archives (run by spark-submit): the
ledger audit on a small synthetic ledger, and a streaming query through ``foreachBatch``.
What the suite's Spark JVMs load beyond this is loaded from the jars as before."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from georep.adapters.spark import audit, spark_session, write_synthetic_ledger


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="georep-cds-") as scratch:
        root = Path(scratch)
        write_synthetic_ledger(root / "ledger", messages=2_000)
        audit(root / "ledger", out_dir=root / "report", master=None, plots=False)
        spark = spark_session(None)
        rows = spark.readStream.format("rate").option("rowsPerSecond", 100).load()
        query = (
            rows.writeStream.foreachBatch(lambda batch, _: batch.count())
            .option("checkpointLocation", str(root / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(60)
        query.stop()
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
