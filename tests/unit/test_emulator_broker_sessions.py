"""Sessions in the emulator's broker, on virtual time: no network, no sleeping."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from _emulator_parts import Clock

from georep.adapters.emulator._broker import (
    BrokerError,
    Entity,
    EntityProperties,
    Namespace,
    StoredMessage,
    SubscriptionProperties,
)
from georep.adapters.emulator._codec import encode_value
from georep.adapters.emulator._sessions import (
    SESSION_CANNOT_BE_LOCKED,
    SESSION_LOCK_LOST,
    Session,
)

LOCK = 30.0


def payload(body: str, session_id: str | None = None) -> bytes:
    """An encoded message whose properties carry ``session_id`` as the AMQP group-id."""
    properties = [None] * 10 + [session_id]
    return b"\x00\x53\x73" + encode_value(properties) + b"\x00\x53\x75" + encode_value(body)


@dataclass(eq=False)
class Receiver:
    """A session receiver link as the broker sees it: holder and waiter at once."""

    credit: int = 100
    receive_and_delete: bool = False
    got: list[tuple[StoredMessage, uuid.UUID | None]] = field(default_factory=list)
    session: Session | None = None
    lost: list[BrokerError] = field(default_factory=list)
    timeouts: int = 0

    @property
    def holder(self) -> Receiver:
        return self

    def deliver(self, message: StoredMessage, lock_token: uuid.UUID | None) -> None:
        self.credit -= 1
        self.got.append((message, lock_token))

    def accepted(self, session: Session) -> None:
        self.session = session

    def timed_out(self) -> None:
        self.timeouts += 1

    def session_lost(self, error: BrokerError) -> None:
        self.lost.append(error)

    def bodies(self) -> list[str]:
        return [m.bare.decode("latin-1").rsplit("\xa1", 1)[-1][1:] for m, _ in self.got]

    def tokens(self) -> list[uuid.UUID]:
        return [token for _, token in self.got if token is not None]


@pytest.fixture
def queue(ns: Namespace) -> Entity:
    return ns.create_queue(
        "q", EntityProperties(requires_session=True, lock_duration=timedelta(seconds=LOCK))
    )


def send(ns: Namespace, queue: Entity, *messages: tuple[str, str | None]) -> None:
    for body, session_id in messages:
        ns.send(queue, payload(body, session_id))


def advance(ns: Namespace, broker_clock: Clock, seconds: float) -> None:
    broker_clock.now += seconds
    ns.run_timers()


def sessions_of(entity: Entity):  # type: ignore[no-untyped-def]
    assert entity.sessions is not None
    return entity.sessions


# -- delivery -------------------------------------------------------------------------------


def test_a_session_holder_gets_only_its_sessions_messages_in_order(
    ns: Namespace, queue: Entity
) -> None:
    send(ns, queue, ("a1", "a"), ("b1", "b"), ("a2", "a"), ("b2", "b"), ("a3", "a"))
    receiver = Receiver()
    sessions_of(queue).accept(receiver, "a")
    assert receiver.bodies() == ["a1", "a2", "a3"]
    send(ns, queue, ("a4", "a"))
    assert receiver.bodies()[-1] == "a4"
    assert {m.session_id for m, _ in receiver.got} == {"a"}


def test_delivery_waits_for_credit_and_keeps_the_order(ns: Namespace, queue: Entity) -> None:
    send(ns, queue, *((f"m{i}", "s") for i in range(4)))
    receiver = Receiver(credit=1)
    sessions_of(queue).accept(receiver, "s")
    assert receiver.bodies() == ["m0"]
    receiver.credit = 2
    queue.dispatch()  # what a flow frame does
    assert receiver.bodies() == ["m0", "m1", "m2"]


def test_abandon_puts_the_message_back_at_the_head_of_its_session(
    ns: Namespace, queue: Entity
) -> None:
    send(ns, queue, ("m0", "s"), ("m1", "s"))
    receiver = Receiver(credit=1)
    sessions_of(queue).accept(receiver, "s")
    queue.abandon(receiver.tokens()[0])
    receiver.credit = 2
    queue.dispatch()
    assert receiver.bodies() == ["m0", "m0", "m1"]
    assert receiver.got[1][0].delivery_count == 1


def test_messages_abandoned_one_by_one_return_in_their_session_order(
    ns: Namespace, queue: Entity
) -> None:
    send(ns, queue, ("m0", "s"), ("m1", "s"), ("m2", "s"), ("m3", "s"))
    receiver = Receiver(credit=3)
    sessions_of(queue).accept(receiver, "s")
    for token in receiver.tokens():  # oldest first, as a closing receiver releases them
        queue.abandon(token)
    receiver.credit = 4
    queue.dispatch()
    assert receiver.bodies()[3:] == ["m0", "m1", "m2", "m3"]


def test_a_message_without_session_id_is_refused_by_a_session_queue(
    ns: Namespace, queue: Entity
) -> None:
    with pytest.raises(BrokerError, match="SessionId was not set") as refused:
        ns.send(queue, payload("none"))
    assert refused.value.condition == "amqp:not-allowed"
    with pytest.raises(BrokerError, match="SessionId was not set"):
        ns.schedule(queue, payload("none"), None)
    assert queue.message_count == 0


def test_a_session_subscription_dead_letters_a_message_without_session_id(
    ns: Namespace,
) -> None:
    topic = ns.create_topic("t")
    subscription = ns.create_subscription("t", "s", SubscriptionProperties(requires_session=True))
    ns.send(topic, payload("none"))
    dead_letter = subscription.dead_letter
    assert dead_letter is not None and dead_letter.sessions is None
    (dead,) = dead_letter.peek(0, 10)
    assert dead.session_id is None
    assert b"Session id is null." in dead.bare
    assert subscription.active_count == 0


def test_the_dead_letter_queue_of_a_session_queue_is_not_session_enabled(
    ns: Namespace, queue: Entity
) -> None:
    send(ns, queue, ("m", "s"))
    receiver = Receiver()
    sessions_of(queue).accept(receiver, "s")
    queue.dead_letter_by_token(receiver.tokens()[0], "r", "d")
    assert queue.dead_letter is not None and queue.dead_letter.sessions is None
    assert [m.session_id for m in queue.dead_letter.available] == ["s"]


# -- locks ----------------------------------------------------------------------------------


def test_a_held_session_cannot_be_locked_by_another_receiver(ns: Namespace, queue: Entity) -> None:
    sessions = sessions_of(queue)
    sessions.accept(Receiver(), "s")
    with pytest.raises(BrokerError) as refused:
        sessions.accept(Receiver(), "s")
    assert refused.value.condition == SESSION_CANNOT_BE_LOCKED


def test_a_released_session_can_be_locked_again_and_its_messages_return(
    ns: Namespace, queue: Entity
) -> None:
    send(ns, queue, ("m0", "s"), ("m1", "s"))
    sessions = sessions_of(queue)
    first = Receiver()
    sessions.accept(first, "s")
    sessions.release(first)  # its link closed with both messages unsettled
    second = Receiver()
    sessions.accept(second, "s")
    assert second.bodies() == ["m0", "m1"]
    assert [m.delivery_count for m, _ in second.got] == [1, 1]


def test_the_session_lock_expires_after_the_lock_duration(
    ns: Namespace, queue: Entity, broker_clock: Clock
) -> None:
    send(ns, queue, ("m0", "s"), ("m1", "s"))
    receiver = Receiver()
    session = sessions_of(queue).accept(receiver, "s")
    assert session.locked_until == broker_clock.now + LOCK
    assert {m.locked_until for m, _ in receiver.got} == {broker_clock.now + LOCK}
    advance(ns, broker_clock, LOCK - 1)
    assert receiver.lost == []
    advance(ns, broker_clock, 1)
    assert [e.condition for e in receiver.lost] == [SESSION_LOCK_LOST]
    with pytest.raises(BrokerError) as settle:
        queue.complete(receiver.tokens()[0])
    assert settle.value.condition == SESSION_LOCK_LOST
    again = Receiver()
    sessions_of(queue).accept(again, "s")
    assert again.bodies() == ["m0", "m1"]


def test_renew_extends_the_session_and_its_message_locks(
    ns: Namespace, queue: Entity, broker_clock: Clock
) -> None:
    send(ns, queue, ("m", "s"))
    receiver = Receiver()
    sessions = sessions_of(queue)
    sessions.accept(receiver, "s")
    advance(ns, broker_clock, LOCK - 1)
    assert sessions.renew("s", receiver) == broker_clock.now + LOCK
    assert receiver.got[0][0].locked_until == broker_clock.now + LOCK
    advance(ns, broker_clock, LOCK - 1)  # past the first expiry: the old timer does nothing
    assert receiver.lost == []
    queue.complete(receiver.tokens()[0])
    assert queue.message_count == 0


def test_only_the_holder_may_renew_or_use_the_state(ns: Namespace, queue: Entity) -> None:
    sessions = sessions_of(queue)
    sessions.accept(Receiver(), "s")
    for operation in (
        lambda: sessions.renew("s", Receiver()),
        lambda: sessions.get_state("s", None),
        lambda: sessions.set_state("unknown", Receiver(), b"x"),
    ):
        with pytest.raises(BrokerError) as refused:
            operation()
        assert refused.value.condition == SESSION_LOCK_LOST


def test_expire_session_locks_detaches_every_holder_of_the_entity(
    ns: Namespace, queue: Entity
) -> None:
    send(ns, queue, ("a", "a"), ("b", "b"))
    holders = [Receiver(), Receiver()]
    sessions_of(queue).accept(holders[0], "a")
    sessions_of(queue).accept(holders[1], "b")
    assert ns.expire_session_locks("q") == 2
    assert [[e.condition for e in h.lost] for h in holders] == [[SESSION_LOCK_LOST]] * 2
    assert ns.expire_session_locks("q") == 0
    ns.create_queue("plain")
    with pytest.raises(BrokerError, match="not session-enabled"):
        ns.expire_session_locks("plain")


# -- next available -------------------------------------------------------------------------


def test_next_available_takes_the_oldest_free_session_with_messages(
    ns: Namespace, queue: Entity
) -> None:
    send(ns, queue, ("x", "busy"), ("y", "old"), ("z", "new"))
    sessions = sessions_of(queue)
    sessions.accept(Receiver(), "busy")
    receiver = Receiver()
    assert sessions.accept_next(receiver, timeout=5)
    assert receiver.session is not None and receiver.session.session_id == "old"


def test_next_available_waits_for_a_message_then_times_out(
    ns: Namespace, queue: Entity, broker_clock: Clock
) -> None:
    sessions = sessions_of(queue)
    waiting = Receiver()
    assert not sessions.accept_next(waiting, timeout=5)
    send(ns, queue, ("m", "s"))
    assert waiting.session is not None and waiting.bodies() == ["m"]
    late = Receiver()
    assert not sessions.accept_next(late, timeout=5)
    advance(ns, broker_clock, 4.9)
    assert late.timeouts == 0
    advance(ns, broker_clock, 0.1)
    assert late.timeouts == 1 and late.session is None


def test_a_withdrawn_waiter_neither_gets_a_session_nor_times_out(
    ns: Namespace, queue: Entity, broker_clock: Clock
) -> None:
    sessions = sessions_of(queue)
    waiting = Receiver()
    sessions.accept_next(waiting, timeout=5)
    sessions.withdraw(waiting)  # its link closed
    send(ns, queue, ("m", "s"))
    advance(ns, broker_clock, 10)
    assert (waiting.session, waiting.timeouts) == (None, 0)


def test_a_waiter_gets_a_session_its_holder_released(ns: Namespace, queue: Entity) -> None:
    send(ns, queue, ("m", "s"))
    sessions = sessions_of(queue)
    holder = Receiver()
    sessions.accept(holder, "s")
    waiting = Receiver()
    assert not sessions.accept_next(waiting, timeout=5)
    sessions.release(holder)
    assert waiting.session is not None and waiting.bodies() == ["m"]


# -- state, listing, peek, deferred ---------------------------------------------------------


def test_session_state_outlives_the_lock_and_none_clears_it(
    ns: Namespace, queue: Entity, broker_clock: Clock
) -> None:
    sessions = sessions_of(queue)
    first = Receiver()
    sessions.accept(first, "s")
    sessions.set_state("s", first, b"step-1")
    sessions.release(first)
    second = Receiver()
    sessions.accept(second, "s")
    assert sessions.get_state("s", second) == b"step-1"
    sessions.set_state("s", second, None)
    assert sessions.get_state("s", second) is None


def test_list_sessions_with_messages_or_state_and_updated_since(
    ns: Namespace, queue: Entity, broker_clock: Clock
) -> None:
    send(ns, queue, ("m", "with-messages"), ("m", "with-messages"))
    sessions = sessions_of(queue)
    receiver = Receiver()
    sessions.accept(receiver, "with-state")
    since = broker_clock.now
    advance(ns, broker_clock, 1)
    sessions.set_state("with-state", receiver, b"x")
    sessions.release(receiver)
    assert sessions.list(None, 0, 100) == ["with-messages", "with-state"]
    assert sessions.list(None, 1, 100) == ["with-state"]
    assert sessions.list(None, 0, 1) == ["with-messages"]
    assert sessions.list(since, 0, 100) == ["with-state"]
    assert sessions.list(broker_clock.now, 0, 100) == []


def test_peek_and_deferred_receive_see_only_the_named_session(ns: Namespace, queue: Entity) -> None:
    send(ns, queue, ("a0", "a"), ("b0", "b"), ("a1", "a"))
    assert [m.session_id for m in queue.peek(0, 10, "a")] == ["a", "a"]
    receiver = Receiver(credit=1)
    sessions_of(queue).accept(receiver, "b")
    (message, token) = receiver.got[0]
    queue.defer(token)  # type: ignore[arg-type]
    with pytest.raises(BrokerError, match="No deferred message"):
        queue.receive_deferred([message.sequence_number], False, "a")
    ((again, again_token),) = queue.receive_deferred([message.sequence_number], False, "b")
    assert again_token is not None and again.locked_until == receiver.session.locked_until  # type: ignore[union-attr]
    queue.complete(again_token)
