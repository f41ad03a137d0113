"""A Structured Streaming ``foreachBatch`` sink that sends rows through a GeoSender.

Spark replays a micro-batch after a failure (same batch id, same rows). The sink derives
each message's MessageId from (scope, batch id, row key), so the replayed copies carry the
ids of the first attempt and a dedup receiver (GeoReceiver with a seen-set) suppresses them:
each row is processed once however often its batch is replayed.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from georep.exceptions import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from georep import GeoSender

__all__ = ["SINK_NAMESPACE", "foreach_batch_sink", "sink_message_id"]

SINK_NAMESPACE = uuid.UUID("6f1c1b9e-5d0a-5e0b-9a55-6e0f7c2d9b31")
"""The UUID namespace of the sink's uuid5 MessageIds."""
_T = TypeVar("_T")


def sink_message_id(scope: str, batch_id: int, key: str) -> str:
    """The MessageId of the row with ``key`` in micro-batch ``batch_id``."""
    return str(uuid.uuid5(SINK_NAMESPACE, f"{scope}\x1f{batch_id}\x1f{key}"))


def _run(coroutine: Coroutine[Any, Any, _T]) -> _T:
    """Run a coroutine to completion from synchronous code.

    Spark calls foreachBatch functions on a Py4J callback thread with no event loop, where
    ``asyncio.run`` is right; a caller that has a running loop in this thread (a notebook)
    gets the coroutine run on a thread of its own instead of a "loop is running" error.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = asyncio.run(coroutine)
        except BaseException as exc:  # handed to the calling thread below
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="georep-spark-sink")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]  # type: ignore[no-any-return]


def _body(value: Any, body_col: str) -> str | bytes:
    if isinstance(value, str | bytes):
        return value
    if isinstance(value, bytearray):
        return bytes(value)
    raise ConfigurationError(
        f"column {body_col!r} holds {type(value).__name__}, not a string or binary: "
        f"cast it first, e.g. to_json(struct(...)) or col({body_col!r}).cast('string')"
    )


def foreach_batch_sink(
    sender_factory: Callable[[], GeoSender | Awaitable[GeoSender]],
    *,
    body_col: str = "body",
    key_col: str = "key",
    scope: str = "georep.spark",
    batch_size: int = 100,
) -> Callable[[DataFrame, int], None]:
    """A function for ``writeStream.foreachBatch`` that sends each row as one message.

    Each micro-batch opens a sender with ``sender_factory()`` (inside the event loop that
    sends, so SDK clients bind to it), sends the rows in lists of ``batch_size`` (one
    ``send_messages`` call each), and closes the sender. A failed send raises, so Spark
    fails the batch and replays it; the replay reuses the MessageIds.

    Args:
        sender_factory: Returns a new, unopened ``GeoSender`` (or an awaitable of one),
            e.g. ``lambda: GeoSender.from_connection_strings(primary, secondary,
            queue_name="orders")``; the sink closes it after each batch.
        body_col: String or binary column sent as the message body.
        key_col: Column that identifies a row within its micro-batch (unique per batch);
            with the batch id it makes the MessageId.
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
        missing = [c for c in (body_col, key_col) if c not in df.columns]
        if missing:
            raise ConfigurationError(
                f"micro-batch {batch_id} has no column {missing[0]!r} "
                f"(columns: {', '.join(df.columns)}): pass body_col=/key_col="
            )
        rows = df.select(key_col, body_col).toLocalIterator()
        _run(_send_rows(sender_factory, rows, batch_id))

    async def _send_rows(
        factory: Callable[[], GeoSender | Awaitable[GeoSender]], rows: Iterator[Any], batch_id: int
    ) -> None:
        try:
            from azure.servicebus import ServiceBusMessage
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ImportError(
                "the Spark sink needs azure-servicebus: pip install 'georep[servicebus]'"
            ) from exc
        made = factory()
        sender = await made if inspect.isawaitable(made) else made
        keys: set[str] = set()
        async with sender:
            pending: list[Any] = []
            for row in rows:
                raw_key = row[0]
                if raw_key is None:
                    raise ConfigurationError(
                        f"micro-batch {batch_id}: a row has a null {key_col!r}; every row "
                        "needs a key to derive its MessageId"
                    )
                key = str(raw_key)
                if key in keys:
                    raise ConfigurationError(
                        f"micro-batch {batch_id}: key {key!r} appears twice in {key_col!r}; "
                        "keys must be unique within a batch (the receiver would drop one)"
                    )
                keys.add(key)
                pending.append(
                    ServiceBusMessage(
                        _body(row[1], body_col),
                        message_id=sink_message_id(scope, batch_id, key),
                        application_properties={"georep.spark.batch_id": batch_id},
                    )
                )
                if len(pending) >= batch_size:
                    await sender.send_messages(pending)
                    pending = []
            if pending:
                await sender.send_messages(pending)

    return send_batch
