"""What the drop-in client tests share: the entities a sample program uses, what a run
leaves in a region, and running a program with its output captured.

Imported as ``from _dropin import ...`` by ``test_dropin_client.py`` and
``test_dropin_client_sync.py``.
"""

from __future__ import annotations

import contextlib
import io
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from types import ModuleType
from typing import Any

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

from georep.adapters.emulator import Emulator

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
