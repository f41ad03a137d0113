"""The ``georep`` format: one Spark Python data source for the source and the sink.

``register(spark)`` makes ``spark.readStream.format("georep")`` (the source, see
``_source.py``), ``df.writeStream.format("georep")`` and ``df.write.format("georep")`` (the
sink, see ``_sink.py``) available in a session.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)

from georep.exceptions import ConfigurationError

from ._sink import GeorepStreamWriter, GeorepWriter, sink_settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

__all__ = ["SOURCE_SCHEMA", "GeorepDataSource", "register"]

SOURCE_SCHEMA = (
    "message_id string, body binary, content_type string, "
    "application_properties map<string,string>, enqueued_time timestamp, region string, "
    "session_id string, dead_letter_reason string"
)
"""The rows the source produces (Spark DDL)."""


class GeorepDataSource(DataSource):
    """Service Bus through georep, in both regions: read a stream, write a stream or a batch.

    Options are documented in docs/spark.md; each is checked on the driver when the query
    starts, and a mistake raises :class:`georep.ConfigurationError` naming the option.
    """

    @classmethod
    def name(cls) -> str:
        return "georep"

    def schema(self) -> str:
        return SOURCE_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        raise ConfigurationError(
            "the georep source is a stream: use spark.readStream.format('georep') "
            "(a batch read has no end to stop at)"
        )

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from ._source import GeorepStreamReader, source_settings

        return GeorepStreamReader(source_settings(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return GeorepWriter(sink_settings(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return GeorepStreamWriter(sink_settings(self.options), schema)


def register(spark: SparkSession) -> None:
    """Make the ``georep`` format available in ``spark`` (once per session; idempotent).

    Python workers import georep to run it: on a cluster, install georep where the
    executors' Python is (or ship it with ``--py-files``).
    """
    spark.dataSource.register(GeorepDataSource)
