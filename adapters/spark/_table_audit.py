"""What a streaming query's Parquet table holds, against what the senders were told was sent.

Spark's file sink writes a micro-batch's files, then lists them in the table's
``_spark_metadata`` log when it commits the batch; a reader of the table (``spark.read.
parquet(table)``) sees only the listed files, so files a killed driver left half-written
are never read. :func:`table_audit` reads the table that way, through Spark, and the
acknowledged sends from the ledger, and counts the messages lost (acknowledged, not in the
table) and in the table more than once. :class:`CommittedRows` follows the same log with
pyarrow alone (no JVM), for a live view while the query runs.
"""

from __future__ import annotations

__all__ = ["CommittedRows", "table_audit"]

import json
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow.parquet as pq
from pyspark.sql import SparkSession, functions as F

from ._audit import _read_ledger
from ._report import ACKNOWLEDGED

_LOG = "_spark_metadata"


def _committed_files(table: Path) -> list[Path]:
    """The data files of the committed micro-batches, from the table's sink log."""
    log = table / _LOG
    if not log.is_dir():
        return []
    added: dict[str, None] = {}
    deleted: set[str] = set()
    # Spark writes each log file under a hidden name and renames it: a listed one is whole.
    for entry in sorted(log.iterdir()):
        if entry.name.startswith("."):
            continue
        try:
            lines = entry.read_text().splitlines()[1:]  # the first line is the version
        except FileNotFoundError:  # compacted away meanwhile: its entries are in a later one
            continue
        for line in lines:
            if not line.strip():
                continue
            record = json.loads(line)
            (deleted.add if record.get("action") == "delete" else added.setdefault)(record["path"])
    return [Path(unquote(urlparse(path).path)) for path in added if path not in deleted]


class CommittedRows:
    """The MessageIds in a file-sink table's committed micro-batches, read incrementally.

    Args:
        table: The table's directory.
    """

    def __init__(self, table: Path) -> None:
        self._table = table
        self._read: set[Path] = set()
        self.ids: Counter[str] = Counter()

    def refresh(self) -> Counter[str]:
        """Read the files committed since the last call; every MessageId and its rows."""
        for path in _committed_files(self._table):
            if path not in self._read:
                column = pq.read_table(path, columns=["message_id"]).column(0)
                self.ids.update(str(value) for value in column.to_pylist())
                self._read.add(path)
        return self.ids


def table_audit(spark: SparkSession, ledger_dir: str | Path, table: str | Path) -> dict[str, Any]:
    """Each acknowledged message against a file-sink table's rows, through Spark.

    Returns:
        ``acknowledged`` (messages the ledger records as acknowledged), ``rows`` (in the
        table), ``lost`` (acknowledged, no row), ``more_than_once`` (messages with two rows
        or more) and ``unexpected`` (rows of messages never acknowledged).
    """
    sends, _ = _read_ledger(spark, ledger_dir)
    acknowledged = (
        sends.where(F.col("outcome").isin(*ACKNOWLEDGED))
        .select("message_id")
        .distinct()
        .withColumn("acknowledged", F.lit(True))
    )
    rows = spark.read.parquet(str(table)).groupBy("message_id").agg(F.count("*").alias("rows"))
    joined = acknowledged.join(rows, "message_id", "full_outer")
    figures = joined.agg(
        F.count(F.when(F.col("acknowledged"), True)).alias("acknowledged"),
        F.coalesce(F.sum("rows"), F.lit(0)).alias("rows"),
        F.count(F.when(F.col("acknowledged") & F.col("rows").isNull(), True)).alias("lost"),
        F.count(F.when(F.col("rows") > 1, True)).alias("more_than_once"),
        F.count(F.when(F.col("acknowledged").isNull(), True)).alias("unexpected"),
    ).first()
    assert figures is not None
    return {name: int(figures[name]) for name in figures.asDict()}
