"""``receive_deferred_messages`` across two regions: the numbers handed out round-trip.

A deferred message is retrieved by its sequence number, and each region numbers its copies
itself; the numbers the client hands out name their region (:mod:`._numbers`), so
``receive_deferred_messages(numbers)`` asks each number's region for it, from any process.
The client also keeps, per entity, a :class:`DeferredBook`: the dedup key of each message
it handed out and the application deferred, and for each key whose twin georep deferred
(the copy in the other region, deferred because this one was), that copy's region and
number. When a number's region is down, its twin is fetched instead. Settling what it
returns records the outcome in the seen-set, settles the copy, and settles the deferred
twin the same way, so neither region keeps a deferred copy the raw SDK run would not.

The book lives in the client (any receiver the client makes for the entity reads it) and,
when the seen-set can keep it (``RedisSeenSet``, ``InMemorySeenSet``: a
:class:`georep.ports.ScheduleStore`), in the seen-set too: a number deferred by another
process sharing the seen-set, or before a restart, is found through its twin as well. With
a seen-set that cannot, a number deferred elsewhere is fetched from its region only. A twin
that is not fetched stays deferred in its region until a sweep settles it (its key final).
"""

from __future__ import annotations

__all__ = ["DeferredBook", "DeferredMessages", "settle_found"]

import asyncio
import hashlib
import logging
from collections import OrderedDict
from collections.abc import Sequence
from functools import partial
from typing import Any, Final

from georep._channel import CALL_SECONDS, bounded_call
from georep._clock import SystemClock
from georep._lifecycle import start_task
from georep.exceptions import (
    ConfigurationError,
    MessageNotFoundError,
    RegionError,
    SettlementError,
    StoreUnavailableError,
)
from georep.ports import ClaimState, Clock, ErrorKind, ScheduleStore
from georep.receive.outcomes import Decision, Settle, twin_reason
from georep.receive.pull import PullReceiver, SettleProbe

from ._numbers import handed_out, mark, own_number, region_of

_log = logging.getLogger("georep.servicebus")

_SETTLED: Final = (ClaimState.DONE, ClaimState.DEAD_LETTERED)
"""Seen-set states of a message no deferred copy of which may be handed out again."""

_KEPT: Final = 100_000
"""Entries a book keeps at most (oldest forgotten first)."""
SHARED_DAYS: Final = 14
"""Days a deferred message's entries are kept in the store (unless it is settled first):
Service Bus's default message time-to-live."""
_TWIN_WAIT: Final = 5.0
"""Seconds to wait for georep to defer a twin whose original's region is down."""


class DeferredBook:
    """What this client knows of the deferred messages of one entity: the dedup key of each
    number it handed out and the application deferred, and where georep deferred each
    key's twin (the copy in the other region, deferred because this one was).

    With a ``store`` (the seen-set, when it is a :class:`georep.ports.ScheduleStore`, as
    ``RedisSeenSet`` is) both are also kept there, for :data:`SHARED_DAYS` days or until
    the message is settled, so that any process sharing the seen-set (or this one after a
    restart) finds a deferred message through its twin while its own region is down.

    Args:
        store: Where every process of the application keeps them (None: this client only).
        scope: The entity and its namespaces, naming the book in ``store``.
        clock: Wall-clock time for the entries' expiry.
    """

    def __init__(
        self, store: ScheduleStore | None = None, scope: str = "", clock: Clock | None = None
    ) -> None:
        self._keys: OrderedDict[int, str | None] = OrderedDict()
        self._twins: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self._store = store
        self._scope = scope
        self._clock = clock or SystemClock()
        self._writes: set[asyncio.Task[None]] = set()

    async def deferred(self, number: int, key: str | None) -> None:
        """The application deferred the message (dedup key ``key``) handed out as ``number``."""
        self._keys[number] = key
        self._keys.move_to_end(number)
        _trim(self._keys)
        if key is not None:
            await self._keep("keys", {number: key.encode()})

    def twin_deferred(self, key: str, region: str, message: Any) -> None:
        """georep deferred ``message`` in ``region`` because its key ``key`` was deferred."""
        number = getattr(message, "sequence_number", None)
        if number is None:
            return
        own = own_number(int(number))
        self._twins[key] = (region, own)
        _trim(self._twins)
        if self._store is not None:  # told from a settlement's callback: written aside
            entry = f"{region}\n{own}\n{key}".encode()
            write = start_task(
                self._keep("twins", {_slot(key): entry}), name=f"georep-deferred {self._scope}"
            )
            self._writes.add(write)
            write.add_done_callback(self._writes.discard)

    async def key(self, number: int) -> str | None:
        """The dedup key of the message handed out as ``number``, if this client (or, with
        a store, any process) deferred it."""
        if number in self._keys:
            return self._keys[number]
        found = await self._find("keys", number)
        return None if found is None else found.decode("utf-8", "replace")

    async def twin(self, key: str) -> tuple[str, int] | None:
        """Where georep deferred the twin of ``key`` (region, its number there), if this
        client (or, with a store, any process) saw it."""
        twin = self._twins.get(key)
        if twin is not None:
            return twin
        found = await self._find("twins", _slot(key))
        if found is None:
            return None
        region, number, stored_key = found.decode("utf-8", "replace").split("\n", 2)
        return (region, int(number)) if stored_key == key else None

    async def forget(self, number: int) -> None:
        """The message handed out as ``number`` was settled."""
        self._keys.pop(number, None)
        await self._drop("keys", number)

    async def take_twin(self, key: str) -> tuple[str, int] | None:
        """The deferred twin of ``key`` (forgotten: it is being settled)."""
        twin = self._twins.pop(key, None) or await self.twin(key)
        await self._drop("twins", _slot(key))
        return twin

    async def aclose(self) -> None:
        """Wait (bounded) for the entries still being written to the store."""
        if self._writes:
            await asyncio.wait(list(self._writes), timeout=CALL_SECONDS)

    async def _keep(self, kind: str, entries: dict[int, bytes]) -> None:
        if self._store is None:
            return
        expires_at = self._clock.time() + SHARED_DAYS * 86_400
        try:
            await self._store.keep_schedules(
                f"{kind} {self._scope}", entries, expires_at=expires_at
            )
        except StoreUnavailableError as exc:
            _log.warning(
                "deferred messages: the seen-set did not keep an entry (%s); only this "
                "client finds the message through its twin",
                exc,
            )

    async def _find(self, kind: str, number: int) -> bytes | None:
        if self._store is None:
            return None
        try:
            (found,) = await self._store.find_schedules(f"{kind} {self._scope}", [number])
        except StoreUnavailableError as exc:
            _log.warning("deferred messages: the seen-set did not answer (%s)", exc)
            return None
        return found

    async def _drop(self, kind: str, number: int) -> None:
        if self._store is None:
            return
        try:
            await self._store.drop_schedules(f"{kind} {self._scope}", [number])
        except StoreUnavailableError as exc:  # it expires by itself
            _log.debug("deferred messages: an entry was not dropped (%s)", exc)


def _slot(key: str) -> int:
    """The number a twin's entry is kept under in the store: from its dedup key."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") >> 2


def _trim(entries: OrderedDict[Any, Any]) -> None:
    while len(entries) > _KEPT:
        entries.popitem(last=False)


class DeferredMessages:
    """``receive_deferred_messages`` of one receiver, and settling what it returned.

    Args:
        pull: The receiver's pull receiver (its regions, seen-set and clock).
        book: The client's book for the entity.
    """

    def __init__(self, pull: PullReceiver, book: DeferredBook) -> None:
        self._pull = pull
        self._book = book
        self._held: dict[int, tuple[SettleProbe, str | None, int]] = {}

    def holds(self, message: Any) -> bool:
        """Whether ``message`` came from :meth:`receive` and is not settled yet."""
        return id(message) in self._held

    async def receive(self, numbers: Sequence[int], timeout: float | None) -> list[Any]:
        """The deferred messages handed out (and deferred) as ``numbers``, locked.

        A number names its region (:mod:`._numbers`); each is asked for once.

        Raises:
            MessageNotFoundError: A number whose message was completed or dead-lettered
                already, from its twin in the other region (while its own region was down):
                as the SDK raises for a number settled since (its copy here is settled
                now, as a twin).
            RegionError: A region refused (no such deferred message) or did not answer.
        """
        messages = await self._receive(numbers, timeout)
        await self._drop_settled(messages)
        return messages

    async def _receive(self, numbers: Sequence[int], timeout: float | None) -> list[Any]:
        probes = {probe.region: probe for probe in self._pull.regions}
        plan: dict[str, list[tuple[int, int]]] = {}
        for number in dict.fromkeys(numbers):
            region = region_of(number)
            if region not in probes:
                raise ConfigurationError(
                    f"receive_deferred_messages: {number} is not a number this client hands "
                    f"out (no {region} region)"
                )
            plan.setdefault(region, []).append((own_number(number), number))
        messages: list[Any] = []
        for region, entries in plan.items():
            try:
                messages += await self._fetch(probes[region], [n for n, _ in entries], timeout)
            except RegionError as exc:
                # The region it was deferred in is down: its twin, deferred by georep in
                # the other region, is the same message.
                messages += await self._twins_of(region, entries, exc, timeout)
        return messages

    async def _drop_settled(self, messages: list[Any]) -> None:
        """Raise the SDK's ``MessageNotFoundError`` if one of ``messages`` is final in the
        seen-set (settled from its twin), after settling each such copy as a twin; the
        others are let go (their locks run out: they stay deferred), as a refused call
        leaves them. Nothing is checked if the seen-set does not answer.
        """
        keyed = [(m, held) for m in messages if (held := self._held[id(m)])[1] is not None]
        if not keyed:
            return
        geo = self._pull.geo
        try:
            states = await geo.seen.peek([geo.seen_key(str(held[1])) for _, held in keyed])
        except StoreUnavailableError as exc:
            _log.warning("receive_deferred_messages: not checked for settled twins (%s)", exc)
            return
        settled: list[int] = []
        region = ""
        for (message, (probe, _, number)), state in zip(keyed, states, strict=True):
            if state not in _SETTLED:
                continue
            settled.append(number)
            region = region or probe.region
            try:
                await self._apply(probe, message, twin_reason(state, None))
            except RegionError as exc:
                _log.warning(
                    "a settled message's deferred copy stays in %s (%s)", probe.region, exc
                )
            await self._book.forget(number)
        if not settled:
            return
        for message in messages:
            self._held.pop(id(message), None)
        raise MessageNotFoundError(
            "receive_deferred_messages: the message deferred as "
            + ", ".join(str(n) for n in settled)
            + " was completed or dead-lettered already (from its copy in the other region)",
            region=region,
            kind=ErrorKind.INVALID_ARGUMENT,
        )

    async def _twins_of(
        self,
        region: str,
        entries: list[tuple[int, int]],
        error: RegionError,
        timeout: float | None,
    ) -> list[Any]:
        """The deferred twins of ``entries`` (deferred in ``region``, which failed).

        Raises:
            RegionError: ``error``, when a twin is not known or cannot be fetched either.
        """
        probes = {probe.region: probe for probe in self._pull.regions}
        messages: list[Any] = []
        for _, number in entries:
            key = await self._book.key(number)
            twin = None if key is None else await self._twin(key, region)
            if twin is None or twin[0] not in probes:
                raise error
            messages += await self._fetch(probes[twin[0]], [twin[1]], timeout)
        return messages

    async def _twin(self, key: str, region: str) -> tuple[str, int] | None:
        """The twin of ``key`` outside ``region``, waiting a little for georep to defer it
        (the other region's copy is deferred when its receiver next claims it)."""
        clock = self._pull.clock
        deadline = clock.monotonic() + _TWIN_WAIT
        while True:
            twin = await self._book.twin(key)
            if twin is not None and twin[0] != region:
                return twin
            if clock.monotonic() >= deadline:
                return None
            await clock.sleep(0.1)

    async def _fetch(
        self, probe: SettleProbe, numbers: list[int], timeout: float | None
    ) -> list[Any]:
        inner = probe.inner
        receive_deferred = getattr(inner, "receive_deferred", None)
        if receive_deferred is None:
            raise SettlementError(
                f"the {probe.region} region's receiver ({type(inner).__name__}) cannot "
                "receive deferred messages"
            )
        seconds = 10.0 if timeout is None else timeout
        with bounded_call(self._pull.clock, probe.region, "a deferred receive", seconds):
            messages: list[Any] = await probe.call(lambda _: receive_deferred(numbers))
        policy = self._pull.geo.dedup_key
        for message in messages:
            key = probe.delivery(message, policy.source, policy.name).key
            own = int(message.sequence_number)
            self._held[id(message)] = (probe, key, handed_out(probe.region, own))
            mark(message, probe.region)
        return messages

    async def settle(self, message: Any, decision: Decision, operation: str) -> None:
        """Settle a deferred message :meth:`receive` returned, and its deferred twin.

        A completion or dead-lettering is recorded in the seen-set first (the copy of the
        message still in the other region's queue then gets it); an abandon or defer
        leaves the message deferred.

        Raises:
            SettlementError: ``message`` is not one this receiver holds.
            RegionError: An abandon or defer the region refused.
            StoreUnavailableError: The seen-set did not answer (nothing was settled).
        """
        held = self._held.pop(id(message), None)
        if held is None:
            raise SettlementError(
                f"{operation}: this deferred message is not one this receiver returned and "
                "has not settled yet"
            )
        probe, key, number = held
        geo = self._pull.geo
        final = decision.settle in (Settle.COMPLETE, Settle.DEAD_LETTER)
        state = decision.state
        if final and key is not None and state is not None:
            reasons = [decision.recorded_reason] if state is ClaimState.DEAD_LETTERED else None
            await geo.seen.commit(
                [geo.seen_key(key)], owner=geo.owner, outcome=state, reasons=reasons
            )
        try:
            await self._apply(probe, message, decision)
        except RegionError as exc:
            if not final:
                self._held[id(message)] = held
                raise
            _log.warning(
                "%s: %s could not settle the deferred copy (%s); its outcome is recorded",
                operation,
                probe.region,
                exc,
            )
        if final:
            await self._book.forget(number)
            if key is not None and state is not None:
                await self._settle_twin(
                    key, probe.region, twin_reason(state, decision.recorded_reason)
                )

    async def _settle_twin(self, key: str, region: str, decision: Decision) -> None:
        twin = await self._book.take_twin(key)
        if twin is None or twin[0] == region:
            return
        probes = {probe.region: probe for probe in self._pull.regions}
        probe = probes.get(twin[0])
        if probe is None:
            return
        try:
            (copy,) = await self._fetch(probe, [twin[1]], None)
            self._held.pop(id(copy), None)
            await self._apply(probe, copy, decision)
        except (RegionError, ValueError) as exc:
            _log.warning(
                "the deferred twin in %s could not be settled (%s): it stays deferred there",
                twin[0],
                exc,
            )

    async def _apply(self, probe: SettleProbe, message: Any, decision: Decision) -> None:
        with bounded_call(self._pull.clock, probe.region, "a settlement"):
            await probe.call(partial(decision.apply, message=message))

    async def renew_lock(self, message: Any) -> float | None:
        """Renew the lock of a deferred message :meth:`receive` returned.

        Raises:
            SettlementError: Not one this receiver holds.
            RegionError: The region refused or did not answer.
        """
        held = self._held.get(id(message))
        if held is None:
            raise SettlementError("renew_message_lock: not a deferred message this receiver holds")
        probe = held[0]
        with bounded_call(self._pull.clock, probe.region, "a lock renewal"):
            expiry: float | None = await probe.call(lambda region: region.renew_lock(message))
            return expiry


async def settle_found(
    clock: Clock, probe: SettleProbe, found: list[tuple[Any, ClaimState]]
) -> None:
    """Settle deferred copies a sweep of ``probe``'s region found with a final key (the
    key was processed or dead-lettered from the other region since): complete them, or
    dead-letter them as twins. The pull receiver's ``settle_deferred``."""
    receive_deferred = getattr(probe.inner, "receive_deferred", None)
    if receive_deferred is None:
        return
    for peeked, state in found:
        number = int(peeked.sequence_number)
        decision = twin_reason(state, None)
        try:
            with bounded_call(clock, probe.region, "a deferred receive"):
                copies: list[Any] = await probe.call(partial(_deferred, receive_deferred, number))
            for copy in copies:
                with bounded_call(clock, probe.region, "a settlement"):
                    await probe.call(partial(_apply_to, copy, decision))
        except RegionError as exc:
            _log.debug("settling deferred copy %d in %s failed: %s", number, probe.region, exc)


async def _deferred(receive_deferred: Any, number: int, region: Any) -> Any:
    return await receive_deferred([number])


async def _apply_to(message: Any, decision: Decision, region: Any) -> None:
    if decision.settle is Settle.COMPLETE:
        await region.complete(message)
    elif decision.settle is Settle.DEAD_LETTER:
        await region.dead_letter(message, decision.reason, decision.description)
