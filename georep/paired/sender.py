"""The paired-namespace sender (SPEC §3): primary first, backlog queues while it is down."""

from __future__ import annotations

__all__ = ["PairedSender", "PairedState"]

import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import Any, Final

from opentelemetry import metrics

from georep._channel import RegionChannel
from georep._clock import SystemClock
from georep._endpoint import FromNamespaces, Target, one_entity, with_client_options_pair
from georep._lifecycle import AsyncResource, close_all, close_in_order
from georep._policy import DedupKey
from georep._telemetry import Instruments, InstrumentSpec
from georep.exceptions import ConfigurationError, RegionError
from georep.paired.backlog import BacklogQueues, ledger_error
from georep.paired.failover import PairedFailover, PairedState, paired_state
from georep.paired.options import PairedNamespaceOptions
from georep.ports import Clock, Ledger, RegionAttempt, RegionSender, RoleStore, SendRecord
from georep.roles.join import role_join
from georep.roles.state import RoleState
from georep.send.ordering import SessionSequencer
from georep.send.records import flush_ledger
from georep.send.result import MessagePrep

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
        self._clock: Clock = clock or SystemClock()
        # The failover timer (PairedState) decides when to fail over: the channels count
        # nothing themselves.
        self._main = RegionChannel(primary, clock=self._clock)
        self._rng = rng or random.Random()
        self.ledger = ledger
        self.state = state = paired_state(primary, secondary_namespace)
        # Shared per provider: instruments created per instance would pile up.
        self._counters = Instruments.of(meter_provider).counters(PAIRED_COUNTERS)
        self._backlog_queues = BacklogQueues(
            backlog,
            state.excluded,
            entity=primary.entity,
            rewrite=rewrite,
            rng=self._rng,
            clock=self._clock,
            options=self.options,
            sends=self._counters["backlog_sends"],
        )
        names = {"primary": "primary", "secondary": "secondary"}
        self._role_join = role_join(
            role_store, primary.entity, names, clock=self._clock, meter_provider=meter_provider
        )
        self._failover = PairedFailover(
            state,
            self._main,
            options=self.options,
            clock=self._clock,
            make_ping=make_ping,
            pings=self._counters["pings"],
            roles=self._shared_roles,
        )
        self._owned: list[RegionSender] = []
        # Session order stamps (docs/sessions.md), keyed by MessageId: a message without
        # one gets one, as from a GeoSender.
        self._prep = MessagePrep(
            primary.codec, DedupKey.MESSAGE_ID, SessionSequencer(self._generation)
        )

    def _generation(self) -> int:
        roles = self._shared_roles()
        return self.state.generation if roles is None else roles.current.generation

    @property
    def pings(self) -> int:
        """Pings this sender sent to the unavailable primary."""
        return self._failover.pings

    async def aclose(self) -> None:
        """Leave the entity's failover (the last sender of the entity to close stops its
        pinger) and close what it created. Idempotent."""
        await super().aclose()

    # -- shared roles ------------------------------------------------------------------
    async def _open(self) -> None:
        roles = self._shared_roles()
        if roles is not None and roles.shared is None and self._role_join is not None:
            await self._role_join.refresh()

    def _shared_roles(self) -> RoleState | None:
        """The shared roles (joined on first use), None without a role store."""
        join = self._role_join
        if join is None:
            return None
        first = join.link is None
        roles = join.state("primary")
        if first:
            self._failover.follow(roles)
        return roles

    async def _close(self) -> None:
        # Every step runs whatever the one before it did: a failed stop must not leave the
        # clients this sender created open.
        timeout = self.options.seconds("ping_timeout")
        role_join = self._role_join
        await close_in_order(
            [
                ("leaving the entity's failover (pinger)", self._failover.stop),
                (
                    "releasing the shared roles",
                    role_join.release if role_join is not None else None,
                ),
                (
                    "closing the region senders",
                    partial(
                        close_all,
                        self._owned,
                        timeout=timeout,
                        clock=self._clock,
                        what="region sender",
                    ),
                ),
                (
                    "flushing the ledger",
                    partial(flush_ledger, self.ledger, timeout=timeout, clock=self._clock),
                ),
            ]
        )

    @property
    def entity(self) -> str:
        """The queue or topic this sender sends to."""
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

        ``client_options`` are as :meth:`georep.GeoSender.from_connection_strings` takes them.
        """
        from georep._sdk import make_ping, open_region_sender, to_backlog
        from georep.paired.options import backlog_queue_path

        one_entity(queue_name, topic_name)
        primary, secondary = with_client_options_pair(primary, secondary, client_options)
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
        messages, payload = self._validate(message)
        ledger = self.ledger
        if ledger is None:
            return await self._send(payload, messages, timeout, None)
        started_at = self._clock.time()
        attempts: list[RegionAttempt] = []
        try:
            destination = await self._send(payload, messages, timeout, attempts)
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
        batch, _ = self._validate(messages)
        if not batch:
            return []
        deadline = self.options.seconds("ping_timeout") if timeout is None else timeout
        if not self.state.engaged:
            accepted, numbers = await self._try_primary(
                self._primary.schedule, batch, deadline, None, schedule_time_utc
            )
            if accepted:
                return list(numbers)
        self._failover.ensure_pinging()
        await self._backlog_queues.send(batch, deadline, None, schedule_time_utc)
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

    def _validate(self, message: Any) -> tuple[list[Any], Any]:
        """The messages in ``message``, checked before any network call and given their
        MessageIds and session order stamps; and what to send the primary.

        What was checked is what is sent (dicts became messages); a single message or a
        batch goes as is, unless the SDK encoded the batch before georep gave its messages
        an id or a stamp: then the list of its (prepared) messages.
        """
        self._check_open()
        self._shared_roles()
        codec = self._primary.codec
        messages = codec.split(message)
        codec.check(messages, one_partition=False)
        whole = len(messages) == 1 and messages[0] is message
        if codec.is_batch(message):
            whole = all(
                codec.message_id(m) is not None and codec.session_id(m) is None for m in messages
            )
        self._prep.prepare_all(messages, None)
        return messages, message if whole else messages

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
        payload: Any,
        messages: list[Any],
        timeout: float | None,
        attempts: list[RegionAttempt] | None,
    ) -> str:
        """The send itself; each region tried is appended to ``attempts`` (ledger on)."""
        deadline = self.options.seconds("ping_timeout") if timeout is None else timeout
        if not self.state.engaged:
            accepted, _ = await self._try_primary(self._primary.send, payload, deadline, attempts)
            if accepted:
                return "primary"
        self._failover.ensure_pinging()
        return await self._backlog_queues.send(messages, deadline, attempts)

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
            await self._failover.failed(exc)
            if attempts is not None:
                attempts.append(RegionAttempt(self._primary.region, "failed", ledger_error(exc)))
            if not self.state.engaged:
                raise
        else:
            self._failover.succeeded()
            if attempts is not None:
                attempts.append(RegionAttempt(self._primary.region, "accepted"))
            return True, result
        return False, None
