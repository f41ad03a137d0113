"""pytest fixtures that give tests (georep's and yours) a running two-region emulator.

Registered automatically when georep is installed (entry point ``pytest11``):

- ``georep_emulator``: one emulator for the whole session, namespaces ``primary`` and
  ``secondary``, with the queues listed in the ini option ``georep_emulator_queues``
  (default ``orders``) and topics in ``georep_emulator_topics`` (``NAME:SUB1,SUB2``).
  Shared: create your own entities (``emu.namespace(n).create_queue(...)``) and do not
  inject faults into it.
- ``georep_emulator_factory``: call it with :class:`Emulator` arguments to get a private
  emulator for this test (faults welcome); it is stopped after the test.

Both give an :class:`Emulator`: ``emu.control_token`` / ``emu.control_headers()`` are what a
test needs to call the control endpoint by hand (``emu.namespace(n)`` calls send them), and
``emu.namespace(n).connection_string_for("SendOnly" | "ListenOnly")`` gives keys with fewer
claims.
"""

from __future__ import annotations

__all__ = ["georep_emulator", "georep_emulator_factory", "pytest_addoption"]

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from . import Emulator


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "georep_emulator_queues",
        "queues for the georep_emulator fixture",
        type="args",
        default=["orders"],
    )
    parser.addini(
        "georep_emulator_topics",
        "topics (NAME:SUB1,SUB2) for the georep_emulator fixture",
        type="args",
        default=[],
    )


@pytest.fixture(scope="session")
def georep_emulator(pytestconfig: pytest.Config) -> Iterator[Emulator]:
    """A two-region emulator shared by the whole test session."""
    from . import Emulator
    from ._runner import parse_topic

    topics = dict(parse_topic(t) for t in pytestconfig.getini("georep_emulator_topics"))
    with Emulator(
        queues=tuple(pytestconfig.getini("georep_emulator_queues")), topics=topics
    ) as emulator:
        yield emulator


@pytest.fixture
def georep_emulator_factory() -> Iterator[Callable[..., Emulator]]:
    """Start private emulators for one test: ``georep_emulator_factory(queues=("q",))``."""
    from . import Emulator

    started: list[Emulator] = []

    def start(*args: Any, **kwargs: Any) -> Emulator:
        emulator = Emulator(*args, **kwargs)
        emulator.start()
        started.append(emulator)
        return emulator

    yield start
    for emulator in started:
        emulator.stop()
