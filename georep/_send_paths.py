"""The GeoSender's two ways to send (SPEC §2.1-2.3), each over the same region channels.

:class:`PassivePath` sends to the active region and fails over to the backup (swapping the
roles, and probing for switch-back); :class:`ActivePath` sends to both regions at once,
skipping a region that is cooling down. Both queue in the outbox (through ``queue``) what
no region could be reached for.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from opentelemetry.trace import Span, SpanKind

from georep._channel import RegionChannel
from georep._lifecycle import start_task, stop_task
from georep._policy import as_seconds
from georep._roles import FailoverEvidence, RoleMove, RoleSnapshot, RoleState
from georep._sending import PendingSend, SendContext, SendResult
from georep.exceptions import AllRegionsUnavailableError, RegionError
from georep.ports import RegionSender

__all__ = ["ActivePath", "PassivePath", "Queue"]

_log = logging.getLogger("georep.sender")

#: ``queue(messages, regions)``: persist ``messages`` in the outbox for each region label
#: (None: whichever region accepts). Only for messages no region could be reached for.
Queue = Callable[[Sequence[Any], Sequence[str | None]], Awaitable[None]]

Channel = RegionChannel[RegionSender]


def _region_failed(span: Span, region: str, error: RegionError) -> None:
    span.add_event(
        "georep.region_failed", {"georep.region": region, "error.type": error.kind.value}
    )


class _Path:
    """What both paths hold: the shared context and the outbox's ``queue``."""

    def __init__(self, context: SendContext, queue: Queue | None) -> None:
        self._context = context
        self._regions = context.regions
        self._policy = context.policy
        self._counts = context.counts
        self._queue = queue


class PassivePath(_Path):
    """Passive replication: the active region, then the backup; roles shared per pair.

    Args:
        context: What the sender's collaborators share (regions, policy, counters...).
        roles: Returns the role state shared by every sender on the pair.
        queue: Persists what no region accepted (None: no outbox).
    """

    def __init__(
        self, context: SendContext, *, roles: Callable[[], RoleState], queue: Queue | None
    ) -> None:
        super().__init__(context, queue)
        self._roles = roles
        self._probe: asyncio.Task[None] | None = None
        self._stopped = False
        self._unwatch: Callable[[], None] | None = None

    async def send(self, send: PendingSend, *, may_queue: bool = True) -> SendResult:
        """Send to the active region; on an unavailability, to the backup."""
        roles = self._roles()
        snapshot = roles.read_now() or await roles.read()
        active = self._regions.by_namespace[snapshot.active]
        try:
            await active.call(send.timeout, active.client.send, send.payload)
        except RegionError as first_error:
            if first_error.kind not in self._policy.fail_over_on:
                self._counts.failed(active.region, len(send.messages))
                raise
            return await self._fail_over(snapshot, active, send, first_error, may_queue)
        self._counts.accepted(active.region, len(send.messages))
        send.span.set_attribute("georep.region", active.region)
        return SendResult(accepted=(active.region,), message_ids=send.ids)

    async def send_unqueued(self, message: Any) -> None:
        """An outbox entry for whichever region accepts (never queued again)."""
        telemetry = self._context.telemetry
        span = telemetry.tracer.start_span(
            telemetry.span_name,
            kind=SpanKind.PRODUCER,
            attributes={**telemetry.span_attributes, "georep.outbox": True},
        )
        try:
            send = PendingSend(message, [message], self._policy.attempt_seconds, span)
            await self.send(send, may_queue=False)
        finally:
            span.end()

    async def _fail_over(
        self,
        snapshot: RoleSnapshot,
        active: Channel,
        send: PendingSend,
        first_error: RegionError,
        may_queue: bool,
    ) -> SendResult:
        backup = self._regions.other(active)
        count = len(send.messages)
        self._counts.failed(active.region, count)
        _region_failed(send.span, active.region, first_error)
        _log.warning(
            "send to %s failed (%s: %s); failing over to %s",
            active.region,
            first_error.kind.value,
            first_error,
            backup.region,
        )
        # The SDK may have kept state on the objects it tried to send; the backup gets
        # copies with the same MessageIds (a batch is immutable once built, so it is reused).
        retry_payload = self._context.prep.copy_payload(send.payload, send.messages)
        try:
            await backup.call(send.timeout, backup.client.send, retry_payload)
        except RegionError as second_error:
            self._counts.failed(backup.region, count)
            _region_failed(send.span, backup.region, second_error)
            if second_error.kind not in self._policy.fail_over_on:
                # The backup answered and refused the message itself (too large, invalid,
                # credentials, missing entity): raised at once, never queued, since no
                # later retry could succeed (issue 20).
                raise second_error
            causes = {active.region: first_error, backup.region: second_error}
            if self._queue is not None and may_queue:
                await self._queue(send.messages, [None])
                send.span.set_attribute("georep.queued", True)
                return SendResult(accepted=(), failed=causes, queued=True, message_ids=send.ids)
            raise AllRegionsUnavailableError(
                f"no region accepted the send to {self._context.entity!r}", causes
            ) from second_error
        self._counts.accepted(backup.region, count)
        await self.record_failover(snapshot, active, backup, send.span)
        return SendResult(
            accepted=(backup.region,),
            failed={active.region: first_error},
            failed_over=True,
            message_ids=send.ids,
        )

    async def record_failover(
        self, snapshot: RoleSnapshot, active: Channel, backup: Channel, span: Span | None
    ) -> None:
        """The backup accepted what the active region refused: count it, swap the roles
        (with a role store: for every process when the failure is corroborated, else for
        this process only)."""
        self._context.stats.failovers += 1
        self._context.telemetry.failover(active.region, backup.region)
        if span is not None:
            span.set_attribute("georep.region", backup.region)
            span.set_attribute("georep.failover", True)
        last = active.last_success
        evidence = FailoverEvidence(
            reached_ago=None if last is None else self._context.clock.monotonic() - last,
            corroboration=self._policy.corroboration,
        )
        roles = self._roles()
        move = await roles.move(
            expected=snapshot, new_active=backup.client.namespace, evidence=evidence
        )
        if move is RoleMove.SWAPPED:
            self._context.stats.role_swaps += 1
            self._context.telemetry.role_swap(backup.region)
            if span is not None:
                span.add_event("georep.role_swap", {"georep.region": backup.region})
            _log.warning("%s is now the active region for %s", backup.region, self._context.entity)
        elif move is RoleMove.LEFT:  # the role store's link said why
            if span is not None:
                span.add_event("georep.role_departure", {"georep.region": backup.region})
        elif move is RoleMove.REJOINED:
            _log.warning(
                "%s: back on the shared roles (%s active) after %s failed",
                self._context.entity,
                backup.region,
                active.region,
            )
        if move is not RoleMove.UNCHANGED:
            self._start_probe()

    def watch(self, roles: RoleState) -> None:
        """Probe for switch-back whenever ``roles`` move away from the primary, whoever
        moved them (this sender, another one, or another process through a role store)."""
        primary = self._regions.primary.client.namespace
        self._unwatch = roles.on_change(
            lambda snapshot: None if snapshot.active == primary else self._start_probe()
        )

    def _start_probe(self) -> None:
        if self._probe is not None or self._stopped:
            return
        if self._policy.switch_back or self._roles().departed_from is not None:
            self._probe = start_task(
                self._keep_probing(), name=f"georep-switch-back {self._context.entity}"
            )

    async def _keep_probing(self) -> None:
        """Run the switch-back probe until it is done or stopped. One that fails on an
        error other than the probe's answer (the role store raised, say) is logged and
        starts over after its interval: a dead probe would leave the roles swapped for
        good."""
        while not self._stopped:
            try:
                await self._probe_for_switch_back()
                return
            except Exception:
                _log.exception(
                    "switch-back probe of %s failed; probing again in %g s",
                    self._regions.primary.region,
                    as_seconds(self._policy.switch_back_probe_interval),
                )
                # Still this task's: the probe's ``finally`` let go of it.
                self._probe = asyncio.current_task()

    async def _probe_for_switch_back(self) -> None:
        """Move back to the original primary once it has answered for ``failback_after``;
        first, while this process has left the shared roles (an uncorroborated failover),
        back to them once the region it left has answered as long.

        Only a swap georep made itself is undone, and never while the roles are pinned:
        an operator's choice stays until an operator changes it. A return to the shared
        roles needs no ``switch_back``: it only undoes this process's own departure.
        """
        interval = as_seconds(self._policy.switch_back_probe_interval)
        clock = self._context.clock
        healthy_since: float | None = None
        probed: Channel | None = None
        try:
            while not self._stopped:
                await clock.sleep(interval)
                roles = self._roles()
                snapshot = await roles.read()
                departed = roles.departed_from
                if departed is not None:
                    target = self._regions.by_namespace[departed.active]
                elif not self._policy.switch_back:
                    return
                else:
                    target = self._regions.primary
                    if snapshot.active == target.client.namespace:
                        return
                    if roles.pinned or not roles.automatic:
                        return
                if target is not probed:
                    probed, healthy_since = target, None
                try:
                    await target.call(self._policy.attempt_seconds, target.client.probe)
                except RegionError:
                    healthy_since = None
                    continue
                now = clock.monotonic()
                if healthy_since is None:
                    healthy_since = now
                if now - healthy_since < self._policy.failback_seconds:
                    continue
                move = await roles.move(expected=snapshot, new_active=target.client.namespace)
                if departed is not None:  # rejoined, or the roles moved meanwhile: look again
                    if move is RoleMove.REJOINED:
                        _log.warning(
                            "%s answered for %g s: %s follows the shared roles again",
                            target.region,
                            now - healthy_since,
                            self._context.entity,
                        )
                    probed = None
                    continue
                if move is RoleMove.SWAPPED:
                    self._context.stats.role_swaps += 1
                    self._context.telemetry.role_swap(target.region)
                    _log.warning(
                        "%s answered for %g s; switched back to it",
                        target.region,
                        now - healthy_since,
                    )
                return
        finally:
            self._probe = None

    async def stop(self) -> None:
        """Stop the switch-back probe (for good): flag, cancel, bounded wait."""
        self._stopped = True
        if self._unwatch is not None:
            self._unwatch()
        await stop_task(self._probe, clock=self._context.clock)


class ActivePath(_Path):
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
            _region_failed(send.span, region, error)
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
        _log.warning(
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
