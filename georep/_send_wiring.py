"""How a GeoSender's collaborators are put together (its composition root).

Each collaborator gets what it uses through its constructor; nothing here imports
:mod:`georep._sender`, so no import cycle appears.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from georep._channel import RegionPair, sender_channel
from georep._drain import DrainTelemetry, OutboxDrainer
from georep._policy import DedupKey, DrainPolicy, FailoverPolicy, ReplicationMode
from georep._roles import RoleState
from georep._schedule import Scheduler
from georep._send_flow import SendFlow
from georep._send_outbox import OutboxLink
from georep._send_paths import ActivePath, PassivePath, Queue
from georep._send_records import SendRecords
from georep._sending import MessagePrep, PendingSend, SendCounts, SenderStats, SendResult
from georep._telemetry import SenderTelemetry
from georep.ports import Clock, Ledger, MessageCodec, Outbox, RegionSender

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider

__all__ = ["SenderParts", "SenderSettings", "wire"]


@dataclass(frozen=True, slots=True)
class SenderSettings:
    """What a GeoSender was configured with (its constructor's arguments, checked)."""

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
    clock: Clock


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
    stats: SenderStats,
    telemetry: SenderTelemetry,
    roles: Callable[[], RoleState],
    meter_provider: MeterProvider | None,
) -> SenderParts:
    """Build the collaborators of one GeoSender."""
    policy, clock = settings.policy, settings.clock
    regions = RegionPair(
        *(sender_channel(region, clock=clock, policy=policy) for region in (primary, secondary))
    )
    prep = MessagePrep(primary.codec, settings.dedup_key)
    counts = SendCounts(stats, telemetry)

    async def deliver(target: str | None, message: Any) -> None:
        # An outbox entry: to its region, or (None) to whichever accepts, never requeued.
        if target is None:
            await passive.send_unqueued(message)
        else:
            assert link is not None
            await link.deliver_to(target, message)

    drainer, link = _outbox(settings, regions, counts, stats, telemetry, deliver, meter_provider)
    queue = None if link is None else link.queue
    passive = PassivePath(
        regions,
        policy=policy,
        roles=roles,
        prep=prep,
        counts=counts,
        stats=stats,
        telemetry=telemetry,
        queue=queue,
        entity=settings.entity,
        clock=clock,
    )
    flow = SendFlow(
        _path(settings, regions, prep, counts, queue) or passive.send,
        regions=regions,
        codec=primary.codec,
        prep=prep,
        partitioned=settings.partitioned,
        telemetry=telemetry,
        records=_records(settings, primary, secondary),
        clock=clock,
    )
    scheduler = Scheduler(
        regions,
        active=settings.mode is ReplicationMode.ACTIVE,
        policy=policy,
        codec=primary.codec,
        prep=prep,
        partitioned=settings.partitioned,
        passive=passive,
        roles=roles,
        entity=settings.entity,
        clock=clock,
    )
    return SenderParts(regions, prep, drainer, passive, flow, scheduler)


def _path(
    settings: SenderSettings,
    regions: RegionPair[RegionSender],
    prep: MessagePrep,
    counts: SendCounts,
    queue: Queue | None,
) -> Callable[[PendingSend], Awaitable[SendResult]] | None:
    """The active path's send in active mode; None in passive mode."""
    if settings.mode is not ReplicationMode.ACTIVE:
        return None
    return ActivePath(
        regions,
        policy=settings.policy,
        prep=prep,
        counts=counts,
        queue=queue,
        repair=settings.repair,
        entity=settings.entity,
        clock=settings.clock,
    ).send


def _outbox(
    settings: SenderSettings,
    regions: RegionPair[RegionSender],
    counts: SendCounts,
    stats: SenderStats,
    telemetry: SenderTelemetry,
    deliver: Callable[[str | None, Any], Awaitable[None]],
    meter_provider: MeterProvider | None,
) -> tuple[OutboxDrainer | None, OutboxLink | None]:
    """The drain loop and the link that fills the outbox (none without an outbox)."""
    if settings.outbox is None:
        return None, None
    codec = regions.primary.client.codec
    drainer = _drainer(settings, deliver, stats, meter_provider, codec)
    link = OutboxLink(
        settings.outbox,
        channel=settings.channel,
        regions=regions,
        policy=settings.policy,
        codec=codec,
        counts=counts,
        stats=stats,
        telemetry=telemetry,
        wake=drainer.wake,
        clock=settings.clock,
    )
    return drainer, link


def _drainer(
    settings: SenderSettings,
    deliver: Callable[[str | None, Any], Awaitable[None]],
    stats: SenderStats,
    meter_provider: MeterProvider | None,
    codec: MessageCodec,
) -> OutboxDrainer:
    assert settings.outbox is not None
    return OutboxDrainer(
        outbox=settings.outbox,
        channel=settings.channel,
        codec=codec,
        policy=settings.drain_policy,
        clock=settings.clock,
        deliver=deliver,
        unavailable_kinds=settings.policy.fail_over_on,
        # A passive delivery may try both regions, each within the attempt deadline.
        send_budget=2 * settings.policy.attempt_seconds + 1.0,
        telemetry=DrainTelemetry(entity=settings.entity, meter_provider=meter_provider),
        stats=stats,
        ledger=settings.ledger,
        entity=settings.entity,
        mode=settings.mode.value,
    )


def _records(
    settings: SenderSettings, primary: RegionSender, secondary: RegionSender
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
        clock=settings.clock,
    )
