"""``spark.readStream.format("georep")``: both regions of a queue or subscription as a stream.

What runs where, and why:

- **On the driver**, in the Python process Spark keeps for the stream's reader (one per
  query, alive while it runs), an :class:`Intake`: a GeoReceiver reading both regions with
  the seen-set, whose handler does not process a copy but hands it to the next micro-batch
  and waits until Spark has committed that batch. Receiving has to happen there: a copy's
  lock belongs to the link that received it, so the process that settles the copy after
  Spark's commit must be the one that received it, and only the driver lives from one
  micro-batch to the next (an executor's task ends with its batch).
- **On the executors**, only ``read()``: a micro-batch's rows are read from the Parquet
  file the driver staged for it (:mod:`._staging`). The staging location must therefore be
  reachable at one path from the driver and every executor.

The guarantee (docs/spark.md): each message acknowledged by a sender appears once in the
query's output, across an outage of a region and a crash of the driver, within the
seen-set's window:

1. ``latestOffset`` takes the copies waiting in the handlers (at most
   ``maxMessagesPerBatch`` and ``maxBytesPerBatch``), writes them to ``batch-N.parquet``
   durably, and only then reports offset N. A restarted query that runs batch N again
   reads that file: the same rows, whatever the broker holds by then.
2. A copy is settled only after Spark committed its batch: Spark's micro-batch engine asks
   for the offset after N only once batch N is in its commit log, so ``latestOffset(N)``
   (and ``commit``) record N's MessageIds as done in the seen-set, then release the
   handlers, which complete their copies (and the twins in the other region).
3. One logical message is one row: the GeoReceiver claims each MessageId in the seen-set
   before its handler runs, so a twin from the other region waits for the claim's outcome
   and is completed as a duplicate; a copy redelivered after a lost lock or a restart whose
   MessageId is in a staged, uncommitted batch waits for that batch's commit instead of
   joining a new batch; one already recorded as done is completed at once.
"""

from __future__ import annotations

__all__ = ["GeorepStreamReader", "Intake", "SourceSettings", "StagedBatch", "source_settings"]

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from georep._lifecycle import wait_within
from georep._sync_runtime import LoopRuntime
from georep.exceptions import StoreUnavailableError
from georep.receive.settlement import complete_all

from ._options import Connection, Entity, Options, connection, connection_options, entity
from ._staging import ARROW_SCHEMA, Staging, read_staged, staging_path

_log = logging.getLogger("georep.spark")

_SOURCE_OPTIONS = (
    "stagingLocation",
    "seenSetUrl",
    "seenSetGroup",
    "maxMessagesPerBatch",
    "maxBytesPerBatch",
    "leaseSeconds",
    "maxWaitSeconds",
    "dedupScope",
)
_REGION = "_georep_spark_region"
"""The attribute a received copy carries its region's label in (set on receipt)."""
_ANONYMOUS = "\x00no-message-id:"
"""Prefix of the key a copy without a MessageId waits under (it has no row identity)."""
_LANES = 2
"""GeoReceivers over both regions: a micro-batch runs while another lane receives."""
_FILL_WAIT = 0.05
"""Seconds a receive that fills a lane's turn waits for more (the entity is busy then)."""
_FILL_LIMIT = 5.0
"""Seconds a lane fills one turn at most: well inside the receive's deadline
(``max_wait`` plus :data:`georep.receive.region_loop.RECEIVE_GRACE`)."""
_ASSUMED_SIZE = 256 * 1024
"""Body bytes assumed per copy before a region's first receive (Standard's largest)."""
_SETTLE_BATCH = 1000
"""Completions a lane's region receiver buffers before it sends them (see _Labelled)."""
_BODY = "_georep_spark_body"
"""The attribute a received copy carries its body's bytes in (read once, on receipt)."""
_SETTLE_TURN = 0.02
"""Seconds without a new arrival after which a receive turn's copies are all in."""


@dataclass(frozen=True)
class SourceSettings:
    """The source's options, parsed on the driver (see docs/spark.md for each).

    Attributes:
        connection: Both regions' namespaces.
        entity: The queue, or topic and subscription.
        seen_url: The Redis URL of the seen-set (kept out of ``repr``: it may hold a
            password).
        seen_group: The seen-set group; every reader of the entity that must not see a
            message twice shares it.
        staging: Where the planned batches are staged.
        max_messages: Most messages in one micro-batch, and copies one lane holds per
            region.
        max_bytes: Most body bytes in one micro-batch (at least one message), and about
            the most one lane receives per region in one turn.
        lease: Seconds a claim in the seen-set lasts unless renewed (renewed while the
            copy waits for its batch); after a crash, the copies wait this long.
        max_wait: Seconds one receive waits when the entity is idle, and ``latestOffset``
            waits for a first copy.
        dedup_scope: The seen-set scope (default: the entity path).
    """

    connection: Connection
    entity: Entity
    seen_url: str = field(repr=False)
    seen_group: str
    staging: str
    max_messages: int
    max_bytes: int
    lease: float
    max_wait: float
    dedup_scope: str | None


def source_settings(given: Any) -> SourceSettings:
    """The source's settings from Spark's options.

    Raises:
        ConfigurationError: An option is unknown, missing or malformed.
    """
    options = Options(given, (*connection_options(), *_SOURCE_OPTIONS), "the georep source")
    staging = options.required(
        "stagingLocation",
        "a directory kept with the query's checkpoint (e.g. <checkpoint>/georep-staging), "
        "where each planned micro-batch is written before Spark runs it",
    )
    staging_path(staging)  # the scheme is checked now, not in the middle of the stream
    return SourceSettings(
        connection=connection(options),
        entity=entity(options, reading=True),
        seen_url=options.required(
            "seenSetUrl", "the Redis URL of the seen-set, e.g. redis://127.0.0.1:6379/0"
        ),
        seen_group=options.text("seenSetGroup", "georep-spark") or "georep-spark",
        staging=staging,
        max_messages=options.integer("maxMessagesPerBatch", 10_000),
        max_bytes=options.integer("maxBytesPerBatch", 16 * 1024 * 1024),
        lease=options.seconds("leaseSeconds", 60.0),
        max_wait=options.seconds("maxWaitSeconds", 1.0),
        dedup_scope=options.text("dedupScope"),
    )


class StagedBatch(InputPartition):
    """One micro-batch's staged file, read by one task."""

    def __init__(self, path: str, batch: int) -> None:
        super().__init__(batch)
        self.path = path
        self.batch = batch


class GeorepStreamReader(DataSourceStreamReader):
    """The georep source's reader: offsets are staged batch numbers (``{"batch": N}``).

    Spark creates one in a long-lived Python process on the driver (offsets, partitions,
    commits: the :class:`Intake` starts there on the first ``latestOffset``) and
    others only to ship :meth:`read` to the executors, so construction does no I/O.
    """

    def __init__(self, settings: SourceSettings) -> None:
        self._settings = settings
        self._intake: Intake | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"_settings": self._settings, "_intake": None}

    def _staging(self) -> Staging:
        return Staging(staging_path(self._settings.staging))

    def initialOffset(self) -> dict[str, int]:
        return {"batch": self._staging().open()}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self._settings.max_messages)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        if self._intake is None:
            self._intake = Intake(self._settings)
            self._intake.start()
        most = self._settings.max_messages
        if isinstance(limit, ReadMaxRows):
            most = min(most, limit.max_rows)
        elif not isinstance(limit, ReadAllAvailable):
            _log.warning("georep source: read limit %r not supported; using %d", limit, most)
        return {"batch": self._intake.plan(int(start["batch"]), most)}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        staging = self._staging()
        batches = range(int(start["batch"]) + 1, int(end["batch"]) + 1)
        missing = [batch for batch in batches if not staging.has(batch)]
        if missing:
            raise FileNotFoundError(
                f"the georep source's staged batch {missing[0]} is missing from "
                f"{staging.root}: it cannot be read again identically. Restore the "
                "stagingLocation that belongs to this checkpoint, or start the query "
                "with a new checkpoint (its messages not yet committed are received again)"
            )
        return [StagedBatch(str(staging.path(batch)), batch) for batch in batches]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, StagedBatch)
        return read_staged(partition.path, partition.batch)

    def commit(self, end: dict[str, int]) -> None:
        if self._intake is not None:
            self._intake.committed(int(end["batch"]))

    def stop(self) -> None:
        intake, self._intake = self._intake, None
        if intake is not None:
            intake.close()


# --------------------------------------------------------------------------- the driver


class _Closing(Exception):
    """The source is stopping: the copy is handed back to the broker."""


@dataclass
class _Waiting:
    """A received copy's row, waiting to be staged in a batch."""

    row: dict[str, Any]
    staged: asyncio.Future[int]
    lane: object
    """The lane (GeoReceiver) whose handler holds the copy."""


class Intake:
    """The driver's half of the source: receive, stage, and settle after Spark's commit.

    Runs a GeoReceiver on an event loop thread of its own; Spark's calls
    (:meth:`plan`, :meth:`committed`, :meth:`close`) come from the reader's thread and wait
    for the loop.

    Args:
        settings: The source's settings.
    """

    def __init__(self, settings: SourceSettings) -> None:
        self._settings = settings
        self._staging = Staging(staging_path(settings.staging))
        self._runtime = LoopRuntime()
        self._owner = f"spark-source:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._waiting: dict[str, _Waiting] = {}
        self._staged: dict[str, int] = {}
        self._batch_ids: dict[int, list[str]] = {}
        self._commits: dict[int, asyncio.Future[None]] = {}
        self._committed = 0
        self._closing = False
        self._receiver: Any = None
        self._receivers: list[Any] = []
        self._regions: list[Any] = []
        self._labelled: list[_Labelled] = []
        self._seen: Any = None
        self._running: list[asyncio.Task[None]] = []
        self._arrived: asyncio.Event | None = None

    # ------------------------------------------------------------- Spark's calls

    def start(self) -> None:
        """Recover the staged batches, connect, and start receiving.

        Raises:
            StoreUnavailableError: The seen-set did not answer (batches committed before a
                crash must be recorded before anything else is received).
        """
        self._runtime.acquire()
        try:
            self._runtime.call(self._open())
        except BaseException:
            self.close()
            raise

    def plan(self, start: int, most: int) -> int:
        """Record that ``start`` is committed and plan the batch after it: the offset to
        report (``start`` when nothing arrived)."""
        return self._runtime.call(self._plan(start, most))

    def committed(self, batch: int) -> None:
        """Spark committed every batch up to ``batch``: settle their copies."""
        self._runtime.call(self._record_committed(batch))

    def close(self) -> None:
        """Hand back every copy not yet settled, and close; idempotent."""
        if self._runtime.thread is None:
            return
        with contextlib.suppress(Exception):
            self._runtime.call(self._close())
        self._runtime.release()

    # ------------------------------------------------------------- on the loop

    async def _open(self) -> None:
        from georep import GeoReceiver
        from georep.adapters.redis import RedisSeenSet
        from georep.adapters.servicebus import open_region_receiver

        settings = self._settings
        self._arrived = asyncio.Event()
        self._committed = await asyncio.to_thread(self._staging.open)
        self._seen = RedisSeenSet.from_url(settings.seen_url, group=settings.seen_group)
        primary, secondary = settings.connection.targets()
        found = settings.entity
        # Each lane is a GeoReceiver over both regions. A lane's turn of copies is held
        # until its batch is committed; with two, one receives the next batch's copies
        # while Spark runs the batch that holds the other's.
        for _ in range(_LANES):
            regions = [
                open_region_receiver(
                    target,
                    region=label,
                    queue_name=found.queue_name,
                    topic_name=found.topic_name,
                    subscription_name=found.subscription_name,
                )
                for target, label in ((primary, "primary"), (secondary, "secondary"))
            ]
            self._regions += regions
            labelled = [_Labelled(region, settings.max_bytes) for region in regions]
            self._labelled += labelled
            self._receivers.append(
                GeoReceiver(
                    *labelled,
                    seen=self._seen,
                    concurrency=settings.max_messages,
                    lease=settings.lease,
                    max_wait=settings.max_wait,
                    dedup_scope=settings.dedup_scope,
                    owner=self._owner,
                )
            )
        self._receiver = self._receivers[0]
        await self._recover()
        self._running = [
            asyncio.create_task(receiver.run(partial(self._handle, receiver)))
            for receiver in self._receivers
        ]

    async def _recover(self) -> None:
        """Index the batches staged before a restart; record the committed ones as done."""
        done: list[str] = []
        for batch in await asyncio.to_thread(self._staging.batches):
            ids = await asyncio.to_thread(self._staging.message_ids, batch)
            if batch <= self._committed:
                done += ids
                continue
            self._batch_ids[batch] = ids
            for message_id in ids:
                self._staged[message_id] = batch
        if done:
            await self._commit([self._receiver.seen_key(i) for i in done])
        await asyncio.to_thread(self._staging.drop_through, self._committed)
        if self._batch_ids:
            _log.info(
                "georep source: batches %s were planned before a restart and are read "
                "again from %s",
                sorted(self._batch_ids),
                self._staging.root,
            )

    async def _handle(self, receiver: Any, message: Any) -> None:
        """A lane's handler: wait until the copy's row is in a committed batch."""
        given = message.message_id
        # A copy without a MessageId cannot be recognised again: its own key, never shared
        # (the GeoReceiver hands each such copy over unchecked: at least once).
        message_id = str(given) if given is not None else f"{_ANONYMOUS}{uuid.uuid4().hex}"
        try:
            batch = self._staged.get(message_id)
            if batch is None:
                waiting = self._waiting.get(message_id)
                if waiting is None:
                    row = _row(message, str(given) if given is not None else None)
                    future = asyncio.get_running_loop().create_future()
                    waiting = self._waiting[message_id] = _Waiting(row, future, receiver)
                    assert self._arrived is not None
                    self._arrived.set()
                batch = await asyncio.shield(waiting.staged)
            await asyncio.shield(self._commit_of(batch))
        except _Closing:
            # Not processed: redelivered at once (a restart finds it staged, if it was).
            await receiver.abandon_message(message)

    def _commit_of(self, batch: int) -> asyncio.Future[None]:
        future = self._commits.get(batch)
        if future is None:
            future = self._commits[batch] = asyncio.get_running_loop().create_future()
            if self._closing:
                future.set_exception(_Closing())
            elif batch <= self._committed:
                future.set_result(None)
        return future

    async def _plan(self, start: int, most: int) -> int:
        # Spark plans the batch after ``start`` only once ``start`` is in its commit log.
        await self._record_committed(start)
        batch = start + 1
        if batch in self._batch_ids or await asyncio.to_thread(self._staging.has, batch):
            return batch  # planned before (a restart, or a retried call): the same rows
        await self._gather(most)
        taken = self._take(most)
        if not taken:
            return start
        table = pa.Table.from_pylist([waiting.row for _, waiting in taken], schema=ARROW_SCHEMA)
        await asyncio.to_thread(self._staging.write, batch, table)
        ids = [message_id for message_id, _ in taken if not message_id.startswith(_ANONYMOUS)]
        self._batch_ids[batch] = ids
        self._staged.update(dict.fromkeys(ids, batch))
        for message_id, waiting in taken:
            del self._waiting[message_id]
            if not waiting.staged.done():
                waiting.staged.set_result(batch)
        return batch

    async def _gather(self, most: int) -> None:
        """Wait up to ``max_wait`` for a first copy, then for the rest of its turn."""
        assert self._arrived is not None
        if not self._waiting:
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await wait_within(self._arrived.wait(), self._settings.max_wait)
        # A receive turn's handlers start together: wait until no more arrive.
        count = -1
        while count != len(self._waiting) and len(self._waiting) < most:
            count = len(self._waiting)
            await asyncio.sleep(_SETTLE_TURN)

    def _take(self, most: int) -> list[tuple[str, _Waiting]]:
        """The waiting copies of the next batch, in arrival order: one lane's (the oldest
        copy's), so that the other lane's turn can fill while Spark runs the batch; at
        most ``most``, and at most ``maxBytesPerBatch`` of bodies (one copy, whatever its
        size)."""
        taken: list[tuple[str, _Waiting]] = []
        size = 0
        lane = None
        for item in self._waiting.items():
            waiting = item[1]
            if lane is None:
                lane = waiting.lane
            elif waiting.lane is not lane:
                continue
            size += len(waiting.row["body"])
            if len(taken) == most or (taken and size > self._settings.max_bytes):
                break
            taken.append(item)
        return taken

    async def _record_committed(self, batch: int) -> None:
        """Record batches up to ``batch`` as done in the seen-set, then settle their copies.

        The seen-set first: a copy redelivered later (its lock lost, the region back from
        an outage) is then completed as a duplicate, never planned again. If the seen-set
        does not answer, nothing is settled now; the next call tries again.
        """
        if batch <= self._committed:
            return
        batches = [b for b in sorted(self._batch_ids) if b <= batch]
        ids = [message_id for b in batches for message_id in self._batch_ids[b]]
        try:
            if ids:
                await self._commit([self._receiver.seen_key(message_id) for message_id in ids])
        except StoreUnavailableError as exc:
            _log.warning(
                "georep source: the seen-set did not answer (%s); batches up to %d are "
                "settled once it does",
                exc,
                batch,
            )
            return
        await asyncio.to_thread(self._staging.set_committed, batch)
        self._committed = batch
        for b in batches:
            for message_id in self._batch_ids.pop(b):
                self._staged.pop(message_id, None)
        for b in [b for b in self._commits if b <= batch]:
            future = self._commits.pop(b)
            if not future.done():
                future.set_result(None)
        await asyncio.to_thread(self._staging.drop_through, batch)

    async def _commit(self, keys: list[str]) -> None:
        """Record ``keys`` as done in the seen-set, and tell every lane: their twins are
        then settled without a claim, and a handler still waiting on one is not reported
        as having lost its claim."""
        await self._seen.commit(keys, owner=self._owner)
        for receiver in self._receivers:
            receiver.record_outcomes(keys)

    async def _close(self) -> None:
        self._closing = True
        for waiting in self._waiting.values():
            if not waiting.staged.done():
                waiting.staged.set_exception(_Closing())
        for future in self._commits.values():
            if not future.done():
                future.set_exception(_Closing())
        for receiver in self._receivers:
            await receiver.aclose()
        for running in self._running:
            with contextlib.suppress(Exception):
                await running
        for labelled in self._labelled:
            await labelled.flush()
        for region in self._regions:
            with contextlib.suppress(Exception):
                await region.close()
        if self._seen is not None:
            await self._seen.aclose()


def _row(message: Any, message_id: str | None) -> dict[str, Any]:
    """The source's row for one received copy."""
    return {
        "message_id": message_id,
        "body": getattr(message, _BODY, None) or _body_bytes(message),
        "content_type": message.content_type,
        "application_properties": _properties(message.application_properties),
        "enqueued_time": message.enqueued_time_utc or datetime.now(UTC),
        "region": getattr(message, _REGION, None),
        "session_id": message.session_id,
        "dead_letter_reason": message.dead_letter_reason,
    }


def _body_bytes(message: Any) -> bytes:
    from azure.servicebus.amqp import AmqpMessageBodyType

    if message.body_type is AmqpMessageBodyType.DATA:
        return b"".join(message.body)
    # A value or sequence body (sent by another AMQP client): as JSON text.
    return json.dumps(message.body, default=str).encode()


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _properties(properties: Any) -> list[tuple[str, str]] | None:
    if not properties:
        return None
    return [(_text(key), _text(value)) for key, value in properties.items()]


class _Labelled:
    """One region's receiver (a :class:`georep.ports.RegionReceiver`) for one lane: it
    labels each copy it receives with the region (the row's ``region`` column) and its
    body's bytes, and fills the lane's turn within the batch limits.

    A turn fills while copies keep coming, for :data:`_FILL_LIMIT` seconds at most: a
    micro-batch costs Spark about the same whatever it holds, and the driver settles a
    large turn's copies for less CPU each than many small turns' (measured in
    docs/spark.md), so a busy entity makes large batches and a quiet one short waits.

    Completions are buffered and sent together (``complete_many``: one disposition per
    run of consecutive delivery ids) before the next call of any other kind, or once
    :data:`_SETTLE_BATCH` wait: settling one at a time, a round trip each, was most of
    the driver's CPU. The source completes a copy only after its MessageId is recorded
    as done in the seen-set, so a completion that is lost (a crash, a dropped link)
    costs nothing but the copy's coming back, to be completed as a duplicate.

    Args:
        inner: The region's receiver.
        max_bytes: ``maxBytesPerBatch``: a turn stops filling once its bodies reach it,
            and each receive asks for no more copies than fit in what is left, at the
            size of the largest body seen (so one turn holds about ``max_bytes``).
        clock: Seconds, monotonic (for the fill's time limit).
    """

    def __init__(
        self, inner: Any, max_bytes: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._inner = inner
        self._max_bytes = max_bytes
        self._clock = clock
        self._completed: list[Any] = []
        self._size = _ASSUMED_SIZE
        """The largest body of the last turn: what the next turn's first receive fits."""

    @property
    def region(self) -> str:
        return str(self._inner.region)

    @property
    def namespace(self) -> str:
        return str(self._inner.namespace)

    @property
    def entity(self) -> str:
        return str(self._inner.entity)

    def delivery(self, message: Any, dedup_source: str, dedup_name: str | None) -> Any:
        return self._inner.delivery(message, dedup_source, dedup_name)

    def _fits(self, most: int, room: int, size: int) -> int:
        """How many copies of ``size`` bytes fit in ``room`` (at least one, at most
        ``most``)."""
        return max(1, min(most, room // max(size, 1)))

    def _label(self, messages: list[Any]) -> tuple[int, int]:
        """Label ``messages``; their bodies' total and largest size."""
        total = largest = 0
        for message in messages:
            body = _body_bytes(message)
            total += len(body)
            largest = max(largest, len(body))
            with contextlib.suppress(AttributeError):
                setattr(message, _REGION, self.region)
                setattr(message, _BODY, body)
        return total, largest

    async def flush(self) -> None:
        """Send the buffered completions; a failure is logged (the copies come back, and
        are completed as duplicates then)."""
        done, self._completed = self._completed, []
        if not done:
            return
        try:
            await complete_all(self._inner, done)
        except Exception as exc:
            _log.warning(
                "georep source: completing %d copies in %s failed (%s); they come back "
                "and are completed as duplicates",
                len(done),
                self.region,
                exc,
            )

    async def receive(self, max_messages: int, *, max_wait: float) -> list[Any]:
        await self.flush()
        first = self._fits(max_messages, self._max_bytes, self._size)
        messages: list[Any] = list(await self._inner.receive(first, max_wait=max_wait))
        size, largest = self._label(messages)
        # One receive returns the first burst that arrived. A lane's turn is all it
        # receives until its micro-batch is committed, so fill the turn while more is
        # there: each Spark micro-batch costs about the same whatever it holds.
        until = self._clock() + _FILL_LIMIT
        while (
            messages
            and len(messages) < max_messages
            and size < self._max_bytes
            and self._clock() < until
        ):
            count = self._fits(max_messages - len(messages), self._max_bytes - size, largest)
            more = list(await self._inner.receive(count, max_wait=_FILL_WAIT))
            if not more:
                break
            more_size, more_largest = self._label(more)
            size += more_size
            largest = max(largest, more_largest)
            messages += more
        if messages:
            self._size = largest
        return messages

    async def peek(self, count: int) -> list[Any]:
        await self.flush()
        return list(await self._inner.peek(count))

    async def complete(self, message: Any) -> None:
        self._completed.append(message)
        if len(self._completed) >= _SETTLE_BATCH:
            await self.flush()

    async def abandon(self, message: Any) -> None:
        await self.flush()
        await self._inner.abandon(message)

    async def dead_letter(self, message: Any, reason: str | None, description: str | None) -> None:
        await self.flush()
        await self._inner.dead_letter(message, reason, description)

    async def defer(self, message: Any) -> None:
        await self.flush()
        await self._inner.defer(message)

    async def renew_lock(self, message: Any) -> float | None:
        await self.flush()
        renewed: float | None = await self._inner.renew_lock(message)
        return renewed

    async def close(self) -> None:
        """The underlying receiver is the Intake's to close."""
