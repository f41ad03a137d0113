"""An in-memory :class:`georep.ports.SeenStore` for unit tests: Redis's rules, an injected clock."""

from __future__ import annotations

__all__ = ["InMemorySeenSet"]

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

from georep._clock import SystemClock
from georep._policy import positive_seconds
from georep.exceptions import StoreUnavailableError
from georep.ports import Claims, ClaimState, Clock
from georep.receive.dedup import _SeenSetBase


@dataclass(frozen=True, slots=True)
class _Entry:
    owner: str | None
    """Who holds the claim; None once the key has a final outcome."""
    expires_at: float
    """On the clock's ``monotonic()``; the entry is gone once the clock is past it."""
    outcome: ClaimState = ClaimState.DONE
    """The final outcome recorded (meaningful once ``owner`` is None)."""
    reason: str = ""
    """The dead-letter reason recorded with ``DEAD_LETTERED``."""


class InMemorySeenSet(_SeenSetBase):
    """Behaves like :class:`georep.adapters.redis.RedisSeenSet` but lives in a dict.

    Leases and the window run on ``clock.monotonic()``, so a test moves them with
    :meth:`georep.testing.FakeClock.advance` instead of sleeping. Not shared between
    processes: for unit tests only.

    Args:
        window: How long a committed key stays done, in seconds or a ``timedelta``.
            Default 24 hours.
        clock: Time source; defaults to the system clock.

    Attributes:
        unavailable: Set to True to make every call raise
            :class:`~georep.exceptions.StoreUnavailableError`, as an unreachable Redis
            would; set it back to False to "restore" the store.
        round_trips: Calls that went to the store (non-empty ones), failed ones included.

    Every method follows :class:`georep.ports.SeenStore` (its docstrings are the
    reference); besides, a call raises :class:`~georep.exceptions.StoreUnavailableError`
    while ``unavailable`` is set and :class:`~georep.exceptions.ClosedError` once closed.

    Raises:
        ConfigurationError: ``window`` is not positive.
    """

    def __init__(
        self, *, window: float | timedelta = timedelta(hours=24), clock: Clock | None = None
    ) -> None:
        self._window = positive_seconds(window, "window")
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._entries: dict[str, _Entry] = {}
        self._states: dict[str, bytes] = {}
        self._schedules: dict[tuple[str, int], tuple[float, bytes]] = {}
        self._sweep_at = 1024
        self.unavailable = False
        self.round_trips = 0

    @property
    def window(self) -> float:
        """Seconds a committed key stays done."""
        return self._window

    async def claim(self, keys: Sequence[str], *, owner: str, lease: float) -> list[ClaimState]:
        """Claim each key for ``owner`` for ``lease`` seconds (> 0); states in key order."""
        lease = positive_seconds(lease, "lease")
        states = Claims()
        now = self._begin(keys)
        if now is None:
            return states
        for index, key in enumerate(keys):
            entry = self._live(key, now)
            if entry is None or entry.owner == owner:
                self._entries[key] = _Entry(owner, now + lease)
                states.append(ClaimState.CLAIMED)
            elif entry.owner is None:
                states.append(entry.outcome)
                if entry.outcome is ClaimState.DEAD_LETTERED:
                    states.reasons[index] = entry.reason
            else:
                states.append(ClaimState.IN_FLIGHT)
        return states

    async def _commit(
        self, keys: Sequence[str], owner: str, outcome: ClaimState, reasons: list[str]
    ) -> None:
        now = self._begin(keys)
        if now is None:
            return
        expires_at = now + self._window
        for key, reason in zip(keys, reasons, strict=True):
            self._entries[key] = _Entry(None, expires_at, outcome, reason)

    async def release(self, keys: Sequence[str], *, owner: str) -> None:
        """Drop ``owner``'s claims on the keys; done keys and others' claims stay."""
        now = self._begin(keys)
        if now is None:
            return
        for key in keys:
            entry = self._live(key, now)
            if entry is not None and entry.owner == owner:
                del self._entries[key]

    async def peek(self, keys: Sequence[str]) -> list[ClaimState | None]:
        """The keys' states without claiming them (None: no entry; IN_FLIGHT: claimed)."""
        now = self._begin(keys)
        if now is None:
            return []
        states: list[ClaimState | None] = []
        for key in keys:
            entry = self._live(key, now)
            if entry is None:
                states.append(None)
            else:
                states.append(ClaimState.IN_FLIGHT if entry.owner is not None else entry.outcome)
        return states

    async def extend(self, keys: Sequence[str], *, owner: str, lease: float) -> list[bool]:
        """Renew ``owner``'s claims for ``lease`` seconds (> 0); False where it lost one."""
        lease = positive_seconds(lease, "lease")
        renewed: list[bool] = []
        now = self._begin(keys)
        if now is None:
            return renewed
        for key in keys:
            entry = self._live(key, now)
            held = entry is not None and entry.owner == owner
            if held:
                self._entries[key] = _Entry(owner, now + lease)
            renewed.append(held)
        return renewed

    async def get_session_state(self, key: str) -> bytes | None:
        """The session state stored under ``key`` (never expires)."""
        self._begin([key])
        return self._states.get(key)

    async def set_session_state(self, key: str, state: bytes | None) -> None:
        """Store (None: delete) the session state under ``key``."""
        self._begin([key])
        if state is None:
            self._states.pop(key, None)
        else:
            self._states[key] = bytes(state)

    async def keep_schedules(
        self, scope: str, entries: Mapping[int, bytes], *, expires_at: float
    ) -> None:
        """Store each scheduled message's entry until ``expires_at`` (the clock's ``time()``)."""
        self._begin(["schedules"])
        for number, value in entries.items():
            self._schedules[scope, number] = (expires_at, bytes(value))

    async def find_schedules(self, scope: str, numbers: Sequence[int]) -> list[bytes | None]:
        """The entries stored for ``numbers`` (None: none, or expired)."""
        self._begin(["schedules"])
        now = self._clock.time()
        found: list[bytes | None] = []
        for number in numbers:
            entry = self._schedules.get((scope, number))
            found.append(entry[1] if entry is not None and now <= entry[0] else None)
        return found

    async def drop_schedules(self, scope: str, numbers: Sequence[int]) -> None:
        """Forget the entries of ``numbers``."""
        self._begin(["schedules"])
        for number in numbers:
            self._schedules.pop((scope, number), None)

    async def _close(self) -> None:
        # The keys are dropped, as a store nobody reaches again.
        self._entries.clear()

    def _begin(self, keys: Sequence[str]) -> float | None:
        """Checks shared by every call: the clock's time, or None when there is nothing to
        do (no round trip)."""
        self._check_open()
        if not keys:
            return None
        self.round_trips += 1
        if self.unavailable:
            raise StoreUnavailableError("seen set: in-memory store is unavailable (test outage)")
        if len(self._entries) >= self._sweep_at:
            self._sweep()
        return self._clock.monotonic()

    def _live(self, key: str, now: float) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is not None and now > entry.expires_at:  # Redis keeps a key up to its PX
            del self._entries[key]
            return None
        return entry

    def _sweep(self) -> None:
        # Expired keys nobody asks about again would pile up; drop them in bulk, at most as
        # often as the dict doubles, so the cost stays proportional to the keys stored.
        now = self._clock.monotonic()
        self._entries = {k: e for k, e in self._entries.items() if now <= e.expires_at}
        self._sweep_at = max(1024, 2 * len(self._entries))
