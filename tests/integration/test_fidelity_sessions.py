"""Fidelity: sessions: rows of the
fidelity table in docs/emulator.md (see ``_fidelity.py``)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from _fidelity import (
    bodies,
    check,
    checks_test,
    client_for,
    make_queue,
    receive_all,
    send,
)
from azure.servicebus import (
    NEXT_AVAILABLE_SESSION,
    AutoLockRenewer,
    ServiceBusMessage,
)
from azure.servicebus.exceptions import (
    OperationTimeoutError,
    ServiceBusError,
    SessionCannotBeLockedError,
)

from georep.adapters.emulator import Emulator

pytestmark = pytest.mark.integration


# -- sessions ------------------------------------------------------------------------------
def _session_queue(emu: Emulator, **properties: Any) -> str:
    return make_queue(emu, requires_session=True, **properties)


@check("Sessions: receive a named session, FIFO within it")
def _named_session(emu: Emulator) -> None:
    queue = _session_queue(emu)
    send(emu, queue, *(ServiceBusMessage(f"{s}{i}", session_id=s) for i in range(4) for s in "ab"))
    with client_for(emu) as client, client.get_queue_receiver(queue, session_id="b") as receiver:
        got = receive_all(receiver, 4)
        assert bodies(got) == [b"b0", b"b1", b"b2", b"b3"]
        assert {m.session_id for m in got} == {"b"}
        for message in got:
            receiver.complete_message(message)
        assert receiver.receive_messages(max_wait_time=0.3) == []


@check("Sessions: `NEXT_AVAILABLE_SESSION`, `OperationTimeoutError` when none is free")
def _next_available(emu: Emulator) -> None:
    queue = _session_queue(emu)
    send(emu, queue, ServiceBusMessage(b"x", session_id="only"))
    with client_for(emu, retry_total=0) as client:
        first = client.get_queue_receiver(queue, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1)
        with first:
            assert first.session.session_id == "only"
            with (
                pytest.raises(OperationTimeoutError),
                client.get_queue_receiver(
                    queue, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1
                ) as second,
            ):
                second.receive_messages(max_wait_time=1)


@check("Sessions: exclusive lock (`SessionCannotBeLockedError` for a second receiver)")
def _session_lock_conflict(emu: Emulator) -> None:
    queue = _session_queue(emu)
    send(emu, queue, ServiceBusMessage(b"x", session_id="s"))
    with (
        client_for(emu, retry_total=0) as client,
        client.get_queue_receiver(queue, session_id="s") as holder,
    ):
        assert holder.session.locked_until_utc is not None
        with (
            pytest.raises(SessionCannotBeLockedError),
            client.get_queue_receiver(queue, session_id="s") as second,
        ):
            second.receive_messages(max_wait_time=1)


@check("Sessions: `get_state`/`set_state`, `renew_lock`, `locked_until_utc`")
def _session_state(emu: Emulator) -> None:
    queue = _session_queue(emu, lock_duration=30)
    send(emu, queue, ServiceBusMessage(b"x", session_id="s"))
    with client_for(emu) as client:
        with client.get_queue_receiver(queue, session_id="s") as receiver:
            before = receiver.session.locked_until_utc
            time.sleep(0.05)
            assert receiver.session.renew_lock() > before
            receiver.session.set_state(b"step-2")
        with client.get_queue_receiver(queue, session_id="s") as receiver:
            assert receiver.session.get_state() == b"step-2"  # outlives the receiver


@check("Sessions: a message without `session_id` refused by a session queue")
def _session_id_required(emu: Emulator) -> None:
    queue = _session_queue(emu)
    with pytest.raises(ServiceBusError, match="SessionId"):
        send(emu, queue, ServiceBusMessage(b"no session"))
    assert emu.namespace("primary").message_count(queue) == 0


@check("Sessions: `list_queue_sessions`")
def _list_sessions(emu: Emulator) -> None:
    queue = _session_queue(emu)
    send(emu, queue, *(ServiceBusMessage(b"x", session_id=s) for s in ("s1", "s2", "s3")))
    with client_for(emu) as client:
        assert sorted(client.list_queue_sessions(queue)) == ["s1", "s2", "s3"]


@check("Sessions: `AutoLockRenewer` on a session")
def _session_auto_renew(emu: Emulator) -> None:
    queue = _session_queue(emu, lock_duration=3)
    send(emu, queue, ServiceBusMessage(b"x", session_id="s"))
    with (
        client_for(emu) as client,
        client.get_queue_receiver(queue, session_id="s") as receiver,
        AutoLockRenewer(max_lock_renewal_duration=30) as renewer,
    ):
        renewer.register(receiver, receiver.session)
        [message] = receive_all(receiver, 1)
        time.sleep(4)  # beyond the 3 s lock: only renewal keeps the session
        receiver.complete_message(message)
    assert emu.namespace("primary").message_count(queue) == 0


test_supported_operation_works = checks_test(__name__)
