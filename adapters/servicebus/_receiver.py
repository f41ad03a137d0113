"""The :class:`georep.ports.RegionReceiver` on an azure-servicebus async receiver."""

from __future__ import annotations

from typing import Any

from azure.servicebus import ServiceBusReceivedMessage, ServiceBusReceiveMode
from azure.servicebus.aio import ServiceBusClient, ServiceBusReceiver
from azure.servicebus.exceptions import MessageLockLostError

from georep._peek import peek_all
from georep.exceptions import ConfigurationError, RegionError
from georep.ports import Delivery, ErrorKind

from ._region import SdkRegion
from ._sender import open_client

__all__ = ["ServiceBusRegionReceiver", "open_region_receiver"]


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


class ServiceBusRegionReceiver(SdkRegion):
    """One region's peek-lock ``ServiceBusReceiver`` behind georep's port.

    Args:
        receiver: The SDK receiver, in PEEK_LOCK mode. Closed by :meth:`close` only if
            ``client`` is given (georep created both).
        region: The region's label.
        client: The client georep created for this receiver, closed with it.

    Raises:
        ConfigurationError: The receiver is in RECEIVE_AND_DELETE mode (a copy would be
            gone before georep knew whether it was a duplicate or was processed).
    """

    def __init__(
        self, receiver: ServiceBusReceiver, *, region: str, client: ServiceBusClient | None = None
    ) -> None:
        mode = getattr(receiver, "_receive_mode", ServiceBusReceiveMode.PEEK_LOCK)
        if mode != ServiceBusReceiveMode.PEEK_LOCK:
            raise ConfigurationError(
                f"the {region} receiver is in {mode} mode: GeoReceiver needs PEEK_LOCK "
                "(get_queue_receiver(..., receive_mode=ServiceBusReceiveMode.PEEK_LOCK))"
            )
        super().__init__(
            receiver,
            region=region,
            namespace=str(receiver.fully_qualified_namespace),
            entity=str(getattr(receiver, "_entity_path", None) or receiver.entity_path),
            client=client,
        )
        self._receiver = receiver
        self._link_open = False

    def _translate(self, exc: Exception) -> Exception:
        if isinstance(exc, MessageLockLostError):
            return RegionError(
                f"{self._region} ({self._namespace}): the copy's lock was lost; it will be "
                "redelivered",
                region=self._region,
                kind=ErrorKind.LOCK_LOST,
            )
        return super()._translate(exc)

    def delivery(self, message: Any, dedup_source: str, dedup_name: str | None) -> Delivery:
        properties = message.application_properties or {}
        if dedup_source == "message_id":
            key = _text(message.message_id)
        elif dedup_source == "subject":
            key = _text(message.subject)
        else:
            name = dedup_name or ""
            key = _text(properties.get(name.encode(), properties.get(name)))
        enqueued = message.enqueued_time_utc
        locked = message.locked_until_utc
        return Delivery(
            key=key,
            delivery_count=int(message.delivery_count or 0) + 1,
            enqueued_at=enqueued.timestamp() if enqueued is not None else None,
            locked_until=locked.timestamp() if locked is not None else None,
            traceparent=_text(properties.get(b"traceparent", properties.get("traceparent"))),
            content_type=_text(message.content_type),
        )

    async def receive(self, max_messages: int, *, max_wait: float) -> list[Any]:
        try:
            if not self._link_open:
                # Open the link with the SDK's own open timeouts first: receive_messages
                # bounds the open by max_wait_time too, and a short idle wait on a busy
                # machine would then never get a link open at all.
                await self._receiver.__aenter__()
                self._link_open = True
            return list(
                await self._receiver.receive_messages(
                    max_message_count=max_messages, max_wait_time=max_wait
                )
            )
        except Exception as exc:
            self._link_open = False
            raise self._translate(exc) from exc

    async def peek(self, count: int) -> list[Any]:
        return await self._call(lambda: peek_all(self._receiver, count))

    async def complete(self, message: ServiceBusReceivedMessage) -> None:
        await self._call(lambda: self._receiver.complete_message(message))

    async def abandon(self, message: ServiceBusReceivedMessage) -> None:
        await self._call(lambda: self._receiver.abandon_message(message))

    async def dead_letter(
        self, message: ServiceBusReceivedMessage, reason: str, description: str
    ) -> None:
        await self._call(
            lambda: self._receiver.dead_letter_message(
                message, reason=reason, error_description=description
            )
        )

    async def defer(self, message: ServiceBusReceivedMessage) -> None:
        await self._call(lambda: self._receiver.defer_message(message))

    async def renew_lock(self, message: ServiceBusReceivedMessage) -> float | None:
        try:
            expiry = await self._receiver.renew_message_lock(message)
        except Exception as exc:
            raise self._translate(exc) from exc
        return expiry.timestamp() if expiry is not None else None


def open_region_receiver(
    connection_string: str,
    *,
    region: str,
    queue_name: str | None = None,
    topic_name: str | None = None,
    subscription_name: str | None = None,
    prefetch_count: int = 0,
    retry_total: int = 1,
    retry_backoff_factor: float = 0.01,
    **client_kwargs: Any,
) -> ServiceBusRegionReceiver:
    """Create a client and a peek-lock receiver for one region, owned by the result.

    Raises:
        ConfigurationError: The connection string is malformed (the message never shows it).
    """
    client = open_client(
        connection_string,
        region=region,
        retry_total=retry_total,
        retry_backoff_factor=retry_backoff_factor,
        **client_kwargs,
    )
    if queue_name is not None:
        sdk_receiver = client.get_queue_receiver(
            queue_name, receive_mode=ServiceBusReceiveMode.PEEK_LOCK, prefetch_count=prefetch_count
        )
    else:
        sdk_receiver = client.get_subscription_receiver(
            str(topic_name),
            str(subscription_name),
            receive_mode=ServiceBusReceiveMode.PEEK_LOCK,
            prefetch_count=prefetch_count,
        )
    return ServiceBusRegionReceiver(sdk_receiver, region=region, client=client)
