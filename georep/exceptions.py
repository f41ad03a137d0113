"""Errors raised by georep.

Every error georep raises derives from :class:`GeoReplicationError`. Each class says
whether retrying the same call may succeed (``retryable``); where a builtin exception
type fits, the class inherits it too so callers can keep their existing ``except``.
"""

from __future__ import annotations

__all__ = [
    "ConfigurationError",
    "EmulatorError",
    "GeoReplicationError",
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
