"""GeoSender: active and passive replication over two regions' senders (SPEC §2.1-2.3).

The GeoSender is the public face; its collaborators, built in :mod:`georep.send.wiring`
and each given its state through its constructor, do the work: the region channels
(:mod:`georep._channel`), one send from end to end (:mod:`georep.send.pipeline`), the active
and passive paths (:mod:`georep.send.passive`), scheduling (:mod:`georep.send.schedule`), the
outbox link and drain loop (:mod:`georep.outbox.enqueue`, :mod:`georep.outbox.drainer`) and the
ledger rows (:mod:`georep.send.records`). What they share is one
:class:`georep.send.result.SendContext`.
"""

from __future__ import annotations

__all__ = ["GeoSender", "SendResult", "SenderStats"]

import logging
import warnings
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from georep._channel import batch_size, learn_max_sizes, open_failure
from georep._clock import SystemClock
from georep._endpoint import FromNamespaces, Target, one_entity, with_client_options_pair
from georep._lifecycle import AsyncResource, InFlight, close_all, close_in_order
from georep._policy import (
    DedupKey,
    DrainPolicy,
    FailoverPolicy,
    ReplicationMode,
    flag,
    positive_seconds,
)
from georep._region_wrap import check_pair, open_pair, wrap_pair
from georep._telemetry import SenderTelemetry
from georep.exceptions import ClosedError, ConfigurationError, RegionError, region_error
from georep.ports import Clock, Ledger, Outbox, RegionSender, RoleStore, ScheduleStore
from georep.roles.join import role_join
from georep.roles.state import RoleState, role_state_for
from georep.send.records import flush_ledger
from georep.send.result import SenderStats, SendResult
from georep.send.wiring import SenderParts, wire

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

_log = logging.getLogger("georep.sender")


def _observed_outbox_depth(sender: GeoSender) -> int | None:
    """The outbox depth the gauge reports for ``sender``: none once it is closed."""
    return None if sender.closed else sender.stats.outbox_depth


def _check_options(
    regions: Sequence[RegionSender],
    policy: FailoverPolicy,
    mode: ReplicationMode,
    partitioned: bool,
    repair: bool,
    outbox: Any,
) -> None:
    needs = "geo-replication needs a namespace in each region"
    check_pair(*regions, what="senders", where="namespace", needs=needs)
    if partitioned and policy.attempt_seconds < 15:
        message = (
            f"attempt_timeout={policy.attempt_seconds:g} s with a partitioned entity: "
            "Service Bus recommends an operation timeout above 15 s (default 60 s) so a "
            "partition failing over inside its region is not mistaken for a regional outage"
        )
        warnings.warn(message, UserWarning, stacklevel=3)
        _log.warning(message)
    if repair and (outbox is None or mode is not ReplicationMode.ACTIVE):
        raise ConfigurationError(
            "repair=True re-sends a failed region's copy through the outbox: it needs "
            "mode=ReplicationMode.ACTIVE and an outbox (e.g. SqliteOutbox(path))"
        )


class GeoSender(FromNamespaces, AsyncResource):
    """Send to a queue or topic that exists in two regions, surviving the loss of one.

    Wraps two existing ``azure.servicebus.aio.ServiceBusSender`` objects (one per region;
    the caller keeps owning them) and has the same methods, so an application swaps its
    sender for a GeoSender and changes nothing else. See :meth:`from_connection_strings`
    for a GeoSender that creates and owns its clients.

    Args:
        primary: The primary region's sender (an SDK sender or any
            :class:`georep.ports.RegionSender`).
        secondary: The secondary region's sender, for the same entity.
        mode: :attr:`ReplicationMode.PASSIVE` (default) or :attr:`ReplicationMode.ACTIVE`.
        policy: When to fail over, and georep's own per-attempt deadline.
        outbox: A durable :class:`georep.ports.Outbox` (e.g. :class:`georep.SqliteOutbox`).
            With one, a message no region could be reached for is persisted and sent later
            (``SendResult(queued=True)``) instead of raising; a message a region refused
            for what it is is still raised, never queued. The caller owns it.
        repair: Active mode: when one region fails, queue its copy in the outbox so both
            regions end up with the message. Needs ``outbox``.
        partitioned: The entity is partitioned (in both regions). Lists and batches must
            then carry one partition key (checked before sending), and an attempt deadline
            under 15 s draws a warning: a partition can take that long to fail over inside
            its region (SPEC §4).
        dedup_key: The field receivers deduplicate on; every message must carry it.
            MessageIds are assigned (UUID4) to messages without one whatever the key.
        drain: How the outbox is drained.
        ledger: Record one row per message sent (e.g. :class:`georep.ParquetLedger`).
            The caller owns it: :meth:`aclose` flushes it but does not close it.
        role_state: Share roles explicitly; by default every GeoSender on the same
            namespace pair in this event loop shares one.
        role_store: Share the entity's roles with every process of the application
            (e.g. ``georep.adapters.redis.RedisRoleStore``): a failover seen by one
            process moves them all (when ``policy.corroboration`` holds: a process that
            never reached the failing region moves only itself), and ``georep
            failover``/``pin`` steer them. Sends
            read a local copy, refreshed in the background every
            ``store.refresh_interval``; ``async with`` reads it once before the first
            send. The caller owns the store.
        verify_on_open: A strict start: ``async with`` (and :meth:`warm_up`) raises
            when a region *answers* that the entity cannot be used there (not found,
            disabled, credentials refused), instead of logging it and starting: a passive
            sender whose entity exists in one region only would otherwise learn it during
            the outage, as ``EntityNotFoundError``. A region that does not answer at all
            is logged, not raised: it may be down, which is what georep is for. Default
            False.
        schedules: Where active mode keeps the other region's number of each message
            :meth:`schedule_messages` scheduled (a :class:`georep.ports.ScheduleStore`,
            e.g. the ``RedisSeenSet`` the receivers share), so that
            :meth:`cancel_scheduled_messages` cancels both copies from any process and
            after a restart. Without one, only this sender can (its memory). The caller
            owns it.
        clock: Time source (tests inject :class:`georep.testing.FakeClock`).
        tracer_provider: OpenTelemetry tracer provider (default: the global one).
        meter_provider: OpenTelemetry meter provider (default: the global one).

    Raises:
        ConfigurationError: Both senders point at the same namespace, or ``repair`` is
            set without an outbox or outside active mode, or both ``role_state`` and
            ``role_store`` are given.
    """

    def __init__(
        self,
        primary: Any,
        secondary: Any,
        *,
        mode: ReplicationMode | str = ReplicationMode.PASSIVE,
        policy: FailoverPolicy | None = None,
        outbox: Outbox | None = None,
        repair: bool = False,
        dedup_key: DedupKey = DedupKey.MESSAGE_ID,
        drain: DrainPolicy | None = None,
        ledger: Ledger | None = None,
        role_state: RoleState | None = None,
        role_store: RoleStore | None = None,
        partitioned: bool = False,
        verify_on_open: bool = False,
        schedules: ScheduleStore | None = None,
        clock: Clock | None = None,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        self.mode = ReplicationMode(mode)
        self.schedules = schedules
        self.verify_on_open = flag(verify_on_open, "verify_on_open")
        self.partitioned = partitioned
        self.policy = policy or FailoverPolicy()
        self.drain_policy = drain or DrainPolicy()
        self.dedup_key = dedup_key
        self.outbox = outbox
        self.repair = repair
        self.ledger = ledger
        self._clock: Clock = clock or SystemClock()
        # Adapters georep made around the caller's SDK senders are georep's to close: that
        # stops their worker threads (sync senders) and never closes the caller's sender.
        regions, self._owned = wrap_pair(primary, secondary, "sender")
        self._primary: RegionSender = regions[0]
        self._secondary: RegionSender = regions[1]
        _check_options(regions, self.policy, self.mode, partitioned, repair, outbox)
        self._codec = self._primary.codec
        self._flights = InFlight(
            lambda: self._closed, f"the GeoSender for {self._primary.entity!r}"
        )
        if role_state is not None and role_store is not None:
            raise ConfigurationError("give role_state= or role_store=, not both")
        reports = self.policy.corroboration.reports
        if role_store is not None and reports > 1 and not hasattr(role_store, "report_failure"):
            raise ConfigurationError(
                f"Corroboration(reports={reports}) keeps failure reports in the role store, "
                f"and {type(role_store).__name__} has no report_failure(): use RedisRoleStore "
                "or InMemoryRoleStore, or Corroboration(reports=1)"
            )
        self._role_state = role_state
        self.entity = self._primary.entity
        names = {region.region: region.namespace for region in regions}
        self._role_join = role_join(
            role_store,
            self.entity,
            names,
            clock=self._clock,
            meter_provider=meter_provider,
            mode=self.mode.value,
        )
        # The outbox channel names the pair in a fixed order, so a sender created with the
        # regions the other way round still drains what an earlier one left.
        self.channel = "|".join(
            [*sorted((self._primary.namespace, self._secondary.namespace)), self.entity]
        )
        self.stats = SenderStats()
        self._parts = self._build(tracer_provider, meter_provider)
        self._drainer = self._parts.drainer
        if role_state is not None:
            self._parts.passive.watch(role_state)

    def _build(
        self, tracer_provider: TracerProvider | None, meter_provider: MeterProvider | None
    ) -> SenderParts:
        self._telemetry = SenderTelemetry(
            entity=self.entity,
            mode=self.mode.value,
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            owner=self,
            outbox_depth=_observed_outbox_depth,
        )
        return wire(
            self,
            self._primary,
            self._secondary,
            clock=self._clock,
            stats=self.stats,
            telemetry=self._telemetry,
            roles=lambda: self.roles,
            meter_provider=meter_provider,
        )

    # ----------------------------------------------------------------- construction

    @classmethod
    def from_connection_strings(
        cls,
        primary: Target,
        secondary: Target,
        *,
        queue_name: str | None = None,
        topic_name: str | None = None,
        retry_total: int = 1,
        client_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> GeoSender:
        """A GeoSender that creates, and closes, its own clients and senders.

        Args:
            primary: The primary namespace's connection string.
            secondary: The secondary namespace's connection string.
            queue_name: The queue to send to (exactly one of ``queue_name``/``topic_name``).
            topic_name: The topic to send to.
            retry_total: The SDK's own retries per attempt (default 1: one reconnect for
                a stale connection). Each retry delays failover, so keep it small.
            client_options: ``ServiceBusClient`` settings for both regions (e.g.
                ``transport_type``, ``http_proxy``, ``connection_verify``, retry settings),
                over georep's defaults.
            **kwargs: Passed on to :class:`GeoSender` (mode, policy, outbox, ...).

        Raises:
            ConfigurationError: A connection string is malformed or the entity is not
                named exactly once. The message never contains the key.
        """
        from georep._sdk import open_region_sender

        one_entity(queue_name, topic_name)
        primary, secondary = with_client_options_pair(primary, secondary, client_options)
        regions = open_pair(
            open_region_sender,
            primary,
            secondary,
            queue_name=queue_name,
            topic_name=topic_name,
            retry_total=retry_total,
        )
        sender = cls(*regions, **kwargs)
        sender._owned.extend(regions)
        return sender

    # ------------------------------------------------------------------- lifecycle

    async def _open(self) -> None:
        roles = self.roles  # joins the shared roles, if any
        if roles.shared is None and self._role_join is not None:
            await self._role_join.refresh()
        try:
            await self.warm_up()
        except RegionError:  # verify_on_open: nothing this sender opened stays open
            await self.aclose()
            raise
        if self._drainer is not None:
            self._drainer.start()

    async def warm_up(self) -> None:
        """Open both regions' links now (bounded by the attempt deadline).

        A failover then costs one send to an already connected backup instead of a new
        connection (0.3-1 s). A region that is down now is skipped; it connects on first
        use. What went wrong with a region is logged as what it is: no answer, not
        reachable, entity not found or disabled, credentials refused.

        Raises:
            EntityNotFoundError, AuthenticationError, RegionError: With
                ``verify_on_open=True``, a region answered that the entity cannot be used
                there (the message names the region, its namespace and the entity).
        """
        errors = await learn_max_sizes(list(self._parts.regions), self.policy.attempt_seconds)
        if not self.verify_on_open:
            return
        refused = [
            (region, error)
            for region in self._parts.regions
            if (error := errors.get(region.region)) is not None
            and error.kind not in self.policy.fail_over_on
        ]
        if refused:
            (region, error), *others = refused
            also = "".join(f"; and {open_failure(r, e)}" for r, e in others)
            raise region_error(
                f"GeoSender(verify_on_open=True) for {self.entity!r}: "
                f"{open_failure(region, error)}{also}",
                region=region.region,
                kind=error.kind,
            ) from error

    async def aclose(self) -> None:
        """Stop the outbox drainer and close what this GeoSender created. Idempotent.

        The drainer stops gracefully: the send in flight finishes (at most two attempt
        deadlines plus 1 s), accepted entries are deleted and the rest handed back. The SDK
        senders this GeoSender created are then closed concurrently, each within the
        attempt deadline, and the ledger is flushed; every step runs even if one before it
        failed. Senders passed in by the caller, the outbox and the ledger stay open: the
        caller owns them. Messages still in the outbox stay there for the next GeoSender on
        the same file.
        """
        await super().aclose()

    async def _close(self) -> None:
        # Each step runs whatever the one before it did: nothing this sender owns is left
        # open because something else failed to close.
        timeout = self.policy.attempt_seconds
        drainer, role_join, clock = self._drainer, self._role_join, self._clock
        await close_in_order(
            [
                # The application's sends under way finish first (each is bounded by its
                # attempt deadlines): closing the connections under them would fail them.
                (
                    "letting the calls in flight finish",
                    partial(self._flights.landed, timeout=timeout, clock=clock),
                ),
                # Graceful: the entry in flight finishes (a send is bounded by the attempt
                # deadlines), accepted entries are deleted, the rest are handed back.
                (
                    "stopping the outbox drainer",
                    partial(drainer.stop, timeout=2 * timeout + 1.0) if drainer else None,
                ),
                ("stopping the switch-back probe", self._parts.passive.stop),
                ("releasing the shared roles", role_join.release if role_join else None),
                (
                    "closing the region senders",
                    partial(
                        close_all, self._owned, timeout=timeout, clock=clock, what="region sender"
                    ),
                ),
                (
                    "flushing the ledger",
                    partial(flush_ledger, self.ledger, timeout=timeout, clock=clock),
                ),
            ]
        )

    def _check_open(self) -> None:
        self._check_process()
        if self.closed:
            raise ClosedError(f"GeoSender for {self.entity!r} is closed; create a new one")

    @property
    def roles(self) -> RoleState:
        """The role state this sender shares with every sender on its namespace pair
        (and, with a ``role_store``, with every process of the application)."""
        if self._role_state is None:
            primary = self._primary.namespace
            if self._role_join is None:
                state = role_state_for(primary, self._secondary.namespace)
            else:  # a closed sender starts no background refresh
                state = self._role_join.state(primary, hold=not self.closed)
            self._role_state = state
            self._parts.passive.watch(state)
        return self._role_state

    @property
    def active_region(self) -> str:
        """The label of the region passive sends go to now."""
        return self._parts.regions.by_namespace[self.roles.current.active].region

    # ----------------------------------------------------------------------- sends

    async def send_messages(self, message: Any, *, timeout: float | None = None) -> SendResult:
        """Send a message, a list of messages (as one batch) or a batch.

        Messages without a MessageId get a UUID4 one (set on the caller's object, so the
        caller can see it). In active mode both regions get a copy with the same MessageId.

        Args:
            message: ``ServiceBusMessage``, a list of them, or a batch from
                :meth:`create_message_batch`.
            timeout: Deadline per region attempt in seconds (default:
                ``policy.attempt_timeout``).

        Returns:
            Which regions accepted, whether it failed over or was queued.

        Raises:
            AllRegionsUnavailableError: No region accepted and there is no outbox.
            MessageTooLargeError, AuthenticationError, EntityNotFoundError, RegionError:
                A failure that does not mean the region is down; never failed over.
            OutboxFullError: No region accepted and the outbox is full.
            ClosedError: The sender was closed.
        """
        self._check_open()
        drainer = self._drainer
        if drainer is not None and not drainer.running:
            drainer.start()
        attempt_timeout = (
            self.policy.attempt_seconds if timeout is None else positive_seconds(timeout, "timeout")
        )
        return await self._flights.track(self._parts.flow.send(message, attempt_timeout))

    # ------------------------------------------------------------------ scheduling

    async def schedule_messages(
        self, messages: Any, schedule_time_utc: datetime, *, timeout: float | None = None
    ) -> list[int]:
        """Schedule messages for later delivery, as ``ServiceBusSender.schedule_messages``.

        Passive: in the active region, failing over like a send. Active: in both regions.

        Returns:
            One sequence number per message, as the SDK returns: the primary's numbers
            when it scheduled them, else the secondary's with
            :data:`georep.send.schedule.SECONDARY_FLAG` (2**62) added (passive mode after
            a failover), so a number names its region by itself. Pass them (or one of
            them) to :meth:`cancel_scheduled_messages`, from any sender on the pair, which
            cancels every region's copy (in active mode the secondary's numbers are
            looked up in ``schedules``, or this sender's memory). Each region's own
            numbers: :meth:`schedule_messages_by_region`.

        Raises:
            AllRegionsUnavailableError: No region scheduled them (schedules never go to
                the outbox: a late schedule would fire at the wrong time).
        """
        self._check_open()
        return await self._flights.track(
            self._parts.scheduler.schedule(messages, schedule_time_utc, timeout)
        )

    async def schedule_messages_by_region(
        self, messages: Any, schedule_time_utc: datetime, *, timeout: float | None = None
    ) -> dict[str, list[int]]:
        """Schedule messages; return each region's sequence numbers.

        Like :meth:`schedule_messages`, but the result maps each region label that
        scheduled them to that region's numbers; cancel with
        :meth:`cancel_scheduled_messages_by_region` (from any sender on the pair, after a
        restart too: persist the mapping).

        Raises:
            AllRegionsUnavailableError: No region scheduled them.
        """
        self._check_open()
        return await self._flights.track(
            self._parts.scheduler.schedule_by_region(messages, schedule_time_utc, timeout)
        )

    async def cancel_scheduled_messages(
        self,
        sequence_numbers: int | Sequence[int] | Mapping[str, Sequence[int]],
        *,
        timeout: float | None = None,
    ) -> None:
        """Cancel scheduled messages, as ``ServiceBusSender.cancel_scheduled_messages``.

        Args:
            sequence_numbers: A number or a list of numbers :meth:`schedule_messages`
                returned; every region's copy is cancelled. (A region -> numbers mapping
                is still accepted, deprecated: use
                :meth:`cancel_scheduled_messages_by_region`.)
            timeout: Deadline per region attempt in seconds.

        Raises:
            InvalidMessageError: Not an int (nothing is cancelled then).
            StoreUnavailableError: ``schedules`` did not answer for a number this sender
                did not schedule itself (nothing is cancelled then: try again).
            RegionError: A region could not cancel (the others were still cancelled); the
                scheduled message in that region will still be delivered. A number no
                region knows gets the region's answer, as the SDK's does.
        """
        self._check_open()
        if isinstance(sequence_numbers, Mapping):
            warnings.warn(
                "cancel_scheduled_messages with a region mapping is deprecated: pass the "
                "list schedule_messages returns, or use cancel_scheduled_messages_by_region",
                DeprecationWarning,
                stacklevel=2,
            )
            await self.cancel_scheduled_messages_by_region(sequence_numbers, timeout=timeout)
            return
        numbers = [sequence_numbers] if isinstance(sequence_numbers, int) else sequence_numbers
        await self._flights.track(self._parts.scheduler.cancel(numbers, timeout))

    async def cancel_scheduled_messages_by_region(
        self, sequence_numbers: Mapping[str, Sequence[int]], *, timeout: float | None = None
    ) -> None:
        """Cancel by each region's own numbers (:meth:`schedule_messages_by_region`).

        Args:
            sequence_numbers: Region label → that region's sequence numbers.
            timeout: Deadline per region attempt in seconds.

        Raises:
            InvalidMessageError: An unknown region label.
            RegionError: A region could not cancel (the others were still cancelled).
        """
        self._check_open()
        await self._flights.track(self._parts.scheduler.cancel_by_region(sequence_numbers, timeout))

    # ---------------------------------------------------------------------- batches

    async def create_message_batch(self, max_size_in_bytes: int | None = None) -> Any:
        """An empty batch that fits both regions' size limits.

        Messages added to it get their MessageId (and traceparent) as they are added.

        Raises:
            AllRegionsUnavailableError: Neither region could tell its size limit and
                ``max_size_in_bytes`` was not given.
        """
        self._check_open()
        timeout = self.policy.attempt_seconds
        size = await batch_size(self._parts.regions, timeout, max_size_in_bytes)
        return self._codec.new_batch(size, self._parts.prep.prepare)

    # ----------------------------------------------------------------------- outbox

    async def drain_outbox(self) -> int:
        """Try once to send everything due in the outbox; return how many were delivered.

        Entries refused for good move to the outbox's dead-letter table; entries whose
        time-to-live ran out are dropped as expired (see ``SenderStats``).
        """
        self._check_open()
        if self._drainer is None:
            return 0
        return await self._drainer.drain_once()
