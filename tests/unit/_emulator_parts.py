"""Parts the emulator's unit tests share (imported as ``from _emulator_parts import ...``)."""

from __future__ import annotations

from georep.adapters.emulator._codec import encode_value


class Clock:
    """A settable wall clock for the emulator's broker: ``clock()`` returns ``clock.now``."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def batch(*inner: bytes) -> bytes:
    """An AMQP batch payload (properties, then one data section per encoded message)."""
    return (
        b"\x00\x53\x73"
        + encode_value(["batch"])
        + b"".join(b"\x00\x53\x75" + encode_value(m) for m in inner)
    )
