"""Shared fixtures for the unit tests. Shared plain helpers are in the ``_*.py`` modules
next to this file (imported as ``from _senders import ...``)."""

from __future__ import annotations

import pytest
from _emulator_parts import Clock

from georep.adapters.emulator._broker import Namespace
from georep.testing import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock at 0 that moves only when the test advances it (no real waiting)."""
    return FakeClock()


@pytest.fixture
def broker_clock() -> Clock:
    """The emulator broker's settable wall clock (``broker_clock.now``)."""
    return Clock()


@pytest.fixture
def ns(broker_clock: Clock) -> Namespace:
    """An emulator namespace, ``primary``, on ``broker_clock``."""
    return Namespace("primary", clock=broker_clock)
