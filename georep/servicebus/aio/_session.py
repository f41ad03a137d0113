"""Session receivers of the drop-in client: one session, held in both regions.

``get_queue_receiver(q, session_id=...)`` (or ``NEXT_AVAILABLE_SESSION``) locks the session
in each region (the next available one in either region, then the same id in the other),
and pulls it through a :class:`georep.receive.pull.PullReceiver` in ``ordered`` mode: the primary's
session is read while it has messages, the secondary's when it has none or fails, so the
messages are handed out in one region's order and a failover keeps the session going. The
session's state is kept beside the seen-set (as ``GeoReceiver(sessions=True)`` keeps it,
docs/sessions.md), so both regions see one state.
"""

from __future__ import annotations

__all__ = ["Absent", "GeoSession", "SessionOwnership", "SessionRegions", "accept_in_both"]

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Final, NoReturn

from azure.servicebus.aio import ServiceBusSession
from azure.servicebus.exceptions import OperationTimeoutError, SessionCannotBeLockedError

from georep._channel import bounded_call
from georep._classify import every_region_refused
from georep._clock import SystemClock
from georep._region_identity import RegionLabels
from georep.exceptions import (
    AllRegionsUnavailableError,
    ClosedError,
    ConfigurationError,
    RegionError,
    RegionUnavailableError,
    StoreUnavailableError,
)
from georep.ports import (
    ClaimState,
    Clock,
    Delivery,
    ErrorKind,
    RegionSessions,
    SeenStore,
    SessionReceiver,
    SessionStateStore,
)
from georep.receive.pull import PullReceiver

_log = logging.getLogger("georep.servicebus")

NAMED_ACCEPT_SECONDS: Final = 10.0
"""Seconds to lock a named session (the other region's copy of one already locked)."""


class Absent(RegionLabels):
    """A region whose session could not be locked: every call fails, as an unavailable
    region's would, so the receiver reads the other region only."""

    def __init__(self, region: str, namespace: str, entity: str, why: str) -> None:
        super().__init__(region, namespace, entity)
        self._why = why

    def _fail(self) -> RegionError:
        return RegionUnavailableError(
            f"{self._region}: the session is not held in this region ({self._why})",
            region=self._region,
            kind=ErrorKind.CONNECTION,
        )

    def delivery(self, message: Any, dedup_source: str, dedup_name: str | None) -> Delivery:
        raise self._fail()

    async def receive(self, max_messages: int, *, max_wait: float) -> list[Any]:
        await asyncio.sleep(max_wait)  # as an empty region: no busy loop
        raise self._fail()

    async def peek(self, count: int) -> list[Any]:
        raise self._fail()

    async def complete(self, message: Any) -> None:
        raise self._fail()

    async def abandon(self, message: Any) -> None:
        raise self._fail()

    async def dead_letter(self, message: Any, reason: str | None, description: str | None) -> None:
        raise self._fail()

    async def defer(self, message: Any) -> None:
        raise self._fail()

    async def renew_lock(self, message: Any) -> float | None:
        raise self._fail()

    async def close(self) -> None:
        return None


class SessionRegions:
    """What a session receiver opened in the regions, closed in order: the locked sessions
    (which releases them), then each region's session entity (and its client)."""

    def __init__(self, entities: Sequence[RegionSessions], held: Sequence[Any]) -> None:
        self._entities = list(entities)
        self._held = list(held)

    async def close(self) -> None:
        for held in self._held:
            with contextlib.suppress(Exception):
                await held.close()
        for entity in self._entities:
            with contextlib.suppress(Exception):
                await entity.close()


NAMED_RETRY_SECONDS: Final = 2.0
"""Seconds a session found first in one region is tried again in the other while another
receiver holds it there: one that lost the race for it lets go within that time."""

LOST_RACE_PAUSE: Final = 0.2
"""Seconds a receiver that lost a session to another waits before it looks for the next."""

Claim = Callable[[str], Awaitable[bool]]
"""Takes a session for this receiver among every process sharing the seen-set; False when
another receiver took it first."""


SESSION_CLAIM_LEASE: Final = 60.0
"""Seconds a receiver's claim on the session it found lasts; extended each time the
session's locks are renewed, released when the receiver closes (a receiver that died
keeps it from others this long at most, about as long as its session locks)."""


class SessionOwnership:
    """Which receiver, among every process sharing the seen-set, keeps a session that
    two of them found at once (each in a different region): the first to claim it.

    Args:
        seen: The seen-set the receivers share.
        entity: The session entity's path (the claims' scope).
    """

    def __init__(self, seen: SeenStore, entity: str) -> None:
        self._seen = seen
        self._scope = entity.lower()
        self._owner = f"session-owner:{uuid.uuid4()}"
        self._key: str | None = None

    async def claim(self, session_id: str) -> bool:
        """Claim ``session_id``; False when another receiver holds it. A seen-set that does
        not answer lets this receiver keep it (as before there were claims), logged."""
        key = f"{self._scope}\nsession-owner\n{session_id}"
        try:
            [state] = await self._seen.claim([key], owner=self._owner, lease=SESSION_CLAIM_LEASE)
        except StoreUnavailableError as exc:
            _log.warning(
                "could not claim session %r in the seen-set (%s): keeping it",
                session_id,
                type(exc).__name__,
            )
            return True
        if state is ClaimState.IN_FLIGHT:
            return False
        self._key = key
        return True

    async def extend(self) -> None:
        """Keep the claim while the session is held (with its locks); never raises for the
        store."""
        if self._key is not None:
            with contextlib.suppress(StoreUnavailableError):
                await self._seen.extend([self._key], owner=self._owner, lease=SESSION_CLAIM_LEASE)

    async def release(self) -> None:
        """Let go of the claimed session (the receiver closed); never raises for the store."""
        key, self._key = self._key, None
        if key is not None:
            with contextlib.suppress(StoreUnavailableError):
                await self._seen.release([key], owner=self._owner)


async def accept_in_both(
    entities: Sequence[RegionSessions],
    session_id: str | None,
    max_wait: float,
    claim: Claim | None = None,
    clock: Clock | None = None,
) -> tuple[str, list[SessionReceiver | None], dict[str, BaseException]]:
    """Lock ``session_id`` (None: the next available one, in either region) in both regions.

    Two receivers may lock the same next available session at once, each in a different
    region: ``claim`` settles which one keeps it, and the other lets go of it and takes
    the next. The keeper tries the other region again for up to
    :data:`NAMED_RETRY_SECONDS` while the other receiver lets go. ``clock`` times those
    pauses (default: the system's).

    Returns:
        The session id, each region's locked session (None where it could not be locked),
        and the errors of the regions that failed.

    Raises:
        OperationTimeoutError: No session was available in either region (the SDK's).
        SessionCannotBeLockedError: The named session is held by another receiver in
            every region that answered (the SDK's).
        AllRegionsUnavailableError: No region answered.
    """
    errors: dict[str, BaseException] = {}

    async def accept(entity: RegionSessions, wanted: str | None, wait: float) -> Any:
        try:
            return await entity.accept(wanted, max_wait=wait)
        except RegionError as exc:
            errors[entity.region] = exc
            return None

    if session_id is not None:
        held: list[SessionReceiver | None] = list(
            await asyncio.gather(*(accept(e, session_id, max_wait) for e in entities))
        )
    else:
        clock = clock or SystemClock()
        deadline = clock.monotonic() + max_wait
        while True:
            held = await _next_available(entities, accept, max(deadline - clock.monotonic(), 0.0))
            chosen = next((h for h in held if h is not None), None)
            if chosen is None:
                return _no_session(entities, errors, session_id)
            for index, other in enumerate(held):
                if other is not None and other.session_id != chosen.session_id:
                    await other.close()  # another session: released for another receiver
                    held[index] = None
            if claim is None or await claim(chosen.session_id):
                break
            # Another receiver took it first (it holds it in the other region): it is
            # theirs. A pause lets them lock it here too before this one looks again.
            for other in held:
                if other is not None:
                    await other.close()
            if clock.monotonic() + LOST_RACE_PAUSE >= deadline:
                return _no_session(entities, errors, None)
            await clock.sleep(LOST_RACE_PAUSE)
        session_id = chosen.session_id
        for index, entity in enumerate(entities):
            if held[index] is None and entity.region not in errors:
                held[index] = await _accept_named(entity, session_id, accept, errors, clock)
    if all(h is None for h in held):
        _no_session(entities, errors, session_id)
    return str(session_id), held, errors


async def _accept_named(
    entity: RegionSessions,
    session_id: str,
    accept: Callable[[RegionSessions, str | None, float], Awaitable[Any]],
    errors: dict[str, BaseException],
    clock: Clock,
) -> Any:
    """Lock ``session_id`` in ``entity``'s region, trying again for a moment while it is
    held there by a receiver that lost the race for it."""
    until = clock.monotonic() + NAMED_RETRY_SECONDS
    while True:
        locked = await accept(entity, session_id, NAMED_ACCEPT_SECONDS)
        if locked is not None or entity.region in errors or clock.monotonic() >= until:
            return locked
        await clock.sleep(0.05)


async def _next_available(
    entities: Sequence[RegionSessions],
    accept: Callable[[RegionSessions, str | None, float], Awaitable[Any]],
    max_wait: float,
) -> list[SessionReceiver | None]:
    """Each region's next available session, until one region has one: the others' waits
    are then given up (their session would expire while they wait, unread), so at most
    one region holds a session here, unless two answered at once."""
    tasks = [asyncio.ensure_future(accept(entity, None, max_wait)) for entity in entities]
    try:
        pending: set[asyncio.Future[Any]] = set(tasks)
        while pending:
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if any(t.done() and not t.cancelled() and t.result() is not None for t in tasks):
                break
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return [
        None if task.cancelled() or task.exception() is not None else task.result()
        for task in tasks
    ]


def _no_session(
    entities: Sequence[RegionSessions], errors: dict[str, BaseException], session_id: str | None
) -> NoReturn:
    if len(errors) == len(entities):
        # Every region refused the receiver itself (its key, its entity, a session
        # receiver on an entity without sessions): the primary's refusal, as the SDK's.
        refusal = every_region_refused([errors[entity.region] for entity in entities])
        if refusal is not None:
            raise refusal
        raise AllRegionsUnavailableError("no region could lock a session", errors)
    if session_id is None:
        raise OperationTimeoutError(message="no session was available in either region")
    raise SessionCannotBeLockedError(
        message=f"session {session_id!r} is locked by another receiver in every region"
    )


class GeoSession(ServiceBusSession):
    """``receiver.session``: the session held in both regions.

    ``get_state``/``set_state`` read and write the one state both regions share (kept
    beside the seen-set); ``renew_lock`` renews the session's lock in both regions. georep
    also renews them itself while the receiver is open.
    """

    def __init__(
        self,
        session_id: str,
        receiver: object,  # its drop-in receiver (typed loosely: it imports this module)
        pull: PullReceiver,
        held: Sequence[SessionReceiver | None],
        seen: SeenStore,
    ) -> None:
        super().__init__(session_id, receiver)  # type: ignore[arg-type]
        self._pull = pull
        self._held = [h for h in held if h is not None]
        self._seen = seen
        self._stop = asyncio.Event()
        self._keeper: asyncio.Task[None] | None = None
        self._locked_until_utc = datetime.now(UTC)
        # When the session was locked: the SDK's AutoLockRenewer counts its
        # max_lock_renewal_duration from here (None failed it at once).
        self._session_start = datetime.now(UTC)  # type: ignore[assignment]  # SDK: None
        self.on_close: Callable[[], Awaitable[None]] | None = None
        """Called once the receiver lets go of the session (the seen-set claim on it)."""
        self.on_renew: Callable[[], Awaitable[None]] | None = None
        """Called each time georep renewed the session's locks."""
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:  # as the SDK's session, whose handler is shut down
            raise ClosedError(
                "this session's receiver is closed; get a new receiver for the session"
            )

    def _state_store(self) -> tuple[SessionStateStore, str]:
        store = self._seen
        if not isinstance(store, SessionStateStore):
            raise ConfigurationError(
                f"the seen-set ({type(store).__name__}) keeps no session state: use "
                "georep.adapters.redis.RedisSeenSet"
            )
        return store, self._pull.geo.seen_key(self.session_id)

    async def get_state(self, *, timeout: float | None = None, **kwargs: Any) -> bytes:
        """The session's state (None if none was set), the same from either region.

        Raises:
            StoreUnavailableError: The seen-set did not answer.
            ClosedError: The receiver was closed (a ``ValueError``, as the SDK's).
        """
        self._check_open()
        store, key = self._state_store()
        state = await store.get_session_state(key)
        return state  # type: ignore[return-value]  # None when unset, as the SDK's

    async def set_state(
        self, state: str | bytes | bytearray | None, *, timeout: float | None = None, **kwargs: Any
    ) -> None:
        """Set (None: clear) the session's state, for both regions.

        Raises:
            StoreUnavailableError: The seen-set did not answer.
            ClosedError: The receiver was closed (a ``ValueError``, as the SDK's).
        """
        self._check_open()
        store, key = self._state_store()
        value = state.encode() if isinstance(state, str) else state
        await store.set_session_state(key, None if value is None else bytes(value))

    async def renew_lock(self, *, timeout: float | None = None, **kwargs: Any) -> datetime:
        """Renew the session's lock in every region that holds it; the earliest expiry.

        Raises:
            RegionError: No region renewed it (the session lock was lost).
            ClosedError: The receiver was closed (a ``ValueError``, as the SDK's).
        """
        self._check_open()
        return await self._renew()

    async def _renew(self) -> datetime:
        probes = {p.inner: p for p in self._pull.regions}
        expiries: list[float] = []
        failures: list[RegionError] = []
        for held in self._held:
            probe = probes.get(held)
            try:
                with bounded_call(self._pull.clock, held.region, "a session lock renewal"):
                    if probe is not None:
                        expiry = await probe.renew_lock(None)
                    else:
                        expiry = await held.renew_lock(None)
            except RegionError as exc:
                failures.append(exc)
                continue
            if expiry is not None:
                expiries.append(expiry)
        if failures and not expiries:
            raise failures[0]
        if expiries:
            self._locked_until_utc = datetime.fromtimestamp(min(expiries), UTC)
        return self._locked_until_utc

    def start_keeping(self, locked_until: float | None) -> None:
        """Renew the session's locks, at half their remaining time, until the receiver
        closes (:meth:`stop_keeping`)."""
        if locked_until is not None:
            self._locked_until_utc = datetime.fromtimestamp(locked_until, UTC)
        self._keeper = asyncio.ensure_future(self._keep())

    async def _keep(self) -> None:
        clock = self._pull.clock
        while not self._stop.is_set():
            left = self._locked_until_utc.timestamp() - clock.time()
            try:
                with clock.deadline(max(left / 2, 0.5)):
                    await self._stop.wait()
                return
            except TimeoutError:
                pass
            try:
                await self._renew()
            except RegionError as exc:
                _log.warning("could not renew session %r: %s", self.session_id, exc)
                self._locked_until_utc = datetime.fromtimestamp(clock.time() + 5.0, UTC)
            if self.on_renew is not None:
                await self.on_renew()

    async def stop_keeping(self) -> None:
        """Stop renewing (the receiver closes); bounded."""
        self._closed = True
        self._stop.set()
        on_close, self.on_close = self.on_close, None
        if on_close is not None:
            await on_close()
        keeper = self._keeper
        if keeper is None:
            return
        _, late = await asyncio.wait([keeper], timeout=5.0)
        for task in late:
            task.cancel()
        await asyncio.gather(keeper, return_exceptions=True)
