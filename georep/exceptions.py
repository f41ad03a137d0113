"""Errors raised by georep.

Every error georep raises derives from :class:`GeoReplicationError`. Each class says
whether retrying the same call may succeed (``retryable``); where a builtin exception
type fits, the class inherits it too so callers can keep their existing ``except``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from georep.ports import ErrorKind

__all__ = [
    "AllRegionsUnavailableError",
    "AuthenticationError",
    "ClosedError",
    "ConfigurationError",
    "EmulatorError",
    "EntityNotFoundError",
    "GeoReplicationError",
    "InvalidMessageError",
    "MessageExpiredError",
    "MessageTooLargeError",
    "OutboxFullError",
    "OutboxUnavailableError",
    "RegionError",
    "RegionUnavailableError",
    "SettlementError",
    "StoreUnavailableError",
]


class GeoReplicationError(Exception):
    """Root of every georep error.

    Attributes:
        retryable: True when the same call may succeed later without any change.
    """

    retryable: bool = False


class ConfigurationError(GeoReplicationError, ValueError):
    """A setting or argument is invalid; the message names it and the fix."""


class EmulatorError(GeoReplicationError, RuntimeError):
    """The local Service Bus emulator failed to start, stopped, or refused a control call."""


class InvalidMessageError(GeoReplicationError, ValueError):
    """A message (or the way it was passed) cannot be sent; the text says what to change."""


class MessageExpiredError(InvalidMessageError):
    """The message's time to live ran out before georep could deliver it.

    georep never delivers a message after its original ``time_to_live``: one that expired
    while held (in a backlog queue, for the syphon) is dropped as expired (dead-lettered
    with reason ``TTLExpiredException`` and counted), not delivered late.
    """


class ClosedError(GeoReplicationError, RuntimeError):
    """The object was closed; create a new one."""


class OutboxFullError(GeoReplicationError):
    """The durable outbox reached its bound; the message was not stored and not sent.

    Raise the bound, or drain the backlog (restore a region) before sending more.
    """

    retryable = True


class SettlementError(GeoReplicationError, RuntimeError):
    """A handler's settlement call was wrong: a message it was not given, or a second
    decision for one message. The text names the message's state and the fix."""


class OutboxUnavailableError(GeoReplicationError):
    """The outbox file could not be read or written just now (another process held its
    lock past the busy timeout, or an I/O error); nothing was stored by the failed call.

    Retry later; if it persists, check the file's disk and permissions.
    """

    retryable = True


class StoreUnavailableError(GeoReplicationError):
    """The seen-set store (Redis) could not be reached or did not answer in time.

    Receivers stop handing out messages while it lasts (nothing is processed unchecked)
    and resume when it answers again.
    """

    retryable = True


class RegionError(GeoReplicationError):
    """An operation failed in one region.

    Attributes:
        region: The region's label (``"primary"``, ``"secondary"``).
        kind: What the failure says about the region (see :class:`georep.ports.ErrorKind`).
    """

    def __init__(self, message: str, *, region: str, kind: ErrorKind) -> None:
        super().__init__(message)
        self.region = region
        self.kind = kind

    @property
    def retryable(self) -> bool:  # type: ignore[override]
        # The one classification table (georep._classify) decides; imported here because
        # it imports this module.
        from georep._classify import RETRYABLE_KINDS

        return self.kind in RETRYABLE_KINDS


class RegionUnavailableError(RegionError):
    """The region did not answer, or failed in a way that means it may be down.

    Connection failures, timeouts and server-busy (see ``georep._classify``); these fail
    over by default.
    """


class MessageTooLargeError(RegionError, ValueError):
    """The message or batch is over the entity's size limit; split it or shrink it."""


class AuthenticationError(RegionError, PermissionError):
    """The region refused the credentials; check the key name and key for that namespace."""


class EntityNotFoundError(RegionError, LookupError):
    """The queue or topic does not exist (or is disabled) in that region; create it there."""


class AllRegionsUnavailableError(GeoReplicationError):
    """No region accepted the operation.

    Attributes:
        causes: Each region's error, by region label, in the order they were tried.
    """

    retryable = True

    def __init__(self, message: str, causes: Mapping[str, BaseException]) -> None:
        detail = "; ".join(f"{region}: {cause}" for region, cause in causes.items())
        super().__init__(f"{message} ({detail})" if detail else message)
        self.causes = dict(causes)
