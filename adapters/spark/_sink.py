"""Sending a DataFrame's rows through a GeoSender: the ``georep`` sink and ``foreach_batch_sink``.

Spark runs a task again after a failure and a micro-batch again after a restart, with the
same rows. Every message's MessageId is therefore a function of what Spark replays, never
of the attempt: the row's ``message_id`` column as it is, or a uuid5 of (scope, batch id,
the row's key or content). A replayed copy carries its first attempt's MessageId, and a
deduplicating receiver (GeoReceiver with a shared seen-set) processes it once.

Two ways in, one encoding: the data source (``df.write.format("georep")``,
``df.writeStream.format("georep")``) sends from the executors, one GeoSender per task, and
``foreach_batch_sink`` sends a micro-batch from the driver through the sender a factory
makes (kept for the callers that build their GeoSender in code).
"""

from __future__ import annotations

__all__ = [
    "SINK_NAMESPACE",
    "MessageIds",
    "RowLayout",
    "SinkSettings",
    "foreach_batch_sink",
    "micro_batch",
    "run_sync",
    "send_partition",
    "sink_message_id",
    "sink_settings",
]

import asyncio
import hashlib
import inspect
import json
import logging
import threading
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from georep.exceptions import ConfigurationError

from ._options import Connection, Entity, Options, connection, connection_options, entity

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from georep import GeoSender

_log = logging.getLogger("georep.spark")

SINK_NAMESPACE = uuid.UUID("6f1c1b9e-5d0a-5e0b-9a55-6e0f7c2d9b31")
"""The UUID namespace of the sink's uuid5 MessageIds."""
BATCH_ID_PROPERTY = "georep.spark.batch_id"
"""The application property that carries a streamed row's micro-batch id."""
_T = TypeVar("_T")

# Columns a row may carry besides its body and identity, sent as the message's field of
# the same meaning (the source's row has the same names, so source -> sink round-trips).
_FIELDS = (
    "content_type",
    "application_properties",
    "session_id",
    "partition_key",
    "subject",
    "correlation_id",
)
_SINK_OPTIONS = (
    "mode",
    "outboxPath",
    "attemptTimeoutSeconds",
    "bodyColumn",
    "messageIdColumn",
    "keyColumn",
    "scope",
    "sendBatchSize",
)


def sink_message_id(scope: str, batch_id: int, key: str) -> str:
    """The MessageId of the row with ``key`` in micro-batch ``batch_id``."""
    return str(uuid.uuid5(SINK_NAMESPACE, f"{scope}\x1f{batch_id}\x1f{key}"))


# ----------------------------------------------------------------------- rows -> messages


@dataclass(frozen=True)
class RowLayout:
    """Where a row's parts are, by column position (found once per schema, on the driver).

    Attributes:
        body: The body column (string or binary).
        message_id: The column sent as the MessageId as it is, if any.
        key: The column that, with the scope and batch id, derives the MessageId, if any.
        fields: Optional message fields by name (``content_type``...) and their columns.
        columns: Every column name, in order.
    """

    body: int
    message_id: int | None
    key: int | None
    fields: tuple[tuple[str, int], ...]
    columns: tuple[str, ...]

    @classmethod
    def of(
        cls,
        columns: Sequence[str],
        *,
        body_column: str = "body",
        message_id_column: str | None = None,
        key_column: str | None = None,
        where: str = "the georep sink",
    ) -> RowLayout:
        """The layout of rows with ``columns``.

        ``message_id_column`` None uses a column named ``message_id`` if there is one;
        ``key_column`` applies only without a MessageId column.

        Raises:
            ConfigurationError: The body column, or a column named in an option, is missing.
        """
        names = list(columns)

        def position(name: str, option: str) -> int:
            if name not in names:
                raise ConfigurationError(
                    f"{where}: no column {name!r} (columns: {', '.join(names)}): pass {option}"
                )
            return names.index(name)

        body = position(body_column, "bodyColumn / body_col=")
        if message_id_column is not None:
            message_id: int | None = position(message_id_column, "messageIdColumn")
        else:
            message_id = names.index("message_id") if "message_id" in names else None
        key = None
        if key_column is not None and message_id is None:
            key = position(key_column, "keyColumn / key_col=")
        fields = tuple((name, names.index(name)) for name in _FIELDS if name in names)
        return cls(body, message_id, key, fields, tuple(names))

    @property
    def identity(self) -> str:
        """How MessageIds are made, for messages and docs."""
        if self.message_id is not None:
            return f"column {self.columns[self.message_id]!r}"
        if self.key is not None:
            return f"scope, batch id and column {self.columns[self.key]!r}"
        return "scope, batch id and each row's content"


class MessageIds:
    """The MessageIds of one batch's rows (one partition of it, on an executor).

    Args:
        layout: Where the row's parts are.
        scope: Distinguishes writers whose batch ids overlap (a query id, a job name).
        batch_id: The micro-batch id (0 for a batch write).
    """

    def __init__(self, layout: RowLayout, scope: str, batch_id: int) -> None:
        self._layout = layout
        self._scope = scope
        self._batch_id = batch_id
        self._keys: set[str] = set()
        self._contents: dict[str, int] = {}

    def of(self, values: Sequence[Any]) -> str:
        """The MessageId of the row ``values``.

        Raises:
            ConfigurationError: A null MessageId or key, or a key seen before in this batch.
        """
        layout = self._layout
        if layout.message_id is not None:
            value = values[layout.message_id]
            if value is None:
                name = layout.columns[layout.message_id]
                raise ConfigurationError(
                    f"micro-batch {self._batch_id}: a row has a null {name!r}; every row "
                    "needs its MessageId"
                )
            return str(value)
        if layout.key is not None:
            raw = values[layout.key]
            name = layout.columns[layout.key]
            if raw is None:
                raise ConfigurationError(
                    f"micro-batch {self._batch_id}: a row has a null {name!r}; every row "
                    "needs a key to derive its MessageId"
                )
            key = str(raw)
            if key in self._keys:
                raise ConfigurationError(
                    f"micro-batch {self._batch_id}: key {key!r} appears twice in {name!r}; "
                    "keys must be unique within a batch (the receiver would drop one)"
                )
            self._keys.add(key)
            return sink_message_id(self._scope, self._batch_id, key)
        # No identity given: the row's content, and its rank among identical rows here.
        digest = hashlib.sha256(_canonical(list(values)).encode()).hexdigest()
        rank = self._contents.get(digest, 0)
        self._contents[digest] = rank + 1
        return sink_message_id(self._scope, self._batch_id, f"row:{digest}#{rank}")


def _canonical(value: Any) -> str:
    """A text that two equal column values always share, across processes and runs."""
    if value is None:
        return "~"
    if isinstance(value, bytes | bytearray):
        return "b" + bytes(value).hex()
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict):
        items = sorted(f"{_canonical(k)}:{_canonical(v)}" for k, v in value.items())
        return "{" + ",".join(items) + "}"
    if isinstance(value, list | tuple):  # arrays, and structs (Rows are tuples)
        return "[" + ",".join(_canonical(v) for v in value) + "]"
    if isinstance(value, datetime | date):
        return value.isoformat()
    return f"{type(value).__name__}:{value!r}"


def _body(value: Any, column: str) -> str | bytes:
    if isinstance(value, str | bytes):
        return value
    if isinstance(value, bytearray):
        return bytes(value)
    raise ConfigurationError(
        f"column {column!r} holds {type(value).__name__}, not a string or binary: "
        f"cast it first, e.g. to_json(struct(...)) or col({column!r}).cast('string')"
    )


def _message(
    values: Sequence[Any], layout: RowLayout, message_id: str, batch_id: int | None
) -> Any:
    from azure.servicebus import ServiceBusMessage

    fields = {name: values[index] for name, index in layout.fields}
    properties = dict(fields.pop("application_properties", None) or {})
    if batch_id is not None:
        properties.setdefault(BATCH_ID_PROPERTY, batch_id)
    given = {name: value for name, value in fields.items() if value is not None}
    return ServiceBusMessage(
        _body(values[layout.body], layout.columns[layout.body]),
        message_id=message_id,
        application_properties=properties or None,
        **given,
    )


async def send_rows(
    sender: GeoSender,
    rows: Iterable[Sequence[Any]],
    ids: MessageIds,
    layout: RowLayout,
    *,
    batch_id: int | None,
    batch_size: int,
) -> int:
    """Send ``rows`` as messages through the open ``sender``, ``batch_size`` per call.

    Returns:
        How many messages were sent (or queued in the sender's outbox).

    Raises:
        ConfigurationError: A row cannot become a message (see :class:`MessageIds`).
        GeoReplicationError: A send failed (the caller's batch fails and Spark retries it).
    """
    pending: list[Any] = []
    sent = 0
    for values in rows:
        pending.append(_message(values, layout, ids.of(values), batch_id))
        if len(pending) >= batch_size:
            await sender.send_messages(pending)
            sent += len(pending)
            pending = []
    if pending:
        await sender.send_messages(pending)
        sent += len(pending)
    return sent


def run_sync(coroutine: Coroutine[Any, Any, _T]) -> _T:
    """Run a coroutine to completion from synchronous code.

    Spark calls foreachBatch functions on a Py4J callback thread, and a writer's
    ``write`` on a worker's main thread, neither with an event loop, where ``asyncio.run``
    is right; a caller that has a running loop in this thread (a notebook) gets the
    coroutine run on a thread of its own instead of a "loop is running" error.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = asyncio.run(coroutine)
        # cancellation: the thread hands it to the calling thread, which raises it
        except BaseException as exc:  # handed to the calling thread below
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="georep-spark-sink")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]  # type: ignore[no-any-return]


# ------------------------------------------------------------------ the data source sink


@dataclass(frozen=True)
class SinkSettings:
    """The sink's options, parsed on the driver and pickled to the executors.

    Attributes:
        connection: Both regions' namespaces.
        entity: The queue or topic sent to.
        mode: ``passive`` or ``active`` (:class:`georep.ReplicationMode`).
        outbox_path: A SQLite outbox file on each executor (queued sends survive a
            double outage), or None.
        attempt_timeout: Seconds georep waits for one region's attempt.
        batch_size: Messages per ``send_messages`` call.
        body_column: The body column.
        message_id_column: The MessageId column named by the user (None: ``message_id``
            if the rows have it).
        key_column: The column a MessageId is derived from with scope and batch id.
        scope: What distinguishes this writer's ids; default the streaming query's id.
    """

    connection: Connection
    entity: Entity
    mode: str
    outbox_path: str | None
    attempt_timeout: float
    batch_size: int
    body_column: str
    message_id_column: str | None
    key_column: str | None
    scope: str | None

    def layout(self, columns: Sequence[str]) -> RowLayout:
        """The layout of rows with ``columns``, checked against these settings."""
        return RowLayout.of(
            columns,
            body_column=self.body_column,
            message_id_column=self.message_id_column,
            key_column=self.key_column,
        )

    def open_sender(self) -> tuple[GeoSender, Any]:
        """A new GeoSender (not yet open) and the outbox it owns through us (or None)."""
        from georep import FailoverPolicy, GeoSender, SqliteOutbox

        outbox = SqliteOutbox(self.outbox_path) if self.outbox_path else None
        sender = GeoSender.from_connection_strings(
            *self.connection.targets(),
            queue_name=self.entity.queue_name,
            topic_name=self.entity.topic_name,
            mode=self.mode,
            policy=FailoverPolicy(attempt_timeout=self.attempt_timeout),
            outbox=outbox,
        )
        return sender, outbox


def sink_settings(given: Any) -> SinkSettings:
    """The sink's settings from Spark's options.

    Raises:
        ConfigurationError: An option is unknown, missing or malformed.
    """
    options = Options(given, (*connection_options(), *_SINK_OPTIONS), "the georep sink")
    if options.text("subscriptionName") is not None:
        raise ConfigurationError("the georep sink sends to a queue or topic: drop subscriptionName")
    return SinkSettings(
        connection=connection(options),
        entity=entity(options, reading=False),
        mode=options.choice("mode", "passive", ("passive", "active")),
        outbox_path=options.text("outboxPath"),
        attempt_timeout=options.seconds("attemptTimeoutSeconds", 10.0),
        batch_size=options.integer("sendBatchSize", 100),
        body_column=options.text("bodyColumn", "body") or "body",
        message_id_column=options.text("messageIdColumn"),
        key_column=options.text("keyColumn"),
        scope=options.text("scope"),
    )


async def send_partition(
    settings: SinkSettings,
    layout: RowLayout,
    rows: Iterable[Sequence[Any]],
    *,
    scope: str,
    batch_id: int | None,
) -> int:
    sender, outbox = settings.open_sender()
    try:
        async with sender:
            ids = MessageIds(layout, scope, batch_id or 0)
            return await send_rows(
                sender, rows, ids, layout, batch_id=batch_id, batch_size=settings.batch_size
            )
    finally:
        if outbox is not None:
            await outbox.aclose()


def micro_batch() -> tuple[str, int]:
    """The running task's streaming query id and micro-batch id (Spark's local properties).

    Raises:
        ConfigurationError: Not inside a streaming query's micro-batch.
    """
    from pyspark import TaskContext

    context = TaskContext.get()
    query_id = context.getLocalProperty("sql.streaming.queryId") if context else None
    batch_id = context.getLocalProperty("streaming.sql.batchId") if context else None
    if query_id is None or batch_id is None:
        raise ConfigurationError(
            "the georep stream writer runs inside a streaming query's micro-batch only"
        )
    return query_id, int(batch_id)


# ------------------------------------------------------------------ foreach_batch_sink


def foreach_batch_sink(
    sender_factory: Callable[[], GeoSender | Awaitable[GeoSender]],
    *,
    body_col: str = "body",
    key_col: str = "key",
    scope: str = "georep.spark",
    batch_size: int = 100,
) -> Callable[[DataFrame, int], None]:
    """A function for ``writeStream.foreachBatch`` that sends each row as one message.

    The driver-side form of the ``georep`` sink (same MessageIds, same columns), for a
    GeoSender built in code: each micro-batch opens a sender with ``sender_factory()``
    (inside the event loop that sends, so SDK clients bind to it), streams the rows to the
    driver, sends them in lists of ``batch_size``, and closes the sender. A failed send
    raises, so Spark fails the batch and replays it; the replay reuses the MessageIds.
    ``df.writeStream.format("georep")`` does the same from the executors.

    Args:
        sender_factory: Returns a new, unopened ``GeoSender`` (or an awaitable of one),
            e.g. ``lambda: GeoSender.from_connection_strings(primary, secondary,
            queue_name="orders")``; the sink closes it after each batch.
        body_col: String or binary column sent as the message body.
        key_col: Column that identifies a row within its micro-batch (unique per batch);
            with the batch id it makes the MessageId. A ``message_id`` column, if the
            rows have one, is the MessageId instead.
        scope: Distinguishes queries writing to the same entity (their batch ids overlap);
            give each streaming query its own.
        batch_size: Messages per ``send_messages`` call; lower it for large bodies.

    Returns:
        ``f(df, batch_id)`` for ``df.writeStream.foreachBatch(f)``.

    Raises:
        ConfigurationError: ``batch_size`` < 1 (now); at batch time, a missing column, a
            null or repeated key, or a body that is not a string or binary.
    """
    if batch_size < 1:
        raise ConfigurationError(f"batch_size must be at least 1, got {batch_size}")

    def send_batch(df: DataFrame, batch_id: int) -> None:
        layout = RowLayout.of(
            df.columns, body_column=body_col, key_column=key_col, where=f"micro-batch {batch_id}"
        )
        rows = (tuple(row) for row in df.toLocalIterator())
        run_sync(_send_with(sender_factory, rows, layout, scope, batch_id, batch_size))

    return send_batch


async def _send_with(
    factory: Callable[[], GeoSender | Awaitable[GeoSender]],
    rows: Iterable[Sequence[Any]],
    layout: RowLayout,
    scope: str,
    batch_id: int,
    batch_size: int,
) -> int:
    made = factory()
    sender = await made if inspect.isawaitable(made) else made
    async with sender:
        ids = MessageIds(layout, scope, batch_id)
        return await send_rows(sender, rows, ids, layout, batch_id=batch_id, batch_size=batch_size)
