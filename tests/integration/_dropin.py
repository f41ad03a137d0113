"""What the drop-in client tests share: the entities a sample program uses, what a run
leaves in a region, and running a program with its output captured.

Imported as ``from _dropin import ...`` by ``test_dropin_client.py`` and
``test_dropin_client_sync.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from types import ModuleType
from typing import Any

from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusSubQueue
from azure.servicebus.exceptions import OperationTimeoutError
from samples import (
    abandon,
    amqp_annotated,
    auto_lock_renew,
    dead_letter,
    deferred,
    peek,
    receive_and_delete,
    receive_batches,
    schedule_and_cancel,
    send_and_receive,
    sessions,
    topic_subscription,
)

from georep import ReplicationMode
from georep.adapters.emulator import Emulator
from georep.adapters.redis import RedisSeenSet
from georep.servicebus.aio import ServiceBusClient

SAMPLES: tuple[ModuleType, ...] = (
    abandon,
    amqp_annotated,
    auto_lock_renew,
    dead_letter,
    deferred,
    peek,
    receive_and_delete,
    receive_batches,
    schedule_and_cancel,
    send_and_receive,
    sessions,
    topic_subscription,
)
REGIONS = ("primary", "secondary")


def sample_id(sample: ModuleType) -> str:
    return sample.__name__.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class Names:
    """The entities one run of a sample uses (created fresh for it)."""

    queue: str
    lock_queue: str
    session_queue: str
    topic: str
    subscription: str = "sub"

    @property
    def receivable(self) -> tuple[str, ...]:
        """The entity paths that hold messages (queues and the subscription)."""
        return (
            self.queue,
            self.lock_queue,
            self.session_queue,
            f"{self.topic}/Subscriptions/{self.subscription}",
        )


LOCK_SECONDS = 5
"""The entities' lock duration: short, so that copies a region locked for a receiver that
an outage cut off are delivered again within a test (to show they are not handed out)."""


def make_names(emu: Emulator, namespaces: Sequence[str]) -> Names:
    """New entities for one run, in each of ``namespaces`` (every lock lasts 5 s)."""
    tag = uuid.uuid4().hex[:8]
    names = Names(
        queue=f"q-{tag}", lock_queue=f"lock-{tag}", session_queue=f"s-{tag}", topic=f"t-{tag}"
    )
    for namespace in namespaces:
        control = emu.namespace(namespace)
        control.create_queue(names.queue, lock_duration=LOCK_SECONDS)
        control.create_queue(names.lock_queue, lock_duration=LOCK_SECONDS)
        control.create_queue(names.session_queue, lock_duration=LOCK_SECONDS, requires_session=True)
        control.create_topic(names.topic)
        with emu.admin_client(namespace) as admin:
            admin.create_subscription(
                names.topic, names.subscription, lock_duration=timedelta(seconds=LOCK_SECONDS)
            )
    return names


Left = dict[str, tuple[int, int, int]]

SESSIONS = 4
"""Sessions the verifying receiver takes at most (the samples use two)."""


class Outage:
    """The checkpoint that takes the primary down, once, and notes when: every lock the
    program's receivers held in the primary was taken before that moment."""

    def __init__(self, emu: Emulator) -> None:
        self._emu = emu
        self.started: float | None = None
        """``time.monotonic()`` when the primary went down; None until the checkpoint."""

    def _note(self) -> bool:
        if self.started is not None:
            return False
        self.started = time.monotonic()
        return True

    async def __call__(self) -> None:
        if self._note():
            await asyncio.to_thread(self._emu.namespace("primary").outage)

    def sync(self) -> None:
        if self._note():
            self._emu.namespace("primary").outage()

    def locks_lapsed_by(self) -> float:
        """When every lock the primary held at the outage has lapsed, with a margin: a
        copy locked for a receiver the outage cut off is delivered again by then."""
        assert self.started is not None, "the program never reached its checkpoint"
        return self.started + LOCK_SECONDS + 2


_LEAST_WAIT = 3.0
"""The least a verifying receive waits: long enough to attach to both regions and for the
restored primary's copies to arrive."""


async def handed_out_again(
    emu: Emulator, names: Names, seen: RedisSeenSet, *, until: float
) -> list[str]:
    """What a new client on the same seen-set hands out of every entity (and dead-letter
    queue) the program used, receiving until ``until`` (a ``time.monotonic()``, see
    :meth:`Outage.locks_lapsed_by`) and at least a few seconds; then closes it (settling
    the copies it found settled). Every entity, and up to :data:`SESSIONS` sessions, at
    once."""
    found: list[str] = []
    wait = max(_LEAST_WAIT, until - time.monotonic())
    client = ServiceBusClient.from_connection_strings(
        emu.connection_string("primary"),
        emu.connection_string("secondary"),
        seen=seen,
        mode=ReplicationMode.ACTIVE,
    )
    async with client:
        receivers = [
            client.get_queue_receiver(names.queue),
            client.get_queue_receiver(names.lock_queue),
            client.get_subscription_receiver(names.topic, names.subscription),
            client.get_queue_receiver(names.queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER),
            client.get_subscription_receiver(
                names.topic, names.subscription, sub_queue=ServiceBusSubQueue.DEAD_LETTER
            ),
        ]

        async def drain(receiver: Any) -> None:
            async with receiver:
                for msg in await receiver.receive_messages(100, max_wait_time=wait):
                    found.append(f"{receiver.entity_path}: {msg}")
                    await receiver.abandon_message(msg)

        async def drain_a_session() -> None:
            receiver = client.get_queue_receiver(
                names.session_queue, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=wait
            )
            with contextlib.suppress(OperationTimeoutError):  # no session with messages
                await drain(receiver)

        await asyncio.gather(
            *(drain_a_session() for _ in range(SESSIONS)), *(drain(r) for r in receivers)
        )
    return found


def leftovers(emu: Emulator, namespace: str, names: Names) -> Left:
    """What a run left in ``namespace``: per entity, (active, dead-lettered, scheduled)."""
    entities = emu.namespace(namespace).entities()
    left: Left = {}
    for path in names.receivable:
        runtime = entities[path]
        left[
            path.replace(names.queue, "QUEUE")
            .replace(names.lock_queue, "LOCK")
            .replace(names.session_queue, "SESSIONS")
            .replace(names.topic, "TOPIC")
        ] = (
            int(runtime["active_message_count"]),
            int(runtime["dead_letter_message_count"]),
            int(runtime["scheduled_message_count"]),
        )
    return left


async def capture_async(run: Callable[[], Awaitable[None]]) -> list[str]:
    """What ``run()`` printed, by line."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        await run()
    return printed.getvalue().splitlines()


def capture(run: Callable[[], Any]) -> list[str]:
    """What ``run()`` printed, by line."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        run()
    return printed.getvalue().splitlines()


async def nothing() -> None:
    """The checkpoint of a run without faults."""


def nothing_sync() -> None:
    """The checkpoint of a sync run without faults."""
