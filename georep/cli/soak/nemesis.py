"""The nemesis: plays a schedule of faults (:mod:`.schedule`) against a running soak.

Each fault is one task: it waits for its start, injects the fault, waits its length and
ends it. Faults overlap. The emulator's ``restore`` ends every fault of a namespace at
once, so ending one namespace fault restores the namespace and injects again the ones
still running there. What each fault did (or why it could not) goes to :attr:`log`.
"""

from __future__ import annotations

__all__ = ["Nemesis", "Targets"]

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .schedule import NAMESPACE_FAULTS, Fault

_log = logging.getLogger("georep.soak.nemesis")

#: Faults of a number of operations (the next 1-5 sends or settlements), not of a time.
_COUNTED_FAULTS = ("drop-send-answers", "lose-settlements")

#: The session queue whose locks ``session-lock-lost`` takes.
SESSION_QUEUE = "soak-sessions"


class Targets(Protocol):
    """What the nemesis hits: the runner implements it."""

    def namespace(self, region: str) -> Any:
        """The emulator's ``NamespaceControl`` of ``region``."""

    def kill(self, group: str, index: int) -> str:
        """SIGKILL process ``index`` (modulo) of ``group`` (``sender``/``receiver``); its name."""

    def restart(self, name: str) -> None:
        """Start the killed (or stopped) process ``name`` again."""

    def stop(self, index: int) -> tuple[str, float | None]:
        """SIGTERM process ``index`` (modulo) of every live one and wait, bounded, for it to
        exit: its name and the seconds it took (None: it did not exit and was killed)."""

    def fragment(self, target: int) -> tuple[str, int]:
        """The partitioned entity and the fragment (0-15) a ``fragment-down`` fault of
        ``target`` takes down."""

    def roles(self) -> Any:
        """A ``RoleCommands`` on the soak's role store."""

    def redis(self, target: int) -> Any:
        """The Redis server a fault of ``target`` hits (``name``, ``restart``, ``pause``,
        ``resume``): the soak's own, or a node of the seen-set's cluster."""

    def outbox_disk_full(self, full: bool) -> int:
        """Fill the senders' outbox disk (the bytes it took), or give its space back."""


@dataclass
class Nemesis:
    """Plays ``schedule`` against ``targets``: each fault ``at`` seconds (of ``clock``)
    after :meth:`run` starts."""

    schedule: Sequence[Fault]
    targets: Targets
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Any] = asyncio.sleep
    call: Callable[..., Awaitable[Any]] = asyncio.to_thread
    """How a blocking call (the emulator's control endpoint, Redis) is run off the loop."""
    log: list[dict[str, Any]] = field(default_factory=list)
    _running: dict[str, list[Fault]] = field(default_factory=lambda: defaultdict(list))
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def run(self) -> None:
        """Play every fault; return when the last one has ended."""
        started = self.clock()
        await asyncio.gather(*(self._play(fault, started) for fault in self.schedule))

    async def _play(self, fault: Fault, started: float) -> None:
        await self.sleep(max(0.0, started + fault.at - self.clock()))
        entry: dict[str, Any] = {**fault.as_dict(), "began": time.time()}
        self.log.append(entry)
        try:
            undo = await self._begin(fault, entry)
        except Exception as exc:  # a refused operator command, Redis down...: logged, not fatal
            entry["error"] = f"{type(exc).__name__}: {exc}"
            _log.info("fault %s could not begin: %s", fault.kind, entry["error"])
            undo = None
        await self.sleep(max(0.0, started + fault.ends - self.clock()))
        if undo is not None:
            try:
                await undo()
            except Exception as exc:
                entry["end_error"] = f"{type(exc).__name__}: {exc}"
        entry["ended"] = time.time()

    async def _begin(self, fault: Fault, entry: dict[str, Any]) -> Callable[[], Any] | None:
        """Inject ``fault``; the coroutine function that ends it (None: nothing to end)."""
        targets, kind = self.targets, fault.kind
        if kind == "fragment-down":
            entry["entity"], entry["fragment"] = targets.fragment(fault.target)
        if kind in NAMESPACE_FAULTS or kind in _COUNTED_FAULTS:
            return await self._namespace_fault(fault)
        if kind == "session-lock-lost":
            control = targets.namespace(fault.region)
            entry["locks_lost"] = await self.call(control.expire_session_locks, SESSION_QUEUE)
            return None
        if kind in ("kill-sender", "kill-receiver"):
            name = targets.kill(kind.removeprefix("kill-"), fault.target)
            entry["process"] = name

            async def restart() -> None:
                targets.restart(name)

            return restart
        if kind == "stop-worker":
            name, seconds = await self.call(targets.stop, fault.target)
            entry["process"], entry["exit_seconds"] = name, seconds

            async def start_again() -> None:
                targets.restart(name)

            return start_again
        if kind in ("failover", "failback", "pin"):
            return await self._operator(fault, entry)
        if kind == "redis-restart":
            server = targets.redis(fault.target)
            entry["server"] = server.name
            await self.call(server.restart)
            return None
        if kind == "redis-unreachable":
            server = targets.redis(fault.target)
            entry["server"] = server.name
            server.pause()

            async def resume() -> None:
                server.resume()

            return resume
        if kind == "full-outbox-disk":
            entry["bytes"] = await self.call(targets.outbox_disk_full, True)

            async def give_back() -> None:
                await self.call(targets.outbox_disk_full, False)

            return give_back
        raise ValueError(f"the nemesis cannot inject {kind!r}")

    async def _namespace_fault(self, fault: Fault) -> Callable[[], Any]:
        region = fault.region
        async with self._lock:
            self._running[region].append(fault)
            await self.call(self._inject, fault)

        async def end() -> None:
            async with self._lock:
                self._running[region].remove(fault)
                control = self.targets.namespace(region)
                await self.call(control.restore)
                for other in self._running[region]:
                    if other.kind not in _COUNTED_FAULTS:  # spent, or still counting
                        await self.call(self._inject, other)

        return end

    def _inject(self, fault: Fault) -> None:
        control = self.targets.namespace(fault.region)
        if fault.kind == "outage":
            control.outage()
        elif fault.kind == "blackhole":
            control.blackhole()
        elif fault.kind == "reject-sends":
            control.reject_sends("server-busy")
        elif fault.kind == "latency":
            control.latency(fault.amount)
        elif fault.kind == "fragment-down":
            control.fragment_down(*self.targets.fragment(fault.target))
        elif fault.kind == "lose-settlements":
            control.lose_settlements(1 + fault.target % 5)
        else:  # drop-send-answers
            control.drop_dispositions(1 + fault.target % 5)

    async def _operator(self, fault: Fault, entry: dict[str, Any]) -> Callable[[], Any] | None:
        commands = self.targets.roles()
        if fault.kind == "failover":
            entry["changes"] = len(await commands.failover("secondary"))
            return None
        if fault.kind == "failback":
            entry["changes"] = len(await commands.failover("secondary"))

            async def failback() -> None:
                entry["failback_changes"] = len(await self.targets.roles().failback())

            return failback
        entry["changes"] = len(await commands.pin(fault.region))

        async def unpin() -> None:
            entry["unpin_changes"] = len(await self.targets.roles().unpin())

        return unpin
