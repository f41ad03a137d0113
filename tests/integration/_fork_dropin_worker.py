"""The drop-in blocking client across ``os.fork()`` (test_fork_preload.py).

    python _fork_dropin_worker.py PRIMARY SECONDARY QUEUE REDIS_URL GROUP [async]

A gunicorn ``--preload`` / Celery prefork program: the parent makes the client (with a
``RedisSeenSet`` made from a URL, as docs/migration.md shows) and a sender, sends, then
forks. The child sends and receives through the parent's client, as it would with the
SDK's, and uses the parent's sender (whose connections are the parent's). It writes one
JSON line of what happened; the parent waits (at most 60 s: longer is a hang, and the
child is killed), then receives what is left and writes its own line. With ``async``,
the same with the asyncio client (each process runs its own event loop).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from _fork_worker import outcome, wait_for
from azure.servicebus import ServiceBusMessage

from georep.adapters.redis import RedisSeenSet
from georep.servicebus import ServiceBusClient, aio


def received(client: ServiceBusClient, queue: str) -> list[str]:
    bodies = []
    with client.get_queue_receiver(queue, max_wait_time=3) as receiver:
        for message in receiver:
            bodies.append(str(message))
            receiver.complete_message(message)
    return sorted(bodies)


def sent(client: ServiceBusClient, queue: str, body: str) -> str:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage(body))
    return "sent"


async def received_async(client: aio.ServiceBusClient, queue: str) -> list[str]:
    bodies = []
    async with client.get_queue_receiver(queue, max_wait_time=3) as receiver:
        async for message in receiver:
            bodies.append(str(message))
            await receiver.complete_message(message)
    return sorted(bodies)


async def sent_async(client: aio.ServiceBusClient, queue: str, body: str) -> str:
    async with client.get_queue_sender(queue) as sender:
        await sender.send_messages(ServiceBusMessage(body))
    return "sent"


def in_child(report: Callable[[], dict[str, Any]]) -> tuple[int | None, dict[str, Any]]:
    """Fork; the child runs ``report`` and exits. The child's exit status (None: it hung
    and was killed) and its report."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.write(write, json.dumps(report()).encode())
        os._exit(0)
    os.close(write)
    status = wait_for(pid)
    return status, json.loads(os.read(read, 65536) or b"{}")


def main_async(primary: str, secondary: str, queue: str, seen: RedisSeenSet) -> None:
    client = aio.ServiceBusClient.from_connection_strings(primary, secondary, seen=seen)
    asyncio.run(sent_async(client, queue, "from-parent"))
    status, child = in_child(
        lambda: {
            "pid": os.getpid(),
            "send": outcome(lambda: asyncio.run(sent_async(client, queue, "from-child"))),
            "receive": outcome(lambda: asyncio.run(received_async(client, queue))),
        }
    )
    asyncio.run(sent_async(client, queue, "parent-after"))
    after = asyncio.run(received_async(client, queue))
    print(json.dumps({"child_status": status, "child": child, "parent": after}))


def main() -> None:
    primary, secondary, queue, redis_url, group = sys.argv[1:6]
    if sys.argv[6:] == ["async"]:
        main_async(primary, secondary, queue, RedisSeenSet.from_url(redis_url, group=group))
        return
    seen = RedisSeenSet.from_url(redis_url, group=group)
    client = ServiceBusClient.from_connection_strings(primary, secondary, seen=seen)
    parents_sender = client.get_queue_sender(queue)
    parents_sender.send_messages(ServiceBusMessage("from-parent"))

    def report() -> dict[str, Any]:
        result = {
            "pid": os.getpid(),
            "send": outcome(lambda: sent(client, queue, "from-child")),
            "receive": outcome(lambda: received(client, queue)),
            "parents_sender": outcome(
                lambda: parents_sender.send_messages(ServiceBusMessage("never"))
            ),
        }
        client.close()
        return result

    status, child = in_child(report)
    parents_sender.send_messages(ServiceBusMessage("parent-after"))
    parents_sender.close()
    after = received(client, queue)
    client.close()
    print(json.dumps({"child_status": status, "child": child, "parent": after}))


if __name__ == "__main__":
    main()
