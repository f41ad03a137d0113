"""``peek_messages`` over two regions: one copy of each logical message, paged as the SDK
pages (each call continues where the last one ended)."""

from __future__ import annotations

__all__ = ["MergedPeek"]

import asyncio
import logging
from collections import OrderedDict
from typing import Any, Final

from georep._channel import bounded_call
from georep._classify import every_region_refused
from georep.exceptions import AllRegionsUnavailableError, RegionError, StoreUnavailableError
from georep.ports import FINAL_STATES
from georep.receive.pull import PullReceiver, SettleProbe

from ._numbers import mark, own_number

_log = logging.getLogger("georep.servicebus")

_MAX_ROUNDS: Final = 8
"""Browses per region for one ``peek_messages`` call at most."""
_ACTIVE: Final = 0
"""``ServiceBusMessageState.ACTIVE``: neither deferred nor scheduled."""
_REMEMBERED: Final = 10_000
"""Keys of messages returned lately: a region lagging behind the other returns them again
on a later page, and they are not shown twice."""


class MergedPeek:
    """Browses both regions of one receiver.

    Each region is browsed from its own cursor (sequence numbers are per region); the
    answers are merged by enqueued time, a message both regions hold is shown once (the
    copy of the region that answered first in that order), a copy whose message is settled
    already (a twin georep has yet to remove; the seen-set says) is not shown, and each
    cursor moves past what was shown or skipped. A ``sequence_number`` that continues the
    previous page (the last message's number + 1, as SDK code pages) keeps the cursors; any
    other number starts both regions there; a message received from a region moves that
    region's cursor after it (as the SDK's receiver browses on after the last message it
    received). Messages are shown with the numbers the client hands out (:mod:`._numbers`).
    """

    def __init__(self, pull: PullReceiver) -> None:
        self._pull = pull
        self._probes = {probe.region: probe for probe in pull.regions}
        self._cursors: dict[str, int] = {}
        self._continue_at: int | None = None
        self._recent: OrderedDict[str, None] = OrderedDict()

    def received(self, region: str, sequence_number: int | None) -> None:
        """A message of ``region`` was received: as the SDK's receiver, a later
        ``peek_messages`` without a number browses that region from the next one."""
        if sequence_number is not None:
            self._cursors[region] = int(sequence_number) + 1
            self._recent.clear()  # a new walk from there: what it shows again is shown
            self._continue_at = None

    async def peek(self, count: int, sequence_number: int, timeout: float | None) -> list[Any]:
        """Up to ``count`` messages, not locked.

        Raises:
            AllRegionsUnavailableError: No region answered.
        """
        if sequence_number and sequence_number != self._continue_at:
            # Browsing from a number of the caller's choice: a new walk through the entity.
            start = own_number(sequence_number)
            self._cursors = {probe.region: start for probe in self._pull.regions}
            self._recent.clear()
        shown: list[Any] = []
        # A region's answer may be mostly copies already shown (a page of the other
        # region, a region behind the other): browse on from the moved cursors until the
        # page is full or the regions have no more.
        for _ in range(_MAX_ROUNDS):
            asked = count - len(shown)
            merged, more = await self._browse_all(asked, timeout)
            shown += self._page(merged, asked, await self._settled(merged))
            if len(shown) >= count or not more:
                break
        if shown:
            self._continue_at = int(shown[-1].sequence_number) + 1
        return shown

    async def _browse_all(
        self, count: int, timeout: float | None
    ) -> tuple[list[tuple[float, int, str, Any]], bool]:
        """Every region's next ``count`` messages, merged by enqueued time; and whether a
        region may hold more (it answered with all it was asked for).

        Raises:
            AuthenticationError, EntityNotFoundError: Every region refused so.
            AllRegionsUnavailableError: No region answered.
        """
        probes = self._pull.regions
        answers = await asyncio.gather(
            *(self._browse(probe, count, timeout) for probe in probes), return_exceptions=True
        )
        merged: list[tuple[float, int, str, Any]] = []
        errors: dict[str, BaseException] = {}
        more = False
        for order, (probe, answer) in enumerate(zip(probes, answers, strict=True)):
            if isinstance(answer, RegionError):
                errors[probe.region] = answer
                continue
            if isinstance(answer, BaseException):
                raise answer
            more = more or len(answer) >= count
            for message in answer:
                enqueued = getattr(message, "enqueued_time_utc", None)
                when = enqueued.timestamp() if enqueued is not None else 0.0
                merged.append((when, order, probe.region, message))
        if len(errors) == len(probes):
            # Every region refused the client's own settings (its key, its entity): that
            # refusal, as the SDK's receiver raises it; else none answered.
            refusal = every_region_refused([errors[probe.region] for probe in probes])
            if refusal is not None:
                raise refusal
            raise AllRegionsUnavailableError(
                f"no region could browse {self._pull.entity!r}", errors
            )
        for region, error in errors.items():
            _log.warning("peek_messages: %s is skipped (%s)", region, error)
        merged.sort(key=lambda item: (item[0], item[1]))
        return merged, more

    def _key(self, region: str, message: Any) -> str | None:
        policy = self._pull.geo.dedup_key
        return self._probes[region].delivery(message, policy.source, policy.name).key

    async def _settled(self, merged: list[tuple[float, int, str, Any]]) -> frozenset[str]:
        """The keys of the active copies in ``merged`` whose message is settled already
        (from the other region): twins georep has yet to remove, which a one-region
        program would no longer see. Empty if the seen-set does not answer."""
        keys = {
            key
            for _, _, region, message in merged
            if int(getattr(message, "state", _ACTIVE)) == _ACTIVE
            and (key := self._key(region, message)) is not None
        }
        if not keys:
            return frozenset()
        geo = self._pull.geo
        ordered = sorted(keys)
        try:
            states = await geo.seen.peek([geo.seen_key(key) for key in ordered])
        except StoreUnavailableError as error:
            _log.warning("peek_messages: settled twins are shown (seen-set: %s)", error)
            return frozenset()
        return frozenset(
            k for k, state in zip(ordered, states, strict=True) if state in FINAL_STATES
        )

    def _page(
        self, merged: list[tuple[float, int, str, Any]], count: int, settled: frozenset[str]
    ) -> list[Any]:
        shown: list[Any] = []
        for _, _, region, message in merged:
            if len(shown) == count:
                break
            sequence = int(message.sequence_number)
            self._cursors[region] = max(self._cursors.get(region, 1), sequence + 1)
            key = self._key(region, message)
            if key in settled and int(getattr(message, "state", _ACTIVE)) == _ACTIVE:
                continue  # a twin of a settled message, on its way out
            if key is not None:
                if key in self._recent:
                    continue
                self._recent[key] = None
                if len(self._recent) > _REMEMBERED:
                    self._recent.popitem(last=False)
            shown.append(mark(message, region))
        return shown

    async def _browse(self, probe: SettleProbe, count: int, timeout: float | None) -> list[Any]:
        start = self._cursors.get(probe.region, 1)
        inner = probe.inner
        peek_from = getattr(inner, "peek_from", None)
        if peek_from is None:  # a region port without the SDK's sequence numbers
            messages: list[Any] = await probe.call(lambda region: region.peek(count))
            return messages
        clock = self._pull.clock
        seconds = 10.0 if timeout is None else timeout
        with bounded_call(clock, probe.region, "a browse", seconds):
            result: list[Any] = await probe.call(lambda _: peek_from(count, start))
            return result
