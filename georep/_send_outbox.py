"""The GeoSender's side of the outbox: what goes in, and delivering an entry to its region.

The drain loop itself is :class:`georep._drain.OutboxDrainer`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from georep._channel import RegionPair
from georep._policy import FailoverPolicy
from georep._sending import SendCounts, SenderStats
from georep._telemetry import SenderTelemetry
from georep.exceptions import InvalidMessageError, RegionError
from georep.ports import Clock, MessageCodec, Outbox, RegionSender

__all__ = ["OutboxLink"]


class OutboxLink:
    """Puts what no region could be reached for in the outbox; delivers targeted entries.

    Args:
        outbox: The durable outbox (the caller owns it).
        channel: The outbox channel of the sender's namespace pair and entity.
        regions: The two regions' channels.
        policy: The attempt deadline; which failures cool a region down.
        codec: Encodes messages for the outbox.
        counts: Per-region message counters.
        stats: The sender's stats (queued, outbox depth).
        telemetry: The sender's instruments.
        wake: Wakes the drain loop.
        clock: Time source.
    """

    def __init__(
        self,
        outbox: Outbox,
        *,
        channel: str,
        regions: RegionPair[RegionSender],
        policy: FailoverPolicy,
        codec: MessageCodec,
        counts: SendCounts,
        stats: SenderStats,
        telemetry: SenderTelemetry,
        wake: Callable[[], None],
        clock: Clock,
    ) -> None:
        self.outbox = outbox
        self._channel = channel
        self._regions = regions
        self._policy = policy
        self._codec = codec
        self._counts = counts
        self._stats = stats
        self._telemetry = telemetry
        self._wake = wake
        self._clock = clock

    async def queue(self, messages: Sequence[Any], regions: Sequence[str | None]) -> None:
        """Persist ``messages`` for each of ``regions`` (labels; None = whichever accepts).

        Only called when no region could be reached (never for a message a region
        refused for what it is).
        """
        encode = self._codec.encode
        # Entries name their target by namespace, not label: a later sender may have the
        # pair the other way round.
        by_label = self._regions.by_label
        targets = [None if r is None else by_label[r].client.namespace for r in regions]
        items = [(target, encode(message)) for target in targets for message in messages]
        await self.outbox.put(self._channel, items, now=self._clock.time())
        count = len(messages)
        self._stats.queued += count
        self._stats.outbox_depth = (self._stats.outbox_depth or 0) + len(items)
        for region in regions:
            self._telemetry.messages(count, region or "any", "queued")
        self._wake()

    async def deliver_to(self, target: str, message: Any) -> None:
        """Send an entry queued for the region of namespace ``target``."""
        region = self._regions.by_namespace.get(target)
        if region is None:
            raise InvalidMessageError(
                f"outbox entry targets namespace {target!r}, which is not one of this "
                f"sender's ({', '.join(sorted(self._regions.by_namespace))})"
            )
        # The drainer ignores the cool-down (its own backoff paces it) so that it is the
        # one that notices a region is back; its failures do cool live sends down.
        try:
            await region.call(self._policy.attempt_seconds, region.client.send, message)
        except RegionError as exc:
            region.settle(exc)
            raise
        region.settle(None)
        self._counts.accepted(region.region, 1)
