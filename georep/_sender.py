"""GeoSender: active and passive replication over two regions' senders (SPEC §2.1-2.3)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
import warnings
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode

from georep._clock import SystemClock
from georep._drain import DrainTelemetry, OutboxDrainer
from georep._policy import (
    DedupKey,
    DrainPolicy,
    FailoverPolicy,
    ReplicationMode,
    as_seconds,
    positive_seconds,
)
from georep._roles import RoleSnapshot, RoleState, role_state_for
from georep._schedule import ScheduleBook
from georep._telemetry import SenderTelemetry, traceparent_of
from georep.exceptions import (
    AllRegionsUnavailableError,
    ClosedError,
    ConfigurationError,
    InvalidMessageError,
    RegionError,
    RegionUnavailableError,
)
from georep.ports import (
    Clock,
    ErrorKind,
    Ledger,
    MessageCodec,
    Outbox,
    RegionAttempt,
    RegionSender,
    SendRecord,
)

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

__all__ = ["GeoSender", "SendResult", "SenderStats"]

_log = logging.getLogger("georep.sender")

_TRACEPARENT = "traceparent"
_PRODUCER = SpanKind.PRODUCER
_T = TypeVar("_T")


_NO_FAILURES: Mapping[str, BaseException] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class SendResult:
    """What happened to one ``send_messages`` call.

    Attributes:
        accepted: Regions that accepted the message(s), in the order they answered.
        failed: Each region that failed, with its error.
        failed_over: True when the active region failed and the backup accepted (passive).
        queued: True when no region accepted and the message(s) went to the durable outbox;
            the outbox sends them later, so the call still counts as delivered.
        repair_queued: Regions whose copy went to the outbox for a later resend (active
            mode with ``repair=True``).
        message_ids: The MessageId of every message sent, in order.
        skipped: Active mode: regions not tried because they failed moments ago (cool-down);
            their last error is in ``failed``.
    """

    accepted: tuple[str, ...]
    failed: Mapping[str, BaseException] = field(default_factory=lambda: _NO_FAILURES)
    failed_over: bool = False
    queued: bool = False
    repair_queued: tuple[str, ...] = ()
    message_ids: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()


@dataclass(slots=True)
class SenderStats:
    """Counters of one GeoSender since it was created."""

    accepted: dict[str, int] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)
    failovers: int = 0
    role_swaps: int = 0
    queued: int = 0
    drained: int = 0
    dead_lettered: int = 0
    expired: int = 0
    outbox_depth: int | None = None


def _as_region_sender(sender: Any, region: str) -> RegionSender:
    if isinstance(sender, RegionSender):
        return sender
    try:
        from georep._sdk import region_sender_for
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigurationError(
            f"{region} sender is a {type(sender).__name__}; wrapping an SDK sender needs "
            "pip install 'georep[servicebus]'"
        ) from exc
    # Async SDK senders run on the loop, sync ones on a worker thread per SDK sender.
    wrapped: RegionSender = region_sender_for(sender, region=region)
    return wrapped


def _error(error: BaseException) -> str:
    """How the ledger names an error: its class, never its message (it may hold a secret)."""
    return type(error).__name__


def _observed_outbox_depth(sender: GeoSender) -> int | None:
    """The outbox depth the gauge reports for ``sender``: none once it is closed."""
    return None if sender._closed else sender.stats.outbox_depth


class GeoSender:
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
        clock: Time source (tests inject :class:`georep.testing.FakeClock`).
        tracer_provider: OpenTelemetry tracer provider (default: the global one).
        meter_provider: OpenTelemetry meter provider (default: the global one).

    Raises:
        ConfigurationError: Both senders point at the same namespace, or ``repair`` is
            set without an outbox or outside active mode.
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
        partitioned: bool = False,
        clock: Clock | None = None,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        self.mode = ReplicationMode(mode)
        self.partitioned = partitioned
        self.policy = policy or FailoverPolicy()
        self.drain_policy = drain or DrainPolicy()
        self.dedup_key = dedup_key
        self.outbox = outbox
        self.repair = repair
        self.ledger = ledger
        self._clock: Clock = clock or SystemClock()
        self._primary = _as_region_sender(primary, "primary")
        self._secondary = _as_region_sender(secondary, "secondary")
        if self._primary.region == self._secondary.region:
            raise ConfigurationError(
                f"both senders are labelled {self._primary.region!r}: give each region its "
                "own label"
            )
        if self._primary.namespace == self._secondary.namespace:
            raise ConfigurationError(
                f"primary and secondary are the same namespace ({self._primary.namespace}): "
                "geo-replication needs a namespace in each region"
            )
        if partitioned and self.policy.attempt_seconds < 15:
            message = (
                f"attempt_timeout={self.policy.attempt_seconds:g} s with a partitioned entity: "
                "Service Bus recommends an operation timeout above 15 s (default 60 s) so a "
                "partition failing over inside its region is not mistaken for a regional outage"
            )
            warnings.warn(message, UserWarning, stacklevel=2)
            _log.warning(message)
        if repair and (outbox is None or self.mode is not ReplicationMode.ACTIVE):
            raise ConfigurationError(
                "repair=True re-sends a failed region's copy through the outbox: it needs "
                "mode=ReplicationMode.ACTIVE and an outbox (e.g. SqliteOutbox(path))"
            )
        self._codec: MessageCodec = self._primary.codec
        self._regions = {
            self._primary.region: self._primary,
            self._secondary.region: self._secondary,
        }
        self._by_namespace = {
            self._primary.namespace: self._primary,
            self._secondary.namespace: self._secondary,
        }
        self._role_state = role_state
        self.entity = self._primary.entity
        # The outbox channel names the pair in a fixed order, so a sender created with the
        # regions the other way round still drains what an earlier one left.
        self.channel = "|".join(
            [*sorted((self._primary.namespace, self._secondary.namespace)), self.entity]
        )
        self.stats = SenderStats()
        self._mode_name = self.mode.value
        first, second = self._primary.region, self._secondary.region
        first_ok, second_ok = RegionAttempt(first, "accepted"), RegionAttempt(second, "accepted")
        self._all_accepted: dict[tuple[str, ...], tuple[RegionAttempt, ...]] = {
            (first,): (first_ok,),
            (second,): (second_ok,),
            (first, second): (first_ok, second_ok),
        }
        self._telemetry = SenderTelemetry(
            entity=self.entity,
            mode=self.mode.value,
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            owner=self,
            outbox_depth=_observed_outbox_depth,
        )
        self._max_sizes: dict[str, int] = {}
        self._schedules = ScheduleBook()
        self._cooling_down: dict[str, tuple[float, RegionError]] = {}
        self._region_failures: dict[str, int] = {}
        self._last_region_error: dict[str, RegionError] = {}
        # Adapters georep made around the caller's SDK senders are georep's to close: that
        # stops their worker threads (sync senders) and never closes the caller's sender.
        self._owned: list[Any] = [
            adapter
            for adapter, given in ((self._primary, primary), (self._secondary, secondary))
            if adapter is not given
        ]
        self._closed = False
        self._close_task: asyncio.Task[None] | None = None
        self._probe: asyncio.Task[None] | None = None
        self._drainer = self._new_drainer(meter_provider)

    # ----------------------------------------------------------------- construction

    @classmethod
    def from_connection_strings(
        cls,
        primary: str,
        secondary: str,
        *,
        queue_name: str | None = None,
        topic_name: str | None = None,
        retry_total: int = 1,
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
            **kwargs: Passed on to :class:`GeoSender` (mode, policy, outbox, ...).

        Raises:
            ConfigurationError: A connection string is malformed or the entity is not
                named exactly once. The message never contains the key.
        """
        from georep._sdk import open_region_sender

        if (queue_name is None) == (topic_name is None):
            raise ConfigurationError("name exactly one of queue_name= or topic_name=")
        regions = [
            open_region_sender(
                connection_string,
                region=region,
                queue_name=queue_name,
                topic_name=topic_name,
                retry_total=retry_total,
            )
            for region, connection_string in (("primary", primary), ("secondary", secondary))
        ]
        sender = cls(regions[0], regions[1], **kwargs)
        sender._owned.extend(regions)
        return sender

    # ------------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> Self:
        self._check_open()
        await self.warm_up()
        self._start_background()
        return self

    async def warm_up(self) -> None:
        """Open both regions' links now (bounded by the attempt deadline).

        A failover then costs one send to an already connected backup instead of a new
        connection (0.3-1 s). A region that is down now is skipped; it connects on first use.
        """
        await self._learn_max_sizes([self._primary, self._secondary])

    async def _learn_max_sizes(self, regions: Sequence[RegionSender]) -> dict[str, BaseException]:
        errors: dict[str, BaseException] = {}
        timeout = self.policy.attempt_seconds

        async def size_of(region: RegionSender) -> None:
            try:
                self._max_sizes[region.region] = await self._bounded(
                    region, timeout, region.max_message_size
                )
            except RegionError as exc:
                errors[region.region] = exc
                _log.warning("%s did not answer while connecting: %s", region.region, exc)

        await asyncio.gather(*(size_of(region) for region in regions))
        return errors

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

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
        if self._close_task is None:
            self._closed = True
            self._close_task = asyncio.ensure_future(self._close())
        # Shielded: a caller cancelled mid-close must not leave owned connections open.
        await asyncio.shield(self._close_task)

    async def close(self) -> None:
        """Same as :meth:`aclose` (the SDK's name)."""
        await self.aclose()

    async def _close(self) -> None:
        # Each step runs whatever the one before it did: nothing this sender owns is left
        # open because something else failed to close.
        timeout = self.policy.attempt_seconds
        try:
            if self._drainer is not None:
                # Graceful: the entry in flight finishes (a send is bounded by the attempt
                # deadlines), accepted entries are deleted, the rest are handed back.
                await self._drainer.stop(timeout=2 * timeout + 1.0)
        except Exception:
            _log.exception("stopping the outbox drainer failed")
        finally:
            await self._stop_probe()
            await self._close_owned(timeout)
            await self._flush_ledger(timeout)

    async def _stop_probe(self) -> None:
        probe = self._probe
        if probe is not None:
            probe.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await probe

    async def _close_owned(self, timeout: float) -> None:
        """Close the regions this sender created, concurrently, within ``timeout`` seconds."""

        async def close(region: Any) -> None:
            try:
                with self._clock.deadline(timeout):
                    await region.close()
            except Exception as exc:
                _log.warning("closing %s failed: %s", region.region, type(exc).__name__)

        await asyncio.gather(*(close(region) for region in self._owned))

    async def _flush_ledger(self, timeout: float) -> None:
        if self.ledger is None:
            return
        try:
            with self._clock.deadline(timeout):
                await self.ledger.flush()
        except Exception as exc:
            _log.warning("flushing the ledger failed: %s", type(exc).__name__)

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"GeoSender for {self.entity!r} is closed; create a new one")

    def _start_background(self) -> None:
        if self._drainer is not None:
            self._drainer.start()

    @property
    def roles(self) -> RoleState:
        """The role state this sender shares with every sender on its namespace pair."""
        if self._role_state is None:
            self._role_state = role_state_for(self._primary.namespace, self._secondary.namespace)
        return self._role_state

    @property
    def active_region(self) -> str:
        """The label of the region passive sends go to now."""
        return self._by_namespace[self.roles.current.active].region

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
        codec = self._codec
        messages = codec.split(message)
        if not messages:
            return SendResult(accepted=())
        # Validated before any network call (issue 20): what no region would take is
        # raised here, never failed over or queued.
        codec.check(messages, one_partition=self.partitioned, max_size=self._size_limit())
        started = self._clock.monotonic()
        ledger = self.ledger
        wall_started = self._clock.time() if ledger is not None else 0.0
        telemetry = self._telemetry
        # start_span, not start_as_current_span: no context switch on the hot path. The span
        # still parents to the caller's current span and its context travels in traceparent.
        span = (
            telemetry.tracer.start_span(
                telemetry.span_name, kind=_PRODUCER, attributes=telemetry.span_attributes
            )
            if telemetry.tracing()
            else INVALID_SPAN
        )
        try:
            # A single message goes to the SDK as itself: wrapped in a list it would be
            # re-encoded into a one-message batch.
            traceparent = traceparent_of(span) if span is not INVALID_SPAN else None
            if len(messages) == 1 and messages[0] is message:
                payload = message
                ids: tuple[str, ...] = (self._prepare(message, traceparent),)
            else:
                payload = messages
                if codec.is_batch(message) and getattr(message, "georep_prepared", False):
                    payload = message
                # A batch the SDK built before we could give its messages ids is resent as
                # a list of its (now prepared) messages, so both regions see the same ids.
                ids = self._prepare_all(messages, traceparent)
            if self.mode is ReplicationMode.ACTIVE:
                result = await self._send_active(payload, messages, attempt_timeout, span)
            else:
                result = await self._send_passive(payload, messages, attempt_timeout, span)
        except BaseException as exc:
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            span.set_attribute("error.type", type(exc).__name__)
            telemetry.duration(self._clock.monotonic() - started, "failed")
            span.end()
            if ledger is not None:
                self._record_failed(ledger, messages, exc, wall_started)
            raise
        telemetry.duration(
            self._clock.monotonic() - started, "queued" if result.queued else "accepted"
        )
        span.end()
        # The result was made for this call alone: fill in the ids rather than copy it.
        object.__setattr__(result, "message_ids", ids)
        if ledger is not None:
            self._record_sent(ledger, result, wall_started)
        return result

    # ---------------------------------------------------------------------- ledger

    def _record_sent(self, ledger: Ledger, result: SendResult, started_at: float) -> None:
        accepted = result.accepted
        if not result.failed:
            # Every region tried accepted (the common case): a prebuilt tuple, no allocation.
            attempts: Sequence[RegionAttempt] = self._all_accepted[accepted]
            failover = False
        else:
            attempts, failover = self._attempts(result)
        # Positional: this runs on every send.
        ledger.record_send(
            SendRecord(
                result.message_ids,
                self.entity,
                self._mode_name,
                "queued" if result.queued else "accepted",
                accepted[0] if accepted else None,
                failover,
                attempts,
                started_at,
                self._clock.time(),
            )
        )

    def _attempts(self, result: SendResult) -> tuple[list[RegionAttempt], bool]:
        """What each region did in a send that met a failure, and whether it failed over."""
        attempts: list[RegionAttempt] = []
        if self.mode is ReplicationMode.ACTIVE:
            # Both regions are tried at once: list them in a fixed order.
            for label in self._regions:
                if label in result.accepted:
                    attempts.append(RegionAttempt(label, "accepted"))
                elif label in result.failed:
                    outcome = "skipped" if label in result.skipped else "failed"
                    attempts.append(RegionAttempt(label, outcome, _error(result.failed[label])))
            queued = result.repair_queued
            if result.queued:
                transient = self.policy.fail_over_on
                queued = tuple(
                    label
                    for label, error in result.failed.items()
                    if getattr(error, "kind", None) in transient
                )
            attempts.extend(RegionAttempt(label, "queued") for label in queued)
            return attempts, bool(result.accepted)
        attempts.extend(
            RegionAttempt(label, "failed", _error(error)) for label, error in result.failed.items()
        )
        attempts.extend(RegionAttempt(label, "accepted") for label in result.accepted)
        if result.queued:  # the outbox sends it to whichever region accepts
            attempts.append(RegionAttempt(None, "queued"))
        return attempts, result.failed_over

    def _record_failed(
        self, ledger: Ledger, messages: Sequence[Any], error: BaseException, started_at: float
    ) -> None:
        if isinstance(error, AllRegionsUnavailableError):
            causes = error.causes
            # Passive causes are in the order tried; active ones in the fixed region order.
            order = self._regions if self.mode is ReplicationMode.ACTIVE else causes
            attempts = [
                RegionAttempt(label, "failed", _error(causes[label]))
                for label in order
                if label in causes
            ]
        elif isinstance(error, RegionError):
            attempts = [RegionAttempt(error.region, "failed", _error(error))]
        else:
            attempts = []
        message_id = self._codec.message_id
        ledger.record_send(
            SendRecord(
                message_ids=tuple(message_id(message) or "" for message in messages),
                entity=self.entity,
                mode=self.mode.value,
                outcome="failed",
                accepted_region=None,
                failover=False,
                regions=attempts,
                started_at=started_at,
                finished_at=self._clock.time(),
            )
        )

    def _prepare_all(self, messages: Sequence[Any], traceparent: str | None) -> tuple[str, ...]:
        return tuple(self._prepare(message, traceparent) for message in messages)

    def _prepare(self, message: Any, traceparent: str | None = None) -> str:
        """Give ``message`` a MessageId and a traceparent; check its dedup key."""
        codec = self._codec
        message_id = codec.message_id(message)
        if not message_id:
            message_id = str(uuid.uuid4())
            codec.set_message_id(message, message_id)
        if self.dedup_key.source == "subject":
            if not codec.subject(message):
                raise InvalidMessageError(
                    "dedup_key is the subject but a message has none: set message.subject "
                    "(receivers would not recognise its copies)"
                )
        elif self.dedup_key.source == "application_property":
            name = self.dedup_key.name or ""
            if codec.application_property(message, name) is None:
                raise InvalidMessageError(
                    f"dedup_key is application property {name!r} but a message lacks it: "
                    "set it on every message"
                )
        if traceparent is not None and codec.application_property(message, _TRACEPARENT) is None:
            codec.set_application_property(message, _TRACEPARENT, traceparent)
        return message_id

    async def _bounded(
        self,
        region: RegionSender,
        attempt_timeout: float,
        operation: Callable[..., Awaitable[_T]],
        *args: Any,
    ) -> _T:
        """``operation(*args, timeout=attempt_timeout)`` on ``region``, bounded by our deadline.

        The SDK gets the same deadline, but it can wait forever when a response is lost
        (a link that never opens, a disposition that never comes), so ours is the backstop.
        Arguments are passed through rather than closed over: this is every send's path.
        """
        label = region.region
        failures_before = self._region_failures.get(label, 0)
        # Waiting for the region's slot (the SDK allows one call at a time per sender) is
        # not part of the deadline: a queue of healthy sends is not an outage. But a call
        # that waited while the region failed fails at once with that failure, so a burst
        # queued behind a dead region fails over together instead of one deadline each.
        slot = region.slot()
        if not slot.try_acquire():
            await slot.acquire()
        try:
            if self._region_failures.get(label, 0) != failures_before:
                last = self._last_region_error[label]
                raise RegionUnavailableError(
                    f"{label} failed while this call waited for it: {last}",
                    region=label,
                    kind=last.kind,
                ) from last
            try:
                with self._clock.deadline(attempt_timeout):
                    return await operation(*args, timeout=attempt_timeout)
            except TimeoutError as exc:
                error: RegionError = RegionUnavailableError(
                    f"{label} ({region.namespace}) did not answer within {attempt_timeout:g} s",
                    region=label,
                    kind=ErrorKind.TIMEOUT,
                )
                self._note_failure(error)
                raise error from exc
            except RegionError as exc:
                self._note_failure(exc)
                raise
        finally:
            slot.release()

    def _note_failure(self, error: RegionError) -> None:
        if error.kind in self.policy.fail_over_on:
            self._region_failures[error.region] = self._region_failures.get(error.region, 0) + 1
            self._last_region_error[error.region] = error

    def _size_limit(self) -> int | None:
        """The smallest message size limit learned from the regions (bytes), if any."""
        sizes = self._max_sizes
        return min(sizes.values()) if sizes else None

    def _other(self, region: RegionSender) -> RegionSender:
        return self._secondary if region is self._primary else self._primary

    async def _send_passive(
        self,
        payload: Any,
        messages: Sequence[Any],
        attempt_timeout: float,
        span: Span,
        *,
        may_queue: bool = True,
    ) -> SendResult:
        roles = self.roles
        snapshot = roles.read_now() or await roles.read()
        active = self._by_namespace[snapshot.active]
        try:
            await self._bounded(active, attempt_timeout, active.send, payload)
        except RegionError as first_error:
            if first_error.kind not in self.policy.fail_over_on:
                self._count_failed(active.region, len(messages))
                raise
            return await self._fail_over(
                snapshot, active, payload, messages, first_error, attempt_timeout, span, may_queue
            )
        self._count_accepted(active.region, len(messages))
        span.set_attribute("georep.region", active.region)
        return SendResult(accepted=(active.region,))

    async def _fail_over(
        self,
        snapshot: RoleSnapshot,
        active: RegionSender,
        payload: Any,
        messages: Sequence[Any],
        first_error: RegionError,
        attempt_timeout: float,
        span: Span,
        may_queue: bool,
    ) -> SendResult:
        backup = self._other(active)
        count = len(messages)
        self._count_failed(active.region, count)
        span.add_event(
            "georep.region_failed",
            {"georep.region": active.region, "error.type": first_error.kind.value},
        )
        _log.warning(
            "send to %s failed (%s: %s); failing over to %s",
            active.region,
            first_error.kind.value,
            first_error,
            backup.region,
        )
        # The SDK may have kept state on the objects it tried to send; the backup gets
        # copies with the same MessageIds (a batch is immutable once built, so it is reused).
        retry_payload = self._copy_payload(payload, messages)
        try:
            await self._bounded(backup, attempt_timeout, backup.send, retry_payload)
        except RegionError as second_error:
            self._count_failed(backup.region, count)
            span.add_event(
                "georep.region_failed",
                {"georep.region": backup.region, "error.type": second_error.kind.value},
            )
            if second_error.kind not in self.policy.fail_over_on:
                # The backup answered and refused the message itself (too large, invalid,
                # credentials, missing entity): raised at once, never queued, since no
                # later retry could succeed.
                raise second_error
            causes = {active.region: first_error, backup.region: second_error}
            if second_error.kind not in self.policy.fail_over_on:
                # The backup answered and refused the message itself: not an outage, and
                # a queued copy would be refused again forever (issue 20).
                raise second_error
            if self.outbox is not None and may_queue:
                await self._queue(messages, [None])
                span.set_attribute("georep.queued", True)
                return SendResult(accepted=(), failed=causes, queued=True)
            raise AllRegionsUnavailableError(
                f"no region accepted the send to {self.entity!r}", causes
            ) from second_error
        self._count_accepted(backup.region, count)
        await self._record_failover(snapshot, active, backup, span)
        return SendResult(
            accepted=(backup.region,), failed={active.region: first_error}, failed_over=True
        )

    async def _record_failover(
        self, snapshot: RoleSnapshot, active: RegionSender, backup: RegionSender, span: Span | None
    ) -> None:
        """The backup accepted what the active region refused: count it, swap the roles."""
        self.stats.failovers += 1
        self._telemetry.failover(active.region, backup.region)
        if span is not None:
            span.set_attribute("georep.region", backup.region)
            span.set_attribute("georep.failover", True)
        if await self.roles.swap(expected=snapshot, new_active=backup.namespace):
            self.stats.role_swaps += 1
            self._telemetry.role_swap(backup.region)
            if span is not None:
                span.add_event("georep.role_swap", {"georep.region": backup.region})
            _log.warning("%s is now the active region for %s", backup.region, self.entity)
            if self.policy.switch_back and self._probe is None:
                self._probe = asyncio.create_task(self._probe_for_switch_back())

    async def _send_active(
        self, payload: Any, messages: Sequence[Any], attempt_timeout: float, span: Span
    ) -> SendResult:
        primary, secondary = self._primary, self._secondary
        now = self._clock.monotonic()
        cooling = self._cooling_down
        # A region that just failed is skipped until its cool-down ends (its last error
        # stands for this send), so one dead region does not slow every send to its
        # failure latency. If both are cooling down, both are tried: nothing to lose.
        skip = {r.region for r in (primary, secondary) if cooling.get(r.region, (0.0,))[0] > now}
        if len(skip) == 2:
            skip.clear()
        errors: dict[str, RegionError] = {r: cooling[r][1] for r in skip}
        secondary_attempt: asyncio.Future[None] | None = None
        if secondary.region not in skip:
            copies = self._copy_payload(payload, messages)
            # One task, not two: the primary's attempt runs in this task.
            secondary_attempt = asyncio.ensure_future(
                self._bounded(secondary, attempt_timeout, secondary.send, copies)
            )
        if primary.region not in skip:
            try:
                await self._bounded(primary, attempt_timeout, primary.send, payload)
            except RegionError as exc:
                errors[primary.region] = exc
            except BaseException:
                if secondary_attempt is not None:
                    secondary_attempt.cancel()
                raise
        if secondary_attempt is not None:
            try:
                await secondary_attempt
            except RegionError as exc:
                errors[secondary.region] = exc
        cooldown = self.policy.region_cooldown_seconds
        for label in (primary.region, secondary.region):
            error = errors.get(label)
            if label in skip:
                continue
            if error is None:
                cooling.pop(label, None)
            elif error.kind in self.policy.fail_over_on and cooldown > 0:
                cooling[label] = (self._clock.monotonic() + cooldown, error)
        count = len(messages)
        accepted = tuple(r.region for r in (primary, secondary) if r.region not in errors)
        for region in accepted:
            self._count_accepted(region, count)
        for region, error in errors.items():
            self._count_failed(region, count)
            span.add_event(
                "georep.region_failed", {"georep.region": region, "error.type": error.kind.value}
            )
        if accepted:
            span.set_attribute("georep.region", accepted[0])
        if not errors:
            return SendResult(accepted=accepted)
        skipped = tuple(skip)
        if accepted:
            repair: tuple[str, ...] = ()
            if self.repair:
                repair = tuple(r for r, e in errors.items() if e.kind in self.policy.fail_over_on)
                if repair:
                    await self._queue(messages, list(repair))
            _log.warning(
                "send to %s failed (%s); %s accepted%s",
                ", ".join(errors),
                "; ".join(f"{e.kind.value}: {e}" for e in errors.values()),
                accepted[0],
                ", copy queued for repair" if repair else "",
            )
            return SendResult(
                accepted=accepted, failed=dict(errors), repair_queued=repair, skipped=skipped
            )
        transient = [r for r, e in errors.items() if e.kind in self.policy.fail_over_on]
        refused = [e for e in errors.values() if e.kind not in self.policy.fail_over_on]
        if refused:
            # A region answered and refused the message itself (too large, bad key...): not
            # an outage, and a queued copy would be refused again forever (issue 20).
            raise refused[0]
        if self.outbox is not None:
            await self._queue(messages, transient)
            span.set_attribute("georep.queued", True)
            return SendResult(accepted=(), failed=dict(errors), queued=True, skipped=skipped)
        raise AllRegionsUnavailableError(
            f"no region accepted the send to {self.entity!r}", errors
        ) from errors[secondary.region]

    def _copy_payload(self, payload: Any, messages: Sequence[Any]) -> Any:
        """What to send to the second region: the same batch (immutable once built), a copy
        of a single message, or copies of a list."""
        if self._codec.is_batch(payload):
            return payload
        if isinstance(payload, list):
            return self._copies(messages)
        return self._codec.copy(payload)

    def _copies(self, messages: Sequence[Any]) -> list[Any]:
        copy = self._codec.copy
        return [copy(message) for message in messages]

    def _count_accepted(self, region: str, count: int) -> None:
        accepted = self.stats.accepted
        accepted[region] = accepted.get(region, 0) + count
        self._telemetry.messages(count, region, "accepted")

    def _count_failed(self, region: str, count: int) -> None:
        failed = self.stats.failed
        failed[region] = failed.get(region, 0) + count
        self._telemetry.messages(count, region, "failed")

    # ------------------------------------------------------------------ scheduling

    async def schedule_messages(
        self, messages: Any, schedule_time_utc: datetime, *, timeout: float | None = None
    ) -> list[int]:
        """Schedule messages for later delivery, as ``ServiceBusSender.schedule_messages``.

        Passive: in the active region, failing over like a send. Active: in both regions.

        Returns:
            One sequence number per message, as the SDK returns: the numbers of the region
            labelled ``primary`` when it scheduled them, else those of the region that did
            (passive mode after a failover: the backup's). Pass them (or one of them) to
            :meth:`cancel_scheduled_messages`, which cancels every region's copy. Each
            region's own numbers: :meth:`schedule_messages_by_region`.

        Raises:
            AllRegionsUnavailableError: No region scheduled them (schedules never go to
                the outbox: a late schedule would fire at the wrong time).
        """
        by_region = await self.schedule_messages_by_region(
            messages, schedule_time_utc, timeout=timeout
        )
        if not by_region:
            return []
        order = sorted(self._regions, key=lambda label: label != self._primary.region)
        when = schedule_time_utc
        if when.tzinfo is None:  # the SDK reads a naive time as UTC (its samples use utcnow())
            when = when.replace(tzinfo=UTC)
        return self._schedules.remember(by_region, order, when.timestamp(), self._clock.time())

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
        attempt_timeout = self.policy.attempt_seconds if timeout is None else timeout
        batch = self._codec.split(messages)
        if not batch:
            return {}
        self._codec.check(batch, one_partition=self.partitioned, max_size=self._size_limit())
        self._prepare_all(batch, None)

        async def schedule(region: RegionSender, items: Sequence[Any]) -> list[int]:
            return await self._bounded(
                region, attempt_timeout, region.schedule, items, schedule_time_utc
            )

        if self.mode is ReplicationMode.ACTIVE:
            results = await asyncio.gather(
                schedule(self._primary, batch),
                schedule(self._secondary, self._copies(batch)),
                return_exceptions=True,
            )
            scheduled: dict[str, list[int]] = {}
            errors: dict[str, BaseException] = {}
            for region, outcome in zip((self._primary, self._secondary), results, strict=True):
                if isinstance(outcome, RegionError):
                    errors[region.region] = outcome
                elif isinstance(outcome, BaseException):
                    raise outcome
                else:
                    scheduled[region.region] = outcome
            if scheduled and errors:
                # Scheduled messages never go to the outbox (a late schedule would fire at
                # the wrong time): the caller sees which regions have them in the result.
                _log.warning(
                    "scheduled in %s only; %s",
                    ", ".join(scheduled),
                    "; ".join(f"{region}: {error}" for region, error in errors.items()),
                )
            if not scheduled:
                raise AllRegionsUnavailableError(
                    f"no region scheduled the messages for {self.entity!r}", errors
                )
            return scheduled
        snapshot = await self.roles.read()
        active = self._by_namespace[snapshot.active]
        try:
            return {active.region: await schedule(active, batch)}
        except RegionError as first_error:
            if first_error.kind not in self.policy.fail_over_on:
                raise
            backup = self._other(active)
            try:
                numbers = await schedule(backup, self._copies(batch))
            except RegionError as second_error:
                raise AllRegionsUnavailableError(
                    f"no region scheduled the messages for {self.entity!r}",
                    {active.region: first_error, backup.region: second_error},
                ) from second_error
            await self._record_failover(snapshot, active, backup, None)
            return {backup.region: numbers}

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
            InvalidMessageError: A number this sender did not return, or whose entry is
                gone (see :class:`georep._schedule.ScheduleBook` for how long they are
                kept); nothing is cancelled then.
            RegionError: A region could not cancel (the others were still cancelled); the
                scheduled message in that region will still be delivered.
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
        by_region = self._schedules.resolve(list(numbers))
        await self.cancel_scheduled_messages_by_region(by_region, timeout=timeout)
        self._schedules.forget(list(numbers))

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
        if not isinstance(sequence_numbers, Mapping):
            raise InvalidMessageError(
                "cancel_scheduled_messages_by_region takes the mapping "
                "schedule_messages_by_region returned (region -> sequence numbers)"
            )
        attempt_timeout = self.policy.attempt_seconds if timeout is None else timeout
        errors: list[RegionError] = []
        for label, numbers in sequence_numbers.items():
            region = self._regions.get(label)
            if region is None:
                raise InvalidMessageError(
                    f"unknown region {label!r}: expected one of {sorted(self._regions)}"
                )
            if not numbers:
                continue
            try:
                await self._bounded(region, attempt_timeout, region.cancel_scheduled, list(numbers))
            except RegionError as exc:
                errors.append(exc)
        if len(errors) == 1:
            raise errors[0]
        if errors:
            raise AllRegionsUnavailableError(
                f"no region cancelled its scheduled messages for {self.entity!r}",
                {error.region: error for error in errors},
            )

    # ---------------------------------------------------------------------- batches

    async def create_message_batch(self, max_size_in_bytes: int | None = None) -> Any:
        """An empty batch that fits both regions' size limits.

        Messages added to it get their MessageId (and traceparent) as they are added.

        Raises:
            AllRegionsUnavailableError: Neither region could tell its size limit and
                ``max_size_in_bytes`` was not given.
        """
        self._check_open()
        missing = [r for r in (self._primary, self._secondary) if r.region not in self._max_sizes]
        errors = await self._learn_max_sizes(missing) if missing else {}
        sizes = list(self._max_sizes.values())
        if max_size_in_bytes is not None:
            if max_size_in_bytes <= 0:
                raise ConfigurationError("max_size_in_bytes must be greater than 0")
            sizes.append(max_size_in_bytes)
        if not sizes:
            raise AllRegionsUnavailableError(
                "no region could tell its message size limit; pass max_size_in_bytes", errors
            )
        return self._codec.new_batch(min(sizes), self._prepare)

    # ----------------------------------------------------------------------- outbox

    def _new_drainer(self, meter_provider: MeterProvider | None) -> OutboxDrainer | None:
        if self.outbox is None:
            return None
        return OutboxDrainer(
            outbox=self.outbox,
            channel=self.channel,
            codec=self._codec,
            policy=self.drain_policy,
            clock=self._clock,
            deliver=self._deliver,
            unavailable_kinds=self.policy.fail_over_on,
            # A passive delivery may try both regions, each within the attempt deadline.
            send_budget=2 * self.policy.attempt_seconds + 1.0,
            telemetry=DrainTelemetry(entity=self.entity, meter_provider=meter_provider),
            stats=self.stats,
            ledger=self.ledger,
            entity=self.entity,
            mode=self._mode_name,
        )

    async def _queue(self, messages: Sequence[Any], regions: Sequence[str | None]) -> None:
        """Persist ``messages`` for each of ``regions`` (labels; None = whichever accepts).

        Only called when no region could be reached (never for a message a region
        refused for what it is).
        """
        assert self.outbox is not None and self._drainer is not None
        encode = self._codec.encode
        # Entries name their target by namespace, not label: a later sender may have the
        # pair the other way round.
        targets = [None if r is None else self._regions[r].namespace for r in regions]
        items = [(target, encode(message)) for target in targets for message in messages]
        await self.outbox.put(self.channel, items, now=self._clock.time())
        count = len(messages)
        self.stats.queued += count
        self.stats.outbox_depth = (self.stats.outbox_depth or 0) + len(items)
        for region in regions:
            self._telemetry.messages(count, region or "any", "queued")
        self._drainer.wake()

    async def drain_outbox(self) -> int:
        """Try once to send everything due in the outbox; return how many were delivered.

        Entries refused for good move to the outbox's dead-letter table; entries whose
        time-to-live ran out are dropped as expired (see ``SenderStats``).
        """
        self._check_open()
        if self._drainer is None:
            return 0
        return await self._drainer.drain_once()

    async def _deliver(self, target: str | None, message: Any) -> None:
        timeout = self.policy.attempt_seconds
        if target is not None:
            region = self._by_namespace.get(target)
            if region is None:
                raise InvalidMessageError(
                    f"outbox entry targets namespace {target!r}, which is not one of this "
                    f"sender's ({', '.join(sorted(self._by_namespace))})"
                )
            # The drainer ignores the cool-down (its own backoff paces it) so that it is
            # the one that notices a region is back; its failures do cool live sends down.
            try:
                await self._bounded(region, timeout, region.send, message)
            except RegionError as exc:
                cooldown = self.policy.region_cooldown_seconds
                if exc.kind in self.policy.fail_over_on and cooldown > 0:
                    self._cooling_down[region.region] = (self._clock.monotonic() + cooldown, exc)
                raise
            self._cooling_down.pop(region.region, None)
            self._count_accepted(region.region, 1)
            return
        span = self._telemetry.tracer.start_span(
            self._telemetry.span_name,
            kind=_PRODUCER,
            attributes={**self._telemetry.span_attributes, "georep.outbox": True},
        )
        try:
            await self._send_passive(message, [message], timeout, span, may_queue=False)
        finally:
            span.end()

    # ------------------------------------------------------------------ switch back

    async def _probe_for_switch_back(self) -> None:
        """After a swap, move back to the original primary once it answers again."""
        interval = as_seconds(self.policy.switch_back_probe_interval)
        try:
            while not self._closed:
                await self._clock.sleep(interval)
                snapshot = await self.roles.read()
                if snapshot.active == self._primary.namespace:
                    return
                timeout = self.policy.attempt_seconds
                try:
                    await self._bounded(self._primary, timeout, self._primary.probe)
                except RegionError:
                    continue
                if await self.roles.swap(expected=snapshot, new_active=self._primary.namespace):
                    self.stats.role_swaps += 1
                    self._telemetry.role_swap(self._primary.region)
                    _log.warning("%s answers again; switched back to it", self._primary.region)
                return
        finally:
            self._probe = None
