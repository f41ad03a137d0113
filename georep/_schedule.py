"""Drop-in scheduling for GeoSender (issue 14, item 7): one list of sequence numbers out,
the same list (or one number) back in, mapped to each region's own numbers."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence

from georep.exceptions import InvalidMessageError

__all__ = ["ScheduleBook"]

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
