"""Parts the emulator's unit tests share (imported as ``from _emulator_parts import ...``)."""

from __future__ import annotations


class Clock:
    """A settable wall clock for the emulator's broker: ``clock()`` returns ``clock.now``."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now
