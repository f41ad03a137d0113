"""The GeoSender's side of the outbox: what goes in, and delivering an entry to its region.

The drain loop itself is :class:`georep.outbox.drainer.OutboxDrainer`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from georep.exceptions import InvalidMessageError, RegionError
from georep.ports import Outbox
from georep.send.result import SendContext

__all__ = ["OutboxLink"]


class OutboxLink:
    """Puts what no region could be reached for in the outbox; delivers targeted entries.

    Args:
        context: What the sender's collaborators share (regions, policy, codec...).
        outbox: The durable outbox (the caller owns it).
        channel: The outbox channel of the sender's namespace pair and entity.
        wake: Wakes the drain loop.
    """

    def __init__(
        self, context: SendContext, outbox: Outbox, *, channel: str, wake: Callable[[], None]
    ) -> None:
        self._context = context
        self.outbox = outbox
        self._channel = channel
        self._wake = wake

    async def queue(self, messages: Sequence[Any], regions: Sequence[str | None]) -> None:
        """Persist ``messages`` for each of ``regions`` (labels; None = whichever accepts).

        Only called when no region could be reached (never for a message a region
        refused for what it is).
        """
        encode = self._context.codec.encode
        # Entries name their target by namespace, not label: a later sender may have the
        # pair the other way round.
        by_label = self._context.regions.by_label
        targets = [None if r is None else by_label[r].client.namespace for r in regions]
        items = [(target, encode(message)) for target in targets for message in messages]
        await self.outbox.put(self._channel, items, now=self._context.clock.time())
        count = len(messages)
        self._context.stats.queued += count
        self._context.stats.outbox_depth = (self._context.stats.outbox_depth or 0) + len(items)
        for region in regions:
            self._context.telemetry.messages(count, region or "any", "queued")
        self._wake()

    async def deliver_to(self, target: str, message: Any) -> None:
        """Send an entry queued for the region of namespace ``target``."""
        region = self._context.regions.by_namespace.get(target)
        if region is None:
            raise InvalidMessageError(
                f"outbox entry targets namespace {target!r}, which is not one of this "
                f"sender's ({', '.join(sorted(self._context.regions.by_namespace))})"
            )
        # The drainer ignores the cool-down (its own backoff paces it) so that it is the
        # one that notices a region is back; its failures do cool live sends down.
        try:
            await region.call(self._context.policy.attempt_seconds, region.client.send, message)
        except RegionError as exc:
            region.settle(exc)
            raise
        region.settle(None)
        self._context.counts.accepted(region.region, 1)
