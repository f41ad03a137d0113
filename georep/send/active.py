"""The active path: every message to both regions at once, one MessageId."""

from __future__ import annotations

__all__ = ["ActivePath"]

import asyncio

from georep._lifecycle import stop_task
from georep.exceptions import AllRegionsUnavailableError, RegionError
from georep.send.path import Queue, SendPath, region_failed, troubles
from georep.send.result import PendingSend, SendContext, SendResult


class ActivePath(SendPath):
    """Active replication: both regions at once, each message with the same MessageId.

    Args:
        context: What the sender's collaborators share (regions, policy, counters...).
        queue: Persists what no region accepted (None: no outbox).
        repair: Queue a failed region's copy when the other accepted.
    """

    def __init__(self, context: SendContext, *, queue: Queue | None, repair: bool) -> None:
        super().__init__(context, queue)
        self._repair = repair

    async def send(self, send: PendingSend) -> SendResult:
        """Send to both regions; return which accepted (raise when none could)."""
        regions = self._regions
        now = self._context.clock.monotonic()
        # A region that just failed is skipped until its cool-down ends (its last error
        # stands for this send), so one dead region does not slow every send to its
        # failure latency. If both are cooling down, both are tried: nothing to lose.
        errors: dict[str, RegionError] = {}
        for channel in regions:
            cooling = channel.cooling(now)
            if cooling is not None:
                errors[channel.region] = cooling
        skip = set(errors)
        if len(skip) == 2:
            skip.clear()
            errors.clear()
        await self._attempt(send, skip, errors)
        for channel in regions:
            if channel.region not in skip:
                channel.settle(errors.get(channel.region))
        count = len(send.messages)
        accepted = tuple(c.region for c in regions if c.region not in errors)
        for region in accepted:
            self._counts.accepted(region, count)
        for region, error in errors.items():
            self._counts.failed(region, count)
            region_failed(send.span, region, error)
        if accepted:
            send.span.set_attribute("georep.region", accepted[0])
        if not errors:
            return SendResult(accepted=accepted, message_ids=send.ids)
        if accepted:
            return await self._partial(send, accepted, errors, tuple(skip))
        return await self._none_accepted(send, errors, tuple(skip))

    async def _attempt(
        self, send: PendingSend, skip: set[str], errors: dict[str, RegionError]
    ) -> None:
        """Send to each region not in ``skip``; their failures go into ``errors``."""
        primary, secondary = self._regions.primary, self._regions.secondary
        secondary_attempt: asyncio.Future[None] | None = None
        if secondary.region not in skip:
            copies = self._context.prep.copy_payload(send.payload, send.messages)
            # One task, not two: the primary's attempt runs in this task.
            secondary_attempt = asyncio.ensure_future(
                secondary.call(send.timeout, secondary.client.send, copies)
            )
        if primary.region not in skip:
            try:
                await primary.call(send.timeout, primary.client.send, send.payload)
            except RegionError as exc:
                errors[primary.region] = exc
            except BaseException:
                # Cancelled (or worse): the secondary's attempt is ours to stop, not to
                # leave running unowned.
                await stop_task(secondary_attempt, clock=self._context.clock)
                raise
        if secondary_attempt is not None:
            try:
                await secondary_attempt
            except RegionError as exc:
                errors[secondary.region] = exc

    async def _partial(
        self,
        send: PendingSend,
        accepted: tuple[str, ...],
        errors: dict[str, RegionError],
        skipped: tuple[str, ...],
    ) -> SendResult:
        """One region accepted: queue the other's copy for repair when asked to."""
        repair: tuple[str, ...] = ()
        if self._repair and self._queue is not None:
            repair = tuple(r for r, e in errors.items() if e.kind in self._policy.fail_over_on)
            if repair:
                await self._queue(send.messages, list(repair))
        troubles.warning(
            ("partial", self._context.entity, tuple(sorted(errors))),
            "send to %s failed (%s); %s accepted%s",
            ", ".join(errors),
            "; ".join(f"{e.kind.value}: {e}" for e in errors.values()),
            accepted[0],
            ", copy queued for repair" if repair else "",
        )
        return SendResult(
            accepted=accepted,
            failed=dict(errors),
            repair_queued=repair,
            skipped=skipped,
            message_ids=send.ids,
        )

    async def _none_accepted(
        self, send: PendingSend, errors: dict[str, RegionError], skipped: tuple[str, ...]
    ) -> SendResult:
        fail_over_on = self._policy.fail_over_on
        transient = [r for r, e in errors.items() if e.kind in fail_over_on]
        refused = [e for e in errors.values() if e.kind not in fail_over_on]
        if refused:
            # A region answered and refused the message itself (too large, bad key...): not
            # an outage, and a queued copy would be refused again forever (issue 20).
            raise refused[0]
        if self._queue is not None:
            await self._queue(send.messages, transient)
            send.span.set_attribute("georep.queued", True)
            return SendResult(
                accepted=(), failed=dict(errors), queued=True, skipped=skipped, message_ids=send.ids
            )
        raise AllRegionsUnavailableError(
            f"no region accepted the send to {self._context.entity!r}", errors
        ) from errors[self._regions.secondary.region]
