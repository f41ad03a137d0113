"""The GeoSender's side of the outbox: what goes in, and delivering an entry to its region.

What goes in: what no region could be reached for, and a session's sends while the outbox
holds an earlier message of that session (queued behind it, so it is not overtaken). The
drain loop itself is :class:`georep.outbox.drainer.OutboxDrainer`.
"""

from __future__ import annotations

__all__ = ["STANDARD_LIMIT", "OutboxLink"]

from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any, Final

from georep.exceptions import InvalidMessageError, OversizeMessageError, RegionError
from georep.outbox.sessions import HeldSessions
from georep.ports import Outbox
from georep.send.result import PendingSend, SendContext, SendResult

STANDARD_LIMIT: Final = 262_144
"""Bytes of body the outbox takes at most while no region's size limit is known (the
standard tier's message size limit; a premium namespace's is larger, learned on first
contact)."""


@dataclass(frozen=True, slots=True, eq=False)
class OutboxLink:
    """Puts what no region could be reached for in the outbox; delivers targeted entries.

    Attributes:
        context: What the sender's collaborators share (regions, policy, codec...).
        outbox: The durable outbox (the caller owns it).
        channel: The outbox channel of the sender's namespace pair and entity.
        wake: Wakes the drain loop.
        held: The sessions the outbox may hold an entry of.
        behind: Where a send queued behind its session goes (region labels; None: any
            region): ``[None]`` in passive mode, both regions in active mode.
    """

    context: SendContext
    outbox: Outbox
    _: KW_ONLY
    channel: str
    wake: Callable[[], None]
    held: HeldSessions
    behind: Sequence[str | None]

    def _sessions(self, messages: Sequence[Any]) -> list[str | None]:
        session_id = self.context.codec.session_id
        return [session_id(message) for message in messages]

    async def holds_session_of(self, messages: Sequence[Any]) -> bool:
        """True when the outbox holds an earlier message of one of ``messages``' sessions."""
        sessions = {s for s in self._sessions(messages) if s is not None}
        return await self.held.held(sessions) if sessions else False

    async def queue_behind(self, send: PendingSend) -> SendResult:
        """Queue ``send`` behind its session's messages in the outbox (no region tried).

        Returns once the outbox has stored it, as a send queued during an outage.
        """
        await self.queue(send.messages, self.behind)
        send.span.set_attribute("georep.queued", True)
        return SendResult(accepted=(), queued=True, message_ids=send.ids)

    async def queue(self, messages: Sequence[Any], regions: Sequence[str | None]) -> None:
        """Persist ``messages`` for each of ``regions`` (labels; None = whichever accepts).

        Only called when no region could be reached (never for a message a region
        refused for what it is).

        Raises:
            OversizeMessageError: No region's size limit is known yet (none was reached
                since the sender started) and the bodies are over Service Bus's standard
                limit: queued, the message could never be delivered once the regions
                answer, and queueing acknowledges it.
        """
        if self.context.regions.size_limit() is None:
            try:
                self.context.codec.check(messages, one_partition=False, max_size=STANDARD_LIMIT)
            except OversizeMessageError as exc:
                raise OversizeMessageError(
                    f"{exc}. Not queued: no region has been reached since this sender "
                    f"started, so their size limits are unknown, and {STANDARD_LIMIT} bytes "
                    "(Service Bus's standard limit) is the most the outbox takes until "
                    "then (warm_up() once a region answers learns them)"
                ) from None
        encode = self.context.codec.encode
        # Entries name their target by namespace, not label: a later sender may have the
        # pair the other way round.
        by_label = self.context.regions.by_label
        targets = [None if r is None else by_label[r].client.namespace for r in regions]
        items = [(target, encode(message)) for target in targets for message in messages]
        sessions = self._sessions(messages) * len(targets)
        # Held from before the put: a cancelled put may still have stored its entries.
        with self.held.recording({s for s in sessions if s is not None}):
            await self.outbox.put(
                self.channel, items, now=self.context.clock.time(), sessions=sessions
            )
        count = len(messages)
        self.context.stats.queued += count
        self.context.stats.outbox_depth = (self.context.stats.outbox_depth or 0) + len(items)
        for region in regions:
            self.context.telemetry.messages(count, region or "any", "queued")
        self.wake()

    async def deliver_to(self, target: str, message: Any) -> None:
        """Send an entry queued for the region of namespace ``target``."""
        region = self.context.regions.by_namespace.get(target)
        if region is None:
            raise InvalidMessageError(
                f"outbox entry targets namespace {target!r}, which is not one of this "
                f"sender's ({', '.join(sorted(self.context.regions.by_namespace))})"
            )
        # The drainer ignores the cool-down (its own backoff paces it) so that it is the
        # one that notices a region is back; its failures do cool live sends down.
        try:
            await region.call(self.context.policy.attempt_seconds, region.client.send, message)
        except RegionError as exc:
            region.settle(exc)
            raise
        region.settle(None)
        self.context.counts.accepted(region.region, 1)
