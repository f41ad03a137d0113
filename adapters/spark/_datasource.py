"""The ``georep`` format: one Spark Python data source for the source and the sink.

``spark.readStream.format("georep")`` is the source (``_source.py``);
``df.writeStream.format("georep")`` and ``df.write.format("georep")`` are the writers here,
which send through ``_sink.py``. Needs pyspark 4.2+ (Python data sources with admission
control); :func:`georep.adapters.spark.register` imports it when called, so the audit keeps
working on older Spark.
"""

from __future__ import annotations

__all__ = ["GeorepDataSource", "GeorepStreamWriter", "GeorepWriter"]

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)

from georep.exceptions import ConfigurationError

from ._sink import SinkSettings, micro_batch, run_sync, send_partition, sink_settings
from ._source import GeorepStreamReader, source_settings
from ._staging import SOURCE_SCHEMA

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

_log = logging.getLogger("georep.spark")


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
        return GeorepStreamReader(source_settings(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return GeorepWriter(sink_settings(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return GeorepStreamWriter(sink_settings(self.options), schema)


@dataclass
class SentRows(WriterCommitMessage):
    """One task's report to the driver: the messages it sent."""

    sent: int


class GeorepWriter(DataSourceWriter):
    """``df.write.format("georep")``: each task sends its partition through a GeoSender.

    A batch write has no batch id: MessageIds come from the ``message_id`` column, or from
    option ``scope`` (required then: it names the write, so that running it again is
    recognised as a replay) with the key column or each row's content.
    """

    def __init__(self, settings: SinkSettings, schema: StructType) -> None:
        self._settings = settings
        self._layout = settings.layout(schema.fieldNames())
        if self._layout.message_id is None and settings.scope is None:
            raise ConfigurationError(
                "the georep sink: a batch write needs option 'scope' (a name for this "
                "write, e.g. 'orders-2024-06-01', so that running it again sends the same "
                "MessageIds) or a 'message_id' column"
            )

    def write(self, iterator: Iterable[Any]) -> SentRows:
        scope = self._settings.scope or "georep.spark"
        rows = (tuple(row) for row in iterator)
        return SentRows(
            run_sync(send_partition(self._settings, self._layout, rows, scope=scope, batch_id=None))
        )

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _log.info("georep sink: sent %d messages", _sent(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        # What was sent stays sent: a retry sends the same MessageIds, suppressed downstream.
        _log.warning(
            "georep sink: the write failed after %d messages were sent (a retry sends the "
            "same MessageIds)",
            _sent(messages),
        )


class GeorepStreamWriter(DataSourceStreamWriter):
    """``df.writeStream.format("georep")``: each micro-batch's tasks send their rows.

    MessageIds come from the ``message_id`` column, or from (scope, batch id, key or row
    content) where scope defaults to the query's id (kept in its checkpoint) and the batch
    id is Spark's: a task retry and a batch replayed after a restart send the same ids.
    """

    def __init__(self, settings: SinkSettings, schema: StructType) -> None:
        self._settings = settings
        self._layout = settings.layout(schema.fieldNames())

    def write(self, iterator: Iterable[Any]) -> SentRows:
        query_id, batch_id = micro_batch()
        scope = self._settings.scope or query_id
        rows = (tuple(row) for row in iterator)
        return SentRows(
            run_sync(
                send_partition(self._settings, self._layout, rows, scope=scope, batch_id=batch_id)
            )
        )

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        sent = _sent(messages)
        _log.info("georep sink: micro-batch %d sent %d messages", batchId, sent)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _log.warning(
            "georep sink: micro-batch %d failed after %d messages were sent (its replay "
            "sends the same MessageIds)",
            batchId,
            _sent(messages),
        )


def _sent(messages: list[WriterCommitMessage | None]) -> int:
    """The messages the tasks reporting ``messages`` sent."""
    return sum(m.sent for m in messages if isinstance(m, SentRows))
