"""``georep status``'s view of the namespaces: per region and entity, how many messages wait,
how many were dead-lettered or are scheduled, and how old the oldest waiting one is.

The counts are the management endpoint's runtime properties (a key with **Manage** rights);
the age is read by peeking (a key with **Listen** rights), only where messages wait. Nothing
is received, locked or changed. Connection strings and keys never reach the results: a
namespace is named by its host, an error by its kind.
"""

from __future__ import annotations

__all__ = ["PEEKED", "EntityDepth", "RegionDepths", "read_depths"]

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Final

from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceNotFoundError,
    ServiceRequestError,
)
from azure.servicebus import ServiceBusMessageState
from azure.servicebus.aio import ServiceBusClient
from azure.servicebus.aio.management import ServiceBusAdministrationClient

from georep._lifecycle import wait_within
from georep.paired.options import backlog_queue_path

from ._doctor import _certificate_error
from ._sender import namespace_of

PEEKED: Final = 10
"""Messages peeked per entity to find the oldest *active* one: a peek starts at the lowest
sequence number, and a deferred (or, in a queue, scheduled) message there is not waiting
to be received. Ten that are all deferred or scheduled leave the age unknown."""

_SUBSCRIPTIONS: Final = "/Subscriptions/"
_BACKLOG_MARK: Final = backlog_queue_path("x", 0).split("/")[1]  # "x-servicebus-transfer"


@dataclass(frozen=True)
class EntityDepth:
    """One queue or subscription in one region.

    Attributes:
        path: The queue's name, or ``topic/Subscriptions/name``.
        entity: The name it was asked for (the queue or topic).
        found: False when the namespace has no such queue or topic.
        active: Messages waiting to be received (locked ones included: the broker counts a
            message in processing as active until it is settled).
        dead_letter: Messages in the entity's dead-letter queue.
        scheduled: Messages scheduled for later (None for a subscription: a topic's
            scheduled messages wait in the topic until their time).
        oldest_enqueued: When the oldest active message was enqueued (peeked), or None:
            nothing waits, or it could not be read (``note`` says why).
        note: Why ``oldest_enqueued`` is missing although messages wait; empty otherwise.
    """

    path: str
    entity: str
    found: bool = True
    active: int | None = None
    dead_letter: int | None = None
    scheduled: int | None = None
    oldest_enqueued: datetime | None = None
    note: str = ""

    def lag(self, now: datetime | None = None) -> float | None:
        """Seconds since the oldest active message was enqueued (by this machine's clock),
        or None when none waits or it could not be read."""
        if self.oldest_enqueued is None:
            return None
        now = now or datetime.now(UTC)
        return max(0.0, (now - self.oldest_enqueued).total_seconds())


@dataclass(frozen=True)
class RegionDepths:
    """What one region's namespace said.

    Attributes:
        region: ``primary`` or ``secondary``.
        namespace: The namespace's host (never the connection string).
        reachable: False when its management endpoint did not answer or refused the key.
        error: Why it is not reachable (the error's kind and the fix), empty otherwise.
        entities: One row per queue or subscription asked for (empty when unreachable).
    """

    region: str
    namespace: str
    reachable: bool
    error: str = ""
    entities: tuple[EntityDepth, ...] = field(default_factory=tuple)


def _unreachable(
    region: str, namespace: str, exc: BaseException, connection_verify: str | None
) -> RegionDepths:
    """The row of a region whose management endpoint failed, naming why and the fix."""
    if isinstance(exc, ClientAuthenticationError) or (
        isinstance(exc, HttpResponseError) and exc.status_code in (401, 403)
    ):
        error = (
            "the management endpoint refused the key: reading depths needs a key with "
            "Manage rights (e.g. RootManageSharedAccessKey)"
        )
    elif isinstance(exc, HttpResponseError):
        error = f"the management endpoint answered HTTP {exc.status_code}"
    elif (certificate := _certificate_error(exc)) is not None:
        reason = getattr(certificate, "verify_message", None) or "not trusted"
        error = (
            f"certificate verification error on the management endpoint ({reason}), not a "
            "network problem: pass --ca-file PATH (for the emulator, its CA file)"
        )
        if connection_verify is not None:
            error += f"; the CA file given was {connection_verify}"
    elif isinstance(exc, TimeoutError):
        error = "did not answer in time (TimeoutError)"
    else:
        error = f"cannot be reached ({type(exc).__name__})"
    return RegionDepths(region, namespace, reachable=False, error=error)


async def _counts(admin: ServiceBusAdministrationClient, name: str) -> list[EntityDepth]:
    """The runtime counts of queue ``name``, of subscription ``topic/Subscriptions/sub``, or
    of every subscription of topic ``name``; one row with ``found=False`` if none exists."""

    def row(path: str, runtime: Any) -> EntityDepth:
        return EntityDepth(
            path=path,
            entity=name,
            active=runtime.active_message_count or 0,
            dead_letter=runtime.dead_letter_message_count or 0,
            # A subscription has none: scheduled messages wait in the topic.
            scheduled=getattr(runtime, "scheduled_message_count", None),
        )

    try:
        if _SUBSCRIPTIONS in name:
            topic, _, subscription = name.partition(_SUBSCRIPTIONS)
            runtime = await admin.get_subscription_runtime_properties(topic, subscription)
            return [row(name, runtime)]
        # The entity's path answers with whatever entity it is: for a topic, the SDK
        # returns queue properties with nothing inside (reading a count raises
        # AttributeError), so a queue is tried first and a topic next.
        try:
            return [row(name, await admin.get_queue_runtime_properties(name))]
        except (ResourceNotFoundError, AttributeError):
            pass
        await admin.get_topic_runtime_properties(name)  # not found: neither of the two
        return [
            row(f"{name}{_SUBSCRIPTIONS}{runtime.name}", runtime)
            async for runtime in admin.list_subscriptions_runtime_properties(name)
        ]
    except ResourceNotFoundError:
        return [EntityDepth(path=name, entity=name, found=False)]


async def _oldest(client: ServiceBusClient, depth: EntityDepth, timeout: float) -> EntityDepth:
    """``depth`` with the enqueued time of its oldest active message (a peek)."""
    if not depth.active:
        return depth
    if _SUBSCRIPTIONS in depth.path:
        topic, _, subscription = depth.path.partition(_SUBSCRIPTIONS)
        receiver = client.get_subscription_receiver(topic, subscription)
    else:
        receiver = client.get_queue_receiver(depth.path)
    try:
        async with receiver:
            peeked = await wait_within(receiver.peek_messages(max_message_count=PEEKED), timeout)
    except Exception as exc:  # a session entity, a key without Listen, a slow link...
        note = f"not peeked ({type(exc).__name__})"
        return replace(depth, note=note)
    for message in peeked:
        if message.state == ServiceBusMessageState.ACTIVE and message.enqueued_time_utc:
            oldest = message.enqueued_time_utc.astimezone(UTC)
            return replace(depth, oldest_enqueued=oldest)
    note = f"the first {len(peeked)} peeked are deferred or scheduled" if peeked else ""
    return replace(depth, note=note or "nothing to peek")


def _admin(connection_string: str, connection_verify: str | None) -> ServiceBusAdministrationClient:
    # No retry of a failed connection: a region that is down must say so now, not after
    # the SDK's backoff (a refused certificate would become a timeout naming nothing).
    options: dict[str, Any] = {"retry_connect": 0, "retry_total": 0}
    if connection_verify is not None:
        options["connection_verify"] = connection_verify
    return ServiceBusAdministrationClient.from_connection_string(connection_string, **options)


async def _listed(
    connection_string: str, connection_verify: str | None, timeout: float
) -> list[str]:
    """Every queue (backlog queues excepted) and topic of a namespace; [] if unreadable
    (reading its counts then says why)."""

    async def names(admin: ServiceBusAdministrationClient) -> list[str]:
        queues = [queue.name async for queue in admin.list_queues()]
        topics = [topic.name async for topic in admin.list_topics()]
        return [name for name in queues if _BACKLOG_MARK not in name] + topics

    try:
        async with _admin(connection_string, connection_verify) as admin:
            return await wait_within(names(admin), timeout)
    except (HttpResponseError, ServiceRequestError, OSError, TimeoutError):
        return []


async def _first_queue(admin: ServiceBusAdministrationClient) -> None:
    """One round trip to the namespace (the first page of its queues): raises as the
    counts would when it is down or refuses the key."""
    async for _ in admin.list_queues():
        break


async def _region(
    region: str,
    connection_string: str,
    entities: Sequence[str],
    connection_verify: str | None,
    timeout: float,
    peek: bool,
) -> RegionDepths:
    namespace = namespace_of(connection_string)
    rows: list[EntityDepth] = []
    try:
        async with _admin(connection_string, connection_verify) as admin:
            for name in entities:
                rows += await wait_within(_counts(admin, name), timeout)
            if not entities:  # asked about nothing: still ask it something before "answers"
                await wait_within(_first_queue(admin), timeout)
    except (HttpResponseError, ServiceRequestError, OSError, TimeoutError) as exc:
        # ClientAuthenticationError is an HttpResponseError.
        return _unreachable(region, namespace, exc, connection_verify)
    if peek and any(row.active for row in rows):
        client = ServiceBusClient.from_connection_string(connection_string, retry_total=0)
        async with client:
            rows = list(await asyncio.gather(*(_oldest(client, row, timeout) for row in rows)))
    return RegionDepths(region, namespace, reachable=True, entities=tuple(rows))


async def read_depths(
    connection_strings: Mapping[str, str],
    entities: Sequence[str] = (),
    *,
    connection_verify: str | None = None,
    timeout: float = 5.0,
    peek: bool = True,
) -> list[RegionDepths]:
    """Each region's counts for ``entities``, the regions read at once.

    Args:
        connection_strings: Region label (``primary``, ``secondary``) to its namespace's
            connection string (its key needs Manage rights for the counts, Listen for the
            peek).
        entities: Queues, topics (each subscription gets a row) or
            ``topic/Subscriptions/name``. Default: every queue and topic either namespace
            holds, paired backlog queues excepted.
        connection_verify: CA bundle for the management endpoint (the emulator's
            ``ca_file``); default the system's.
        timeout: Seconds each step may take (the counts of one entity, one peek).
        peek: Peek for the oldest active message where messages wait (one receiver link
            per such entity).

    Returns:
        One :class:`RegionDepths` per region, in the order given. Nothing is raised for a
        region that cannot be read: its row says why.
    """
    if not entities:  # every queue and topic either namespace holds, read in both
        listed = await asyncio.gather(
            *(_listed(string, connection_verify, timeout) for string in connection_strings.values())
        )
        entities = sorted({name for names in listed for name in names})
    return list(
        await asyncio.gather(
            *(
                _region(region, string, entities, connection_verify, timeout, peek)
                for region, string in connection_strings.items()
            )
        )
    )
