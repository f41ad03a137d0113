"""The :class:`georep.ports.RegionSender` on an azure-servicebus async sender."""

from __future__ import annotations

__all__ = ["ServiceBusRegionSender", "open_region_sender"]

import contextlib
import functools
import ssl
import weakref
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

import certifi
from azure.servicebus import ServiceBusMessageBatch
from azure.servicebus.aio import ServiceBusClient, ServiceBusSender
from azure.servicebus.exceptions import MessageNotFoundError

from georep._endpoint import NamespaceEndpoint, Target, check_connection_string, check_entity_names
from georep.exceptions import ConfigurationError, GeoReplicationError, RegionError
from georep.ports import RegionSlot

from ._codec import ServiceBusCodec
from ._region import SdkRegion

_SLOTS: weakref.WeakKeyDictionary[ServiceBusSender, RegionSlot] = weakref.WeakKeyDictionary()
_NO_SUCH_SEQUENCE = 2**62


class ServiceBusRegionSender(SdkRegion):
    """One region's ``ServiceBusSender`` behind georep's port.

    Args:
        sender: The SDK sender. Closed by :meth:`close` only if ``client`` is given
            (georep created both); a caller's sender is never closed.
        region: The region's label.
        client: The client georep created for this sender, closed with it.
    """

    def __init__(
        self, sender: ServiceBusSender, *, region: str, client: ServiceBusClient | None = None
    ) -> None:
        super().__init__(
            sender,
            region=region,
            namespace=str(sender.fully_qualified_namespace),
            entity=str(sender.entity_name),
            client=client,
        )
        self._sender = sender
        self._codec = ServiceBusCodec(getattr(sender, "_amqp_transport", None))
        # One call at a time per SDK sender: concurrent send_messages on one async
        # ServiceBusSender interleave AMQP transfers out of order and race on reopening the
        # link ("'NoneType' object has no attribute 'create_sender_link'",
        # Azure/azure-sdk-for-python#36334). georep's core holds the slot around each call
        # and starts its deadline once it has it. Keyed by the SDK sender, so every
        # GeoSender wrapping the same sender shares it.
        slot = _SLOTS.get(sender)
        if slot is None:
            slot = _SLOTS[sender] = RegionSlot()
        self._slot = slot

    @property
    def codec(self) -> ServiceBusCodec:
        """How georep reads and copies the SDK messages this sender sends."""
        return self._codec

    def slot(self) -> RegionSlot:
        return self._slot

    @property
    def sdk_sender(self) -> ServiceBusSender:
        """The wrapped SDK sender."""
        return self._sender

    # Every call below runs with the caller holding slot(); georep's core always does.

    async def send(self, messages: Any, *, timeout: float) -> None:
        # Written out rather than through _call: this is the hot path.
        try:
            await self._sender.send_messages(messages, timeout=timeout)
        except GeoReplicationError:
            raise  # georep's own error (a closed adapter, a lost lock): as it is
        except Exception as exc:
            raise self._translate(exc) from exc

    async def schedule(
        self, messages: Sequence[Any], schedule_time_utc: datetime, *, timeout: float
    ) -> list[int]:
        return await self._call(
            lambda: self._sender.schedule_messages(
                list(messages), schedule_time_utc, timeout=timeout
            )
        )

    async def cancel_scheduled(self, sequence_numbers: Sequence[int], *, timeout: float) -> None:
        await self._call(
            lambda: self._sender.cancel_scheduled_messages(list(sequence_numbers), timeout=timeout)
        )

    async def max_message_size(self, *, timeout: float) -> int:
        # create_message_batch opens the link and reads the size the service announced.
        batch: ServiceBusMessageBatch = await self._call(self._sender.create_message_batch)
        return int(batch.max_size_in_bytes)

    async def probe(self, *, timeout: float) -> None:
        # Cancelling a sequence number that cannot exist is a management round trip that
        # needs a live connection and a valid token, and changes nothing.
        try:
            await self._call(
                lambda: self._sender.cancel_scheduled_messages([_NO_SUCH_SEQUENCE], timeout=timeout)
            )
        except RegionError as exc:
            if not isinstance(exc.__cause__, MessageNotFoundError):
                raise


def namespace_of(connection_string: str) -> str:
    """The namespace host (and port, if any) of a connection string's Endpoint, or ``"?"``.

    ``Endpoint=sb://contoso.servicebus.windows.net/;...`` gives
    ``contoso.servicebus.windows.net``; the emulator's gives ``127.0.0.1:PORT``.
    """
    for part in connection_string.split(";"):
        key, _, value = part.partition("=")
        if key.strip().lower() == "endpoint":
            return value.strip().removeprefix("sb://").rstrip("/")
    return "?"


@functools.lru_cache(maxsize=8)
def shared_ssl_context(ca_file: str) -> ssl.SSLContext:
    """One TLS client context per CA bundle for every client georep opens in this process.

    Without one, the SDK builds a new context and loads the CA bundle (certifi's, or
    ``connection_verify``) on every connection attempt: 35-70 ms of CPU on a busy two-core
    machine, paid twice (the attempt and the SDK's one retry) when a region refuses the
    connection, which made a refused connection fail over slower than a dropped one
    (issue 30). The context is what the SDK builds itself: ``PROTOCOL_TLS_CLIENT``, the
    bundle loaded, hostname checked, certificates required.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(ca_file)
    return context


def open_client(
    target: Target,
    *,
    region: str,
    retry_total: int,
    retry_backoff_factor: float,
    **client_kwargs: Any,
) -> ServiceBusClient:
    """A client with short SDK retries (each retry delays failover), for georep to own.

    Unless given an ``ssl_context``, the client shares :func:`shared_ssl_context` for its CA
    bundle (``connection_verify`` or certifi's, as the SDK would load).

    ``target`` is a connection string or a :class:`~georep._endpoint.NamespaceEndpoint`
    (a namespace and a credential); its client options apply over georep's defaults.

    Raises:
        ConfigurationError: The connection string is malformed (the message never shows it).
    """
    if not isinstance(target, NamespaceEndpoint):
        check_connection_string(target, region)  # None, bytes...: a named error
    endpoint = target if isinstance(target, NamespaceEndpoint) else NamespaceEndpoint(target)
    options: dict[str, Any] = {
        "retry_total": retry_total,
        "retry_backoff_factor": retry_backoff_factor,
        "retry_backoff_max": 2,
        **client_kwargs,
        **endpoint.client_options,
    }
    if options.get("ssl_context") is None:
        options["ssl_context"] = shared_ssl_context(
            options.get("connection_verify") or certifi.where()
        )
    if endpoint.connection_string is None:
        return ServiceBusClient(credential=endpoint.credential, **options)
    check_connection_string(endpoint.connection_string, region)
    try:
        return ServiceBusClient.from_connection_string(endpoint.connection_string, **options)
    except ValueError as exc:
        raise ConfigurationError(
            f"the {region} connection string was refused by azure-servicebus "
            f"({type(exc).__name__}); check Endpoint, SharedAccessKeyName and SharedAccessKey"
        ) from None


def open_region_sender(
    connection_string: Target,
    *,
    region: str,
    queue_name: str | None = None,
    topic_name: str | None = None,
    retry_total: int = 1,
    retry_backoff_factor: float = 0.01,
    **client_kwargs: Any,
) -> ServiceBusRegionSender:
    """Create a client and sender for one region, owned by the returned object.

    The SDK's own retries are kept short (``retry_total`` tries, ``retry_backoff_factor``
    seconds apart, growing exponentially) because every retry delays failover.

    Raises:
        ConfigurationError: The connection string is malformed (the message never shows it).
    """
    check_entity_names(queue_name=queue_name, topic_name=topic_name)
    client = open_client(
        connection_string,
        region=region,
        retry_total=retry_total,
        retry_backoff_factor=retry_backoff_factor,
        **client_kwargs,
    )
    with entity_path_checked(region):
        sender = (
            client.get_queue_sender(queue_name)
            if queue_name is not None
            else client.get_topic_sender(str(topic_name))
        )
    return ServiceBusRegionSender(sender, region=region, client=client)


@contextlib.contextmanager
def entity_path_checked(region: str) -> Iterator[None]:
    """Around the SDK's ``get_*_sender``/``get_*_receiver``: its ``ValueError`` for a
    connection string whose ``EntityPath`` names another entity, as a ConfigurationError.

    Raises:
        ConfigurationError: The connection string's EntityPath and the entity differ.
    """
    try:
        yield
    except ValueError as exc:
        if "EntityPath" not in str(exc):
            raise
        raise ConfigurationError(
            f"the {region} connection string's EntityPath names another entity than the "
            "one given: remove EntityPath from it (georep names the entity itself), or "
            "name that entity"
        ) from None
