"""One region as every georep sender uses it (issue 15, item 1).

:class:`RegionChannel` is the one place that makes a call to a region: hold the region's
slot, apply georep's deadline, turn a timeout into a
:class:`~georep.exceptions.RegionTimeoutError` (kind ``TIMEOUT``) naming that region,
count the failure, and cool the region down. The GeoSender, the PairedSender, the syphon
and the relay channel all call regions through it; which failures count is the caller's
``fail_over_on`` (read from the one table, :mod:`georep._classify`).
:class:`RegionDeadline` is its deadline alone, for calls that hold no slot (relay requests,
receives).
"""

from __future__ import annotations

__all__ = [
    "CALL_SECONDS",
    "RegionChannel",
    "RegionDeadline",
    "RegionPair",
    "batch_size",
    "bounded_call",
    "learn_max_sizes",
    "open_failure",
    "sender_channel",
]

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, Final, Generic, Protocol, TypeVar

from georep._policy import FailoverPolicy
from georep.exceptions import (
    AllRegionsUnavailableError,
    ConfigurationError,
    RegionError,
    RegionTimeoutError,
    region_error,
)
from georep.ports import Clock, ErrorKind, RegionSender

_log = logging.getLogger("georep.sender")

_T = TypeVar("_T")
_NONE: frozenset[ErrorKind] = frozenset()


class _Labelled(Protocol):
    @property
    def region(self) -> str: ...


_C = TypeVar("_C", bound=_Labelled)


def timeout_error(region: str, what: str, seconds: float) -> RegionTimeoutError:
    """``f"{what} within {seconds:g} s"`` as a TIMEOUT failure of ``region``."""
    return RegionTimeoutError(f"{what} within {seconds:g} s", region=region, kind=ErrorKind.TIMEOUT)


class RegionDeadline:
    """``with RegionDeadline(clock, seconds, region):`` the body within ``seconds``.

    A ``TimeoutError`` (georep's deadline, or one the body raised) leaves as a
    :class:`~georep.exceptions.RegionTimeoutError` of kind ``TIMEOUT`` for ``region``,
    its message ``f"{name} {what} within {seconds:g} s"`` (``name`` defaults to the region
    label). A plain class, not a generator: it is on every send's path.

    For a receive: ``with RegionDeadline(clock, bound, label, name=f"{label}:",
    what="a receive did not return"):``.
    """

    __slots__ = ("_deadline", "_name", "_region", "_seconds", "_what")

    def __init__(
        self,
        clock: Clock,
        seconds: float,
        region: str,
        *,
        name: str | None = None,
        what: str = "did not answer",
    ) -> None:
        self._deadline = clock.deadline(seconds)
        self._seconds = seconds
        self._region = region
        self._name = name
        self._what = what

    def error(self) -> RegionTimeoutError:
        """The error a timeout becomes."""
        name = self._region if self._name is None else self._name
        return timeout_error(self._region, f"{name} {self._what}", self._seconds)

    def __enter__(self) -> None:
        self._deadline.__enter__()

    def __exit__(self, *exc_info: Any) -> None:
        exc_type: type[BaseException] | None = exc_info[0]
        try:
            self._deadline.__exit__(*exc_info)
        except TimeoutError as timeout:
            raise self.error() from timeout
        if exc_type is not None and issubclass(exc_type, TimeoutError):
            raise self.error() from exc_info[1]


#: The bound on one settlement, lock renewal or browse of a region by a receiver, seconds.
#: The SDK can wait far longer on a link an outage broke, and a session's worker waiting
#: on it holds the session: its successors in the other region would wait for a
#: predecessor nobody takes.
CALL_SECONDS: Final = 10.0


def bounded_call(
    clock: Clock, region: str, what: str, seconds: float = CALL_SECONDS
) -> RegionDeadline:
    """``with bounded_call(clock, region, "a browse"):`` one call of a receiver to a region,
    within ``seconds`` (default :data:`CALL_SECONDS`); else ``RegionTimeoutError``
    (kind ``TIMEOUT``) saying ``"{region}: {what} did not return within {seconds} s"``."""
    return RegionDeadline(clock, seconds, region, name=f"{region}:", what=f"{what} did not return")


class RegionChannel(Generic[_C]):
    """One region's client and what georep knows about that region.

    Args:
        client: The region's client (a :class:`~georep.ports.RegionSender`, or any object
            with a ``region`` label, e.g. a relay endpoint).
        clock: Time source for deadlines and cool-downs.
        fail_over_on: The failures that count against the region (they fail waiting
            calls at once and start its cool-down); none by default.
        cooldown: Seconds a region is skipped after such a failure (active sends).
        name: How timeouts name the region (default: its label).
        exclusive: Hold the client's ``slot()`` around each call (senders: the SDK allows
            one call at a time per sender).

    Attributes:
        failures: How many counted failures the region had (an epoch: a call that saw it
            change while waiting for the slot fails at once).
        last_error: The last counted failure.
        last_success: When the region last answered a call (``clock.monotonic()``
            seconds), None while it never has: whether this process ever reached it.
        max_size: The region's message size limit in bytes, once learned.
    """

    __slots__ = (
        "_clock",
        "_cooling_until",
        "_name",
        "_slot",
        "client",
        "cooldown",
        "cooling_error",
        "fail_over_on",
        "failures",
        "last_error",
        "last_success",
        "max_size",
        "region",
    )

    def __init__(
        self,
        client: _C,
        *,
        clock: Clock,
        fail_over_on: Collection[ErrorKind] = _NONE,
        cooldown: float = 0.0,
        name: str | None = None,
        exclusive: bool = True,
    ) -> None:
        self.client = client
        self.region: str = client.region
        self._clock = clock
        self.fail_over_on = fail_over_on
        self.cooldown = cooldown
        self._name = name
        self._slot = client.slot() if exclusive else None  # type: ignore[attr-defined]
        self.failures = 0
        self.last_error: RegionError | None = None
        self.last_success: float | None = None
        self.max_size: int | None = None
        self._cooling_until = 0.0
        self.cooling_error: RegionError | None = None

    async def call(
        self, timeout: float, operation: Callable[..., Awaitable[_T]], *args: Any, **kwargs: Any
    ) -> _T:
        """``operation(*args, **kwargs, timeout=timeout)`` bounded by georep's deadline.

        The client gets the same deadline, but it can wait forever when a response is lost
        (a link that never opens, a disposition that never comes), so ours is the backstop.
        Waiting for the slot is not part of the deadline (a queue of healthy calls is not an
        outage), but a call that waited while the region failed fails at once with that
        failure, so a burst queued behind a dead region fails over together.

        Raises:
            RegionError: The region failed (a timeout is kind ``TIMEOUT``).
        """
        # One frame, no helper coroutine: this is every send's path.
        slot = self._slot
        failures_before = self.failures
        if slot is not None and not slot.try_acquire():
            await slot.acquire()
        try:
            if self.failures != failures_before and self.last_error is not None:
                last = self.last_error
                raise region_error(
                    f"{self.region} failed while this call waited for it: {last}",
                    region=self.region,
                    kind=last.kind,
                ) from last
            try:
                with self._clock.deadline(timeout):
                    result = await operation(*args, **kwargs, timeout=timeout)
                self.last_success = self._clock.monotonic()
                return result
            except TimeoutError as exc:
                name = self.region if self._name is None else self._name
                error = timeout_error(self.region, f"{name} did not answer", timeout)
                self._count(error)
                raise error from exc
            except RegionError as exc:
                self._count(exc)
                raise
        finally:
            if slot is not None:
                slot.release()

    def _count(self, error: RegionError) -> None:
        if error.kind in self.fail_over_on:
            self.failures += 1
            self.last_error = error

    # ----------------------------------------------------------------- cool-down

    def cooling(self, now: float) -> RegionError | None:
        """The failure the region is cooling down from at ``now``, if it is."""
        return self.cooling_error if self._cooling_until > now else None

    def settle(self, error: RegionError | None) -> None:
        """After a call: a success ends the cool-down; a counted failure starts one."""
        if error is None:
            self._cooling_until, self.cooling_error = 0.0, None
        elif error.kind in self.fail_over_on and self.cooldown > 0:
            self._cooling_until = self._clock.monotonic() + self.cooldown
            self.cooling_error = error


class RegionPair(Generic[_C]):
    """Two regions' channels, found by label or namespace.

    Args:
        primary: The region labelled first (``primary``).
        secondary: The other one.
        namespace: How a client names its namespace (``client.namespace`` by default).
    """

    __slots__ = ("by_label", "by_namespace", "primary", "secondary")

    def __init__(self, primary: RegionChannel[_C], secondary: RegionChannel[_C]) -> None:
        self.primary = primary
        self.secondary = secondary
        self.by_label = {primary.region: primary, secondary.region: secondary}
        self.by_namespace: dict[str, RegionChannel[_C]] = {}
        for channel in (primary, secondary):
            namespace = getattr(channel.client, "namespace", None)
            if namespace is not None:
                self.by_namespace[namespace] = channel

    def __iter__(self) -> Any:
        return iter((self.primary, self.secondary))

    def other(self, channel: RegionChannel[_C]) -> RegionChannel[_C]:
        """The region that is not ``channel``."""
        return self.secondary if channel is self.primary else self.primary

    def size_limit(self) -> int | None:
        """The smallest message size limit learned from the regions (bytes), if any."""
        sizes = [c.max_size for c in (self.primary, self.secondary) if c.max_size is not None]
        return min(sizes) if sizes else None


def sender_channel(
    sender: RegionSender, *, clock: Clock, policy: FailoverPolicy
) -> RegionChannel[RegionSender]:
    """A GeoSender's channel to a region: ``policy``'s failover kinds and cool-down; its
    timeouts name the region and its namespace."""
    return RegionChannel(
        sender,
        clock=clock,
        fail_over_on=policy.fail_over_on,
        cooldown=policy.region_cooldown_seconds,
        name=f"{sender.region} ({sender.namespace})",
    )


def open_failure(region: RegionChannel[RegionSender], error: RegionError) -> str:
    """What a failure to open ``region``'s link says, in words: not found, credentials
    refused, no answer... (issue 31: "did not answer" was said for all of them)."""
    client = region.client
    where = f"{region.region} ({client.namespace})"
    kind = error.kind
    if kind is ErrorKind.TIMEOUT:
        what = "did not answer while connecting"
    elif kind is ErrorKind.CONNECTION:
        what = "could not be reached while connecting"
    elif kind is ErrorKind.ENTITY_NOT_FOUND:
        what = f"has no entity {client.entity!r}: sends there will fail until it is created"
    elif kind is ErrorKind.ENTITY_DISABLED:
        what = f"has entity {client.entity!r} disabled: sends there will fail until enabled"
    elif kind is ErrorKind.AUTHENTICATION:
        what = f"refused the credentials for {client.entity!r}"
    else:
        what = f"refused to open a link to {client.entity!r} ({kind.value})"
    detail = str(error).removeprefix(f"{where}: ")  # the adapter's errors name it too
    return f"{where} {what}: {detail}"


async def learn_max_sizes(
    regions: Sequence[RegionChannel[RegionSender]], timeout: float
) -> dict[str, RegionError]:
    """Ask each region its message size limit (it opens the link); return who failed."""
    errors: dict[str, RegionError] = {}

    async def size_of(region: RegionChannel[RegionSender]) -> None:
        try:
            region.max_size = await region.call(timeout, region.client.max_message_size)
        except RegionError as exc:
            errors[region.region] = exc
            _log.warning("%s", open_failure(region, exc))

    await asyncio.gather(*(size_of(region) for region in regions))
    return errors


async def batch_size(
    regions: RegionPair[RegionSender], timeout: float, requested: int | None
) -> int:
    """The size of a new batch: ``requested``, or the smallest of both regions' limits
    (asked now where not known yet). As the SDK's, 0 means "not given".

    Raises:
        ConfigurationError: ``requested`` is negative, or larger than a region's limit (a
            ``ValueError``, as the SDK raises for a size over its link's).
        AllRegionsUnavailableError: No region could tell its limit and none was requested.
    """
    missing = [region for region in regions if region.max_size is None]
    errors = await learn_max_sizes(missing, timeout) if missing else {}
    learned = regions.size_limit()
    sizes = [] if learned is None else [learned]
    if requested:
        if requested < 0:
            raise ConfigurationError(f"max_size_in_bytes must be greater than 0, not {requested}")
        if learned is not None and requested > learned:
            raise ConfigurationError(
                f"Max message size: {requested} is too large, acceptable max batch size is: "
                f"{learned} bytes (the smaller of the two regions' limits)."
            )
        sizes.append(requested)
    if not sizes:
        raise AllRegionsUnavailableError(
            "no region could tell its message size limit; pass max_size_in_bytes", errors
        )
    return min(sizes)
