"""The drop-in async ``ServiceBusClient``: the SDK's client over two regions."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Self, Unpack

from azure.servicebus import ServiceBusReceiveMode, ServiceBusSubQueue

from georep._endpoint import NamespaceEndpoint, Target, endpoint_pair, with_client_options_pair
from georep._pull import PullReceiver
from georep._region_wrap import open_pair
from georep._sender import GeoSender
from georep.exceptions import ClosedError, ConfigurationError
from georep.servicebus._options import (
    ClientOptions,
    checked_options,
    receiver_options,
    sender_options,
)

from ._receiver import ServiceBusReceiver
from ._sender import ServiceBusSender

__all__ = ["ServiceBusClient"]

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


class ServiceBusClient:
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
        ConfigurationError: An unknown option.
    """

    def __init__(self, primary: Target, secondary: Target, **options: Unpack[ClientOptions]):
        checked = checked_options(options)
        client_options = checked.pop("client_options", None)
        self._primary, self._secondary = with_client_options_pair(
            primary, secondary, client_options
        )
        self._options = checked
        self._handlers: set[ServiceBusSender | ServiceBusReceiver] = set()
        self._closed = False

    @classmethod
    def from_connection_strings(
        cls, primary: str, secondary: str, **options: Unpack[ClientOptions]
    ) -> Self:
        """A client on two namespaces, each reached with its connection string.

        Args:
            primary: The primary namespace's connection string.
            secondary: The secondary namespace's connection string.
            **options: georep's options (:class:`georep.servicebus.ClientOptions`):
                ``mode``, ``seen``, ``outbox``, ``policy``, ``role_store``, ``ledger``...

        Raises:
            ConfigurationError: An unknown option. (A malformed connection string is
                reported when a sender or receiver is made; never with its key.)
        """
        return cls(primary, secondary, **options)

    @classmethod
    def from_namespaces(
        cls,
        primary: str | Mapping[str, Any],
        secondary: str | Mapping[str, Any],
        credential: Any,
        **options: Unpack[ClientOptions],
    ) -> Self:
        """A client on two namespaces reached with ``credential`` (Microsoft Entra ID,
        ``AzureNamedKeyCredential``, ``AzureSasCredential``), as
        :meth:`georep.GeoSender.from_namespaces` takes them.

        Raises:
            ConfigurationError: No namespace or credential, or an unknown option.
        """
        client_options = options.pop("client_options", None)
        first, second = endpoint_pair(primary, secondary, credential, client_options)
        return cls(first, second, **options)

    @property
    def fully_qualified_namespace(self) -> str:
        """The primary region's namespace."""
        return _namespace(self._primary)

    # ------------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> Self:
        self._check_open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every sender and receiver this client made. Idempotent."""
        self._closed = True
        handlers, self._handlers = list(self._handlers), set()
        results = await asyncio.gather(*(h.close() for h in handlers), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                _log.warning("closing a sender or receiver failed: %s", type(result).__name__)

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("this ServiceBusClient is closed; create a new one")

    # --------------------------------------------------------------------- senders

    def get_queue_sender(
        self,
        queue_name: str,
        *,
        client_identifier: str | None = None,
        socket_timeout: float | None = None,
    ) -> ServiceBusSender:
        """A sender to ``queue_name`` in both regions (a :class:`georep.GeoSender`).

        ``client_identifier`` and ``socket_timeout`` are accepted for the SDK's sake;
        give SDK settings in ``client_options`` of the client instead.
        """
        return self._sender(queue_name=queue_name)

    def get_topic_sender(
        self,
        topic_name: str,
        *,
        client_identifier: str | None = None,
        socket_timeout: float | None = None,
    ) -> ServiceBusSender:
        """A sender to ``topic_name`` in both regions (a :class:`georep.GeoSender`)."""
        return self._sender(topic_name=topic_name)

    def _sender(
        self, *, queue_name: str | None = None, topic_name: str | None = None
    ) -> ServiceBusSender:
        self._check_open()
        geo = GeoSender.from_connection_strings(
            self._primary,
            self._secondary,
            queue_name=queue_name,
            topic_name=topic_name,
            **sender_options(self._options),
        )
        sender = ServiceBusSender(
            geo,
            entity_name=str(queue_name or topic_name),
            fully_qualified_namespace=self.fully_qualified_namespace,
        )
        self._handlers.add(sender)
        return sender

    # ------------------------------------------------------------------- receivers

    def get_queue_receiver(
        self,
        queue_name: str,
        *,
        session_id: str | None = None,
        sub_queue: ServiceBusSubQueue | str | None = None,
        receive_mode: ServiceBusReceiveMode | str = ServiceBusReceiveMode.PEEK_LOCK,
        max_wait_time: float | None = None,
        auto_lock_renewer: Any = None,
        prefetch_count: int = 0,
        client_identifier: str | None = None,
        socket_timeout: float | None = None,
    ) -> ServiceBusReceiver:
        """A receiver of ``queue_name`` (or its ``sub_queue``) in both regions.

        Arguments as the SDK's. ``prefetch_count`` messages are kept ready (claimed,
        locked and renewed) beyond what was asked for. Session receivers
        (``session_id``) are not supported yet (docs/migration.md).

        Raises:
            ConfigurationError: The client has no ``seen`` set, or an argument is invalid.
        """
        return self._receiver(
            {"queue_name": queue_name},
            session_id=session_id,
            sub_queue=sub_queue,
            receive_mode=receive_mode,
            max_wait_time=max_wait_time,
            auto_lock_renewer=auto_lock_renewer,
            prefetch_count=prefetch_count,
        )

    def get_subscription_receiver(
        self,
        topic_name: str,
        subscription_name: str,
        *,
        session_id: str | None = None,
        sub_queue: ServiceBusSubQueue | str | None = None,
        receive_mode: ServiceBusReceiveMode | str = ServiceBusReceiveMode.PEEK_LOCK,
        max_wait_time: float | None = None,
        auto_lock_renewer: Any = None,
        prefetch_count: int = 0,
        client_identifier: str | None = None,
        socket_timeout: float | None = None,
    ) -> ServiceBusReceiver:
        """A receiver of a subscription (or its ``sub_queue``) in both regions; as
        :meth:`get_queue_receiver`."""
        return self._receiver(
            {"topic_name": topic_name, "subscription_name": subscription_name},
            session_id=session_id,
            sub_queue=sub_queue,
            receive_mode=receive_mode,
            max_wait_time=max_wait_time,
            auto_lock_renewer=auto_lock_renewer,
            prefetch_count=prefetch_count,
        )

    def _receiver(
        self,
        names: dict[str, str],
        *,
        session_id: str | None,
        sub_queue: ServiceBusSubQueue | str | None,
        receive_mode: ServiceBusReceiveMode | str,
        max_wait_time: float | None,
        auto_lock_renewer: Any,
        prefetch_count: int,
    ) -> ServiceBusReceiver:
        self._check_open()
        seen = self._options.get("seen")
        if seen is None:
            raise ConfigurationError(
                "receiving needs the seen-set every receiver of the entity shares: "
                "ServiceBusClient.from_connection_strings(..., seen="
                "georep.adapters.redis.RedisSeenSet.from_url(redis_url))"
            )
        if session_id is not None:
            raise NotImplementedError(
                "session receivers are not supported by georep.servicebus yet "
                "(docs/migration.md); use georep.GeoReceiver(sessions=True)"
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
        from georep._sdk import open_region_receiver

        regions = open_pair(
            open_region_receiver, self._primary, self._secondary, sub_queue=sub, **names
        )
        pull = PullReceiver(
            *regions,
            seen=seen,
            receive_and_delete=mode is ServiceBusReceiveMode.RECEIVE_AND_DELETE,
            prefetch=prefetch_count,
            poll=float(self._options.get("poll_interval", 1.0)),
            owned=regions,
            clock=self._options.get("clock"),
            receiver_options=receiver_options(self._options),
        )
        receiver = ServiceBusReceiver(
            pull,
            fully_qualified_namespace=self.fully_qualified_namespace,
            entity_path=regions[0].entity,
            receive_mode=mode,
            max_wait_time=max_wait_time,
            prefetch_count=prefetch_count,
            auto_lock_renewer=auto_lock_renewer,
            dead_letter=sub is not None,
        )
        self._handlers.add(receiver)
        return receiver
