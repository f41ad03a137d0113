"""The syphon (SPEC §3): moves backlog-queue messages back into the primary namespace."""

from __future__ import annotations

__all__ = ["Syphon", "SyphonStats"]

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from opentelemetry import metrics

from georep._channel import RegionChannel
from georep._classify import CLIENT_FAULT_KINDS, RETRYABLE_KINDS
from georep._clock import SystemClock
from georep._endpoint import (
    FromNamespaces,
    Target,
    check_connection_string,
    with_client_options_pair,
)
from georep._lifecycle import AsyncResource, close_all, run_owned, start_task, stop_task
from georep._telemetry import Instruments, InstrumentSpec
from georep.exceptions import (
    GeoReplicationError,
    MessageExpiredError,
    RegionError,
)
from georep.paired.options import PairedNamespaceOptions
from georep.ports import Clock, ErrorKind, RegionReceiver, RegionSender

_log = logging.getLogger("georep.syphon")


@dataclass(slots=True)
class SyphonStats:
    """Counters of one syphon. Each moved message is billed 4 operations (SPEC §3).

    Attributes:
        receive_calls: Receive (long-poll) calls made to backlog queues.
        moved: Messages the primary accepted and whose backlog copy was completed.
        dead_lettered: Messages without ``x-ms-path``, refused for good by the primary,
            or expired (those are also counted in ``expired``).
        retries: Sends to the primary that failed transiently and were retried.
        expired: Messages whose time to live ran out in the backlog: dead-lettered with
            reason ``TTLExpiredException``, never delivered late.
    """

    receive_calls: int = 0
    moved: int = 0
    dead_lettered: int = 0
    retries: int = 0
    expired: int = 0

    @property
    def billed_operations(self) -> int:
        """Send to backlog, receive from backlog, send to primary, receive from primary."""
        return 4 * self.moved


SYPHON_COUNTERS: Final = {
    "receive_calls": InstrumentSpec(
        "georep.syphon.receive_calls",
        "{call}",
        "Long-poll receive calls on backlog queues (billed operations).",
    ),
    "moved": InstrumentSpec(
        "georep.syphon.moved",
        "{message}",
        "Messages moved to the primary (4 billed operations each).",
    ),
    "expired": InstrumentSpec(
        "georep.syphon.expired",
        "{message}",
        "Backlog messages whose time to live ran out: dead-lettered, not moved.",
    ),
}
"""The syphon's counters."""


class Syphon(FromNamespaces, AsyncResource):
    """Long-polls every backlog queue and moves each message to its ``x-ms-path`` entity.

    A message's backlog copy is completed only after the primary accepted it (nothing is
    lost; the MessageId is kept, so a copy moved twice after a crash is suppressed by the
    receivers). While the primary refuses with an unavailability error, the message stays
    locked in the backlog queue and is retried every ``syphon_retry_interval``.

    Args:
        backlog: One receiver per backlog queue (in the secondary namespace).
        primary_sender: ``primary_sender(entity)`` → the primary namespace's sender for
            that entity (created once per entity by the caller's factory).
        restore: ``restore(message)`` → ``(entity, message with aliases restored)``;
            raises :class:`~georep.exceptions.InvalidMessageError` without ``x-ms-path``
            and :class:`~georep.exceptions.MessageExpiredError` when its time to live
            ran out in the backlog (dead-lettered as ``TTLExpiredException``).
        options: :class:`PairedNamespaceOptions` (long poll, batch, retry interval).
        clock: Time source.
        meter_provider: OpenTelemetry meter provider.
    """

    def __init__(
        self,
        backlog: Sequence[RegionReceiver],
        primary_sender: Callable[[str], RegionSender],
        *,
        restore: Callable[[Any], tuple[str, Any]],
        options: PairedNamespaceOptions | None = None,
        clock: Clock | None = None,
        meter_provider: metrics.MeterProvider | None = None,
    ) -> None:
        self.options = options or PairedNamespaceOptions()
        self._backlog = list(backlog)
        self._primary_sender = primary_sender
        self._restore = restore
        self._clock: Clock = clock or SystemClock()
        self.stats = SyphonStats()
        self._owned_receivers: list[RegionReceiver] = []
        self._owned_senders: dict[str, RegionSender] = {}
        # One channel per entity, shared by the drain loops (one call at a time per sender).
        self._used_senders: dict[str, RegionChannel[RegionSender]] = {}
        self.faulted: dict[str, BaseException] = {}
        self.closed_partner: str | None = None
        self._partner_closer: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        # Shared per provider: instruments created per instance would pile up.
        self._counters = Instruments.of(meter_provider).counters(SYPHON_COUNTERS)

    @classmethod
    def from_connection_strings(
        cls,
        primary: Target,
        secondary: Target,
        *,
        primary_namespace: str,
        options: PairedNamespaceOptions | None = None,
        client_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> Syphon:
        """A syphon that creates, and closes, its receivers and senders.

        Args:
            primary: The primary namespace's connection string (messages go there).
            secondary: The secondary namespace's (the backlog queues are there).
            primary_namespace: The name the backlog queue paths are built from (as given
                to ``ensure_backlog_queues``).
            options: The paired namespaces' settings (the syphon's among them).
            client_options: ``ServiceBusClient`` settings for both namespaces, as
                :meth:`georep.GeoSender.from_connection_strings` takes them.
            **kwargs: Passed on to :class:`Syphon` (clock, meter_provider).

        Raises:
            ConfigurationError: A malformed connection string (the primary's is used only
                once a message is moved: checked here, not then), never showing the key.
        """
        for target, region in ((primary, "primary"), (secondary, "secondary")):
            if isinstance(target, str):
                check_connection_string(target, region)
        primary, secondary = with_client_options_pair(primary, secondary, client_options)
        from georep._sdk import (
            from_backlog,
            open_region_receiver,
            open_region_sender,
        )
        from georep.paired.options import backlog_queue_path

        options = options or PairedNamespaceOptions()
        backlog = [
            open_region_receiver(
                secondary,
                region=f"backlog-{i}",
                queue_name=backlog_queue_path(primary_namespace, i),
                prefetch_count=options.syphon_prefetch,
            )
            for i in range(options.backlog_queue_count)
        ]
        senders: dict[str, RegionSender] = {}

        def sender_for(entity: str) -> RegionSender:
            sender = senders.get(entity)
            if sender is None:
                sender = senders[entity] = open_region_sender(
                    primary, region="primary", queue_name=entity
                )
            return sender

        syphon = cls(backlog, sender_for, restore=from_backlog, options=options, **kwargs)
        # The time left of each message's TTL is measured on the syphon's clock.
        syphon._restore = lambda message: from_backlog(message, now=syphon._clock.time())
        syphon._owned_receivers = list(backlog)
        syphon._owned_senders = senders
        return syphon

    async def run(self) -> None:
        """Drain every backlog queue until :meth:`aclose` (or cancellation)."""
        self._check_open()
        drains = [
            asyncio.create_task(self._drain(queue), name=f"georep-syphon {queue.entity}")
            for queue in self._backlog
        ]
        # One drain that fails stops the others (gather left them running, unowned).
        await run_owned(drains, clock=self._clock)
        closer = self._partner_closer
        if closer is not None:
            # Until the partner is closed (or aclose() stopped the closer); its failure
            # was logged when it happened.
            await asyncio.wait([closer])

    async def aclose(self) -> None:
        """Stop after the messages in hand are moved or handed back; close what it created.

        A receive in progress ends when its long poll does; owned receivers are closed
        first so that it ends at once. Idempotent.
        """
        await super().aclose()

    async def _close(self) -> None:
        self._stopping.set()
        # The partner's close is this close's job now: the timer that would do it later
        # is stopped (bounded), not left running past the syphon.
        await stop_task(self._partner_closer, clock=self._clock)
        timeout = self.options.seconds("ping_timeout")
        await close_all(
            self._owned_receivers, timeout=timeout, clock=self._clock, what="backlog receiver"
        )
        await close_all(
            self._owned_senders.values(), timeout=timeout, clock=self._clock, what="sender"
        )

    async def _drain(self, queue: RegionReceiver) -> None:
        batch_size = self.options.syphon_batch_size
        long_poll = self.options.seconds("syphon_long_poll")
        failures = 0
        while not self._stopping.is_set() and not self.faulted:
            # A receive call is billed when it is made, whatever it returns.
            self.stats.receive_calls += 1
            self._counters["receive_calls"].add(1, {"georep.backlog_queue": queue.entity})
            try:
                messages = await queue.receive(batch_size, max_wait=long_poll)
            except RegionError as exc:
                if self._stopping.is_set():
                    return
                if exc.kind in CLIENT_FAULT_KINDS:
                    self._side_faulted("secondary", exc)
                    return
                failures += 1
                # Said the first time and then every tenth: a queue that is missing (or a
                # namespace that is down) fails every round, for as long as it lasts.
                if failures % 10 == 1:
                    hint = (
                        " (create the backlog queues: ensure_backlog_queues)"
                        if exc.kind is ErrorKind.ENTITY_NOT_FOUND
                        else ""
                    )
                    _log.warning(
                        "receive from backlog queue %s failed (%d time(s) in a row): %s%s",
                        queue.entity,
                        failures,
                        exc,
                        hint,
                    )
                retry = self.options.seconds("syphon_retry_interval")
                # Backing off to 5 s at most: the backlog drains soon after the fault ends.
                await self._clock.sleep(min(retry * 2 ** min(failures - 1, 6), max(retry, 5.0)))
                continue
            failures = 0
            for index, message in enumerate(messages):
                if self.faulted:  # a side is unusable: hand the rest back, stop fetching
                    for rest in messages[index:]:
                        with contextlib.suppress(RegionError):
                            await queue.abandon(rest)
                    return
                await self._move(queue, message)

    async def _move(self, queue: RegionReceiver, message: Any) -> None:
        try:
            entity, restored = self._restore(message)
        except MessageExpiredError as exc:
            # Never delivered after its original time to live (issue 14): dropped as the
            # service drops an expired message.
            await self._dead_letter(queue, message, "TTLExpiredException", str(exc))
            self.stats.expired += 1
            self._counters["expired"].add(1, {"georep.backlog_queue": queue.entity})
            return
        except GeoReplicationError as exc:
            await self._dead_letter(queue, message, "NoDestination", str(exc))
            return
        retry = self.options.seconds("syphon_retry_interval")
        timeout = self.options.seconds("ping_timeout")
        while True:
            try:
                channel = self._channel_to(entity)
                await channel.call(timeout, channel.client.send, restored)
                break
            except RegionError as exc:
                kind = exc.kind
                if kind in CLIENT_FAULT_KINDS:
                    # The primary client is unusable, not the message: hand it back.
                    with contextlib.suppress(RegionError):
                        await queue.abandon(message)
                    self._side_faulted("primary", exc)
                    return
                # Retryable kinds (the one table) wait in the backlog; the rest are
                # refused for good and dead-lettered (SPEC §3).
                if kind not in RETRYABLE_KINDS:
                    await self._dead_letter(queue, message, "PrimaryRefused", str(exc))
                    return
                if self._stopping.is_set():
                    with contextlib.suppress(RegionError):
                        await queue.abandon(message)  # handed back, moved next time
                    return
                self.stats.retries += 1
                _log.info("primary refused %s (%s); retrying in %g s", entity, exc, retry)
                await self._clock.sleep(retry)
                with contextlib.suppress(RegionError):
                    await queue.renew_lock(message)
        try:
            await queue.complete(message)
        except RegionError as exc:
            # Moved, but the backlog copy comes back: moved again later with the same
            # MessageId, and suppressed by the receivers.
            _log.warning("completing a moved message in %s failed: %s", queue.entity, exc)
        self.stats.moved += 1
        self._counters["moved"].add(1, {"messaging.destination.name": entity})

    def _channel_to(self, entity: str) -> RegionChannel[RegionSender]:
        channel = self._used_senders.get(entity)
        if channel is None:
            channel = RegionChannel(self._primary_sender(entity), clock=self._clock)
            self._used_senders[entity] = channel
        return channel

    def _side_faulted(self, side: str, error: BaseException) -> None:
        """One side's client faulted: close its partner after ``partner_close_timeout``."""
        if side in self.faulted:
            return
        self.faulted[side] = error
        _log.error(
            "the %s client faulted (%s): closing its partner in %g s",
            side,
            error,
            self.options.seconds("partner_close_timeout"),
        )
        self._partner_closer = start_task(
            self._close_partner_of(side), name=f"georep-syphon close {side}'s partner"
        )

    async def _close_partner_of(self, side: str) -> None:
        await self._clock.sleep(self.options.seconds("partner_close_timeout"))
        self._stopping.set()
        timeout = self.options.seconds("ping_timeout")
        if side == "secondary":
            senders = {id(s): s for s in self._senders_in_use()}.values()
            await close_all(senders, timeout=timeout, clock=self._clock, what="sender")
        else:
            await close_all(
                self._backlog, timeout=timeout, clock=self._clock, what="backlog receiver"
            )
        self.closed_partner = "primary" if side == "secondary" else "secondary"

    def _senders_in_use(self) -> list[RegionSender]:
        return [*self._owned_senders.values(), *(c.client for c in self._used_senders.values())]

    async def _dead_letter(
        self, queue: RegionReceiver, message: Any, reason: str, description: str
    ) -> None:
        with contextlib.suppress(RegionError):
            await queue.dead_letter(message, reason, description[:1024])
        self.stats.dead_lettered += 1
        _log.error("dead-lettered a backlog message (%s): %s", reason, description)
