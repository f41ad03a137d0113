"""The passive path: one region at a time; on failure the backup, a role swap, and the switch-
back probe.
"""

from __future__ import annotations

__all__ = ["PassivePath"]

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from opentelemetry.trace import Span, SpanKind

from georep._lifecycle import start_task, stop_task
from georep._policy import as_seconds
from georep.exceptions import AllRegionsUnavailableError, RegionError
from georep.roles.state import FailoverEvidence, RoleMove, RoleSnapshot, RoleState
from georep.send.path import Channel, Queue, SendPath, region_failed, troubles
from georep.send.result import PendingSend, SendContext, SendResult

_log = logging.getLogger("georep.sender")


class PassivePath(SendPath):
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
        region_failed(send.span, active.region, first_error)
        troubles.warning(
            ("failover", self._context.entity, active.region, first_error.kind),
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
            region_failed(send.span, backup.region, second_error)
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
