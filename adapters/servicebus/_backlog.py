"""Backlog queues for paired namespaces, through ``ServiceBusAdministrationClient``."""

from __future__ import annotations

__all__ = ["PING_CONTENT_TYPE", "ensure_backlog_queues", "from_backlog", "make_ping", "to_backlog"]

import logging
import time
import uuid
import warnings
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.core.exceptions import ResourceNotFoundError
from azure.servicebus import ServiceBusMessage, ServiceBusMessageBatch
from azure.servicebus.exceptions import MessageSizeExceededError

from georep.exceptions import InvalidMessageError, MessageExpiredError, MessageTooLargeError
from georep.paired.options import (
    BACKLOG_ALIASES,
    BACKLOG_QUEUE_PROPERTIES,
    PairedNamespaceOptions,
    backlog_queue_path,
)
from georep.ports import ErrorKind

from ._codec import ServiceBusCodec

_CODEC = ServiceBusCodec()

_log = logging.getLogger("georep.paired")
_warned: set[str] = set()


async def ensure_backlog_queues(
    admin_client: Any, primary_namespace: str, options: PairedNamespaceOptions
) -> list[str]:
    """Create the missing backlog queues in the secondary namespace; return every path used.

    ``admin_client`` is an async ``ServiceBusAdministrationClient`` for the **secondary**
    namespace. Queues ``{primary}/x-servicebus-transfer/{i}`` for i in
    ``[0, backlog_queue_count)`` are created with the SPEC §3 properties only when absent.
    An existing queue is never changed or deleted: if its properties differ it is used as
    it is and a warning is issued once per path. Queues with a higher index are left alone
    and unused.

    Returns:
        The backlog queue paths, index order.
    """
    paths = [backlog_queue_path(primary_namespace, i) for i in range(options.backlog_queue_count)]
    for path in paths:
        try:
            existing = await admin_client.get_queue(path)
        except ResourceNotFoundError:
            await admin_client.create_queue(path, **BACKLOG_QUEUE_PROPERTIES)
            _log.info("created backlog queue %s", path)
            continue
        differences = [
            name
            for name, wanted in BACKLOG_QUEUE_PROPERTIES.items()
            if getattr(existing, name, wanted) != wanted
        ]
        if differences and path not in _warned:
            _warned.add(path)
            message = (
                f"backlog queue {path} exists with different {', '.join(differences)}; "
                "georep uses it as it is (delete it to have it recreated with the defaults)"
            )
            warnings.warn(message, UserWarning, stacklevel=2)
            _log.warning(message)
    return paths


def to_backlog(
    message: ServiceBusMessage,
    destination: str,
    *,
    max_size: int = 262_144,
    schedule_time_utc: datetime | None = None,
) -> Any:
    """A copy of ``message`` for a backlog queue, its entity-bound fields turned into aliases.

    SessionId → ``x-ms-sessionid``, TimeToLive → ``x-ms-timetolive`` (milliseconds),
    ScheduledEnqueueTimeUtc → ``x-ms-scheduledenqueuetimeutc`` (ISO 8601), and the
    destination entity → ``x-ms-path``. The MessageId is kept, so duplicates stay
    recognisable downstream.

    Args:
        message: The message as the caller gave it (never changed).
        destination: The entity path in the primary namespace.
        max_size: The backlog queue's size limit in bytes. Default 256 KB.
        schedule_time_utc: A schedule for the copy (``PairedSender.schedule_messages``);
            default: the message's own.

    Raises:
        MessageTooLargeError: The rewritten message no longer fits ``max_size`` bytes (it
            is never truncated).
    """
    copy = _CODEC.copy(message)
    if schedule_time_utc is not None:
        copy.scheduled_enqueue_time_utc = schedule_time_utc
    properties = dict(copy.application_properties or {})
    properties[BACKLOG_ALIASES["destination"]] = destination
    if copy.session_id is not None:
        properties[BACKLOG_ALIASES["session_id"]] = copy.session_id
        copy.session_id = None
    if copy.time_to_live is not None:
        ttl_ms = int(copy.time_to_live.total_seconds() * 1000)
        properties[BACKLOG_ALIASES["time_to_live"]] = ttl_ms
        copy.time_to_live = None
    if copy.scheduled_enqueue_time_utc is not None:
        scheduled = copy.scheduled_enqueue_time_utc.isoformat()
        properties[BACKLOG_ALIASES["scheduled_enqueue_time_utc"]] = scheduled
        copy.scheduled_enqueue_time_utc = None
    copy.application_properties = properties
    batch = ServiceBusMessageBatch(max_size_in_bytes=max_size)
    try:
        batch.add_message(copy)
    except MessageSizeExceededError as exc:
        raise MessageTooLargeError(
            f"message {message.message_id!r} no longer fits {max_size} bytes once rewritten "
            f"for the backlog queue (aliases for {destination!r} added); shrink it",
            region="secondary",
            kind=ErrorKind.MESSAGE_TOO_LARGE,
        ) from exc
    return copy


def from_backlog(message: Any, *, now: float | None = None) -> tuple[str, ServiceBusMessage]:
    """The destination entity and the message as it was sent, aliases restored.

    The time to live is what is left of the original (issue 14): the time the copy spent
    in the backlog queue (since its enqueued time) is subtracted, except for a message
    scheduled later than now, whose time to live starts at its schedule as in the primary.

    Args:
        message: The received backlog copy.
        now: The current time (epoch seconds); default: the system clock.

    Raises:
        InvalidMessageError: The message has no ``x-ms-path`` (the syphon dead-letters it).
        MessageExpiredError: Its time to live ran out in the backlog (the syphon
            dead-letters it instead of delivering it late).
    """
    properties = {
        (k.decode() if isinstance(k, bytes) else str(k)): v
        for k, v in (message.application_properties or {}).items()
    }
    destination = properties.pop(BACKLOG_ALIASES["destination"], None)
    if destination is None:
        raise InvalidMessageError(
            f"backlog message {message.message_id!r} has no x-ms-path: it cannot be moved"
        )
    restored = _CODEC.copy(message)
    session = properties.pop(BACKLOG_ALIASES["session_id"], None)
    ttl = properties.pop(BACKLOG_ALIASES["time_to_live"], None)
    scheduled = properties.pop(BACKLOG_ALIASES["scheduled_enqueue_time_utc"], None)
    restored.application_properties = properties or None
    if session is not None:
        restored.session_id = _text(session)
    schedule = None if scheduled is None else datetime.fromisoformat(_text(scheduled))
    if schedule is not None:
        restored.scheduled_enqueue_time_utc = schedule
    if ttl is not None:
        current = time.time() if now is None else now
        restored.time_to_live = _remaining_ttl(message, int(ttl) / 1000, schedule, current)
    return _text(destination), restored


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _remaining_ttl(message: Any, ttl: float, schedule: datetime | None, now: float) -> timedelta:
    """What is left of ``ttl`` seconds at ``now``; the clock starts when the message was
    (or is scheduled to be) enqueued: the backlog copy's enqueued time or its schedule."""
    enqueued = getattr(message, "enqueued_time_utc", None)
    start = now if enqueued is None else enqueued.timestamp()
    if schedule is not None:
        start = max(start, _as_utc(schedule).timestamp())
    left = ttl - max(0.0, now - start)
    if left * 1000 < 1:  # the service counts whole milliseconds
        raise MessageExpiredError(
            f"message {message.message_id!r} outlived its time to live of {ttl:g} s in the "
            f"backlog queue (by {-left:.3f} s): dropped, not delivered late"
        )
    return timedelta(seconds=left)


def _as_utc(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


PING_CONTENT_TYPE = "application/vnd.ms-servicebus-ping"


def make_ping() -> ServiceBusMessage:
    """An empty ping (SPEC §3): never delivered to receivers, billed like a message."""
    return ServiceBusMessage(
        b"",
        content_type=PING_CONTENT_TYPE,
        time_to_live=timedelta(seconds=1),
        session_id=uuid.uuid4().hex,
    )
