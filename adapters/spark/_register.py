"""``register(spark)``: the ``georep`` format in a session, imported only when asked for."""

from __future__ import annotations

__all__ = ["register"]

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def register(spark: SparkSession) -> None:
    """Make the ``georep`` format available in ``spark`` (once per session).

    Adds ``spark.readStream.format("georep")`` (the source), ``df.writeStream.format(
    "georep")`` and ``df.write.format("georep")`` (the sink): see docs/spark.md. Python
    workers import georep to run it: on a cluster, install georep where the executors'
    Python is.

    Raises:
        ImportError: pyspark is older than 4.2 (no Python data sources with admission
            control); the audit and ``foreach_batch_sink`` work without it.
    """
    try:
        from ._datasource import GeorepDataSource
    except ImportError as exc:
        raise ImportError(
            f"the georep format needs pyspark 4.2 or newer ({exc}): pip install 'pyspark>=4.2'"
        ) from exc
    spark.dataSource.register(GeorepDataSource)
