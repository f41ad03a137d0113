"""Roles shared by every process of one application, through a :class:`RoleStore`.

A :class:`SharedRoles` keeps one process's :class:`georep.RoleState` in step with the
entity's record in the store: it reads the record in the background (every
``refresh_interval``, so sends never wait for the store), and a swap becomes one
compare-and-set on the generation in the store. When the store cannot be reached the
process goes on with its own roles, says so once, and follows the store again as soon as
it answers. :class:`InMemoryRoleStore` is the store for one process and for tests;
``georep.adapters.redis.RedisRoleStore`` shares the roles between processes.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_REFRESH_INTERVAL",
    "ROLE_COUNTERS",
    "InMemoryRoleStore",
    "SharedRoles",
    "shared_role_state",
    "who_am_i",
]

import asyncio
import getpass
import logging
import os
import secrets
import socket
import weakref
from collections.abc import Mapping
from typing import Final, Literal

from opentelemetry import metrics

from georep._clock import SystemClock
from georep._lifecycle import start_task, stop_task
from georep._policy import positive_seconds
from georep._telemetry import Instruments, InstrumentSpec
from georep.exceptions import StoreUnavailableError
from georep.ports import Clock, RoleChangeTerms, RoleRecord, RoleStore
from georep.roles.state import DEPART, FailoverEvidence, RoleSnapshot, RoleState

_log = logging.getLogger("georep.roles")

#: Seconds between two reads of the shared record: every process obeys a change within
#: this time plus one round trip.
DEFAULT_REFRESH_INTERVAL: Final = 0.25

ROLE_COUNTERS: Final = {
    "fallbacks": InstrumentSpec(
        "georep.roles.store_fallbacks",
        "{fallback}",
        "Times a process lost the shared role store and went on with its own roles.",
    ),
    "rejoins": InstrumentSpec(
        "georep.roles.store_rejoins",
        "{rejoin}",
        "Times a process reached the shared role store again and followed its roles.",
    ),
}
"""The shared roles' counters."""

ROLES_SHARED: Final = InstrumentSpec(
    "georep.roles.shared",
    "{process}",
    "1 while this process follows the shared role store for the entity, 0 while it uses "
    "its own roles (the store is unreachable).",
)

ROLES_DEPARTED: Final = InstrumentSpec(
    "georep.roles.departed",
    "{process}",
    "1 while this process sends to the backup on its own, after a failover the "
    "corroboration rule did not back (the other processes stay on the shared roles).",
)


def who_am_i(what: str) -> str:
    """``user@host pid N (what)``: who a role change is recorded as made by."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no login name in some containers
        user = "unknown"
    return f"{user}@{socket.gethostname()} pid {os.getpid()} ({what})"


_PROCESS_TOKEN: Final = secrets.token_hex(4)


def reporter_id() -> str:
    """This process in failure reports: host, pid and a random token (two containers may
    share a host name and a pid)."""
    return f"{socket.gethostname()} pid {os.getpid()} {_PROCESS_TOKEN}"


class InMemoryRoleStore:
    """A :class:`georep.ports.RoleStore` in this process's memory.

    For one process (every sender of the process shares it) and for tests; processes
    that should share roles use ``georep.adapters.redis.RedisRoleStore``.

    Args:
        refresh_interval: Seconds between two background reads of a record. Default 0.25.
        operation_timeout: Most seconds one store call may take. Default 1.

    Attributes:
        records: Entity → its record.
        reports: (entity, region, generation) → reporter → when it reported the region
            failing (:meth:`report_failure`).
        calls: Calls made so far.
        unavailable: Set it (tests) to make every call raise ``StoreUnavailableError``,
            as an unreachable Redis does.
    """

    def __init__(
        self,
        *,
        refresh_interval: float = DEFAULT_REFRESH_INTERVAL,
        operation_timeout: float = 1.0,
    ) -> None:
        self.refresh_interval = positive_seconds(refresh_interval, "refresh_interval")
        self.operation_timeout = positive_seconds(operation_timeout, "operation_timeout")
        self.records: dict[str, RoleRecord] = {}
        self.reports: dict[tuple[str, str, int], dict[str, float]] = {}
        self.calls = 0
        self.unavailable = False

    def _check(self) -> None:
        self.calls += 1
        if self.unavailable:
            raise StoreUnavailableError("role store: unavailable (InMemoryRoleStore.unavailable)")

    async def read(self, entity: str) -> RoleRecord | None:
        self._check()
        return self.records.get(entity)

    async def create(self, entity: str, record: RoleRecord) -> RoleRecord:
        self._check()
        return self.records.setdefault(entity, record)

    async def change(self, entity: str, terms: RoleChangeTerms) -> tuple[bool, RoleRecord]:
        self._check()
        changed, record = terms.apply(self.records.get(entity))
        if changed:
            self.records[entity] = record
        return changed, record

    async def entities(self) -> list[str]:
        self._check()
        return sorted(self.records)

    async def delete(self, entity: str) -> bool:
        self._check()
        return self.records.pop(entity, None) is not None

    async def report_failure(
        self, entity: str, *, region: str, generation: int, reporter: str, now: float, window: float
    ) -> int:
        self._check()
        reports = self.reports.setdefault((entity, region, generation), {})
        reports[reporter] = now
        for name, at in list(reports.items()):
            if at < now - window:
                del reports[name]
        return len(reports)

    async def aclose(self) -> None:
        return None


class SharedRoles:
    """Keeps one :class:`RoleState` in step with its entity's record in a role store.

    Args:
        store: The shared role store.
        entity: The record's name (the queue, topic or service).
        state: The process's role state, whose ``active`` values are local names (a
            namespace for a GeoSender, an endpoint label for a FailoverChannel).
        names: Region label in the store → the local name it stands for.
        clock: Time source.
        meter_provider: OpenTelemetry meter provider (None: the global one).
        mode: How the owner replicates (``"active"``, ``"passive"``; ``""`` unknown):
            written into a record this link creates, so that ``georep failover`` can
            tell an active-mode entity (nothing to move) from a passive one.
    """

    def __init__(
        self,
        store: RoleStore,
        entity: str,
        state: RoleState,
        *,
        names: Mapping[str, str],
        clock: Clock,
        meter_provider: metrics.MeterProvider | None = None,
        mode: str = "",
    ) -> None:
        self.store = store
        self.entity = entity
        self.state = state
        self.mode = mode
        self._mode_warned = False
        self._local = dict(names)
        self._label = {local: label for label, local in names.items()}
        self._clock = clock
        self._who = who_am_i("automatic failover")
        self.record: RoleRecord | None = None
        self._departed_record: RoleRecord | None = None
        self.reporter = reporter_id()
        """How this process signs its failure reports (``Corroboration(reports=N)``)."""
        self.fallbacks = 0
        self.rejoins = 0
        self._holders = 0
        self._poller: asyncio.Task[None] | None = None
        self._run: object | None = None
        """The current run of the background refresh (None: stopped); its loop's flag."""
        self._unknown_warned: set[str] = set()
        instruments = Instruments.of(meter_provider)
        self._counters = instruments.counters(ROLE_COUNTERS)
        self._attributes = {"georep.entity": entity}
        instruments.gauge_of(ROLES_SHARED, combine=min).add(self, _shared_value, self._attributes)
        instruments.gauge_of(ROLES_DEPARTED, combine=max).add(
            self, _departed_value, self._attributes
        )
        state.link(self)

    @property
    def _timeout(self) -> float:
        return float(getattr(self.store, "operation_timeout", 1.0))

    @property
    def _interval(self) -> float:
        return float(getattr(self.store, "refresh_interval", DEFAULT_REFRESH_INTERVAL))

    # -- lifecycle ---------------------------------------------------------------------
    def hold(self) -> None:
        """One more user: start the background refresh with the first."""
        self._holders += 1
        if self._poller is None or self._poller.done():
            run = self._run = object()
            self._poller = start_task(self._poll(run), name=f"georep-roles {self.entity}")

    async def release(self) -> None:
        """One user fewer: stop the background refresh with the last (flag, cancel, and a
        bounded wait)."""
        self._holders = max(0, self._holders - 1)
        poller = self._poller
        if self._holders == 0 and poller is not None:
            self._poller = None
            self._run = None
            await stop_task(poller, clock=self._clock)

    async def _poll(self, run: object) -> None:
        # The flag (this run still the current one), not only the cancellation, ends the
        # loop: a cancel that lands as the store call's deadline expires comes out of the
        # deadline as TimeoutError, which refresh() takes for an unavailable store, and the
        # loop would go on.
        while self._run is run:
            try:
                await self.refresh()
            except Exception:  # a store that answers nonsense: said, and read again later
                _log.exception(
                    "reading the shared roles of %s failed; reading again in %g s",
                    self.entity,
                    self._interval,
                )
            if self._run is not run:
                return
            await self._clock.sleep(self._interval)

    # -- store calls -------------------------------------------------------------------
    async def refresh(self) -> None:
        """Read the record (creating it from the local roles if absent) and follow it."""
        current = self.state.current
        try:
            with self._clock.deadline(self._timeout):
                record = await self.store.read(self.entity)
                if record is None:
                    record = await self.store.create(self.entity, self._initial(current))
        except (StoreUnavailableError, TimeoutError, OSError) as exc:
            self._lost(exc)
            return
        self._follow(record)

    async def propose(
        self,
        expected: RoleSnapshot,
        new_active: str,
        evidence: FailoverEvidence | None = None,
    ) -> bool | Literal["depart"] | None:
        """The compare-and-set in the store; None when it could not be made (swap
        locally); :data:`georep.roles.state.DEPART` when ``evidence`` does not corroborate a
        move of every process (this process moves alone)."""
        if self.state.shared is not True or self.record is None:
            return None
        try:
            with self._clock.deadline(self._timeout):
                if evidence is not None:
                    refusal = await self._uncorroborated(expected, evidence)
                    if refusal is not None:
                        self._depart(expected, new_active, refusal, evidence)
                        return DEPART
                terms = RoleChangeTerms(
                    expected.generation, self._label[new_active], self._who, self._clock.time()
                )
                swapped, record = await self.store.change(self.entity, terms)
        except (StoreUnavailableError, TimeoutError, OSError) as exc:
            self._lost(exc)
            return None
        if record.generation < 0:  # the record vanished (store flushed): recreate it
            await self.refresh()
            return None
        self._follow(record)
        return swapped

    async def _uncorroborated(
        self, expected: RoleSnapshot, evidence: FailoverEvidence
    ) -> str | None:
        """Why ``evidence`` does not corroborate moving every process off
        ``expected.active`` (None: it does). Reports the failure to the store when the
        rule counts reports."""
        rule = evidence.corroboration
        failing = self._label[expected.active]
        if rule.reached:
            ago = evidence.reached_ago
            if ago is None:
                return (
                    f"this process never reached {failing} (check its connection string, "
                    "endpoint and key for that region)"
                )
            within = rule.reached_within_seconds
            if within is not None and ago > within:
                return f"this process last reached {failing} {ago:.0f} s ago (over {within:g} s)"
        if rule.reports <= 1:
            return None
        count = await self.store.report_failure(
            self.entity,
            region=failing,
            generation=expected.generation,
            reporter=self.reporter,
            now=self._clock.time(),
            window=rule.window_seconds,
        )
        if count >= rule.reports:
            return None
        return (
            f"{count} of the {rule.reports} processes it asks for reported {failing} failing "
            f"within {rule.window_seconds:g} s"
        )

    def _depart(
        self, expected: RoleSnapshot, new_active: str, why: str, evidence: FailoverEvidence
    ) -> None:
        self._departed_record = self.record
        _log.warning(
            "%s: %s is active for this process only: %s; the other processes sharing the "
            "role store stay on %s (FailoverPolicy.corroboration: %s)",
            self.entity,
            self._label[new_active],
            why,
            self._label[expected.active],
            evidence.corroboration.describe(),
        )

    def _initial(self, current: RoleSnapshot) -> RoleRecord:
        return RoleRecord(
            active=self._label[current.active],
            generation=current.generation,
            since=self._clock.time(),
            changed_by=who_am_i("first process"),
            mode=self.mode,
        )

    def _check_mode(self, record: RoleRecord) -> None:
        """Say once when the record and this process disagree on active mode: `georep
        failover` goes by the record's mode (it refuses an active-mode entity), so a
        record left by senders of the other kind would mislead the operator. (An unknown
        mode reads as passive: the commands act on it.)"""
        if self._mode_warned or not self.mode:
            return
        if (record.mode == "active") == (self.mode == "active"):
            return
        self._mode_warned = True
        _log.warning(
            "the shared role record of %s says its senders run in %s mode, this process "
            "runs in %s mode: `georep failover` and `pin` go by the record; run `georep "
            "forget --entity %s` to have it created again by the senders now running",
            self.entity,
            record.mode or "an unknown",
            self.mode,
            self.entity,
        )

    # -- following ---------------------------------------------------------------------
    def _follow(self, record: RoleRecord) -> None:
        state = self.state
        if state.shared is False:
            self.rejoins += 1
            self._counters["rejoins"].add(1, self._attributes)
            _log.warning(
                "role store answers again: %s follows the shared roles (%s active, generation %d)",
                self.entity,
                record.active,
                record.generation,
            )
        rejoined = state.shared is not True
        state.shared = True
        self._check_mode(record)
        known = self.record
        if not rejoined and known is not None and record.generation < known.generation:
            return  # an answer older than one already followed
        local = self._local.get(record.active)
        if local is None:
            if record.active not in self._unknown_warned:
                self._unknown_warned.add(record.active)
                _log.warning(
                    "role store names %r active for %s, which is none of %s: ignored",
                    record.active,
                    self.entity,
                    ", ".join(sorted(self._local)),
                )
            return
        self.record = record
        state.pinned = record.pinned
        state.automatic = record.automatic
        if state.departed_from is not None:
            if record == self._departed_record:
                return  # nobody changed the shared record: this process keeps its own roles
            state.departed_from = None
            _log.warning(
                "%s: the shared roles changed (%s active, generation %d, by %s): this "
                "process follows them again",
                self.entity,
                record.active,
                record.generation,
                record.changed_by or "unknown",
            )
        snapshot = state.current
        if snapshot.active != local or snapshot.generation != record.generation:
            if snapshot.active != local:
                _log.warning(
                    "%s: %s is now active (generation %d, changed by %s)",
                    self.entity,
                    record.active,
                    record.generation,
                    record.changed_by or "unknown",
                )
            state.adopt(RoleSnapshot(local, record.generation))

    def _lost(self, error: BaseException) -> None:
        if self.state.shared is False:
            return
        self.state.shared = False
        self.fallbacks += 1
        self._counters["fallbacks"].add(1, self._attributes)
        _log.warning(
            "role store unreachable (%s): %s uses this process's own roles until it answers",
            error or type(error).__name__,
            self.entity,
        )


def _shared_value(link: SharedRoles) -> int | None:
    shared = link.state.shared
    return None if shared is None else int(shared)


def _departed_value(link: SharedRoles) -> int:
    return int(link.state.departed_from is not None)


_links: weakref.WeakValueDictionary[
    tuple[asyncio.AbstractEventLoop, int, str, frozenset[tuple[str, str]]], SharedRoles
] = weakref.WeakValueDictionary()


def shared_role_state(
    store: RoleStore,
    entity: str,
    *,
    names: Mapping[str, str],
    initial: str,
    clock: Clock | None = None,
    meter_provider: metrics.MeterProvider | None = None,
    mode: str = "",
) -> SharedRoles:
    """The link of ``entity``'s roles to ``store``, one per store and entity in this loop.

    Args:
        store: The shared role store.
        entity: The record's name.
        names: Region label → the local name of that region.
        initial: The local name active until the store answers.
        clock: Time source (default: the system's).
        meter_provider: OpenTelemetry meter provider.
        mode: The owner's replication mode, for a record the link creates (the first
            owner's, when several share the link).
    """
    key = (asyncio.get_running_loop(), id(store), entity, frozenset(names.items()))
    link = _links.get(key)
    if link is None or link.store is not store:
        state = RoleState(initial)
        link = SharedRoles(
            store,
            entity,
            state,
            names=names,
            clock=clock or SystemClock(),
            meter_provider=meter_provider,
            mode=mode,
        )
        _links[key] = link
    return link
