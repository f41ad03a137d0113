"""Drop-in scheduling for GeoSender (issue 14, item 7): one list of sequence numbers out,
the same list (or one number) back in, mapped to each region's own numbers."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from georep._channel import RegionChannel
from georep.exceptions import AllRegionsUnavailableError, InvalidMessageError, RegionError
from georep.ports import RegionSender
from georep.roles.state import RoleState
from georep.send.passive import PassivePath
from georep.send.result import SendContext

__all__ = ["ScheduleBook", "Scheduler"]

_log = logging.getLogger("georep.sender")


class ScheduleBook:
    """Maps the sequence numbers ``GeoSender.schedule_messages`` returned to every region's.

    Each region numbers its messages itself, so the copies of one scheduled message have
    different sequence numbers per region. ``schedule_messages`` returns one region's
    numbers (as the SDK returns one list); this book remembers, per returned number, the
    number of each copy, so that ``cancel_scheduled_messages`` cancels every copy.

    Lifetime and bound: an entry lives in memory, in this sender only, until it is
    cancelled, until ``grace`` seconds after its schedule time (the message was enqueued by
    then: it can no longer be cancelled anyway), or until ``limit`` newer entries pushed it
    out (oldest first). It does not survive a restart: to cancel later from another
    process, keep ``schedule_messages_by_region``'s mapping and cancel with
    ``cancel_scheduled_messages_by_region``.

    Args:
        limit: Entries kept at most (one per scheduled message). Default 100,000.
        grace: Seconds an entry is kept after its schedule time. Default 60.
    """

    def __init__(self, *, limit: int = 100_000, grace: float = 60.0) -> None:
        self._limit = limit
        self._grace = grace
        # returned number -> (schedule time, epoch seconds; {region label: its number})
        self._entries: OrderedDict[int, tuple[float, dict[str, int]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def remember(
        self, by_region: Mapping[str, Sequence[int]], order: Sequence[str], due: float, now: float
    ) -> list[int]:
        """Record one schedule; return the numbers to hand back (see :meth:`pick`)."""
        label = self.pick(by_region, order)
        returned = list(by_region[label])
        for index, number in enumerate(returned):
            copies = {region: numbers[index] for region, numbers in by_region.items()}
            if number in self._entries:
                _log.warning(
                    "sequence number %d was returned before for another schedule that is "
                    "still pending; it now cancels the newer one only",
                    number,
                )
                del self._entries[number]
            self._entries[number] = (due, copies)
        self._trim(now)
        return returned

    def pick(self, by_region: Mapping[str, Sequence[int]], order: Sequence[str]) -> str:
        """The region whose numbers are returned: the first of ``order`` that scheduled and
        whose numbers name no pending entry (sequence numbers of two regions can be equal)."""
        labels = [label for label in order if label in by_region]
        for label in labels:
            if not any(number in self._entries for number in by_region[label]):
                return label
        return labels[0]

    def resolve(self, numbers: Sequence[int]) -> dict[str, list[int]]:
        """Each region's numbers for ``numbers`` (returned by :meth:`remember`).

        Raises:
            InvalidMessageError: A number this book does not hold (naming it and the fix).
        """
        by_region: dict[str, list[int]] = {}
        for number in numbers:
            if isinstance(number, bool) or not isinstance(number, int):
                raise InvalidMessageError(
                    f"a sequence number is an int, got {type(number).__name__} {number!r}"
                )
            entry = self._entries.get(number)
            if entry is None:
                raise InvalidMessageError(
                    f"sequence number {number} was not returned by this GeoSender's "
                    "schedule_messages, or its schedule time passed, or it was cancelled: "
                    "nothing was cancelled. To cancel from another sender or after a restart "
                    "keep schedule_messages_by_region's mapping and pass it to "
                    "cancel_scheduled_messages_by_region"
                )
            for region, copy in entry[1].items():
                by_region.setdefault(region, []).append(copy)
        return by_region

    def forget(self, numbers: Sequence[int]) -> None:
        """Drop the entries of cancelled numbers."""
        for number in numbers:
            self._entries.pop(number, None)

    def _trim(self, now: float) -> None:
        if len(self._entries) <= self._limit:
            return
        cutoff = now - self._grace
        for number in [n for n, (due, _) in self._entries.items() if due < cutoff]:
            del self._entries[number]
        while len(self._entries) > self._limit:
            self._entries.popitem(last=False)


class Scheduler:
    """Scheduling for a GeoSender: both regions (active) or the active one with failover.

    Args:
        context: What the sender's collaborators share (regions, policy, codec...).
        active: Active mode (schedule in both regions).
        passive: Records a failover (passive mode).
        roles: The role state shared on the pair.
    """

    def __init__(
        self,
        context: SendContext,
        *,
        active: bool,
        passive: PassivePath,
        roles: Callable[[], RoleState],
    ) -> None:
        self._context = context
        self._regions = context.regions
        self._policy = context.policy
        self._active = active
        self._passive = passive
        self._roles = roles
        self.book = ScheduleBook()

    async def schedule(
        self, messages: Any, schedule_time_utc: datetime, timeout: float | None
    ) -> list[int]:
        """``GeoSender.schedule_messages``: one list of numbers, remembered per region."""
        by_region = await self.schedule_by_region(messages, schedule_time_utc, timeout)
        if not by_region:
            return []
        primary = self._regions.primary.region
        order = sorted(self._regions.by_label, key=lambda label: label != primary)
        when = schedule_time_utc
        if when.tzinfo is None:  # the SDK reads a naive time as UTC (its samples use utcnow())
            when = when.replace(tzinfo=UTC)
        return self.book.remember(by_region, order, when.timestamp(), self._context.clock.time())

    async def schedule_by_region(
        self, messages: Any, schedule_time_utc: datetime, timeout: float | None
    ) -> dict[str, list[int]]:
        """``GeoSender.schedule_messages_by_region``."""
        attempt_timeout = self._policy.attempt_seconds if timeout is None else timeout
        batch = self._context.codec.split(messages)
        if not batch:
            return {}
        limit = self._regions.size_limit()
        self._context.codec.check(batch, one_partition=self._context.partitioned, max_size=limit)
        self._context.prep.prepare_all(batch, None)
        if self._active:
            return await self._schedule_both(batch, schedule_time_utc, attempt_timeout)
        return await self._schedule_passive(batch, schedule_time_utc, attempt_timeout)

    @staticmethod
    async def _schedule_in(
        region: RegionChannel[RegionSender], timeout: float, items: Sequence[Any], when: datetime
    ) -> list[int]:
        return await region.call(timeout, region.client.schedule, items, when)

    async def _schedule_both(
        self, batch: Sequence[Any], when: datetime, timeout: float
    ) -> dict[str, list[int]]:
        primary, secondary = self._regions.primary, self._regions.secondary
        results = await asyncio.gather(
            self._schedule_in(primary, timeout, batch, when),
            self._schedule_in(secondary, timeout, self._context.prep.copies(batch), when),
            return_exceptions=True,
        )
        scheduled: dict[str, list[int]] = {}
        errors: dict[str, BaseException] = {}
        for region, outcome in zip((primary, secondary), results, strict=True):
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
                f"no region scheduled the messages for {self._context.entity!r}", errors
            )
        return scheduled

    async def _schedule_passive(
        self, batch: Sequence[Any], when: datetime, timeout: float
    ) -> dict[str, list[int]]:
        snapshot = await self._roles().read()
        active = self._regions.by_namespace[snapshot.active]
        try:
            return {active.region: await self._schedule_in(active, timeout, batch, when)}
        except RegionError as first_error:
            if first_error.kind not in self._policy.fail_over_on:
                raise
            backup = self._regions.other(active)
            try:
                numbers = await self._schedule_in(
                    backup, timeout, self._context.prep.copies(batch), when
                )
            except RegionError as second_error:
                raise AllRegionsUnavailableError(
                    f"no region scheduled the messages for {self._context.entity!r}",
                    {active.region: first_error, backup.region: second_error},
                ) from second_error
            await self._passive.record_failover(snapshot, active, backup, None)
            return {backup.region: numbers}

    async def cancel(self, numbers: Sequence[int], timeout: float | None) -> None:
        """``GeoSender.cancel_scheduled_messages`` with a list of returned numbers."""
        by_region = self.book.resolve(list(numbers))
        await self.cancel_by_region(by_region, timeout)
        self.book.forget(list(numbers))

    async def cancel_by_region(
        self, sequence_numbers: Mapping[str, Sequence[int]], timeout: float | None
    ) -> None:
        """``GeoSender.cancel_scheduled_messages_by_region``."""
        if not isinstance(sequence_numbers, Mapping):
            raise InvalidMessageError(
                "cancel_scheduled_messages_by_region takes the mapping "
                "schedule_messages_by_region returned (region -> sequence numbers)"
            )
        attempt_timeout = self._policy.attempt_seconds if timeout is None else timeout
        errors: list[RegionError] = []
        for label, numbers in sequence_numbers.items():
            region = self._regions.by_label.get(label)
            if region is None:
                raise InvalidMessageError(
                    f"unknown region {label!r}: expected one of {sorted(self._regions.by_label)}"
                )
            if not numbers:
                continue
            try:
                await region.call(attempt_timeout, region.client.cancel_scheduled, list(numbers))
            except RegionError as exc:
                errors.append(exc)
        if len(errors) == 1:
            raise errors[0]
        if errors:
            raise AllRegionsUnavailableError(
                f"no region cancelled its scheduled messages for {self._context.entity!r}",
                {error.region: error for error in errors},
            )
