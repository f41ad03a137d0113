"""The drop-in async ``ServiceBusSender``: the SDK's sender methods over a GeoSender."""

from __future__ import annotations

__all__ = ["ServiceBusSender"]

from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime
from typing import Any, Self

from georep._lifecycle import ClosedOnAsyncExit
from georep.send.sender import GeoSender, SendResult


@dataclass(eq=False, repr=False)
class ServiceBusSender(ClosedOnAsyncExit):
    """Sends to a queue or topic in two regions, with ``azure.servicebus.aio.ServiceBusSender``'s
    methods, arguments and results.

    Made by :meth:`georep.servicebus.aio.ServiceBusClient.get_queue_sender` (or
    ``get_topic_sender``); every call is the :class:`georep.GeoSender`'s underneath
    (active or passive replication, failover, outbox), and what it did is kept in
    :attr:`last_result`.

    Attributes:
        geo_sender: The :class:`georep.GeoSender` underneath (stats, roles, the outbox).
        entity_name: The queue or topic, as the SDK's.
        fully_qualified_namespace: The primary region's namespace.
        client_identifier: As given to ``get_queue_sender`` (or generated), as the SDK's.
        last_result: What the last ``send_messages`` did in each region
            (:class:`georep.SendResult`), None before the first.
    """

    geo_sender: GeoSender
    _: KW_ONLY
    entity_name: str
    fully_qualified_namespace: str
    client_identifier: str = ""
    last_result: SendResult | None = field(default=None, init=False)

    async def __aenter__(self) -> Self:
        await self.geo_sender.__aenter__()
        return self

    async def close(self) -> None:
        """Close the sender and the connections it opened (idempotent)."""
        await self.geo_sender.aclose()

    async def send_messages(self, message: Any, *, timeout: float | None = None) -> None:
        """Send a message, a list of messages (one batch) or a batch, as the SDK does.

        Returns None, as the SDK; what each region did is in :attr:`last_result`.

        Args:
            message: A ``ServiceBusMessage`` (or a dict of its fields), a list of them, or
                a batch from :meth:`create_message_batch`.
            timeout: Seconds per region attempt (default: the failover policy's).

        Raises:
            AllRegionsUnavailableError: No region accepted it and there is no outbox.
            MessageTooLargeError, AuthenticationError, EntityNotFoundError, RegionError:
                What the region said (never failed over).
            ClosedError: The sender was closed.
        """
        self.last_result = await self.geo_sender.send_messages(message, timeout=timeout)

    async def schedule_messages(
        self, messages: Any, schedule_time_utc: datetime, *, timeout: float | None = None
    ) -> list[int]:
        """Schedule messages; one sequence number per message, as the SDK returns.

        Passive mode schedules in the active region (failing over), active mode in both;
        :meth:`cancel_scheduled_messages` with the returned numbers cancels every
        region's copy, from any process sharing the client's ``seen`` set, after a
        restart too: a number is the primary's (the secondary's, plus 2**62, when only
        the secondary scheduled it), and active mode keeps the secondary's number of each
        message in the seen-set until a minute after its schedule time.

        Raises:
            AllRegionsUnavailableError: No region scheduled them.
        """
        return await self.geo_sender.schedule_messages(messages, schedule_time_utc, timeout=timeout)

    async def cancel_scheduled_messages(
        self, sequence_numbers: int | Sequence[int], *, timeout: float | None = None
    ) -> None:
        """Cancel scheduled messages by the numbers :meth:`schedule_messages` returned.

        Raises:
            InvalidMessageError: Not an int (nothing cancelled).
            StoreUnavailableError: The seen-set did not answer for a number another
                sender scheduled (nothing cancelled: try again).
            RegionError: A region could not cancel (the other was still cancelled); a
                number that region does not know gets its answer, as with the SDK.
        """
        await self.geo_sender.cancel_scheduled_messages(sequence_numbers, timeout=timeout)

    async def create_message_batch(self, max_size_in_bytes: int | None = None) -> Any:
        """An empty ``ServiceBusMessageBatch`` that fits both regions' size limits."""
        return await self.geo_sender.create_message_batch(max_size_in_bytes)
