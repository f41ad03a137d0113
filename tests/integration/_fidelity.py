"""The fidelity table of docs/emulator.md and the registry of the checks that keep it true.

Every row the table marks supported (``yes``) names an operation; a check registered with
``@check(operation)`` in one of the ``test_fidelity_*.py`` modules runs it with the real
azure-servicebus SDK against the emulator, in the style of the SDK's usage docs. Each module
runs its own checks (so xdist spreads them over workers); ``test_emulator_fidelity.py``
fails when a supported row has no check or a check has no row.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from _helpers import REPO
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue

from georep.adapters.emulator import Emulator

DOC = REPO / "docs" / "emulator.md"
_START, _END = "<!-- fidelity:start -->", "<!-- fidelity:end -->"

Check = Callable[[Emulator], None]
CHECKS: dict[str, Check] = {}
_MODULE: dict[str, str] = {}


def fidelity_rows() -> list[tuple[str, str]]:
    """``(operation, supported)`` for each row of the table between the fidelity markers."""
    text = DOC.read_text(encoding="utf-8")
    if _START not in text or _END not in text:
        raise AssertionError(f"{DOC} has no fidelity table between {_START} and {_END}")
    block = text.split(_START, 1)[1].split(_END, 1)[0]
    rows = []
    for line in block.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] == "Operation" or not cells[0].strip("-: "):
            continue
        rows.append((cells[0], cells[1].lower()))
    return rows


def supported() -> list[str]:
    return [operation for operation, cell in fidelity_rows() if cell.startswith("yes")]


def check(operation: str) -> Callable[[Check], Check]:
    def register(function: Check) -> Check:
        CHECKS[operation] = function
        _MODULE[operation] = function.__module__
        return function

    return register


def checks_of(module: str) -> pytest.MarkDecorator:
    """Parametrize a test over the supported rows whose checks ``module`` registered."""
    operations = [op for op in supported() if _MODULE.get(op) == module]
    return pytest.mark.parametrize(
        "operation",
        operations,
        ids=[re.sub(r"[^a-z0-9]+", "-", op.lower()).strip("-") for op in operations],
    )


def checks_test(module: str) -> Callable[[str, Emulator], None]:
    """The test of a ``test_fidelity_*`` module, which ends with
    ``test_supported_operation_works = checks_test(__name__)``: it runs each check that
    ``module`` registered against the session's emulator, one test id a row."""

    @checks_of(module)
    def test_supported_operation_works(operation: str, georep_emulator: Emulator) -> None:
        CHECKS[operation](georep_emulator)

    return test_supported_operation_works


# -- helpers for the checks -----------------------------------------------------------------
def unique_name(prefix: str) -> str:
    return f"fid-{prefix}-{uuid.uuid4().hex[:8]}"


def make_queue(emu: Emulator, **properties: Any) -> str:
    name = unique_name("q")
    emu.namespace("primary").create_queue(name, **properties)
    return name


@contextmanager
def client_for(emu: Emulator, **options: Any) -> Iterator[ServiceBusClient]:
    # keep_alive=0: closing a sync SDK link otherwise joins its keep-alive thread, which
    # sleeps in one-second steps (half a second per close, a minute over this module).
    with ServiceBusClient.from_connection_string(
        emu.connection_string("primary"), keep_alive=0, **options
    ) as client:
        yield client


def send(emu: Emulator, queue: str, *messages: ServiceBusMessage) -> None:
    with client_for(emu) as client, client.get_queue_sender(queue) as sender:
        sender.send_messages(list(messages))


def bodies(messages: Any) -> list[bytes]:
    return [b"".join(message.body) for message in messages]


def receive_all(receiver: Any, expect: int, *, within: float = 10.0) -> list[Any]:
    received: list[Any] = []
    deadline = time.monotonic() + within
    while len(received) < expect and time.monotonic() < deadline:
        received += receiver.receive_messages(
            max_message_count=expect - len(received), max_wait_time=1
        )
    return received


@contextmanager
def one_received(emu: Emulator, **properties: Any) -> Iterator[tuple[str, Any, Any]]:
    """A new queue (``properties`` as :func:`make_queue`) holding one message ``b"x"``, a
    receiver on it, and that message received (locked): ``(queue, receiver, message)``."""
    queue = make_queue(emu, **properties)
    send(emu, queue, ServiceBusMessage(b"x"))
    with client_for(emu) as client, client.get_queue_receiver(queue) as receiver:
        [message] = receive_all(receiver, 1)
        yield queue, receiver, message


def dead_lettered(emu: Emulator, queue: str, *, within: float = 10.0) -> Any:
    """The one message in ``queue``'s dead-letter sub-queue, received and completed."""
    with (
        client_for(emu) as client,
        client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq,
    ):
        [dead] = receive_all(dlq, 1, within=within)
        dlq.complete_message(dead)
    return dead
