"""Time, as the core reads it (virtual in tests)."""

from __future__ import annotations

__all__ = ["Clock"]

from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """Time, injectable so unit tests never sleep for real."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards."""
        ...

    def time(self) -> float:
        """Wall-clock seconds since the Unix epoch (UTC)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds``."""
        ...

    def deadline(self, seconds: float) -> AbstractContextManager[object]:
        """A ``with`` context that cancels its body after ``seconds`` (``TimeoutError``).

        Synchronous on purpose: it guards every send, where an await costs.
        """
        ...
