"""The drop-in async ``ServiceBusClient``: the SDK's client over two regions."""

from __future__ import annotations

__all__ = ["ServiceBusClient"]

import asyncio
import logging
import os
import uuid
from functools import partial
from typing import Any, Self, Unpack

from azure.core.async_paging import AsyncItemPaged
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusReceiveMode, ServiceBusSubQueue

from georep import _fork
from georep._clock import SystemClock
from georep._endpoint import (
    NamespaceEndpoint,
    Target,
    check_connection_string,
    with_client_options_pair,
)
from georep._lifecycle import ClosedOnAsyncExit
from georep._policy import ReplicationMode
from georep._region_wrap import open_pair
from georep.exceptions import ClosedError, ConfigurationError
from georep.ports import ScheduleStore
from georep.receive.pull import PullReceiver
from georep.send.sender import GeoSender
from georep.servicebus._options import (
    ClientConstructors,
    ClientOptions,
    ReceiverArguments,
    SenderArguments,
    SessionListArguments,
    checked_options,
    receiver_options,
    sender_options,
)

from ._deferred import DeferredBook, settle_found
from ._receiver import DEFAULT_RECEIVE_WAIT, ServiceBusReceiver
from ._sender import ServiceBusSender
from ._session import Absent, GeoSession, SessionOwnership, SessionRegions, accept_in_both
from ._session_list import sessions_in_both

_log = logging.getLogger("georep.servicebus")


def _namespace(target: Target) -> str:
    """The namespace host of a connection string or endpoint (never the key)."""
    if isinstance(target, NamespaceEndpoint):
        if target.connection_string is None:
            return target.namespace
        target = target.connection_string
    for part in target.split(";"):
        key, _, value = part.partition("=")
        if key.strip().lower() == "endpoint":
            return value.strip().removeprefix("sb://").rstrip("/")
    return "?"


class ServiceBusClient(ClientConstructors, ClosedOnAsyncExit):
    """``azure.servicebus.aio.ServiceBusClient`` over two regions: change the line that makes
    the client, keep the rest of the code.

    Build it with :meth:`from_connection_strings` or :meth:`from_namespaces`; georep's
    replication options (:class:`georep.servicebus.ClientOptions`) are given there, once.
    Senders are :class:`georep.GeoSender` objects underneath, receivers
    :class:`georep.GeoReceiver` objects (a ``seen`` set is needed to receive). Each sender
    and receiver opens its own connection to each region; closing the client closes every
    sender and receiver it made (as the SDK's does).

    Args:
        primary: The primary namespace: a connection string or a
            :class:`georep._endpoint.NamespaceEndpoint` (prefer the ``from_`` constructors).
        secondary: The secondary namespace, likewise.
        **options: georep's options (:class:`georep.servicebus.ClientOptions`).

    Raises:
        ConfigurationError: A malformed connection string (naming what it lacks, never
            the key), an unknown option, or a ``mode`` that is not one.
    """

    def __init__(self, primary: Target, secondary: Target, **options: Unpack[ClientOptions]):
        checked = checked_options(options)
        for target, region in ((primary, "primary"), (secondary, "secondary")):
            if not isinstance(target, NamespaceEndpoint):  # as the SDK, refused here
                check_connection_string(target, region)
        if "mode" in checked:
            checked["mode"] = ReplicationMode(checked["mode"])
        client_options = checked.pop("client_options", None)
        self._primary, self._secondary = with_client_options_pair(
            primary, secondary, client_options
        )
        self._options = checked
        self._handlers: set[ServiceBusSender | ServiceBusReceiver] = set()
        self._deferred: dict[str, DeferredBook] = {}
        self._closed = False
        self._made_after_forks, self._made_in = _fork.fork_count(), os.getpid()

    @property
    def fully_qualified_namespace(self) -> str:
        """The primary region's namespace."""
        return _namespace(self._primary)

    # ------------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> Self:
        self._check_open()
        return self

    async def close(self) -> None:
        """Close every sender and receiver this client made (using one afterwards raises
        the SDK's ``ValueError``). As the SDK's client, this one can be used again: a new
        ``async with client:`` or ``get_queue_sender`` works. Idempotent."""
        handlers, self._handlers = list(self._handlers), set()
        results = await asyncio.gather(*(h.close() for h in handlers), return_exceptions=True)
        await asyncio.gather(*(book.aclose() for book in self._deferred.values()))
        for result in results:
            if isinstance(result, BaseException):
                _log.warning("closing a sender or receiver failed: %s", type(result).__name__)

    async def _shutdown(self) -> None:
        """Close for good (the blocking client's close: its resources close with it)."""
        self._closed = True
        await self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("this ServiceBusClient is closed; create a new one")

    def _seen(self) -> Any:
        """The seen-set the client was given; in a process forked after the client was
        made (gunicorn ``--preload``...), one of this process's own with its settings
        (``RedisSeenSet.for_forked_child``), made once: the given one's connections are
        the parent's. The senders and receivers the parent made stay the parent's.

        Raises:
            ForkedProcessError: In such a child, for a seen-set that cannot make one (it
                was given its Redis client): make the client and its seen-set there.
        """
        seen = self._options.get("seen")
        if seen is None or self._made_after_forks == _fork.fork_count():
            return seen
        own = getattr(seen, "for_forked_child", lambda: None)()
        if own is None:
            raise _fork.forked_error(
                "this ServiceBusClient's seen-set (needed to receive)", self._made_in
            )
        _log.info(
            "a ServiceBusClient created in process %d before a fork: its seen-set "
            "reopened in process %d with its own connections",
            self._made_in,
            os.getpid(),
        )
        for book in self._deferred.values():
            _fork.abandon(book)
        self._options["seen"], self._deferred, self._handlers = own, {}, set()
        self._made_after_forks, self._made_in = _fork.fork_count(), os.getpid()
        return own

    # --------------------------------------------------------------------- senders

    def get_queue_sender(
        self, queue_name: str, **arguments: Unpack[SenderArguments]
    ) -> ServiceBusSender:
        """A sender to ``queue_name`` in both regions (a :class:`georep.GeoSender`).

        ``client_identifier`` names the sender (its ``client_identifier``, as the SDK's;
        a new one each time if not given). ``socket_timeout`` is accepted for the SDK's
        sake; give SDK settings in ``client_options`` of the client instead.
        """
        return self._sender(queue_name=queue_name, **arguments)

    def get_topic_sender(
        self, topic_name: str, **arguments: Unpack[SenderArguments]
    ) -> ServiceBusSender:
        """A sender to ``topic_name`` in both regions (a :class:`georep.GeoSender`)."""
        return self._sender(topic_name=topic_name, **arguments)

    def _sender(
        self,
        *,
        queue_name: str | None = None,
        topic_name: str | None = None,
        client_identifier: str | None = None,
        socket_timeout: float | None = None,
        **sdk_settings: Any,
    ) -> ServiceBusSender:
        self._check_open()
        _ignored("get_queue_sender" if queue_name else "get_topic_sender", sdk_settings)
        # The seen-set every process shares also keeps which copy of a scheduled message
        # each region holds, so that any process can cancel it (docs/migration.md).
        seen = self._seen()
        geo = GeoSender.from_connection_strings(
            self._primary,
            self._secondary,
            queue_name=queue_name,
            topic_name=topic_name,
            schedules=seen if isinstance(seen, ScheduleStore) else None,
            **sender_options(self._options),
        )
        sender = ServiceBusSender(
            geo,
            entity_name=str(queue_name or topic_name),
            fully_qualified_namespace=self.fully_qualified_namespace,
            client_identifier=client_identifier or f"SBSender-{uuid.uuid4()}",
        )
        self._handlers.add(sender)
        return sender

    # ------------------------------------------------------------------- receivers

    def get_queue_receiver(
        self, queue_name: str, **arguments: Unpack[ReceiverArguments]
    ) -> ServiceBusReceiver:
        """A receiver of ``queue_name`` (or its ``sub_queue``) in both regions.

        Arguments as the SDK's (:class:`~georep.servicebus._options.ReceiverArguments`).
        ``prefetch_count`` messages are kept ready (claimed, locked and renewed) beyond
        what was asked for. Session receivers (``session_id=``, or
        ``NEXT_AVAILABLE_SESSION``) hold the session in both regions (docs/migration.md).

        Raises:
            ConfigurationError: The client has no ``seen`` set, or an argument is invalid.
        """
        return self._receiver({"queue_name": queue_name}, **arguments)

    def get_subscription_receiver(
        self, topic_name: str, subscription_name: str, **arguments: Unpack[ReceiverArguments]
    ) -> ServiceBusReceiver:
        """A receiver of a subscription (or its ``sub_queue``) in both regions; as
        :meth:`get_queue_receiver`."""
        names = {"topic_name": topic_name, "subscription_name": subscription_name}
        return self._receiver(names, **arguments)

    def _receiver(
        self,
        names: dict[str, str],
        *,
        session_id: Any = None,
        sub_queue: ServiceBusSubQueue | str | None = None,
        receive_mode: ServiceBusReceiveMode | str = ServiceBusReceiveMode.PEEK_LOCK,
        max_wait_time: float | None = None,
        auto_lock_renewer: Any = None,
        prefetch_count: int = 0,
        client_identifier: str | None = None,
        socket_timeout: float | None = None,
        **sdk_settings: Any,
    ) -> ServiceBusReceiver:
        self._check_open()
        _ignored(
            "get_queue_receiver" if "queue_name" in names else "get_subscription_receiver",
            sdk_settings,
        )
        seen = self._seen()
        if seen is None:
            raise ConfigurationError(
                "receiving needs the seen-set every receiver of the entity shares: "
                "ServiceBusClient.from_connection_strings(..., seen="
                "georep.adapters.redis.RedisSeenSet.from_url(redis_url))"
            )
        mode = ServiceBusReceiveMode(receive_mode)
        if max_wait_time is not None and max_wait_time <= 0:
            raise ConfigurationError("max_wait_time must be greater than 0")
        if auto_lock_renewer is not None and mode is ServiceBusReceiveMode.RECEIVE_AND_DELETE:
            raise ConfigurationError(
                "an AutoLockRenewer cannot renew messages received in RECEIVE_AND_DELETE "
                "mode (they are settled already)"
            )
        sub = None if sub_queue is None else ServiceBusSubQueue(sub_queue)
        options = {
            "seen": seen,
            "receive_and_delete": mode is ServiceBusReceiveMode.RECEIVE_AND_DELETE,
            "prefetch": prefetch_count,
            "poll": float(self._options.get("poll_interval", 1.0)),
            "clock": self._options.get("clock"),
            "receiver_options": receiver_options(self._options),
        }
        facade = {
            "fully_qualified_namespace": self.fully_qualified_namespace,
            "receive_mode": mode,
            "max_wait_time": max_wait_time,
            "prefetch_count": prefetch_count,
            "auto_lock_renewer": auto_lock_renewer,
            "client_identifier": client_identifier or f"SBReceiver-{uuid.uuid4()}",
        }
        entity = names.get("queue_name") or (
            f"{names['topic_name']}/Subscriptions/{names['subscription_name']}"
        )
        if sub is not None:
            entity += "/$DeadLetterQueue"
        book = self._deferred.get(entity.lower())
        if book is None:
            seen = self._seen()
            book = self._deferred[entity.lower()] = DeferredBook(
                seen if isinstance(seen, ScheduleStore) else None,
                f"{_namespace(self._primary)} {_namespace(self._secondary)} {entity.lower()}",
                self._options.get("clock"),
            )
        options["on_twin_deferred"] = book.twin_deferred
        options["settle_deferred"] = partial(
            settle_found, self._options.get("clock") or SystemClock()
        )
        facade["deferred"] = book
        if session_id is not None:
            if sub is not None:
                raise ConfigurationError(
                    "session_id and sub_queue can not be given together: a sub-queue has no "
                    "sessions (give sub_queue only)"
                )
            wanted = None if session_id == NEXT_AVAILABLE_SESSION else str(session_id)
            opener = partial(
                self._open_session,
                names,
                wanted,
                max_wait_time or DEFAULT_RECEIVE_WAIT,
                options,
            )
            receiver = ServiceBusReceiver(None, entity_path=entity, opener=opener, **facade)
            self._handlers.add(receiver)
            return receiver
        from georep._sdk import open_region_receiver

        regions = open_pair(
            open_region_receiver, self._primary, self._secondary, sub_queue=sub, **names
        )
        pull = PullReceiver(*regions, owned=regions, **options)
        receiver = ServiceBusReceiver(
            pull, entity_path=regions[0].entity, dead_letter=sub is not None, **facade
        )
        self._handlers.add(receiver)
        return receiver

    # -------------------------------------------------------------------- sessions

    def list_queue_sessions(
        self, queue_name: str, **arguments: Unpack[SessionListArguments]
    ) -> AsyncItemPaged[str]:
        """The ids of the sessions of a session-enabled queue that hold messages or state
        in either region, each once, as the SDK's ``list_queue_sessions`` (lazily: the
        regions are asked when the result is first iterated).

        Arguments as the SDK's (:class:`~georep.servicebus._options.SessionListArguments`).
        ``state_updated_after`` is passed to both regions: it selects by the brokers'
        session state, which georep's ``session.set_state`` does not write (it keeps one
        state for both regions beside the seen-set, docs/migration.md).

        Raises:
            ValueError: ``timeout`` is not greater than 0 (here, as the SDK).
            ServiceBusAuthenticationError, MessagingEntityNotFoundError, ServiceBusError:
                Both regions refused (the key, the entity, an entity without sessions):
                the primary's refusal, when iterated.
            AllRegionsUnavailableError: No region answered (a ``ServiceBusConnectionError``).
            OperationTimeoutError: No answer within ``timeout``.
        """
        return self._sessions_listed({"queue_name": queue_name}, arguments)

    def list_subscription_sessions(
        self, topic_name: str, subscription_name: str, **arguments: Unpack[SessionListArguments]
    ) -> AsyncItemPaged[str]:
        """The sessions of a session-enabled subscription; as :meth:`list_queue_sessions`."""
        names = {"topic_name": topic_name, "subscription_name": subscription_name}
        return self._sessions_listed(names, arguments)

    def _sessions_listed(
        self, names: dict[str, str], arguments: SessionListArguments
    ) -> AsyncItemPaged[str]:
        self._check_open()
        timeout = arguments.get("timeout")
        if timeout is not None and timeout <= 0:
            raise ValueError("The timeout must be greater than 0.")

        async def first_page(_token: str | None) -> list[str]:
            from georep._sdk import open_region_sessions

            self._check_open()
            entities = open_pair(open_region_sessions, self._primary, self._secondary, **names)
            try:
                return await sessions_in_both(
                    entities,
                    state_updated_after=arguments.get("state_updated_after"),
                    timeout=timeout,
                )
            finally:
                closing = (entity.close() for entity in entities)
                await asyncio.gather(*closing, return_exceptions=True)

        async def one_page(ids: list[str]) -> tuple[None, list[str]]:
            return None, ids

        return AsyncItemPaged(first_page, one_page)

    async def _open_session(
        self,
        names: dict[str, str],
        session_id: str | None,
        max_wait: float,
        options: dict[str, Any],
        receiver: ServiceBusReceiver,
    ) -> tuple[PullReceiver, GeoSession]:
        """Lock the session in both regions; the pull receiver over them and the session."""
        from georep._sdk import open_region_sessions

        entities = open_pair(open_region_sessions, self._primary, self._secondary, **names)
        ownership = SessionOwnership(options["seen"], entities[0].entity)
        try:
            chosen, held, errors = await accept_in_both(
                entities,
                session_id,
                max_wait,
                ownership.claim if session_id is None else None,
                options.get("clock"),
            )
        except BaseException:
            await ownership.release()
            for entity in entities:
                await entity.close()
            raise
        regions: list[Any] = []
        for entity, locked in zip(entities, held, strict=True):
            if locked is not None:
                regions.append(locked)
                continue
            why = type(errors[entity.region]).__name__ if entity.region in errors else "locked"
            _log.warning(
                "session %r is not held in %s (%s): reading the other region only",
                chosen,
                entity.region,
                why,
            )
            regions.append(Absent(entity.region, entity.namespace, entity.entity, why))
        owned = [SessionRegions(entities, [h for h in held if h is not None])]
        pull = PullReceiver(*regions, ordered=True, owned=owned, **options)
        session = GeoSession(chosen, receiver, pull, held, options["seen"])
        session.on_close, session.on_renew = ownership.release, ownership.extend
        expiries = [getattr(h, "locked_until", None) for h in held if h is not None]
        session.start_keeping(min((e for e in expiries if e is not None), default=None))
        return pull, session


def _ignored(method: str, settings: dict[str, Any]) -> None:
    """Log the per-handler keyword arguments georep does not use. The SDK's handlers take
    any (``retry_total``, ``user_agent``... and unknown ones, which it ignores); georep's
    take them too, so that a program runs unchanged, and its SDK clients get their
    settings from the client's ``client_options``."""
    if settings:
        _log.warning(
            "%s: %s ignored: georep's SDK clients take their settings from the client's "
            "client_options",
            method,
            ", ".join(sorted(settings)),
        )
