"""The paired-namespace sender (SPEC §3): primary first, backlog queues while it is down."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from opentelemetry import metrics

from georep._channel import RegionChannel
from georep._classify import MESSAGE_FAULT_KINDS, PAIRED_FAILOVER_KINDS
from georep._clock import SystemClock
from georep._endpoint import FromNamespaces, Target, with_client_options
from georep._lifecycle import AsyncResource, close_all
from georep._paired import PairedNamespaceOptions
from georep._role_store import SharedRoles, shared_role_state
from georep._roles import RoleSnapshot, RoleState
from georep._send_records import flush_ledger
from georep._telemetry import Instruments, InstrumentSpec
from georep.exceptions import (
    AllRegionsUnavailableError,
    ConfigurationError,
    RegionError,
)
from georep.ports import Clock, Ledger, RegionAttempt, RegionSender, RoleStore, SendRecord

__all__ = ["PairedSender", "PairedState"]

_log = logging.getLogger("georep.paired")


@dataclass
class PairedState:
    """Failover state of one entity, shared by every PairedSender on the pair.

    Attributes:
        failing_since: Monotonic time of the first failure of the current streak.
        engaged: Sends go to the backlog queues.
        excluded: Backlog queues pulled from the rotation after a failed send, each with
            the monotonic time it rejoins (``ping_primary_interval`` later): one slow send
            must not take a backlog queue away for the rest of an outage.
        roles: With a role store: the shared roles, ``secondary`` active while engaged.
    """

    failing_since: float | None = None
    engaged: bool = False
    excluded: dict[int, float] = field(default_factory=dict)
    pinger: asyncio.Task[None] | None = None
    roles: RoleState | None = None


_states: weakref.WeakValueDictionary[
    tuple[asyncio.AbstractEventLoop | None, str, str, str], PairedState
] = weakref.WeakValueDictionary()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _ledger_error(error: RegionError) -> str:
    """How the ledger names a failure: the class, ``TimeoutError`` for georep's deadline."""
    cause = error.__cause__
    return type(cause if isinstance(cause, TimeoutError) else error).__name__


PAIRED_COUNTERS: Final = {
    "pings": InstrumentSpec(
        "georep.paired.pings", "{ping}", "Pings sent to an unavailable entity."
    ),
    "backlog_sends": InstrumentSpec(
        "georep.paired.backlog_sends", "{message}", "Messages sent to a backlog queue."
    ),
}
"""The paired sender's counters."""


class PairedSender(FromNamespaces, AsyncResource):
    """Send to the primary; after ``failover_interval`` of failures, to backlog queues.

    Args:
        primary: The entity's sender in the primary namespace.
        backlog: One sender per backlog queue in the secondary namespace, index order.
        rewrite: ``rewrite(message, destination)`` → the backlog copy with its aliases
            (``georep.adapters.servicebus.to_backlog``); called with a
            ``schedule_time_utc=`` keyword too for :meth:`schedule_messages`.
        make_ping: Builds a ping message (empty, content type
            ``application/vnd.ms-servicebus-ping``, TTL 1 s, random SessionId).
        options: :class:`PairedNamespaceOptions`.
        secondary_namespace: The secondary namespace (to share state per pair).
        rng: Random source for the backlog pick (seedable for tests).
        ledger: Record one row per message sent (mode ``paired``; a backlog queue that
            accepts counts as a failover). Flushed, not closed, by :meth:`aclose`.
        clock: Time source.
        meter_provider: OpenTelemetry meter provider (pings are billed; they are counted).
        role_store: Share engaged/disengaged with every process of the application
            (``secondary`` active in the store while engaged): one process engaging
            engages them all, the first successful ping disengages them all, once, and
            ``georep failover``/``failback``/``pin`` steer them. The caller owns it.
    """

    def __init__(
        self,
        primary: RegionSender,
        backlog: Sequence[RegionSender],
        *,
        rewrite: Callable[..., Any],
        make_ping: Callable[[], Any],
        options: PairedNamespaceOptions | None = None,
        secondary_namespace: str = "secondary",
        rng: random.Random | None = None,
        ledger: Ledger | None = None,
        clock: Clock | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        role_store: RoleStore | None = None,
    ) -> None:
        self.options = options or PairedNamespaceOptions()
        if len(backlog) != self.options.backlog_queue_count:
            raise ConfigurationError(
                f"{len(backlog)} backlog senders for backlog_queue_count="
                f"{self.options.backlog_queue_count}: give one per backlog queue"
            )
        self._primary = primary
        self._backlog = list(backlog)
        self._clock: Clock = clock or SystemClock()
        # The failover timer (PairedState) decides when to fail over: the channels count
        # nothing themselves.
        self._main = RegionChannel(primary, clock=self._clock)
        self._queues = [RegionChannel(queue, clock=self._clock) for queue in self._backlog]
        self._rewrite = rewrite
        self._make_ping = make_ping
        self._rng = rng or random.Random()
        self.ledger = ledger
        key = (_running_loop(), primary.namespace, secondary_namespace, primary.entity)
        state = _states.get(key)
        if state is None:
            state = _states[key] = PairedState()
        self.state = state
        self._role_store = role_store
        self._role_link: SharedRoles | None = None
        self._meter_provider = meter_provider
        self._owned: list[RegionSender] = []
        # Shared per provider: instruments created per instance would pile up.
        self._counters = Instruments.of(meter_provider).counters(PAIRED_COUNTERS)
        self.pings = 0

    async def aclose(self) -> None:
        """Stop pinging (if this sender pings) and close what it created. Idempotent."""
        await super().aclose()

    # -- shared roles ------------------------------------------------------------------
    async def _open(self) -> None:
        self._shared_roles()
        if self._role_link is not None and self._role_link.state.shared is None:
            await self._role_link.refresh()

    def _shared_roles(self) -> RoleState | None:
        """The shared roles (joined on first use), None without a role store."""
        if self._role_store is None:
            return None
        if self._role_link is None:
            link = shared_role_state(
                self._role_store,
                self.entity,
                names={"primary": "primary", "secondary": "secondary"},
                initial="primary",
                clock=self._clock,
                meter_provider=self._meter_provider,
            )
            link.hold()
            self._role_link = link
            state = self.state
            if state.roles is not link.state:
                state.roles = link.state
                link.state.on_change(self._roles_changed)
                if link.state.current.active == "secondary":
                    self._roles_changed(link.state.current)
        return self._role_link.state

    def _roles_changed(self, snapshot: RoleSnapshot) -> None:
        """Engaged exactly while the shared roles have the secondary active."""
        state = self.state
        if snapshot.active == "secondary":
            if not state.engaged:
                state.engaged = True
                state.excluded.clear()
                _log.warning(
                    "%s: failover engaged (shared roles): sending to backlog queues", self.entity
                )
            if state.pinger is None or state.pinger.done():
                state.pinger = asyncio.create_task(self._ping_until_back(), name="georep-ping")
        elif state.engaged:
            state.engaged = False
            state.failing_since = None
            _log.warning("%s: failover disengaged (shared roles): sending to it", self.entity)

    async def _close(self) -> None:
        if self._role_link is not None:
            await self._role_link.release()
        pinger = self.state.pinger
        if pinger is not None and not pinger.done():
            pinger.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pinger
        timeout = self.options.seconds("ping_timeout")
        await close_all(self._owned, timeout=timeout, clock=self._clock, what="region sender")
        await flush_ledger(self.ledger, timeout=timeout, clock=self._clock)

    @property
    def entity(self) -> str:
        return self._primary.entity

    @classmethod
    def from_connection_strings(
        cls,
        primary: Target,
        secondary: Target,
        *,
        queue_name: str | None = None,
        topic_name: str | None = None,
        primary_namespace: str | None = None,
        options: PairedNamespaceOptions | None = None,
        client_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> PairedSender:
        """A PairedSender that creates, and closes, its senders.

        Backlog queues must exist (``georep.adapters.servicebus.ensure_backlog_queues``).
        ``primary_namespace`` names them (default: the primary's namespace host).

        Args:
            client_options: ``ServiceBusClient`` settings for both regions (e.g.
                ``transport_type``, ``http_proxy``, ``connection_verify``, retry settings),
                over georep's defaults.
        """
        primary = with_client_options(primary, client_options)
        secondary = with_client_options(secondary, client_options)
        from georep._paired import backlog_queue_path
        from georep._sdk import make_ping, open_region_sender, to_backlog

        if (queue_name is None) == (topic_name is None):
            raise ConfigurationError("name exactly one of queue_name= or topic_name=")
        options = options or PairedNamespaceOptions()
        main = open_region_sender(
            primary, region="primary", queue_name=queue_name, topic_name=topic_name
        )
        name = primary_namespace or main.namespace
        backlog = [
            open_region_sender(
                secondary, region=f"backlog-{i}", queue_name=backlog_queue_path(name, i)
            )
            for i in range(options.backlog_queue_count)
        ]
        sender = cls(
            main,
            backlog,
            rewrite=to_backlog,
            make_ping=make_ping,
            options=options,
            secondary_namespace=backlog[0].namespace,
            **kwargs,
        )
        sender._owned.extend([main, *backlog])
        return sender

    async def send_messages(self, message: Any, *, timeout: float | None = None) -> str:
        """Send to the primary, or to a backlog queue while failover is engaged.

        Args:
            message: A message, a list of messages or a ``ServiceBusMessageBatch``; in the
                backlog each message is rewritten (SPEC §3) and the copies go as one batch.
            timeout: Deadline per attempt in seconds (default ``ping_timeout``).

        Returns:
            ``"primary"`` or the backlog queue path that took the message.

        Raises:
            InvalidMessageError: The message cannot be sent (checked before any call).
            RegionError: Before failover engages, the primary's failure as it is (sends
                fail for ``failover_interval``, SPEC §3); at any time, a failure that is
                not one the paired timer counts (auth, server-busy, a service error).
            AllRegionsUnavailableError: Failover is engaged and no backlog queue accepted.
            MessageTooLargeError: The message does not fit once rewritten for the backlog.
        """
        messages = self._validate(message)
        ledger = self.ledger
        if ledger is None:
            return await self._send(message, messages, timeout, None)
        started_at = self._clock.time()
        attempts: list[RegionAttempt] = []
        try:
            destination = await self._send(message, messages, timeout, attempts)
        except BaseException:
            self._record(ledger, messages, "failed", None, attempts, started_at)
            raise
        accepted = attempts[-1].region if attempts else None
        self._record(ledger, messages, "accepted", accepted, attempts, started_at)
        return destination

    async def schedule_messages(
        self, messages: Any, schedule_time_utc: datetime, *, timeout: float | None = None
    ) -> list[int]:
        """Schedule messages in the primary, or carry the schedule through the backlog.

        While failover is engaged each message goes to a backlog queue at once with its
        schedule in ``x-ms-scheduledenqueuetimeutc`` (SPEC §3); the syphon schedules it in
        the primary with that time.

        Returns:
            The primary's sequence numbers (what the SDK returns); an empty list when the
            messages went to the backlog: they get their sequence numbers when the syphon
            schedules them, so they cannot be cancelled from here.

        Raises:
            The same errors as :meth:`send_messages`.
        """
        batch = self._validate(messages)
        if not batch:
            return []
        deadline = self.options.seconds("ping_timeout") if timeout is None else timeout
        if not self.state.engaged:
            accepted, numbers = await self._try_primary(
                self._primary.schedule, batch, deadline, None, schedule_time_utc
            )
            if accepted:
                return list(numbers)
        await self._to_backlog(batch, deadline, None, schedule_time_utc)
        return []

    async def cancel_scheduled_messages(
        self, sequence_numbers: int | Sequence[int], *, timeout: float | None = None
    ) -> None:
        """Cancel messages :meth:`schedule_messages` scheduled in the primary.

        Args:
            sequence_numbers: One sequence number or a list of them (as the SDK takes).

        Raises:
            RegionError: The primary could not cancel them.
        """
        self._check_open()
        numbers = [sequence_numbers] if isinstance(sequence_numbers, int) else sequence_numbers
        if not numbers:
            return
        deadline = self.options.seconds("ping_timeout") if timeout is None else timeout
        await self._main.call(deadline, self._primary.cancel_scheduled, list(numbers))

    def _validate(self, message: Any) -> list[Any]:
        """The messages in ``message``, checked before any network call."""
        self._check_open()
        self._shared_roles()
        codec = self._primary.codec
        messages = codec.split(message)
        codec.check(messages, one_partition=False)
        return messages

    def _record(
        self,
        ledger: Ledger,
        messages: list[Any],
        outcome: str,
        accepted: str | None,
        attempts: list[RegionAttempt],
        started_at: float,
    ) -> None:
        codec = self._primary.codec
        ledger.record_send(
            SendRecord(
                # The messages as checked (and sent): already split, dicts already messages.
                message_ids=tuple(codec.message_id(m) or "" for m in messages),
                entity=self.entity,
                mode="paired",
                outcome=outcome,
                accepted_region=accepted,
                failover=accepted is not None and accepted != self._primary.region,
                regions=attempts,
                started_at=started_at,
                finished_at=self._clock.time(),
            )
        )

    async def _send(
        self,
        message: Any,
        messages: list[Any],
        timeout: float | None,
        attempts: list[RegionAttempt] | None,
    ) -> str:
        """The send itself; each region tried is appended to ``attempts`` (ledger on)."""
        deadline = self.options.seconds("ping_timeout") if timeout is None else timeout
        if not self.state.engaged:
            # What was checked is what is sent (dicts became messages); a batch goes as is.
            codec = self._primary.codec
            whole = codec.is_batch(message) or (len(messages) == 1 and messages[0] is message)
            payload = message if whole else messages
            accepted, _ = await self._try_primary(self._primary.send, payload, deadline, attempts)
            if accepted:
                return "primary"
        return await self._to_backlog(messages, deadline, attempts)

    async def _try_primary(
        self,
        operation: Callable[..., Awaitable[Any]],
        payload: Any,
        deadline: float,
        attempts: list[RegionAttempt] | None,
        *args: Any,
    ) -> tuple[bool, Any]:
        """``operation(payload, *args)`` on the primary: (True, its result), or (False, None)
        once a failure engaged failover; any other failure is raised."""
        try:
            result = await self._main.call(deadline, operation, payload, *args)
        except RegionError as exc:
            await self._failed(exc)
            if attempts is not None:
                attempts.append(RegionAttempt(self._primary.region, "failed", _ledger_error(exc)))
            if not self.state.engaged:
                raise
        else:
            self.state.failing_since = None
            if attempts is not None:
                attempts.append(RegionAttempt(self._primary.region, "accepted"))
            return True, result
        return False, None

    async def _failed(self, error: RegionError) -> None:
        """Run the failover timer; engage when it has run ``failover_interval``."""
        # Not auth, not server-busy, not the message's own fault (SPEC §3; the table).
        if error.kind not in PAIRED_FAILOVER_KINDS:
            return
        state = self.state
        now = self._clock.monotonic()
        if state.failing_since is None:
            state.failing_since = now
        if now - state.failing_since >= self.options.seconds("failover_interval"):
            roles = self._shared_roles()
            if roles is None:
                self._engage()
            else:  # one compare-and-set for every process; the listener engages
                await roles.swap(expected=roles.current, new_active="secondary")

    def _engage(self) -> None:
        state = self.state
        if state.engaged:
            return
        state.engaged = True
        state.excluded.clear()
        _log.warning(
            "%s unavailable for %.0f s: sending to backlog queues",
            self.entity,
            self.options.seconds("failover_interval"),
        )
        if state.pinger is None or state.pinger.done():
            state.pinger = asyncio.create_task(self._ping_until_back(), name="georep-ping")

    async def _to_backlog(
        self,
        messages: list[Any],
        deadline: float,
        attempts: list[RegionAttempt] | None,
        schedule_time_utc: datetime | None = None,
    ) -> str:
        extra = {} if schedule_time_utc is None else {"schedule_time_utc": schedule_time_utc}
        # Each message rewritten (its aliases are per message); the copies go as one batch.
        copies = [self._rewrite(message, self.entity, **extra) for message in messages]
        backlog_copy = copies[0] if len(copies) == 1 else copies
        state = self.state
        causes: dict[str, BaseException] = {}
        tried: set[int] = set()  # each backlog queue at most once per call
        while True:
            now = self._clock.monotonic()
            candidates = [
                i
                for i in range(len(self._backlog))
                if i not in tried and state.excluded.get(i, now) <= now
            ]
            if not candidates:
                raise AllRegionsUnavailableError(
                    f"{self.entity} is failed over and no backlog queue accepted the message",
                    causes,
                )
            index = self._rng.choice(candidates)
            channel = self._queues[index]
            queue = channel.client
            try:
                await channel.call(deadline, queue.send, backlog_copy)
            except RegionError as exc:
                if exc.kind in MESSAGE_FAULT_KINDS:
                    raise  # the message's fault: another backlog queue would refuse it too
                tried.add(index)
                rejoin = self._clock.monotonic() + self.options.seconds("ping_primary_interval")
                state.excluded[index] = rejoin
                causes[queue.entity] = exc
                if attempts is not None:
                    attempts.append(RegionAttempt(queue.region, "failed", _ledger_error(exc)))
                _log.warning("backlog queue %s left the rotation: %s", queue.entity, exc)
                continue
            self._counters["backlog_sends"].add(1, {"georep.backlog_queue": str(index)})
            if attempts is not None:
                attempts.append(RegionAttempt(queue.region, "accepted"))
            return queue.entity

    async def _ping_until_back(self) -> None:
        """Ping the primary every ``ping_primary_interval``; once it has answered every ping
        for ``failback_after`` (the first success, by default), failover ends."""
        interval = self.options.seconds("ping_primary_interval")
        timeout = self.options.seconds("ping_timeout")
        healthy_for = self.options.seconds("failback_after")
        state = self.state
        healthy_since: float | None = None
        while state.engaged:
            await self._clock.sleep(interval)
            roles = self._shared_roles()
            if roles is not None and (roles.pinned or not roles.automatic):
                continue  # an operator engaged it: only an operator disengages it
            self.pings += 1
            self._counters["pings"].add(1, {"messaging.destination.name": self.entity})
            try:
                await self._main.call(timeout, self._primary.send, self._make_ping())
            except RegionError as exc:
                _log.info("ping of %s failed: %s", self.entity, exc)
                healthy_since = None
                continue
            now = self._clock.monotonic()
            healthy_since = now if healthy_since is None else healthy_since
            if now - healthy_since < healthy_for:
                continue  # answering, not yet for long enough
            if roles is not None:
                await roles.swap(expected=roles.current, new_active="primary")
                continue  # the listener disengages (also when another process did first)
            state.engaged = False
            state.failing_since = None
            _log.warning("%s answers pings again: sending to it", self.entity)
