"""How a GeoSender's collaborators are put together (its composition root).

Each collaborator gets what it uses through its constructor; nothing here imports
:mod:`georep.send.sender`, so no import cycle appears.
"""

from __future__ import annotations

__all__ = ["SenderParts", "SenderSettings", "wire"]

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from georep._channel import RegionPair, sender_channel
from georep._policy import DedupKey, DrainPolicy, FailoverPolicy, ReplicationMode
from georep._telemetry import SenderTelemetry
from georep.outbox.drainer import DrainTelemetry, OutboxDrainer
from georep.outbox.enqueue import OutboxLink
from georep.outbox.sessions import HeldSessions
from georep.ports import Clock, Ledger, MessageCodec, Outbox, RegionSender, ScheduleStore
from georep.roles.state import RoleState
from georep.send.active import ActivePath
from georep.send.ordering import SessionSequencer
from georep.send.passive import PassivePath
from georep.send.pipeline import SendFlow
from georep.send.records import SendRecords
from georep.send.result import (
    MessagePrep,
    PendingSend,
    SendContext,
    SendCounts,
    SenderStats,
    SendResult,
)
from georep.send.schedule import Scheduler

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider


class SenderSettings(Protocol):
    """What a GeoSender was configured with: its attributes, checked by its constructor
    and read here once, as its collaborators are built."""

    mode: ReplicationMode
    policy: FailoverPolicy
    drain_policy: DrainPolicy
    dedup_key: DedupKey
    outbox: Outbox | None
    repair: bool
    ledger: Ledger | None
    partitioned: bool
    entity: str
    channel: str
    schedules: ScheduleStore | None


@dataclass(frozen=True, slots=True)
class SenderParts:
    """A GeoSender's collaborators."""

    regions: RegionPair[RegionSender]
    prep: MessagePrep
    drainer: OutboxDrainer | None
    passive: PassivePath
    flow: SendFlow
    scheduler: Scheduler


def wire(
    settings: SenderSettings,
    primary: RegionSender,
    secondary: RegionSender,
    *,
    clock: Clock,
    stats: SenderStats,
    telemetry: SenderTelemetry,
    roles: Callable[[], RoleState],
    meter_provider: MeterProvider | None,
) -> SenderParts:
    """Build the collaborators of one GeoSender."""
    policy, codec = settings.policy, primary.codec
    context = SendContext(
        regions=RegionPair(
            *(sender_channel(region, clock=clock, policy=policy) for region in (primary, secondary))
        ),
        policy=policy,
        codec=codec,
        prep=MessagePrep(
            codec,
            settings.dedup_key,
            SessionSequencer(lambda: roles().current.generation),
        ),
        counts=SendCounts(stats, telemetry),
        stats=stats,
        telemetry=telemetry,
        partitioned=settings.partitioned,
        entity=settings.entity,
        clock=clock,
    )

    async def deliver(target: str | None, message: Any) -> None:
        # An outbox entry: to its region, or (None) to whichever accepts, never requeued.
        if target is None:
            await passive.send_unqueued(message)
        else:
            assert link is not None
            await link.deliver_to(target, message)

    records = _records(settings, primary, secondary, clock)
    drainer: OutboxDrainer | None = None
    link: OutboxLink | None = None
    active = settings.mode is ReplicationMode.ACTIVE
    if settings.outbox is not None:
        held = HeldSessions(settings.outbox, settings.channel)
        drainer = _drainer(settings, deliver, stats, meter_provider, codec, clock, records, held)
        link = OutboxLink(
            context,
            settings.outbox,
            channel=settings.channel,
            wake=drainer.wake,
            held=held,
            # Behind its session: to whichever region accepts (passive), or each region
            # its copy (active).
            behind=[primary.region, secondary.region] if active else [None],
        )
    queue = None if link is None else link.queue
    passive = PassivePath(context, roles=roles, queue=queue)
    path: Callable[[PendingSend], Awaitable[SendResult]] = passive.send
    if active:
        path = ActivePath(context, queue=queue, repair=settings.repair).send
    flow = SendFlow(context, path, records=records, outbox=link)
    scheduler = Scheduler(
        context,
        active=active,
        passive=passive,
        roles=roles,
        store=settings.schedules,
        scope=settings.channel,
    )
    return SenderParts(context.regions, context.prep, drainer, passive, flow, scheduler)


def _drainer(
    settings: SenderSettings,
    deliver: Callable[[str | None, Any], Awaitable[None]],
    stats: SenderStats,
    meter_provider: MeterProvider | None,
    codec: MessageCodec,
    clock: Clock,
    records: SendRecords | None,
    held: HeldSessions,
) -> OutboxDrainer:
    assert settings.outbox is not None
    return OutboxDrainer(
        outbox=settings.outbox,
        channel=settings.channel,
        codec=codec,
        policy=settings.drain_policy,
        clock=clock,
        deliver=deliver,
        unavailable_kinds=settings.policy.fail_over_on,
        # A passive delivery may try both regions, each within the attempt deadline.
        send_budget=2 * settings.policy.attempt_seconds + 1.0,
        telemetry=DrainTelemetry(entity=settings.entity, meter_provider=meter_provider),
        stats=stats,
        records=records,
        held=held,
    )


def _records(
    settings: SenderSettings, primary: RegionSender, secondary: RegionSender, clock: Clock
) -> SendRecords | None:
    if settings.ledger is None:
        return None
    return SendRecords(
        settings.ledger,
        entity=settings.entity,
        mode=settings.mode.value,
        labels=(primary.region, secondary.region),
        fail_over_on=settings.policy.fail_over_on,
        codec=primary.codec,
        clock=clock,
    )
