"""The nemesis's schedule: which faults, when, for how long, drawn from a seed.

Pure and deterministic: :func:`draw_schedule` with the same seed, length and kinds gives
the same list of :class:`Fault` every time, so a failing seed replays the same faults
(``georep soak --seed N``). Every kind asked for is drawn at least once (when the run is
long enough to hold one of each), the rest at random; faults may overlap, at most
``max_overlap`` at a time.
"""

from __future__ import annotations

__all__ = [
    "FAULT_KINDS",
    "NAMESPACE_FAULTS",
    "Fault",
    "check_kinds",
    "draw_schedule",
]

import random
from dataclasses import asdict, dataclass
from typing import Any, Final

from georep.exceptions import ConfigurationError

#: Faults the emulator injects into one namespace (region), as long as they last.
NAMESPACE_FAULTS: Final = ("outage", "blackhole", "reject-sends", "latency", "fragment-down")

#: Every fault kind the nemesis knows, with what it does.
FAULT_KINDS: Final[dict[str, str]] = {
    "outage": "a region refuses connections and drops its own (data kept)",
    "blackhole": "a region accepts connections and never answers",
    "reject-sends": "a region rejects every send (server-busy)",
    "latency": "a region answers everything 0.3-1.5 s late",
    "drop-send-answers": "a region stores the next sends but never answers them",
    "lose-settlements": "a region loses the next receivers' settlements (never applied)",
    "session-lock-lost": "every session lock on the session queue is lost, in one region",
    "fragment-down": "one fragment of a partitioned queue is down in one region (keyed sends "
    "to it time out, its stored messages wait)",
    "kill-sender": "SIGKILL of a sender process; the soak restarts it",
    "kill-receiver": "SIGKILL of a receiver process (or the syphon); the soak restarts it",
    "stop-worker": "SIGTERM of any process mid-fault: it must exit within 60 s; restarted",
    "failover": "operator: `georep failover --to secondary` for the passive senders' entities",
    "failback": "operator: failover to secondary, then `georep failback` mid-fault",
    "pin": "operator: `georep pin` to a region for a while, then unpin",
    "redis-restart": "the Redis server (seen-set and roles, with AOF) is killed and restarted",
    "full-outbox-disk": "the senders' outbox disk is full (a ballast takes its free space)",
    "redis-unreachable": "the Redis server stops answering for a while (SIGSTOP, then SIGCONT)",
}

#: Shortest and longest fault, seconds (one-shot kinds use the length as their settling time).
_SHORTEST: Final = 2.0
_LONGEST: Final = 8.0


@dataclass(frozen=True)
class Fault:
    """One fault of the schedule.

    Attributes:
        at: Seconds after the faults begin when it starts.
        kind: One of :data:`FAULT_KINDS`.
        length: Seconds it lasts (a one-shot fault: seconds before the nemesis counts it
            over).
        region: The region it hits (``primary``/``secondary``), where that applies.
        target: Which process (kills: an index, taken modulo the processes of that
            group), or how many sends (``drop-send-answers``), as drawn.
        amount: Latency seconds, or unused.
    """

    at: float
    kind: str
    length: float
    region: str = "primary"
    target: int = 0
    amount: float = 0.0

    @property
    def ends(self) -> float:
        return self.at + self.length

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_kinds(kinds: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """``kinds`` without repeats, in the given order; ``all`` stands for every kind.

    Raises:
        ConfigurationError: A kind is unknown (the message lists the known ones).
    """
    chosen: list[str] = []
    for kind in kinds:
        names = list(FAULT_KINDS) if kind == "all" else [kind]
        for name in names:
            if name not in FAULT_KINDS:
                raise ConfigurationError(
                    f"unknown fault kind {name!r}; use 'all' or some of: {', '.join(FAULT_KINDS)}"
                )
            if name not in chosen:
                chosen.append(name)
    return tuple(chosen)


def draw_schedule(
    seed: int,
    seconds: float,
    kinds: tuple[str, ...] | list[str],
    *,
    mean_gap: float = 3.0,
    max_overlap: int = 3,
) -> list[Fault]:
    """The faults of a run of ``seconds``, drawn from ``seed``, sorted by start.

    Each kind of ``kinds`` is placed once at a random moment first (when ``seconds``
    holds one of each), then faults of random kinds arrive every ``mean_gap`` seconds on
    average (exponential gaps). A fault that would make more than ``max_overlap`` run at
    once, or last past ``seconds``, is dropped (and nothing else drawn in its place, so the
    draws stay aligned with the seed). The one-of-each faults are always kept.

    Raises:
        ConfigurationError: No kind, an unknown kind, or a run too short for one fault.
    """
    kinds = check_kinds(list(kinds))
    if not kinds:
        raise ConfigurationError("give at least one fault kind (or 'all')")
    if seconds < _SHORTEST + 1:
        raise ConfigurationError(
            f"a soak needs at least {_SHORTEST + 1:.0f} s of faults, not {seconds:g}"
        )
    rng = random.Random(seed)
    wanted: list[Fault] = []
    # One of each kind, spread over the run (so a short run still meets every kind).
    slots = rng.sample(range(len(kinds)), len(kinds))
    span = seconds - _SHORTEST
    for kind, slot in zip(kinds, slots, strict=True):
        at = (slot + rng.random()) * span / len(kinds)
        wanted.append(_draw(rng, kind, at, seconds))
    at = rng.expovariate(1 / mean_gap)
    while at < span:
        wanted.append(_draw(rng, rng.choice(kinds), at, seconds))
        at += rng.expovariate(1 / mean_gap)
    kept = wanted[: len(kinds)]
    for fault in wanted[len(kinds) :]:
        running = [f for f in kept if f.at <= fault.at < f.ends]
        if len(running) < max_overlap:
            kept.append(fault)
    return sorted(kept, key=lambda f: (f.at, f.kind))


def _draw(rng: random.Random, kind: str, at: float, seconds: float) -> Fault:
    length = min(rng.uniform(_SHORTEST, _LONGEST), max(seconds - at, 0.5))
    region = rng.choice(("primary", "secondary"))
    target = rng.randrange(1_000)
    amount = round(rng.uniform(0.3, 1.5), 2) if kind == "latency" else 0.0
    return Fault(
        at=round(at, 3),
        kind=kind,
        length=round(length, 3),
        region=region,
        target=target,
        amount=amount,
    )
