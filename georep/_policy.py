"""Replication modes and the configuration objects that steer them."""

from __future__ import annotations

__all__ = [
    "DEFAULT_FAILOVER_KINDS",
    "Corroboration",
    "DedupKey",
    "DrainPolicy",
    "FailoverPolicy",
    "ReplicationMode",
    "as_seconds",
    "count",
    "error_kinds",
    "flag",
    "positive_seconds",
    "seconds",
]

import enum
import math
from dataclasses import dataclass, field
from datetime import timedelta
from typing import ClassVar, Literal

from georep._classify import UNAVAILABLE_KINDS
from georep.exceptions import ConfigurationError
from georep.ports import ErrorKind

Seconds = float | timedelta


def seconds(value: Seconds, name: str) -> float:
    """``value`` in seconds (a number or a ``timedelta``), which must be finite and >= 0.

    NaN and infinity are refused: a NaN deadline expires at once (an instant failover on a
    healthy region), an infinite one never does.

    Raises:
        ConfigurationError: ``value`` is not a number, is negative, NaN or infinite (the
            message names ``name``).
    """
    result = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(result, bool) or not isinstance(result, int | float):
        raise ConfigurationError(
            f"{name} must be a number of seconds (int, float or timedelta), "
            f"got {type(value).__name__} {value!r}"
        )
    if not math.isfinite(result) or result < 0:
        raise ConfigurationError(
            f"{name} must be a finite, non-negative number of seconds, got {value!r}"
        )
    return float(result)


def error_kinds(kinds: object, name: str) -> frozenset[ErrorKind]:
    """``kinds`` (a collection of :class:`ErrorKind` or their values) as a frozenset.

    Raises:
        ConfigurationError: It is a string, not iterable, or names an unknown kind.
    """
    if isinstance(kinds, str | bytes) or not hasattr(kinds, "__iter__"):
        raise ConfigurationError(
            f"{name} must be a collection of ErrorKind values, e.g. "
            f"frozenset({{ErrorKind.CONNECTION}}), got {kinds!r}"
        )
    try:
        return frozenset(ErrorKind(kind) for kind in kinds)
    except ValueError as error:
        known = ", ".join(kind.value for kind in ErrorKind)
        raise ConfigurationError(f"{name}: {error}; the kinds are: {known}") from None


def as_seconds(value: Seconds) -> float:
    """A validated ``Seconds`` field as a float."""
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def positive_seconds(value: Seconds, name: str) -> float:
    """``value`` in seconds, which must be positive and finite.

    Raises:
        ConfigurationError: It is not (the message names ``name``).
    """
    result = seconds(value, name)
    if result <= 0:
        raise ConfigurationError(f"{name} must be greater than 0 seconds, got {value!r}")
    return result


def count(value: object, name: str, minimum: int = 1, maximum: int | None = None) -> int:
    """``value`` as a whole number in ``[minimum, maximum]``.

    ``bool`` (``True`` is 1 to Python) and integral floats (``2.0``) are refused too: a
    count given as anything but an ``int`` is a mistake worth reporting.

    Raises:
        ConfigurationError: ``value`` is not an ``int`` or is out of range (the message
            names ``name``).
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(
            f"{name} must be a whole number (int), got {type(value).__name__} {value!r}"
        )
    if value < minimum or (maximum is not None and value > maximum):
        upper = "" if maximum is None else f" and <= {maximum}"
        raise ConfigurationError(f"{name} must be >= {minimum}{upper}, got {value}")
    return value


def flag(value: object, name: str) -> bool:
    """``value``, which must be a ``bool`` (``"false"`` is truthy: refuse it).

    Raises:
        ConfigurationError: It is not a bool (the message names ``name``).
    """
    if not isinstance(value, bool):
        raise ConfigurationError(f"{name} must be True or False, got {value!r}")
    return value


class ReplicationMode(enum.StrEnum):
    """How a :class:`georep.GeoSender` uses its two regions."""

    PASSIVE = "passive"
    """One region at a time; on a failure that means the region may be down, send to the
    other and swap roles (SPEC §2.2). Costs what an unreplicated send costs."""
    ACTIVE = "active"
    """Every message to both regions at once, one MessageId for both copies; success when
    at least one accepted (SPEC §2.1). Twice the operations."""

    @classmethod
    def _missing_(cls, value: object) -> ReplicationMode:
        raise ConfigurationError(
            f"mode must be one of {', '.join(repr(m.value) for m in cls)} "
            f"(ReplicationMode.PASSIVE, ReplicationMode.ACTIVE), not {value!r}"
        )


@dataclass(frozen=True, kw_only=True)
class Corroboration:
    """What must back one process's failover before it moves every process sharing a role
    store (issue 31).

    A connection error seen by one process is not evidence of a regional outage: a process
    with a typo in its primary's endpoint fails every send there. A failover that is not
    corroborated still sends the message to the backup, and the roles move *for that
    process only* (``sender.roles.departed_from``); the shared record, and every other
    process, stay where they are. The process follows the shared roles again as soon as
    anyone changes the record (a corroborated failover, an operator's command), or once the
    region it left has answered its probes for ``FailoverPolicy.failback_after`` seconds.
    Without a role store, every failover is this process's own: nothing to corroborate.

    Every condition set must hold (they are ANDed). The default moves the fleet as fast as
    before for a correctly configured process: one failure, no second process asked.

    Attributes:
        reached: The failing process must have reached the region before: a send, a link
            opened by ``async with``/``warm_up()`` or a probe that the region answered, in
            this GeoSender's lifetime (or within ``reached_within``). A process that never
            reached the region (a wrong endpoint, port or key) cannot move the others.
            Default True.
        reached_within: Seconds: with ``reached``, the last success must be this recent.
            None (default): any time in the sender's lifetime.
        reports: How many distinct processes must have reported the region failing,
            within ``window`` seconds and the same generation of the roles, this one
            included (reports are kept in the role store). 1 (default): this process alone
            is enough. A report counts only from a process that passes ``reached``.
        window: Seconds a report counts for. Default 30.

    ``Corroboration(reached=False)`` is the behaviour before issue 31: any process's
    failure moves every process.

    Raises:
        ConfigurationError: A field has the wrong type or range (the message names it).
    """

    reached: bool = True
    reached_within: Seconds | None = None
    reports: int = 1
    window: Seconds = 30.0

    def __post_init__(self) -> None:
        flag(self.reached, "Corroboration.reached")
        if self.reached_within is not None:
            within = positive_seconds(self.reached_within, "Corroboration.reached_within")
            object.__setattr__(self, "reached_within", within)
        count(self.reports, "Corroboration.reports")
        object.__setattr__(self, "window", positive_seconds(self.window, "Corroboration.window"))

    @property
    def window_seconds(self) -> float:
        """``window`` in seconds."""
        return as_seconds(self.window)

    @property
    def reached_within_seconds(self) -> float | None:
        """``reached_within`` in seconds (None: any time)."""
        return None if self.reached_within is None else as_seconds(self.reached_within)

    def describe(self) -> str:
        """The rule in words, for logs: ``reached before, 2 processes within 30 s``."""
        parts = []
        if self.reached:
            within = self.reached_within_seconds
            parts.append("reached before" if within is None else f"reached within {within:g} s")
        if self.reports > 1:
            parts.append(f"{self.reports} processes within {self.window_seconds:g} s")
        return ", ".join(parts) or "none"


#: Failures that mean "the region may be unavailable" (SPEC §2.2): connection, timeout and
#: server-busy, read from the one classification table (``georep._classify``, where each
#: decision is argued). Any other error is raised at once, region unchanged.
DEFAULT_FAILOVER_KINDS: frozenset[ErrorKind] = UNAVAILABLE_KINDS


@dataclass(frozen=True, kw_only=True)
class FailoverPolicy:
    """When a passive sender fails over, and how long it waits for a region.

    Attributes:
        fail_over_on: Error kinds that send the message to the other region (and, when
            no region answers, to the outbox). Anything else (size, argument,
            authentication, entity not found or disabled, quota, a service error) is
            raised at once, region unchanged, never queued. Default:
            :data:`DEFAULT_FAILOVER_KINDS` (connection, timeout, server-busy).
        attempt_timeout: georep's own deadline for one region's attempt, in seconds
            (``float`` or ``timedelta``), covering the link open and the send. The SDK can
            wait forever when a response is lost, so this is never unbounded. Default 10 s.
        switch_back: Move back to the original active region once it is healthy again.
            Off by default: like the seed, roles stay swapped until the next failure.
        switch_back_probe_interval: Seconds between health probes of the old active
            region when ``switch_back`` is on. Default 30 s.
        failback_after: Seconds the old active region must have answered every probe
            before the roles move back to it (``switch_back`` on): one good probe is not
            enough. With a shared role store the move is one compare-and-set, made once
            for every process. Default 60 s.
        region_cooldown: Active mode: after a region fails with an unavailability error,
            sends skip it for this many seconds (its copy counts as failed, and is queued
            for repair when ``repair=True``), then try it again. Without it every send
            would wait for the dead region's failure, up to ``attempt_timeout``. 0 turns it
            off. Default 5 s.
        corroboration: With a shared role store, what a failure must show before this
            process's failover moves every process (:class:`Corroboration`); an
            uncorroborated failover moves this process only. Default: the process must
            have reached the region before (no second process needed).

    Raises:
        ConfigurationError: A duration is not a finite number of seconds (> 0; >= 0 for
            ``region_cooldown``), ``switch_back`` is not a bool, or ``fail_over_on`` names
            an unknown kind. The message names the field.
    """

    fail_over_on: frozenset[ErrorKind] = DEFAULT_FAILOVER_KINDS
    attempt_timeout: Seconds = 10.0
    switch_back: bool = False
    switch_back_probe_interval: Seconds = 30.0
    failback_after: Seconds = 60.0
    region_cooldown: Seconds = 5.0
    corroboration: Corroboration = field(default_factory=Corroboration)

    def __post_init__(self) -> None:
        if not isinstance(self.corroboration, Corroboration):
            raise ConfigurationError(
                "FailoverPolicy.corroboration must be a Corroboration(...), got "
                f"{type(self.corroboration).__name__} {self.corroboration!r}"
            )
        for name in (
            "attempt_timeout",
            "switch_back_probe_interval",
            "failback_after",
            "region_cooldown",
        ):
            check = seconds if name == "region_cooldown" else positive_seconds
            object.__setattr__(self, name, check(getattr(self, name), f"FailoverPolicy.{name}"))
        flag(self.switch_back, "FailoverPolicy.switch_back")
        kinds = error_kinds(self.fail_over_on, "FailoverPolicy.fail_over_on")
        object.__setattr__(self, "fail_over_on", kinds)

    @property
    def attempt_seconds(self) -> float:
        """``attempt_timeout`` in seconds."""
        return as_seconds(self.attempt_timeout)

    @property
    def failback_seconds(self) -> float:
        """``failback_after`` in seconds."""
        return as_seconds(self.failback_after)

    @property
    def region_cooldown_seconds(self) -> float:
        """``region_cooldown`` in seconds."""
        return as_seconds(self.region_cooldown)


@dataclass(frozen=True, kw_only=True)
class DrainPolicy:
    """How the background drainer resends what the outbox holds.

    Attributes:
        initial_backoff: Seconds before the first retry of an entry that failed. Default 0.5.
        max_backoff: Upper bound of the exponential backoff, in seconds: after a region
            returns, the outbox starts draining within this time. Default 5.
        batch_size: Entries claimed per round. Default 100.
        lease: Seconds an entry stays claimed by one drainer (so two processes sharing an
            outbox file do not both send it). Default 60.
        idle_interval: Seconds between checks when nothing is due. Default 1.

    Raises:
        ConfigurationError: A duration is not a finite number of seconds > 0, or
            ``batch_size`` is not an int >= 1. The message names the field.
    """

    initial_backoff: Seconds = 0.5
    max_backoff: Seconds = 5.0
    batch_size: int = 100
    lease: Seconds = 60.0
    idle_interval: Seconds = 1.0

    def __post_init__(self) -> None:
        for name in ("initial_backoff", "max_backoff", "lease", "idle_interval"):
            value = positive_seconds(getattr(self, name), f"DrainPolicy.{name}")
            object.__setattr__(self, name, value)
        if as_seconds(self.initial_backoff) > as_seconds(self.max_backoff):
            raise ConfigurationError(
                f"DrainPolicy.initial_backoff ({as_seconds(self.initial_backoff)} s) is over "
                f"max_backoff ({as_seconds(self.max_backoff)} s), its upper bound: raise "
                "max_backoff or lower initial_backoff"
            )
        count(self.batch_size, "DrainPolicy.batch_size")

    def backoff(self, attempts: int) -> float:
        """Seconds to wait after ``attempts`` failed attempts."""
        initial = as_seconds(self.initial_backoff)
        return min(as_seconds(self.max_backoff), initial * 2.0 ** max(attempts - 1, 0))


@dataclass(frozen=True)
class DedupKey:
    """Which field identifies a logical message (both copies share it).

    Use the constants: ``DedupKey.MESSAGE_ID`` (default), ``DedupKey.SUBJECT``, or
    ``DedupKey.application_property("order-id")``.
    """

    source: Literal["message_id", "subject", "application_property"] = "message_id"
    name: str | None = field(default=None)

    MESSAGE_ID: ClassVar[DedupKey]
    SUBJECT: ClassVar[DedupKey]

    def __post_init__(self) -> None:
        if self.source not in ("message_id", "subject", "application_property"):
            raise ConfigurationError(
                f"DedupKey source {self.source!r} is unknown: use message_id, subject or "
                "application_property"
            )
        if (self.source == "application_property") != bool(self.name):
            raise ConfigurationError(
                "DedupKey.application_property needs a property name (and only it takes one)"
            )

    @classmethod
    def application_property(cls, name: str) -> DedupKey:
        """The value of the application property ``name``."""
        return cls("application_property", name)

    def __str__(self) -> str:
        return f"application property {self.name!r}" if self.name else self.source


DedupKey.MESSAGE_ID = DedupKey("message_id")
DedupKey.SUBJECT = DedupKey("subject")
