"""How a GeoReceiver settles a copy: at the broker, in its stats, metrics, spans and ledger.

One :class:`Settlements` per region of a GeoReceiver (its region loop's settler). The
receiver decides (claim states, the handler's decisions); this applies a decision to one
copy and accounts for it.
"""

from __future__ import annotations

__all__ = ["Copy", "Settlements", "complete_all"]

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN, Link, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from georep._channel import bounded_call
from georep._logs import Throttled
from georep.exceptions import RegionError
from georep.ports import ClaimState, Delivery, ReceiveRecord, RegionReceiver
from georep.receive.outcomes import (
    COMPLETE,
    LEDGER_OUTCOMES,
    PING_CONTENT_TYPE,
    Decision,
    Settle,
    twin_reason,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from georep.receive.context import ReceiveContext

_log = logging.getLogger("georep.receiver")
_troubles = Throttled(_log)
"""A region that fails settlements fails them all: one line, then one per 30 s."""
_propagator = TraceContextTextMapPropagator()


@dataclass(slots=True)
class Copy:
    """One received copy, as the receiver tracks it."""

    message: Any
    delivery: Delivery
    received_at: float = 0.0
    """Wall-clock seconds when the receive call returned it (for the ledger)."""
    renewed_at: float = 0.0
    """Wall-clock seconds when its lock was last taken or renewed (received, at first):
    with ``delivery.locked_until``, how long the lock lasts."""
    parked_turns: int = 0
    settled: bool = False
    order_gap: str | None = None
    """Session mode: why it was handed on without its predecessor (``timeout``, ``absent``)."""
    order_waited: float = 0.0
    """Session mode: seconds it waited for its predecessor."""
    handled_at: float | None = None
    """Wall-clock seconds when the handler returned (None: not handed to it)."""


async def complete_all(region: RegionReceiver, messages: list[Any]) -> None:
    """Complete ``messages`` in ``region``: in one call where its receiver offers
    ``complete_many`` (the async SDK adapter: one disposition per run of delivery ids),
    else one ``complete`` each.

    Raises:
        RegionError: A message was not taken (see the receiver's ``complete_many``).
    """
    complete_many = getattr(region, "complete_many", None)
    if complete_many is not None:
        await complete_many(messages)
        return
    for message in messages:
        await region.complete(message)


class Settlements:
    """Settles one region's copies for a GeoReceiver and accounts for them.

    Args:
        region: The region whose copies this settles.
        context: The receiver's shared state (its entity, stats, metrics, ledger, clock
            and tracing).
    """

    def __init__(self, region: RegionReceiver, context: ReceiveContext) -> None:
        self.region = region
        self.lock = asyncio.Lock()
        """Held for every call on the region's receiver: settlements and lock renewals may
        overlap within a turn, and the SDK's receiver takes one call at a time."""
        self._context = context
        self.on_final: Callable[[Copy], None] | None = None
        """Session mode: told of each copy settled with a final outcome (not abandoned)."""

    def start_span(self, operation: str, copy: Copy) -> trace.Span:
        if not self._context.tracing():
            return INVALID_SPAN
        links = []
        if copy.delivery.traceparent:
            context = trace.get_current_span(
                _propagator.extract({"traceparent": copy.delivery.traceparent})
            ).get_span_context()
            if context.is_valid:
                links.append(Link(context))
        return self._context.tracer.start_span(
            f"{operation} {self._context.entity}",
            kind=SpanKind.CONSUMER if operation == "process" else SpanKind.CLIENT,
            links=links,
            attributes={
                "messaging.system": "servicebus",
                "messaging.destination.name": self._context.entity,
                "messaging.operation.type": operation,
                "georep.region": self.region.region,
                "georep.duplicate": False,
                "messaging.message.delivery_count": copy.delivery.delivery_count,
            },
        )

    def _begin(self, copy: Copy, decision: Decision, duplicate: bool) -> trace.Span:
        """Mark ``copy`` settled (telling ``on_final`` of a final outcome); its span."""
        span = self.start_span("settle", copy)
        span.set_attribute("georep.duplicate", duplicate)
        span.set_attribute("messaging.operation.name", decision.settle.value)
        copy.settled = True
        if self.on_final is not None and decision.settle is not Settle.ABANDON:
            self.on_final(copy)
        return span

    async def settle(self, copy: Copy, decision: Decision, *, duplicate: bool = False) -> bool:
        """Settle ``copy`` as decided; False when the broker did not take the settlement."""
        region = self.region
        span = self._begin(copy, decision, duplicate)
        message = copy.message
        try:
            async with self.lock:
                with bounded_call(self._context.clock, region.region, "a settlement"):
                    await self._send(message, decision)
        except RegionError as exc:
            # The copy will be redelivered; its outcome is recorded, so the redelivery
            # gets the same outcome without the handler.
            _troubles.warning(
                ("settle", self._context.entity, region.region, exc.kind),
                "settling a copy of %s in %s failed: %s",
                self._context.entity,
                region.region,
                exc,
            )
            return False
        finally:
            span.end()
        return True

    async def _send(self, message: Any, decision: Decision) -> None:
        await decision.apply(self.region, message)

    def record(self, copy: Copy, outcome: str, settled: bool) -> None:
        ledger = self._context.ledger
        if ledger is None:
            return
        delivery = copy.delivery
        now = self._context.clock.time()
        ledger.record_receive(
            ReceiveRecord(
                message_id=delivery.key or "",
                entity=self._context.entity,
                region=self.region.region,
                outcome=outcome,
                delivery_count=delivery.delivery_count,
                enqueued_at=delivery.enqueued_at,
                received_at=copy.received_at,
                settled_at=now if settled else None,
                session_id=delivery.session_id,
                order_writer=None if delivery.stamp is None else delivery.stamp.writer,
                order_seq=None if delivery.stamp is None else delivery.stamp.seq,
                order_gap=copy.order_gap,
                order_wait=copy.order_waited,
                # When the handler was done, not when settling returned: a settlement that
                # fails can take seconds, and the next copy of the session may be handled
                # (from its redelivery's twin) meanwhile; the audit orders by this time.
                finished_at=now if copy.handled_at is None else copy.handled_at,
            )
        )

    def count(self, decision: Decision) -> None:
        label = self.region.region
        if decision.settle is Settle.COMPLETE:
            self._context.stats.processed += 1
            self._context.metrics.copy("processed", label)
        elif decision.settle is Settle.DEAD_LETTER:
            self._context.stats.dead_lettered += 1
            self._context.metrics.copy("dead_lettered", label)
        elif decision.settle is Settle.DEFER:
            self._context.stats.deferred += 1
            self._context.metrics.copy("deferred", label)

    async def complete_pings(self, copies: list[Copy]) -> list[Copy]:
        """Complete the paired namespaces' pings (never a handler's business); the rest."""
        pings = [c for c in copies if c.delivery.content_type == PING_CONTENT_TYPE]
        if not pings:
            return copies
        for copy in pings:
            await self.settle(copy, COMPLETE, duplicate=False)
        self._context.stats.pings += len(pings)
        return [c for c in copies if c.delivery.content_type != PING_CONTENT_TYPE]

    async def settle_all(
        self, batch: list[tuple[Copy, Decision]], *, duplicate: bool = False
    ) -> list[bool]:
        """Settle each copy as decided; for each, whether the broker took it.

        The completions go to the region in one call where it offers ``complete_many``
        (one disposition per run of delivery ids, not a round trip each); a failure there
        is logged and marks them all not taken (the adapter completes a refused run one
        copy at a time, so some may be), and a copy not taken is redelivered and gets its
        recorded outcome then. The other decisions are settled one copy at a time.
        """
        complete_many = getattr(self.region, "complete_many", None)
        bulk = [i for i, (_, d) in enumerate(batch) if d.settle is Settle.COMPLETE]
        if complete_many is None or len(bulk) < 2:
            return [await self.settle(c, d, duplicate=duplicate) for c, d in batch]
        taken = [True] * len(batch)
        in_bulk = set(bulk)
        for index, (copy, decision) in enumerate(batch):
            if index not in in_bulk:
                taken[index] = await self.settle(copy, decision, duplicate=duplicate)
        copies = [batch[i][0] for i in bulk]
        spans = [self._begin(batch[i][0], batch[i][1], duplicate) for i in bulk]
        label = self.region.region
        try:
            async with self.lock:
                with bounded_call(self._context.clock, label, "a settlement"):
                    await complete_many([copy.message for copy in copies])
        except RegionError as exc:
            for index in bulk:
                taken[index] = False
            _troubles.warning(
                ("settle", self._context.entity, label, exc.kind),
                "settling %d copies of %s in %s failed: %s",
                len(copies),
                self._context.entity,
                label,
                exc,
            )
        finally:
            for span in spans:
                span.end()
        return taken

    async def settle_twins(self, twins: list[tuple[Copy, ClaimState, str | None]]) -> None:
        """Give each copy the outcome its twin (or an earlier copy) already got, without a
        handler: counted as suppressed when completed, as that outcome otherwise;
        completions together (see :meth:`settle_all`)."""
        if not twins:
            return
        label = self.region.region
        batch: list[tuple[Copy, Decision]] = []
        outcomes: list[str] = []
        for copy, state, reason in twins:
            decision = twin_reason(state, reason)
            if decision.settle is Settle.COMPLETE:
                suppressed = self._context.stats.suppressed
                suppressed[label] = suppressed.get(label, 0) + 1
                self._context.metrics.copy("suppressed", label)
                outcomes.append("suppressed")
            else:
                self.count(decision)
                outcomes.append(LEDGER_OUTCOMES[decision.settle])
            batch.append((copy, decision))
        taken = await self.settle_all(batch, duplicate=True)
        for (copy, _), outcome, settled in zip(batch, outcomes, taken, strict=True):
            self.record(copy, outcome, settled)
