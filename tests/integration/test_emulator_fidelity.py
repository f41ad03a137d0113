"""The fidelity table of docs/emulator.md, kept true.

Every row the table marks supported (``yes``) names an operation; this module runs each one
with the real azure-servicebus SDK against the emulator, in the style of the SDK's usage
docs. A supported row without a check, a check without a row, or a check that fails, fails
the suite: the table cannot claim what the emulator does not do.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from _helpers import REPO
from azure.servicebus import (
    NEXT_AVAILABLE_SESSION,
    AutoLockRenewer,
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
)
from azure.servicebus.aio import ServiceBusClient as AsyncClient
from azure.servicebus.exceptions import (
    MessageSizeExceededError,
    MessagingEntityNotFoundError,
    OperationTimeoutError,
    ServiceBusAuthenticationError,
    ServiceBusError,
    SessionCannotBeLockedError,
)
from azure.servicebus.management import (
    CorrelationRuleFilter,
    FalseRuleFilter,
    SqlRuleAction,
    SqlRuleFilter,
    TrueRuleFilter,
)

from georep.adapters.emulator import Emulator

pytestmark = pytest.mark.integration

DOC = REPO / "docs" / "emulator.md"
_START, _END = "<!-- fidelity:start -->", "<!-- fidelity:end -->"

Check = Callable[[Emulator], None]
CHECKS: dict[str, Check] = {}


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


def check(operation: str) -> Callable[[Check], Check]:
    def register(function: Check) -> Check:
        CHECKS[operation] = function
        return function

    return register


def _slug(operation: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", operation.lower()).strip("-")


# -- helpers --------------------------------------------------------------------------------
def _name(prefix: str) -> str:
    return f"fid-{prefix}-{uuid.uuid4().hex[:8]}"


def _queue(emu: Emulator, **properties: Any) -> str:
    name = _name("q")
    emu.namespace("primary").create_queue(name, **properties)
    return name


@contextmanager
def _client(emu: Emulator) -> Iterator[ServiceBusClient]:
    with ServiceBusClient.from_connection_string(emu.connection_string("primary")) as client:
        yield client


def _send(emu: Emulator, queue: str, *messages: ServiceBusMessage) -> None:
    with _client(emu) as client, client.get_queue_sender(queue) as sender:
        sender.send_messages(list(messages))


def _bodies(messages: Any) -> list[bytes]:
    return [b"".join(message.body) for message in messages]


def _receive_all(receiver: Any, expect: int, *, within: float = 10.0) -> list[Any]:
    received: list[Any] = []
    deadline = time.monotonic() + within
    while len(received) < expect and time.monotonic() < deadline:
        received += receiver.receive_messages(
            max_message_count=expect - len(received), max_wait_time=1
        )
    return received


# -- sending --------------------------------------------------------------------------------
@check("Send one message or a list")
def _send_single_and_list(emu: Emulator) -> None:
    queue = _queue(emu)
    with _client(emu) as client:
        with client.get_queue_sender(queue) as sender:
            sender.send_messages(ServiceBusMessage(b"one"))
            sender.send_messages([ServiceBusMessage(b"two"), ServiceBusMessage(b"three")])
        with client.get_queue_receiver(queue) as receiver:
            got = _receive_all(receiver, 3)
            assert sorted(_bodies(got)) == [b"one", b"three", b"two"]


@check("Send a `ServiceBusMessageBatch`")
def _send_batch(emu: Emulator) -> None:
    queue = _queue(emu)
    with _client(emu) as client:
        with client.get_queue_sender(queue) as sender:
            batch = sender.create_message_batch()
            for index in range(5):
                batch.add_message(ServiceBusMessage(f"m{index}"))
            sender.send_messages(batch)
        with client.get_queue_receiver(queue) as receiver:
            assert len(_receive_all(receiver, 5)) == 5


@check("Schedule and cancel scheduled messages")
def _schedule(emu: Emulator) -> None:
    queue = _queue(emu)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    with _client(emu) as client:
        with client.get_queue_sender(queue) as sender:
            first, second = sender.schedule_messages(
                [ServiceBusMessage(b"a"), ServiceBusMessage(b"b")], later
            )
            sender.cancel_scheduled_messages(first)
        with client.get_queue_receiver(queue) as receiver:
            peeked = receiver.peek_messages(max_message_count=10)
            assert [m.sequence_number for m in peeked] == [second]
            assert receiver.receive_messages(max_wait_time=1) == []


@check("Send to a topic: fan-out to every subscription")
def _topic_fan_out(emu: Emulator) -> None:
    topic = _name("t")
    emu.namespace("primary").create_topic(topic, ["a", "b"])
    with _client(emu) as client:
        with client.get_topic_sender(topic) as sender:
            sender.send_messages(ServiceBusMessage(b"fan"))
        for subscription in ("a", "b"):
            with client.get_subscription_receiver(topic, subscription) as receiver:
                assert _bodies(_receive_all(receiver, 1)) == [b"fan"]


# -- receiving and settling -----------------------------------------------------------------
@check("Receive (PEEK_LOCK) and `complete_message`")
def _peek_lock_complete(emu: Emulator) -> None:
    queue = _queue(emu)
    _send(emu, queue, ServiceBusMessage(b"x"))
    with _client(emu) as client, client.get_queue_receiver(queue) as receiver:
        [message] = _receive_all(receiver, 1)
        assert message.locked_until_utc is not None and message.delivery_count == 0
        receiver.complete_message(message)
        assert receiver.receive_messages(max_wait_time=1) == []
    assert emu.namespace("primary").message_count(queue) == 0


@check("RECEIVE_AND_DELETE")
def _receive_and_delete(emu: Emulator) -> None:
    queue = _queue(emu)
    _send(emu, queue, ServiceBusMessage(b"x"))
    with _client(emu) as client:
        receiver = client.get_queue_receiver(
            queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
        )
        with receiver:
            assert _bodies(_receive_all(receiver, 1)) == [b"x"]
    assert emu.namespace("primary").message_count(queue) == 0


@check("`abandon_message`: redelivered with the delivery count raised")
def _abandon(emu: Emulator) -> None:
    queue = _queue(emu)
    _send(emu, queue, ServiceBusMessage(b"x"))
    with _client(emu) as client, client.get_queue_receiver(queue) as receiver:
        [message] = _receive_all(receiver, 1)
        receiver.abandon_message(message)
        [again] = _receive_all(receiver, 1)
        assert again.sequence_number == message.sequence_number
        assert again.delivery_count == 1
        receiver.complete_message(again)


@check("`dead_letter_message` and the dead-letter sub-queue")
def _dead_letter(emu: Emulator) -> None:
    queue = _queue(emu)
    _send(emu, queue, ServiceBusMessage(b"x"))
    with _client(emu) as client:
        with client.get_queue_receiver(queue) as receiver:
            [message] = _receive_all(receiver, 1)
            receiver.dead_letter_message(message, reason="bad", error_description="why")
        dlq = client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
        with dlq:
            [dead] = _receive_all(dlq, 1)
            assert (dead.dead_letter_reason, dead.dead_letter_error_description) == (
                "bad",
                "why",
            )
            dlq.complete_message(dead)


@check("`defer_message` and `receive_deferred_messages`")
def _defer(emu: Emulator) -> None:
    queue = _queue(emu)
    _send(emu, queue, ServiceBusMessage(b"x"))
    with _client(emu) as client, client.get_queue_receiver(queue) as receiver:
        [message] = _receive_all(receiver, 1)
        receiver.defer_message(message)
        assert receiver.receive_messages(max_wait_time=1) == []
        [deferred] = receiver.receive_deferred_messages([message.sequence_number])
        assert _bodies([deferred]) == [b"x"]
        receiver.complete_message(deferred)


@check("`renew_message_lock`")
def _renew_lock(emu: Emulator) -> None:
    queue = _queue(emu, lock_duration=30)
    _send(emu, queue, ServiceBusMessage(b"x"))
    with _client(emu) as client, client.get_queue_receiver(queue) as receiver:
        [message] = _receive_all(receiver, 1)
        before = message.locked_until_utc
        time.sleep(0.05)
        after = receiver.renew_message_lock(message)
        assert after > before
        receiver.complete_message(message)


@check("`peek_messages`")
def _peek(emu: Emulator) -> None:
    queue = _queue(emu)
    _send(emu, queue, *(ServiceBusMessage(f"m{i}") for i in range(3)))
    with _client(emu) as client, client.get_queue_receiver(queue) as receiver:
        peeked = receiver.peek_messages(max_message_count=10)
        assert _bodies(peeked) == [b"m0", b"m1", b"m2"]
    assert emu.namespace("primary").message_count(queue) == 3


@check("Lock expiry: the message is redelivered")
def _lock_expiry(emu: Emulator) -> None:
    queue = _queue(emu, lock_duration=1)
    _send(emu, queue, ServiceBusMessage(b"x"))
    with _client(emu) as client, client.get_queue_receiver(queue) as receiver:
        [message] = _receive_all(receiver, 1)
        [again] = _receive_all(receiver, 1, within=5)
        assert again.sequence_number == message.sequence_number
        assert again.delivery_count == 1
        receiver.complete_message(again)


@check("Max delivery count: dead-lettered `MaxDeliveryCountExceeded`")
def _max_delivery(emu: Emulator) -> None:
    queue = _queue(emu, max_delivery_count=2)
    _send(emu, queue, ServiceBusMessage(b"x"))
    with _client(emu) as client:
        with client.get_queue_receiver(queue) as receiver:
            for _ in range(2):
                [message] = _receive_all(receiver, 1)
                receiver.abandon_message(message)
            assert receiver.receive_messages(max_wait_time=1) == []
        dlq = client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
        with dlq:
            [dead] = _receive_all(dlq, 1)
            assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
            dlq.complete_message(dead)


@check("Message time to live: expired messages dead-lettered `TTLExpiredException`")
def _ttl(emu: Emulator) -> None:
    queue = _queue(emu, dead_lettering_on_message_expiration=True)
    _send(emu, queue, ServiceBusMessage(b"x", time_to_live=dt.timedelta(seconds=1)))
    with _client(emu) as client:
        dlq = client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
        with dlq:
            [dead] = _receive_all(dlq, 1, within=6)
            assert dead.dead_letter_reason == "TTLExpiredException"
            dlq.complete_message(dead)


@check("Duplicate detection")
def _duplicate_detection(emu: Emulator) -> None:
    queue = _queue(emu, requires_duplicate_detection=True)
    _send(emu, queue, ServiceBusMessage(b"1", message_id="same"))
    _send(emu, queue, ServiceBusMessage(b"2", message_id="same"))
    assert emu.namespace("primary").message_count(queue) == 1


@check("Partitioned queues and topics")
def _partitioned(emu: Emulator) -> None:
    queue = _queue(emu, enable_partitioning=True)
    _send(emu, queue, *(ServiceBusMessage(f"m{i}", partition_key=f"k{i}") for i in range(4)))
    with _client(emu) as client, client.get_queue_receiver(queue) as receiver:
        assert len(_receive_all(receiver, 4)) == 4


@check("Async client (`azure.servicebus.aio`)")
def _async_client(emu: Emulator) -> None:
    queue = _queue(emu)

    async def run() -> list[bytes]:
        async with AsyncClient.from_connection_string(emu.connection_string("primary")) as sb:
            async with sb.get_queue_sender(queue) as sender:
                await sender.send_messages(ServiceBusMessage(b"async"))
            async with sb.get_queue_receiver(queue) as receiver:
                got = await receiver.receive_messages(max_wait_time=5)
                for message in got:
                    await receiver.complete_message(message)
                return _bodies(got)

    assert asyncio.run(run()) == [b"async"]


@check("`AutoLockRenewer` on messages")
def _auto_lock_renewer(emu: Emulator) -> None:
    queue = _queue(emu, lock_duration=2)
    _send(emu, queue, *(ServiceBusMessage(f"m{i}") for i in range(3)))
    with _client(emu) as client, client.get_queue_receiver(queue) as receiver:
        messages = _receive_all(receiver, 3)
        with AutoLockRenewer(max_lock_renewal_duration=30) as renewer:
            for message in messages:
                renewer.register(receiver, message)
            time.sleep(3)  # beyond the 2 s lock: only renewal keeps the locks
            for message in messages:
                receiver.complete_message(message)
    assert emu.namespace("primary").message_count(queue) == 0


# -- refusals -------------------------------------------------------------------------------
@check("Oversize message refused (`MessageSizeExceededError`)")
def _oversize(emu: Emulator) -> None:
    queue = _queue(emu)
    with pytest.raises(MessageSizeExceededError):
        _send(emu, queue, ServiceBusMessage(b"x" * (300 * 1024)))
    assert emu.namespace("primary").message_count(queue) == 0


@check("Unknown entity refused (`MessagingEntityNotFoundError`)")
def _unknown_entity(emu: Emulator) -> None:
    with pytest.raises(MessagingEntityNotFoundError):
        _send(emu, _name("missing"), ServiceBusMessage(b"x"))


@check("Wrong key refused (`ServiceBusAuthenticationError`)")
def _wrong_key(emu: Emulator) -> None:
    queue = _queue(emu)
    good = emu.connection_string("primary")
    bad = re.sub(r"SharedAccessKey=[^;]+", "SharedAccessKey=" + "A" * 44, good)
    with (
        ServiceBusClient.from_connection_string(bad) as client,
        pytest.raises(ServiceBusAuthenticationError),
        client.get_queue_sender(queue) as sender,
    ):
        sender.send_messages(ServiceBusMessage(b"x"))


# -- administration -------------------------------------------------------------------------
@check("Admin: queue create, get, update, list, runtime properties, delete")
def _admin_queue(emu: Emulator) -> None:
    name = _name("adq")
    with emu.admin_client("primary") as admin:
        admin.create_queue(name, max_delivery_count=7)
        queue = admin.get_queue(name)
        assert queue.max_delivery_count == 7
        queue.max_delivery_count = 9
        admin.update_queue(queue)
        assert admin.get_queue(name).max_delivery_count == 9
        assert name in [q.name for q in admin.list_queues()]
        assert admin.get_queue_runtime_properties(name).total_message_count == 0
        admin.delete_queue(name)
        assert name not in [q.name for q in admin.list_queues()]


@check("Admin: topic and subscription create, get, list, delete")
def _admin_topic(emu: Emulator) -> None:
    topic = _name("adt")
    with emu.admin_client("primary") as admin:
        admin.create_topic(topic)
        admin.create_subscription(topic, "s1", max_delivery_count=4)
        assert admin.get_subscription(topic, "s1").max_delivery_count == 4
        assert [s.name for s in admin.list_subscriptions(topic)] == ["s1"]
        admin.delete_subscription(topic, "s1")
        admin.delete_topic(topic)
        assert topic not in [t.name for t in admin.list_topics()]


# -- rules and filters ---------------------------------------------------------------------
@check("Admin: rule create, get, list, update, delete (`$Default` too)")
def _admin_rules(emu: Emulator) -> None:
    topic = _name("rt")
    emu.namespace("primary").create_topic(topic, ["s"])
    with emu.admin_client("primary") as admin:
        assert [r.name for r in admin.list_rules(topic, "s")] == ["$Default"]
        admin.create_rule(topic, "s", "red", filter=SqlRuleFilter("color = 'red'"))
        rule = admin.get_rule(topic, "s", "red")
        assert isinstance(rule.filter, SqlRuleFilter)
        rule.filter = SqlRuleFilter("color = 'blue'")
        admin.update_rule(topic, "s", rule)
        assert admin.get_rule(topic, "s", "red").filter.sql_expression == "color = 'blue'"
        admin.delete_rule(topic, "s", "$Default")
        assert [r.name for r in admin.list_rules(topic, "s")] == ["red"]
        admin.delete_rule(topic, "s", "red")
        assert list(admin.list_rules(topic, "s")) == []


@check("Subscription filters: SQL, correlation, true and false")
def _filters(emu: Emulator) -> None:
    topic = _name("ft")
    emu.namespace("primary").create_topic(topic, ["sql", "corr", "none"])
    with emu.admin_client("primary") as admin:
        rules = {
            "sql": SqlRuleFilter("size > @min AND sys.Label LIKE 'ord%'", parameters={"@min": 5}),
            "corr": CorrelationRuleFilter(correlation_id="c-1", properties={"tier": "gold"}),
            "none": FalseRuleFilter(),
        }
        for subscription, rule_filter in rules.items():
            admin.delete_rule(topic, subscription, "$Default")
            admin.create_rule(topic, subscription, "only", filter=rule_filter)
    with _client(emu) as client:
        with client.get_topic_sender(topic) as sender:
            sender.send_messages(
                [
                    ServiceBusMessage(b"big", subject="ord", application_properties={"size": 9}),
                    ServiceBusMessage(b"small", subject="ord", application_properties={"size": 1}),
                    ServiceBusMessage(
                        b"gold", correlation_id="c-1", application_properties={"tier": "gold"}
                    ),
                ]
            )
        expected = {"sql": [b"big"], "corr": [b"gold"], "none": []}
        for subscription, bodies in expected.items():
            with client.get_subscription_receiver(topic, subscription) as receiver:
                got = _receive_all(receiver, len(bodies), within=3)
                assert _bodies(got) == bodies, subscription
                assert receiver.receive_messages(max_wait_time=0.5) == []


@check("`SqlRuleAction` (`SET`, `REMOVE`) on the subscription's copy")
def _rule_action(emu: Emulator) -> None:
    topic = _name("at")
    emu.namespace("primary").create_topic(topic, ["tagged", "plain"])
    with emu.admin_client("primary") as admin:
        admin.delete_rule(topic, "tagged", "$Default")
        admin.create_rule(
            topic,
            "tagged",
            "tag",
            filter=TrueRuleFilter(),
            action=SqlRuleAction("SET routed = 'yes'; REMOVE secret"),
        )
    message = ServiceBusMessage(b"m", application_properties={"secret": "s", "keep": 1})
    with _client(emu) as client:
        with client.get_topic_sender(topic) as sender:
            sender.send_messages(message)
        with client.get_subscription_receiver(topic, "tagged") as receiver:
            [tagged] = _receive_all(receiver, 1)
            props = tagged.application_properties
            assert props[b"routed"] == b"yes" and b"secret" not in props and props[b"keep"] == 1
        with client.get_subscription_receiver(topic, "plain") as receiver:
            [plain] = _receive_all(receiver, 1)
            assert b"routed" not in plain.application_properties
            assert plain.application_properties[b"secret"] == b"s"


# -- sessions ------------------------------------------------------------------------------
def _session_queue(emu: Emulator, **properties: Any) -> str:
    return _queue(emu, requires_session=True, **properties)


@check("Sessions: receive a named session, FIFO within it")
def _named_session(emu: Emulator) -> None:
    queue = _session_queue(emu)
    _send(emu, queue, *(ServiceBusMessage(f"{s}{i}", session_id=s) for i in range(4) for s in "ab"))
    with _client(emu) as client, client.get_queue_receiver(queue, session_id="b") as receiver:
        got = _receive_all(receiver, 4)
        assert _bodies(got) == [b"b0", b"b1", b"b2", b"b3"]
        assert {m.session_id for m in got} == {"b"}
        for message in got:
            receiver.complete_message(message)
        assert receiver.receive_messages(max_wait_time=0.5) == []


@check("Sessions: `NEXT_AVAILABLE_SESSION`, `OperationTimeoutError` when none is free")
def _next_available(emu: Emulator) -> None:
    queue = _session_queue(emu)
    _send(emu, queue, ServiceBusMessage(b"x", session_id="only"))
    with _client(emu) as client:
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
    _send(emu, queue, ServiceBusMessage(b"x", session_id="s"))
    with _client(emu) as client, client.get_queue_receiver(queue, session_id="s") as holder:
        assert holder.session.locked_until_utc is not None
        with (
            pytest.raises(SessionCannotBeLockedError),
            client.get_queue_receiver(queue, session_id="s") as second,
        ):
            second.receive_messages(max_wait_time=1)


@check("Sessions: `get_state`/`set_state`, `renew_lock`, `locked_until_utc`")
def _session_state(emu: Emulator) -> None:
    queue = _session_queue(emu, lock_duration=30)
    _send(emu, queue, ServiceBusMessage(b"x", session_id="s"))
    with _client(emu) as client:
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
        _send(emu, queue, ServiceBusMessage(b"no session"))
    assert emu.namespace("primary").message_count(queue) == 0


@check("Sessions: `list_queue_sessions`")
def _list_sessions(emu: Emulator) -> None:
    queue = _session_queue(emu)
    _send(emu, queue, *(ServiceBusMessage(b"x", session_id=s) for s in ("s1", "s2", "s3")))
    with _client(emu) as client:
        assert sorted(client.list_queue_sessions(queue)) == ["s1", "s2", "s3"]


@check("Sessions: `AutoLockRenewer` on a session")
def _session_auto_renew(emu: Emulator) -> None:
    queue = _session_queue(emu, lock_duration=3)
    _send(emu, queue, ServiceBusMessage(b"x", session_id="s"))
    with (
        _client(emu) as client,
        client.get_queue_receiver(queue, session_id="s") as receiver,
        AutoLockRenewer(max_lock_renewal_duration=30) as renewer,
    ):
        renewer.register(receiver, receiver.session)
        [message] = _receive_all(receiver, 1)
        time.sleep(4)  # beyond the 3 s lock: only renewal keeps the session
        receiver.complete_message(message)
    assert emu.namespace("primary").message_count(queue) == 0


# -- the tests ------------------------------------------------------------------------------
ROWS = fidelity_rows()
SUPPORTED = [operation for operation, supported in ROWS if supported.startswith("yes")]


def test_the_table_and_the_checks_name_the_same_operations() -> None:
    listed = {operation for operation, _ in ROWS}
    assert not [op for op in SUPPORTED if op not in CHECKS], "supported rows without a check"
    assert not [op for op in CHECKS if op not in listed], "checks without a row in the table"
    assert len(SUPPORTED) >= 20


@pytest.mark.parametrize("operation", SUPPORTED, ids=[_slug(op) for op in SUPPORTED])
def test_supported_operation_works(operation: str, georep_emulator: Emulator) -> None:
    CHECKS[operation](georep_emulator)
