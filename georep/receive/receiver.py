"""GeoReceiver: read both regions, hand each logical message to the handler once (SPEC §2.4).

The GeoReceiver holds the settings, the lifecycle and the handler's outcome methods; the
work is done by one :class:`georep.receive.region_loop.RegionLoop` per region (receive, claim,
process, settle, renew), which alone touches its region's receiver.
"""

from __future__ import annotations

__all__ = ["GeoReceiver", "ReceiverHandler", "ReceiverStats", "receiver"]

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

from opentelemetry import trace

from georep._clock import SystemClock
from georep._endpoint import FromNamespaces, Target, with_client_options_pair
from georep._lifecycle import AsyncResource, close_all, stop_tasks
from georep._policy import DedupKey, Seconds, count, positive_seconds, seconds
from georep._region_wrap import open_pair, wrap_pair
from georep._telemetry import ReceiverMetrics, TracingGate
from georep.exceptions import ConfigurationError, SettlementError
from georep.ports import (
    ClaimState,
    Clock,
    Ledger,
    RegionReceiver,
    RegionSessions,
    SeenStore,
    SessionStateStore,
)
from georep.receive.context import ReceiveContext, ReceiverStats, RecentOutcomes
from georep.receive.outcomes import (
    ABANDON,
    COMPLETE,
    RETURNED,
    Decision,
    Decisions,
    Settle,
    dead_letter_decision,
)
from georep.receive.region_loop import (
    RECEIVE_GRACE as RECEIVE_GRACE,
    Handler,
    LoopPolicy,
    RegionLoop,
    StorePolicy,
)
from georep.receive.session_loop import SessionPolicy, SessionRegionLoop
from georep.receive.wiring import region_loop, session_loops

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

_log = logging.getLogger("georep.receiver")


_LOOP: Final = (
    "concurrency",
    "lease",
    "max_wait",
    "max_attempts",
    "on_store_unavailable",
    "dedup_key",
)
"""The GeoReceiver's attributes its region loops read (:class:`LoopPolicy` fields; the
other one, ``scope_prefix``, is derived from ``dedup_scope``)."""


def _observed_parked(receiver: GeoReceiver) -> int | None:
    """The parked count the gauge reports for ``receiver``: none once it is closed."""
    return None if receiver._closed else receiver.stats.parked


class GeoReceiver(FromNamespaces, AsyncResource):
    """Receive from a queue (or subscription) in two regions; process each message once.

    Wraps two existing ``azure.servicebus.aio.ServiceBusReceiver`` objects in PEEK_LOCK
    mode (the caller keeps owning them; see :meth:`from_connection_strings` for a
    GeoReceiver that owns its clients). Duplicates (the twin from the other region, a
    redelivery after a lost settlement) are suppressed through the shared seen-set.

    Delivery is at-least-once with duplicates suppressed: a key is marked done only after
    its handler succeeded, so a consumer that dies mid-handler loses nothing (its lease
    expires and the message is processed again elsewhere).

    Args:
        primary: The primary region's receiver (SDK receiver or RegionReceiver).
        secondary: The secondary region's receiver.
        seen: The shared seen-set (e.g. ``georep.adapters.redis.RedisSeenSet``).
        dedup_key: The field that identifies a logical message (as the sender's).
        concurrency: Handlers running at once per region, and copies received per turn.
        lease: Seconds a claim lasts unless renewed; renewed while the handler runs.
        max_wait: Seconds one receive call waits for copies when the entity is idle.
        on_store_unavailable: ``"pause"`` (default): hand out nothing while the seen-set
            is unreachable, keep the copies locked, retry with backoff. ``"process"``:
            process without the dedup check (availability over exactly-once).
        owner: This consumer's identity in the seen-set (default: host, pid and a UUID).
        dedup_scope: What the copies are copies *of*: seen-set keys are scoped by it, so
            the subscriptions of one topic never look like duplicates of each other.
            Default: the entity path (queue, or ``topic/Subscriptions/name``), lower-cased
            (Service Bus names are case-insensitive); both regions' receivers must read
            the same path. Set it (the same string on every GeoReceiver of the entity)
            when the entity is named differently in the two regions.
        max_attempts: Handler failures (it raised or abandoned the copy) after which a
            copy is dead-lettered (reason ``georep:max-attempts``) instead of abandoned
            again; counted by the broker's delivery count of that copy. Default 10,
            Service Bus's default max delivery count: georep does not read the entity's
            (that needs Manage rights). Keep it at or below the entity's, so georep, not
            the broker, dead-letters the copy and records it for the twin.
        close_timeout: Seconds :meth:`aclose` waits for the clients it owns to close
            (closed concurrently). Default 5.0.
        ledger: Record one row per copy received (e.g. :class:`georep.ParquetLedger`): which
            region, processed, suppressed or failed, and when. The caller owns it:
            :meth:`aclose` flushes it but does not close it.
        clock: Time source (tests inject :class:`georep.testing.FakeClock`).
        tracer_provider: OpenTelemetry tracer provider (default: the global one).
        meter_provider: OpenTelemetry meter provider (default: the global one).

    Raises:
        ConfigurationError: A setting is out of range, or the two regions' receivers read
            different entities and no ``dedup_scope`` says they are one.
    """

    def __init__(
        self,
        primary: Any,
        secondary: Any,
        *,
        seen: SeenStore,
        dedup_key: DedupKey = DedupKey.MESSAGE_ID,
        concurrency: int = 32,
        lease: Seconds = 60.0,
        max_wait: Seconds = 1.0,
        on_store_unavailable: StorePolicy = "pause",
        owner: str | None = None,
        dedup_scope: str | None = None,
        max_attempts: int = 10,
        close_timeout: Seconds = 5.0,
        ledger: Ledger | None = None,
        sessions: bool = False,
        max_sessions: int = 8,
        order_wait: Seconds = 30.0,
        session_idle: Seconds | None = None,
        clock: Clock | None = None,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        self.concurrency = count(concurrency, "concurrency")
        self.max_attempts = count(max_attempts, "max_attempts")
        self.close_timeout = positive_seconds(close_timeout, "close_timeout")
        self.on_store_unavailable = _store_policy(on_store_unavailable)
        self.seen = seen
        self.dedup_key = dedup_key
        self.lease = seconds(lease, "lease")
        # Greater than 0: the SDK refuses a receive that may not wait, so a receiver made
        # with 0 would receive nothing, logging a "wrong request" for ever.
        self.max_wait = positive_seconds(max_wait, "max_wait")
        if self.lease <= 0:
            raise ConfigurationError("lease must be greater than 0 seconds")
        self.ledger = ledger
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._clock: Clock = clock or SystemClock()
        self.sessions = bool(sessions)
        regions = self._regions(primary, secondary, dedup_scope)
        self.stats = ReceiverStats()
        self._context = self._shared(tracer_provider, meter_provider)
        self._loops: list[RegionLoop] = []
        self._session_loops: list[SessionRegionLoop] = []
        loop = {name: getattr(self, name) for name in _LOOP}
        if self.sessions:
            held = self._session_policy(loop, max_sessions, order_wait, session_idle)
            self._session_loops = session_loops(regions, self._context, held, self.owner)
        else:
            policy = LoopPolicy(scope_prefix=self._scope_prefix, **loop)
            self._loops = [region_loop(r, self._context, policy, self.owner) for r in regions]
        self._running: list[asyncio.Task[None]] = []
        """The region loops' tasks while :meth:`run` runs."""
        self._released = asyncio.Event()
        """Set when :meth:`aclose` is done with the loops (they ended, or it gave up)."""

    def _regions(self, primary: Any, secondary: Any, dedup_scope: str | None) -> list[Any]:
        """Both regions' receivers (or session entities); sets what georep owns of them and
        the entity and scope they read."""
        regions: list[Any]
        self._owned: list[Any]
        if self.sessions:
            regions, self._owned = _session_regions(primary, secondary), []
        else:
            # Adapters georep made around the caller's SDK receivers are georep's to close:
            # that stops their worker threads (sync receivers), never the caller's receiver.
            regions, self._owned = wrap_pair(primary, secondary, "receiver")
        self.entity: str = regions[0].entity
        self.dedup_scope = _dedup_scope(regions, dedup_scope)
        self._scope_prefix = self.dedup_scope + "\n"
        return regions

    def _shared(
        self, tracer_provider: TracerProvider | None, meter_provider: MeterProvider | None
    ) -> ReceiveContext:
        """What every loop and settler of this receiver shares."""
        return ReceiveContext(
            entity=self.entity,
            seen=self.seen,
            decisions=Decisions(),
            stats=self.stats,
            metrics=ReceiverMetrics(self.entity, meter_provider, self, _observed_parked),
            ledger=self.ledger,
            clock=self._clock,
            stopping=asyncio.Event(),
            tracer=trace.get_tracer("georep", None, tracer_provider),
            tracing=TracingGate(tracer_provider, self._clock.monotonic),
            recent=RecentOutcomes(self._clock, _window_of(self.seen)),
        )

    def _session_policy(
        self,
        loop: dict[str, Any],
        max_sessions: int,
        order_wait: Seconds,
        session_idle: Seconds | None,
    ) -> SessionPolicy:
        """Session mode's settings, checked (and kept as this receiver's attributes), with
        the region loops' settings ``loop``."""
        self.max_sessions = count(max_sessions, "max_sessions")
        self.order_wait = seconds(order_wait, "order_wait")
        idle = self.max_wait if session_idle is None else session_idle
        self.session_idle = seconds(idle, "session_idle")
        return SessionPolicy(
            max_sessions=self.max_sessions,
            order_wait=self.order_wait,
            session_idle=self.session_idle,
            scope_prefix=self._scope_prefix,
            **loop,
        )

    @classmethod
    def from_connection_strings(
        cls,
        primary: Target,
        secondary: Target,
        *,
        sessions: bool = False,
        queue_name: str | None = None,
        topic_name: str | None = None,
        subscription_name: str | None = None,
        prefetch_count: int = 0,
        client_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> GeoReceiver:
        """A GeoReceiver that creates, and closes, its own clients and receivers.

        ``sessions=True`` reads each region's session-enabled entity (session mode). Name a
        queue, or a topic and subscription. ``prefetch_count`` is passed to the SDK
        (default 0: georep asks for exactly what it can process, so nothing sits locked in
        a buffer when the receiver stops).

        ``client_options`` are as :meth:`georep.GeoSender.from_connection_strings` takes them.

        Raises:
            ConfigurationError: A connection string is malformed or the entity is not
                named properly. The message never contains the key.
        """
        primary, secondary = with_client_options_pair(primary, secondary, client_options)
        from georep._sdk import open_region_receiver, open_region_sessions

        if (queue_name is None) == (topic_name is None) or (
            topic_name is not None and subscription_name is None
        ):
            raise ConfigurationError(
                "name a queue (queue_name=) or a topic and subscription "
                "(topic_name=, subscription_name=)"
            )
        names = {
            "queue_name": queue_name,
            "topic_name": topic_name,
            "subscription_name": subscription_name,
        }
        regions: tuple[Any, Any]
        if sessions:  # a session receiver is opened per accepted session, never prefetching
            regions = open_pair(open_region_sessions, primary, secondary, **names)
        else:
            regions = open_pair(
                open_region_receiver, primary, secondary, prefetch_count=prefetch_count, **names
            )
        receiver = cls(*regions, sessions=sessions, **kwargs)
        receiver._owned.extend(regions)
        return receiver

    # ------------------------------------------------------------------- lifecycle

    async def run(self, handler: Handler) -> None:
        """Receive and process until :meth:`aclose` (or cancellation).

        The region loops run as tasks this receiver owns. When :meth:`aclose` stops them,
        ``run()`` returns once the receiver is closed (clients closed, ledger flushed), so
        an application that exits when ``run()`` returns never cuts the close short.

        Args:
            handler: ``async def handler(message)``. Returning means "processed" (the
                copy is completed), raising means "not processed" (abandoned and
                redelivered, dead-lettered on its ``max_attempts``-th delivery). It may
                decide otherwise with :meth:`complete_message`, :meth:`abandon_message`,
                :meth:`defer_message` or :meth:`dead_letter_message` on the message it
                was given (never with the SDK's own settle methods). A plain ``def``
                works the same but runs on the event loop, blocking it while it runs:
                give blocking handlers to :class:`georep.sync.GeoReceiver`, which runs
                them on worker threads (and refuses an ``async def``).

        Raises:
            ClosedError: The receiver was closed.
            Exception: A region loop failed (the other one is stopped first).
        """
        self._check_open()
        if self._running:
            raise RuntimeError("this GeoReceiver is already running")
        loops: Sequence[RegionLoop | SessionRegionLoop] = self._loops or self._session_loops
        tasks = [
            asyncio.create_task(loop.run(handler), name=f"georep-receive {self.entity} {label}")
            for loop, label in zip(loops, ("primary", "secondary"), strict=False)
        ]
        self._running = tasks
        self._released.clear()
        try:
            await self._until_loops_end(tasks)
        except BaseException:
            # Cancelled, or a loop failed: the loops are this receiver's to stop (the
            # caller's cancellation is re-raised, never absorbed).
            await stop_tasks(tasks, clock=self._clock)
            raise
        finally:
            self._running = []
        close = self._close_task
        if close is not None:
            # Stopped by aclose(): return once the receiver is closed. asyncio.wait, not
            # an await of the close: its outcome is aclose()'s to report.
            await asyncio.wait([close])

    async def _until_loops_end(self, tasks: list[asyncio.Task[None]]) -> None:
        """Wait until every loop ended, or :meth:`aclose` gave up on them; raise the
        first loop failure."""
        released = asyncio.ensure_future(self._released.wait())
        try:
            while True:
                await asyncio.wait([*tasks, released], return_when=asyncio.FIRST_COMPLETED)
                for task in tasks:
                    if task.done() and not task.cancelled() and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
                if released.done() or all(task.done() for task in tasks):
                    return
        finally:
            released.cancel()

    async def aclose(self) -> None:
        """Stop fetching, finish in-flight handlers, settle, and close owned clients.

        Idempotent and shielded. Copies parked waiting for another consumer are abandoned
        (redelivered at once rather than when their locks expire). A ledger is flushed, not
        closed. A handler still running a lease after the close began is cancelled, and
        one that does not end then is left behind (logged): the close goes on without it.
        """
        await super().aclose()

    async def _close(self) -> None:
        self._context.stopping.set()
        running = list(self._running)
        try:
            if running:
                await self._wait_for_loops(running)
        finally:
            self._released.set()  # run() stops waiting for loops given up on
        await close_all(
            self._owned, timeout=self.close_timeout, clock=self._clock, what="region receiver"
        )
        if self.ledger is not None:
            with contextlib.suppress(Exception):
                await self.ledger.flush()

    async def _wait_for_loops(self, running: list[asyncio.Task[None]]) -> None:
        """Let the region loops finish their handlers and settle, for at most a lease (a
        handler running longer has lost its claim anyway); then cancel them, and wait a
        bounded time for them to end. Only this receiver's loop tasks are cancelled, never
        the task that called :meth:`run`."""
        bound = self.lease + self.max_wait
        with contextlib.suppress(TimeoutError), self._clock.deadline(bound):
            await asyncio.wait(running)
        if all(task.done() for task in running):
            return
        _log.warning(
            "the receive loops did not stop within %g s; cancelling them (copies not "
            "settled are redelivered when their locks expire)",
            bound,
        )
        await stop_tasks(running, clock=self._clock)

    async def peek_all(self, count: int) -> dict[str, list[Any]]:
        """Up to ``count`` messages from each region, without locking them.

        Loops past short answers (a partitioned entity answers one fragment at a time), so
        each list is ``count`` long unless the region holds fewer.

        Returns:
            The peeked messages per region label.

        Raises:
            ConfigurationError: The receiver is in session mode (peek a session with the
                SDK's session receiver).
        """
        if self.sessions:
            raise ConfigurationError(
                "peek_all is not available in session mode: peek a session with the SDK's "
                "session receiver (get_queue_receiver(..., session_id=...).peek_messages)"
            )
        return {loop.region.region: await loop.peek(count) for loop in self._loops}

    async def get_session_state(self, message: Any) -> bytes | None:
        """The state of ``message``'s session, the same from either region (session mode).

        Kept beside the seen-set (docs/sessions.md §3), not in the broker's session, so a
        failover keeps it; call it from the handler with the message it was given.

        Raises:
            ConfigurationError: Not in session mode, or the seen-set keeps no state.
            SettlementError: ``message`` has no session id.
            StoreUnavailableError: The store did not answer.
        """
        store, key = self._session_state(message)
        return await store.get_session_state(key)

    async def set_session_state(self, message: Any, state: bytes | str | None) -> None:
        """Set (None: clear) the state of ``message``'s session, for both regions.

        Written at once (before the handler returns): the session's next message, from
        either region, reads it. A ``str`` is stored UTF-8 encoded.

        Raises:
            ConfigurationError: Not in session mode, or the seen-set keeps no state.
            SettlementError: ``message`` has no session id.
            StoreUnavailableError: The store did not answer.
        """
        store, key = self._session_state(message)
        value = state.encode() if isinstance(state, str) else state
        await store.set_session_state(key, value)

    def _session_state(self, message: Any) -> tuple[SessionStateStore, str]:
        if not self.sessions:
            raise ConfigurationError(
                "session state needs session mode: GeoReceiver(..., sessions=True)"
            )
        store = self.seen
        if not isinstance(store, SessionStateStore):
            raise ConfigurationError(
                f"the seen-set ({type(store).__name__}) keeps no session state: use "
                "georep.adapters.redis.RedisSeenSet"
            )
        session_id = getattr(message, "session_id", None)
        if session_id is None:
            raise SettlementError("session state: the message has no session id")
        return store, self._scope_prefix + str(session_id)

    def seen_key(self, value: str) -> str:
        """The seen-set key this receiver uses for the dedup key ``value`` (its scope + it)."""
        return self._scope_prefix + value

    def record_outcomes(self, keys: Sequence[str], state: ClaimState = ClaimState.DONE) -> None:
        """Tell this receiver that its owner committed ``keys`` (seen-set keys, see
        :meth:`seen_key`) with ``state`` itself, outside the receiver (the Spark source
        commits a micro-batch's ids when Spark commits the batch, while the copies'
        handlers still wait for it).

        The receiver then settles their twins without a claim, as it does for outcomes it
        recorded, and does not report a running handler's key as a lost claim when the
        lease renewal finds it already committed.
        """
        self._context.recent.add(keys, state, None)

    # ------------------------------------------------------------ handler decisions

    async def complete_message(self, message: Any) -> None:
        """Decide that ``message`` (the one the handler was given) is processed.

        The default when the handler returns without a decision. Only recorded here;
        applied when the handler returns (seen-set first, then the broker).

        Raises:
            SettlementError: ``message`` is not being handled now, or was decided already.
        """
        self._context.decisions.decide(message, COMPLETE)

    async def abandon_message(self, message: Any) -> None:
        """Decide that ``message`` is not processed: redelivered, as if the handler raised.

        Counts as a failed attempt (``max_attempts``).

        Raises:
            SettlementError: ``message`` is not being handled now, or was decided already.
        """
        self._context.decisions.decide(message, ABANDON)

    async def hand_back(self, message: Any) -> None:
        """Decide to abandon ``message`` unprocessed: redelivered, and not a failed attempt
        (the drop-in receiver's, for a copy the application never got).

        Raises:
            SettlementError: ``message`` is not being handled now, or was decided already.
        """
        self._context.decisions.decide(message, RETURNED)

    async def defer_message(self, message: Any) -> None:
        """Decide to defer ``message``; its twin in the other region is deferred too.

        The copy stays in its entity, retrievable by sequence number with the SDK's
        ``receive_deferred_messages`` (georep does not fetch deferred messages).

        Raises:
            SettlementError: ``message`` is not being handled now, or was decided already.
        """
        self._context.decisions.decide(message, Decision(Settle.DEFER))

    async def dead_letter_message(
        self, message: Any, reason: str | None = None, error_description: str | None = None
    ) -> None:
        """Decide to dead-letter ``message``; its twin is dead-lettered too, never processed.

        Args:
            message: The message the handler was given.
            reason: The DeadLetterReason (None: none). The seen-set keeps its first 4,096
                characters, and the twin's reason is ``georep:twin:`` followed by them.
            error_description: The DeadLetterErrorDescription (None: none); the twin gets
                it too (its first 4,096 characters). Keep secrets out of it, as with the
                SDK.

        Raises:
            SettlementError: ``message`` is not being handled now, or was decided already.
        """
        self._context.decisions.decide(message, dead_letter_decision(reason, error_description))


def _window_of(seen: SeenStore) -> float | None:
    """The seen-set's window in seconds, if it says (``RedisSeenSet``, ``InMemorySeenSet``)."""
    window = getattr(seen, "window", None)
    if isinstance(window, int | float) and not isinstance(window, bool) and window > 0:
        return float(window)
    return None


def _dedup_scope(regions: Sequence[RegionReceiver], override: str | None) -> str:
    """The seen-set scope: ``override``, or the entity path both regions read (lower case).

    Raises:
        ConfigurationError: ``override`` is empty, or the regions read different entities.
    """
    if override is not None:
        if not isinstance(override, str) or not override.strip():
            raise ConfigurationError(
                f"dedup_scope must be a non-empty string, not {override!r} (leave it out to "
                "scope by the entity path)"
            )
        return override.strip().lower()
    paths = {region.region: region.entity.strip("/").lower() for region in regions}
    if len(set(paths.values())) > 1:
        described = ", ".join(f"{label} reads {path!r}" for label, path in paths.items())
        raise ConfigurationError(
            f"the regions' receivers read different entities ({described}): dedup needs "
            "one scope for both copies of a message. If they are the same entity under two "
            "names, pass dedup_scope='<one name>' (the same on every GeoReceiver of it); "
            "otherwise give the receivers of one entity"
        )
    return next(iter(paths.values()))


def _session_regions(primary: Any, secondary: Any) -> list[Any]:
    """The two regions of a session-mode GeoReceiver: each must be a RegionSessions.

    Raises:
        ConfigurationError: One is something else (an SDK receiver locks one session only).
    """
    for given, label in ((primary, "primary"), (secondary, "secondary")):
        if not isinstance(given, RegionSessions):
            raise ConfigurationError(
                f"sessions=True needs each region's session entity, and the {label} is a "
                f"{type(given).__name__}: use GeoReceiver.from_connection_strings(..., "
                "sessions=True), or pass georep.adapters.servicebus.ServiceBusRegionSessions"
                "(client, region=..., queue_name=...) for each region"
            )
    return [primary, secondary]


def _store_policy(value: str) -> StorePolicy:
    if value not in ("pause", "process"):
        raise ConfigurationError(
            f"on_store_unavailable must be 'pause' or 'process', not {value!r}"
        )
    return cast(StorePolicy, value)


class ReceiverHandler:
    """What ``@georep.receiver(...)`` returns: the handler, still callable, plus ``run()``.

    Attributes:
        stats: Live counters (:class:`ReceiverStats`), once running.
    """

    def __init__(self, function: Handler, factory: Callable[[], GeoReceiver]) -> None:
        self._function = function
        self._factory = factory
        self._receiver: GeoReceiver | None = None
        self.__name__ = getattr(function, "__name__", "handler")
        self.__doc__ = getattr(function, "__doc__", None)

    def __call__(self, message: Any) -> Awaitable[object]:
        return self._function(message)

    @property
    def stats(self) -> ReceiverStats:
        return self._receiver.stats if self._receiver is not None else ReceiverStats()

    def _running_receiver(self, method: str) -> GeoReceiver:
        if self._receiver is None:
            raise SettlementError(
                f"{method}: this handler is not running; call it on the message the "
                "handler was given while run() is receiving"
            )
        return self._receiver

    async def complete_message(self, message: Any) -> None:
        """As :meth:`GeoReceiver.complete_message` (the default when the handler returns)."""
        await self._running_receiver("complete_message").complete_message(message)

    async def abandon_message(self, message: Any) -> None:
        """As :meth:`GeoReceiver.abandon_message`: redelivered, counts as a failed attempt."""
        await self._running_receiver("abandon_message").abandon_message(message)

    async def defer_message(self, message: Any) -> None:
        """As :meth:`GeoReceiver.defer_message`: deferred here, and its twin too."""
        await self._running_receiver("defer_message").defer_message(message)

    async def dead_letter_message(
        self, message: Any, reason: str | None = None, error_description: str | None = None
    ) -> None:
        """As :meth:`GeoReceiver.dead_letter_message`: dead-lettered here, and its twin too."""
        await self._running_receiver("dead_letter_message").dead_letter_message(
            message, reason=reason, error_description=error_description
        )

    async def get_session_state(self, message: Any) -> bytes | None:
        """As :meth:`GeoReceiver.get_session_state` (session mode)."""
        return await self._running_receiver("get_session_state").get_session_state(message)

    async def set_session_state(self, message: Any, state: bytes | str | None) -> None:
        """As :meth:`GeoReceiver.set_session_state` (session mode)."""
        await self._running_receiver("set_session_state").set_session_state(message, state)

    async def run(self) -> None:
        """Receive and process until :meth:`aclose` or cancellation."""
        if self._receiver is None:
            self._receiver = self._factory()
        await self._receiver.run(self._function)

    async def aclose(self) -> None:
        """Stop gracefully: finish in-flight handlers, settle, close owned clients."""
        if self._receiver is not None:
            await self._receiver.aclose()


def receiver(
    *,
    primary: Any,
    secondary: Any,
    seen: SeenStore,
    queue_name: str | None = None,
    topic_name: str | None = None,
    subscription_name: str | None = None,
    **options: Any,
) -> Callable[[Handler], ReceiverHandler]:
    """Decorate ``async def handle(message)`` to receive each logical message once.

    ``primary``/``secondary`` are SDK receivers (or RegionReceivers), or connection strings
    together with ``queue_name`` (or ``topic_name`` and ``subscription_name``). Other
    options go to :class:`GeoReceiver` (``ledger=`` among them: ``aclose()`` flushes it).
    The decorated function stays callable; the returned object also has ``run()``,
    ``aclose()`` and ``stats``::

        @georep.receiver(primary=conn_a, secondary=conn_b, queue_name="orders", seen=seen)
        async def handle(message): ...

        await handle.run()
    """

    names = (queue_name, topic_name, subscription_name)
    return receiver_decorator(
        GeoReceiver, ReceiverHandler, primary, secondary, seen, names, options
    )


_R = TypeVar("_R")
_H = TypeVar("_H")


def receiver_decorator(
    geo_receiver: Any,
    handler_class: Callable[[Any, Callable[[], _R]], _H],
    primary: Any,
    secondary: Any,
    seen: Any,
    names: tuple[str | None, str | None, str | None],
    options: dict[str, Any],
) -> Callable[[Any], _H]:
    """The decorator ``@receiver(...)`` returns, async (:func:`receiver`) or blocking
    (:func:`georep.sync.receiver`).

    Its handler object builds the receiver when run: from connection strings through
    ``geo_receiver.from_connection_strings``, from anything else through its constructor.

    Args:
        geo_receiver: The GeoReceiver class (:class:`GeoReceiver`, or the blocking one).
        handler_class: What wraps the decorated function (given it and the factory).
        primary: The primary region's receiver or connection string.
        secondary: The secondary region's receiver or connection string.
        seen: The shared seen-set.
        names: With connection strings: the queue, topic and subscription names (as
            ``from_connection_strings`` takes them; None where not given).
        options: Other keyword arguments of ``geo_receiver``.
    """

    queue_name, topic_name, subscription_name = names

    def factory() -> _R:
        built: _R
        if isinstance(primary, str) and isinstance(secondary, str):
            built = geo_receiver.from_connection_strings(
                primary,
                secondary,
                queue_name=queue_name,
                topic_name=topic_name,
                subscription_name=subscription_name,
                seen=seen,
                **options,
            )
        else:
            built = geo_receiver(primary, secondary, seen=seen, **options)
        return built

    def decorate(function: Any) -> _H:
        return handler_class(function, factory)

    return decorate
