"""The GeoSender's side of the outbox: what goes in, and delivering an entry to its region.

What goes in: what no region could be reached for, and a session's sends while the outbox
holds an earlier message of that session (queued behind it, so it is not overtaken). The
drain loop itself is :class:`georep.outbox.drainer.OutboxDrainer`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from georep.exceptions import InvalidMessageError, RegionError
from georep.outbox.sessions import HeldSessions
from georep.ports import Outbox
from georep.send.result import PendingSend, SendContext, SendResult

__all__ = ["OutboxLink"]


class OutboxLink:
    """Puts what no region could be reached for in the outbox; delivers targeted entries.

    Args:
        context: What the sender's collaborators share (regions, policy, codec...).
        outbox: The durable outbox (the caller owns it).
        channel: The outbox channel of the sender's namespace pair and entity.
        wake: Wakes the drain loop.
        held: The sessions the outbox may hold an entry of.
        behind: Where a send queued behind its session goes (region labels; None: any
            region): ``[None]`` in passive mode, both regions in active mode.
    """

    def __init__(
        self,
        context: SendContext,
        outbox: Outbox,
        *,
        channel: str,
        wake: Callable[[], None],
        held: HeldSessions,
        behind: Sequence[str | None],
    ) -> None:
        self._context = context
        self.outbox = outbox
        self._channel = channel
        self._wake = wake
        self._held = held
        self._behind = list(behind)

    def _sessions(self, messages: Sequence[Any]) -> list[str | None]:
        session_id = self._context.codec.session_id
        return [session_id(message) for message in messages]

    async def holds_session_of(self, messages: Sequence[Any]) -> bool:
        """True when the outbox holds an earlier message of one of ``messages``' sessions."""
        sessions = {s for s in self._sessions(messages) if s is not None}
        return await self._held.held(sessions) if sessions else False

    async def queue_behind(self, send: PendingSend) -> SendResult:
        """Queue ``send`` behind its session's messages in the outbox (no region tried).

        Returns once the outbox has stored it, as a send queued during an outage.
        """
        await self.queue(send.messages, self._behind)
        send.span.set_attribute("georep.queued", True)
        return SendResult(accepted=(), queued=True, message_ids=send.ids)

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
        sessions = self._sessions(messages) * len(targets)
        # Held from before the put: a cancelled put may still have stored its entries.
        with self._held.recording({s for s in sessions if s is not None}):
            await self.outbox.put(
                self._channel, items, now=self._context.clock.time(), sessions=sessions
            )
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
