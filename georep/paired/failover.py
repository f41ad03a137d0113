"""When a PairedSender's entity is failed over, and when it is back (SPEC §3).

Every PairedSender on a namespace pair shares one :class:`PairedState` per entity. A failure
the paired timer counts starts (or continues) a failure streak; once the streak has lasted
``failover_interval`` with no successful send, failover engages: sends go to the backlog
queues, and one task pings the primary every ``ping_primary_interval`` until it has
answered every ping for ``failback_after``. With a role store, engaging and disengaging
are swaps of the shared roles (``secondary`` active while engaged), which every process
follows.

The pinger is the entity's, not one sender's: it pings through the first sender still open,
and only the last sender of the entity to close stops it (closing one sender must not leave
the others engaged, sending to the backlog, with nobody pinging).
"""

from __future__ import annotations

__all__ = ["PairedFailover", "PairedState", "paired_state"]

import asyncio
import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import metrics

from georep._channel import RegionChannel
from georep._classify import PAIRED_FAILOVER_KINDS
from georep._lifecycle import start_task, stop_task
from georep.exceptions import RegionError
from georep.paired.options import PairedNamespaceOptions
from georep.ports import Clock, RegionSender
from georep.roles.state import RoleSnapshot, RoleState

_log = logging.getLogger("georep.paired")


@dataclass
class PairedState:
    """Failover state of one entity, shared by every PairedSender on the pair.

    Attributes:
        failing_since: Monotonic time of the first failure of the current streak.
        engaged: Sends go to the backlog queues.
        excluded: Backlog queues pulled from the rotation after a failed send, each with
            the monotonic time it rejoins (``ping_primary_interval`` later): one slow send
            must not take a backlog queue away for the rest of an outage.
        roles: With a role store: the shared roles, ``secondary`` active while engaged.
        generation: Engagements and disengagements so far (without a role store: the
            session order stamps' generation).
        members: The failover parts of the entity's open senders; the first one's channel
            carries the pings.
        pinger: The entity's pinger while one runs.
    """

    failing_since: float | None = None
    engaged: bool = False
    generation: int = 0
    excluded: dict[int, float] = field(default_factory=dict)
    pinger: Pinger | None = None
    roles: RoleState | None = None
    members: list[PairedFailover] = field(default_factory=list)
    unfollow: Callable[[], None] | None = None


@dataclass(eq=False)
class Pinger:
    """One run of an entity's pinger: its task, and the flag that stops it.

    The flag, not only the cancellation, ends the loop: a cancel that lands as a ping's
    deadline expires comes out of the channel as a failed ping, and the loop would go on.
    """

    task: asyncio.Task[None] | None = None
    stopped: bool = False

    def task_done(self) -> bool:
        return self.task is None or self.task.done()


_states: weakref.WeakValueDictionary[
    tuple[asyncio.AbstractEventLoop | None, str, str, str], PairedState
] = weakref.WeakValueDictionary()


def paired_state(primary: RegionSender, secondary_namespace: str) -> PairedState:
    """The state of ``primary``'s entity on its namespace pair, one per pair and entity in
    this event loop (kept while a PairedSender holds it)."""
    try:
        loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    key = (loop, primary.namespace, secondary_namespace, primary.entity)
    state = _states.get(key)
    if state is None:
        state = _states[key] = PairedState()
    return state


class PairedFailover:
    """One PairedSender's part in its entity's failover: the timer and the pinger.

    Args:
        state: The entity's shared state.
        main: The channel to the entity in the primary namespace (the pings go there).
        options: The paired namespaces' settings (intervals, ping timeout).
        clock: Time source.
        make_ping: Builds a ping message.
        pings: The ``georep.paired.pings`` counter (pings are billed).
        roles: The shared roles (joined on first use), None without a role store.
    """

    def __init__(
        self,
        state: PairedState,
        main: RegionChannel[RegionSender],
        *,
        options: PairedNamespaceOptions,
        clock: Clock,
        make_ping: Callable[[], Any],
        pings: metrics.Counter,
        roles: Callable[[], RoleState | None],
    ) -> None:
        self.state = state
        self.pings = 0
        """Pings this sender sent."""
        self._pings = pings
        self._main = main
        self._entity = main.client.entity
        self._options = options
        self._clock = clock
        self._make_ping = make_ping
        self._roles = roles
        self._stopped = False
        state.members.append(self)

    def follow(self, roles: RoleState) -> None:
        """From now on, engaged exactly while ``roles`` has the secondary active."""
        state = self.state
        if state.roles is not roles:
            if state.unfollow is not None:
                state.unfollow()
            state.roles = roles
            state.unfollow = roles.on_change(self._roles_changed)
            if roles.current.active == "secondary":
                self._roles_changed(roles.current)

    def _roles_changed(self, snapshot: RoleSnapshot) -> None:
        if snapshot.active == "secondary":
            self._engage("%s: failover engaged (shared roles): sending to backlog queues")
        elif self.state.engaged:
            self._disengage("%s: failover disengaged (shared roles): sending to it")

    def succeeded(self) -> None:
        """The primary accepted a send: the failure streak ends."""
        self.state.failing_since = None

    async def failed(self, error: RegionError) -> None:
        """Run the failover timer; engage when it has run ``failover_interval``."""
        # Not auth, not server-busy, not the message's own fault (SPEC §3; the table).
        if error.kind not in PAIRED_FAILOVER_KINDS:
            return
        state = self.state
        now = self._clock.monotonic()
        if state.failing_since is None:
            state.failing_since = now
        interval = self._options.seconds("failover_interval")
        if now - state.failing_since < interval:
            return
        roles = self._roles()
        if roles is not None:  # one compare-and-set for every process; the listener engages
            await roles.swap(expected=roles.current, new_active="secondary")
        elif not state.engaged:
            self._engage(f"%s unavailable for {interval:.0f} s: sending to backlog queues")

    def _engage(self, message: str) -> None:
        """Engage (logging ``message`` with the entity), and ping until the primary is back."""
        state = self.state
        if not state.engaged:
            state.engaged = True
            state.generation += 1
            state.excluded.clear()
            _log.warning(message, self._entity)
        self._start_pinger()

    def ensure_pinging(self) -> None:
        """While engaged, make sure the entity's pinger runs: a sender that joins an entity
        whose senders all closed while it was engaged (their pinger stopped with the last
        of them) starts it again, or it would stay engaged for good."""
        if self.state.engaged and not self._stopped:
            self._start_pinger()

    def _start_pinger(self) -> None:
        """Start the entity's pinger, unless one runs or no sender of the entity is open."""
        state = self.state
        running = state.pinger
        if not state.members or (running is not None and not running.task_done()):
            return
        pinger = state.pinger = Pinger()
        pinger.task = start_task(
            _ping_until_back(state, pinger), name=f"georep-ping {self._entity}"
        )

    def _disengage(self, message: str) -> None:
        if self.state.engaged:
            self.state.generation += 1
        self.state.engaged = False
        self.state.failing_since = None
        _log.warning(message, self._entity)

    async def _ping_round(self, healthy_since: float | None) -> float | None:
        """One ping through this sender's channel; returns since when the primary has
        answered every ping (None: the last ping failed)."""
        roles = self._roles()
        if roles is not None and (roles.pinned or not roles.automatic):
            return healthy_since  # an operator engaged it: only an operator disengages it
        self.pings += 1
        self._pings.add(1, {"messaging.destination.name": self._entity})
        try:
            timeout = self._options.seconds("ping_timeout")
            await self._main.call(timeout, self._main.client.send, self._make_ping())
        except RegionError as exc:
            _log.info("ping of %s failed: %s", self._entity, exc)
            return None
        now = self._clock.monotonic()
        healthy_since = now if healthy_since is None else healthy_since
        if now - healthy_since < self._options.seconds("failback_after"):
            return healthy_since  # answering, not yet for long enough
        if roles is not None:
            # The listener disengages (also when another process did first).
            await roles.swap(expected=roles.current, new_active="primary")
        else:
            self._disengage("%s answers pings again: sending to it")
        return healthy_since

    async def stop(self) -> None:
        """This sender leaves the entity's failover: the last one to leave stops the
        pinger (flag, cancel, bounded wait); while others remain, it goes on pinging
        through theirs."""
        if self._stopped:
            return
        self._stopped = True
        state = self.state
        if self in state.members:
            state.members.remove(self)
        if state.members:
            return
        if state.unfollow is not None:
            state.unfollow()
            state.unfollow = None
            state.roles = None
        pinger, state.pinger = state.pinger, None
        if pinger is not None:
            pinger.stopped = True
            await stop_task(pinger.task, clock=self._clock)


async def _ping_until_back(state: PairedState, pinger: Pinger) -> None:
    """Ping the primary every ``ping_primary_interval``; once it has answered every ping
    for ``failback_after`` (the first success, by default), failover ends.

    Each round pings through the first of the entity's senders still open (its channel,
    settings and roles); none left, or the flag set: the loop ends. A round that fails
    for a reason other than the primary's answer is logged and the next one runs: a dead
    pinger would leave the entity engaged until the process restarts.
    """
    healthy_since: float | None = None
    while state.engaged and not pinger.stopped and state.members:
        member = state.members[0]
        await member._clock.sleep(member._options.seconds("ping_primary_interval"))
        if pinger.stopped or not state.members:
            return
        member = state.members[0]
        try:
            healthy_since = await member._ping_round(healthy_since)
        except Exception:
            healthy_since = None
            _log.exception("pinging %s failed; trying again next interval", member._entity)
