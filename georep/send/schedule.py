"""Drop-in scheduling for GeoSender (issue 14, item 7): one list of sequence numbers out,
the same list (or one number) back in, mapped to each region's own numbers."""

from __future__ import annotations

__all__ = ["SECONDARY_FLAG", "ScheduleBook", "Scheduler", "sequence_number"]

import asyncio
import contextlib
import json
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from georep._channel import RegionChannel
from georep.exceptions import (
    AllRegionsUnavailableError,
    InvalidMessageError,
    MessageNotFoundError,
    RegionError,
    StoreUnavailableError,
)
from georep.ports import RegionSender, ScheduleStore
from georep.roles.state import RoleState
from georep.send.passive import PassivePath
from georep.send.result import SendContext

_log = logging.getLogger("georep.sender")


SECONDARY_FLAG: Final = 1 << 62
"""Set in a returned number that is the secondary's own (the primary did not schedule it).

Sequence numbers are 64-bit and never reach 2**62 (a partitioned entity keeps its
partition in the top 16 bits, and there are at most a few dozen partitions), so a returned
number names its region by itself, in every process: below the flag, the primary's number;
with it, the secondary's."""


def sequence_number(value: Any) -> int:
    """``value``, a sequence number given back by the application.

    Raises:
        InvalidMessageError: Not an int (the SDK raises a ``ServiceBusError`` when it
            cannot encode one; georep's error is that too).
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidMessageError(
            f"a sequence number is an int, got {type(value).__name__} {value!r}"
        )
    return value


class ScheduleBook:
    """Maps the sequence numbers ``GeoSender.schedule_messages`` returned to every region's.

    Each region numbers its messages itself, so the copies of one scheduled message have
    different sequence numbers per region. ``schedule_messages`` returns one number per
    message, as the SDK does: the primary's number when the primary scheduled it, else the
    secondary's with :data:`SECONDARY_FLAG` set. A returned number therefore says by itself
    where its message is when only one region scheduled it (passive mode), in any process.

    In active mode both regions schedule it: the secondary's number is recorded in
    ``store`` (a :class:`georep.ports.ScheduleStore` shared by every process, e.g. the
    ``RedisSeenSet``) until ``grace`` seconds after the schedule time, so that a cancel from
    any process, or after a restart, cancels both copies. Without a store (or while it is
    unreachable at schedule time, which is logged) the mapping is kept in this sender's
    memory only, at most ``limit`` entries (the oldest schedule times go first).

    Args:
        regions: The namespace of each region label (``primary``, ``secondary``).
        store: Where the mappings are shared, or None (this sender's memory only).
        scope: The store's scope: the sender's namespace pair and entity.
        limit: Entries kept in memory at most (one per scheduled message). Default 100,000.
        grace: Seconds an entry is kept after its schedule time. Default 60.
    """

    def __init__(
        self,
        regions: Mapping[str, str] | None = None,
        *,
        store: ScheduleStore | None = None,
        scope: str = "",
        limit: int = 100_000,
        grace: float = 60.0,
    ) -> None:
        self._regions = dict(regions or {"primary": "primary", "secondary": "secondary"})
        self._primary, self._secondary = list(self._regions)
        self._labels = {namespace: label for label, namespace in self._regions.items()}
        self._store = store
        self._scope = scope
        self._limit = limit
        self._grace = grace
        # returned number -> (schedule time, epoch seconds; {region label: its number})
        self._entries: OrderedDict[int, tuple[float, dict[str, int]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    async def remember(self, by_region: Mapping[str, Sequence[int]], due: float) -> list[int]:
        """Record one schedule (region label -> numbers); return the numbers to hand back."""
        if self._primary in by_region:
            returned = [sequence_number(n) for n in by_region[self._primary]]
        else:
            returned = [sequence_number(n) | SECONDARY_FLAG for n in by_region[self._secondary]]
        if len(by_region) < 2:
            return returned  # the number says it all
        shared: dict[int, bytes] = {}
        for index, number in enumerate(returned):
            copies = {region: numbers[index] for region, numbers in by_region.items()}
            self._entries[number] = (due, copies)
            named = {self._regions[label]: copy for label, copy in copies.items()}
            shared[number] = json.dumps(named, sort_keys=True).encode()
        self._trim()
        if self._store is not None:
            try:
                await self._store.keep_schedules(self._scope, shared, expires_at=due + self._grace)
            except StoreUnavailableError as exc:
                _log.warning(
                    "the schedule store did not record %d scheduled message(s) (%s): only "
                    "this sender can cancel both regions' copies",
                    len(shared),
                    type(exc).__name__,
                )
        return returned

    async def resolve(self, numbers: Sequence[int]) -> dict[str, list[int]]:
        """Each region's numbers for ``numbers`` (returned by :meth:`remember`).

        Raises:
            InvalidMessageError: Something other than an int.
            StoreUnavailableError: The store did not answer for a number this sender does
                not remember (nothing was cancelled).
        """
        found: dict[int, dict[str, int]] = {}
        unknown = []
        for value in numbers:
            number = sequence_number(value)
            entry = self._entries.get(number)
            if entry is not None:
                found[number] = entry[1]
            elif number < SECONDARY_FLAG:
                unknown.append(number)
        if unknown and self._store is not None:
            stored = await self._store.find_schedules(self._scope, unknown)
            for number, answer in zip(unknown, stored, strict=True):
                if answer is not None:
                    named = json.loads(answer)
                    found[number] = {
                        self._labels[ns]: int(n) for ns, n in named.items() if ns in self._labels
                    }
        by_region: dict[str, list[int]] = {}
        for number in numbers:
            copies = found.get(number)
            if copies is None:
                if number >= SECONDARY_FLAG:
                    copies = {self._secondary: number & ~SECONDARY_FLAG}
                else:
                    copies = {self._primary: number}
            for region, copy in copies.items():
                by_region.setdefault(region, []).append(copy)
        return by_region

    async def forget(self, numbers: Sequence[int]) -> None:
        """Drop the entries of cancelled numbers."""
        shared = [n for n in numbers if n < SECONDARY_FLAG]
        for number in numbers:
            self._entries.pop(number, None)
        if self._store is not None and shared:
            # Left behind, they expire a minute after their schedule time anyway.
            with contextlib.suppress(StoreUnavailableError):
                await self._store.drop_schedules(self._scope, shared)

    def _trim(self) -> None:
        if len(self._entries) <= self._limit:
            return
        for number, _ in sorted(self._entries.items(), key=lambda item: item[1][0])[
            : len(self._entries) - self._limit
        ]:
            del self._entries[number]


class Scheduler:
    """Scheduling for a GeoSender: both regions (active) or the active one with failover.

    Args:
        context: What the sender's collaborators share (regions, policy, codec...).
        active: Active mode (schedule in both regions).
        passive: Records a failover (passive mode).
        roles: The role state shared on the pair.
        store: Where active mode's mappings are shared (:class:`ScheduleBook`), or None.
        scope: The store's scope (the sender's outbox channel: namespace pair and entity).
    """

    def __init__(
        self,
        context: SendContext,
        *,
        active: bool,
        passive: PassivePath,
        roles: Callable[[], RoleState],
        store: ScheduleStore | None = None,
        scope: str = "",
    ) -> None:
        self._context = context
        self._regions = context.regions
        self._policy = context.policy
        self._active = active
        self._passive = passive
        self._roles = roles
        self.book = ScheduleBook(
            {
                region.region: getattr(region.client, "namespace", region.region)
                for region in self._regions
            },
            store=store,
            scope=scope,
        )

    async def schedule(
        self, messages: Any, schedule_time_utc: datetime, timeout: float | None
    ) -> list[int]:
        """``GeoSender.schedule_messages``: one list of numbers, remembered per region."""
        by_region = await self.schedule_by_region(messages, schedule_time_utc, timeout)
        if not by_region:
            return []
        when = schedule_time_utc
        if when.tzinfo is None:  # the SDK reads a naive time as UTC (its samples use utcnow())
            when = when.replace(tzinfo=UTC)
        return await self.book.remember(by_region, when.timestamp())

    async def schedule_by_region(
        self, messages: Any, schedule_time_utc: datetime, timeout: float | None
    ) -> dict[str, list[int]]:
        """``GeoSender.schedule_messages_by_region``."""
        if not isinstance(schedule_time_utc, datetime):
            raise InvalidMessageError(
                "schedule_messages: schedule_time_utc must be a datetime (UTC, or naive "
                f"read as UTC), not {type(schedule_time_utc).__name__}"
            )
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
            self._raise_a_refusal(errors.values())
            raise AllRegionsUnavailableError(
                f"no region scheduled the messages for {self._context.entity!r}", errors
            )
        return scheduled

    def _raise_a_refusal(self, errors: Iterable[BaseException]) -> None:
        """Raise the first region error that is not an outage (a bad argument, a wrong key:
        each region refused the call itself), as the SDK raises its namespace's; else
        nothing (every region was unavailable)."""
        for error in errors:
            if isinstance(error, RegionError) and error.kind not in self._policy.fail_over_on:
                raise error

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
        by_region = await self.book.resolve(list(numbers))
        await self.cancel_by_region(by_region, timeout)
        await self.book.forget(list(numbers))

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
        cancelled = 0
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
                cancelled += 1
            except RegionError as exc:
                errors.append(exc)
        if cancelled:
            # A region that no longer has its copy while another cancelled its own: the
            # copy went in an earlier call that failed in the other region (a retry after
            # an outage), so the message is cancelled now. The service refuses a number
            # it does not hold ("Messages not found"); a number no region holds still is.
            errors = [e for e in errors if not isinstance(e, MessageNotFoundError)]
        if len(errors) == 1:
            raise errors[0]
        if errors:
            self._raise_a_refusal(errors)
            raise AllRegionsUnavailableError(
                f"no region cancelled its scheduled messages for {self._context.entity!r}",
                {error.region: error for error in errors},
            )
