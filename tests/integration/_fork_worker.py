"""A gunicorn-style preload, with a real ``os.fork()`` (test_fork.py).

    python _fork_worker.py PRIMARY SECONDARY QUEUE

The parent makes a georep.sync.GeoSender (and sends, so its connections are open), a
georep.sync.GeoReceiver and an async GeoSender on a loop of its own, then forks. The child
uses each of them, and writes one JSON line of what happened; the parent waits for the
child (at most 60 s: longer is a hang, and the child is killed), sends again, and writes
its own line. Every call in the child is bounded by the sender's attempt deadline or
raises at once; a child that hangs is reported as such, not waited for.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import time
from typing import Any

from azure.servicebus import ServiceBusMessage

import georep.sync
from georep import FailoverPolicy, GeoSender
from georep.testing import InMemorySeenSet

CHILD_SECONDS = 60.0


def outcome(call: Any) -> dict[str, Any]:
    try:
        value = call()
    except Exception as exc:
        return {"error": type(exc).__name__, "message": str(exc)}
    return {"value": value}


def child(
    sender: georep.sync.GeoSender,
    receiver: georep.sync.GeoReceiver,
    loop_sender: GeoSender,
) -> dict[str, Any]:
    report: dict[str, Any] = {"pid": os.getpid()}
    report["send"] = outcome(
        lambda: list(sender.send_messages(ServiceBusMessage("c", message_id="child")).accepted)
    )
    report["receive"] = outcome(lambda: receiver.run(lambda message: None))
    report["async"] = outcome(
        lambda: asyncio.run(loop_sender.send_messages(ServiceBusMessage("a", message_id="x")))
    )
    sender.close()
    receiver.close()
    report["threads"] = sorted(t.name for t in threading.enumerate())
    return report


def wait_for(pid: int) -> int | None:
    """The child's exit status, or None when it had not exited within CHILD_SECONDS."""
    deadline = time.monotonic() + CHILD_SECONDS
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def main() -> None:
    primary, secondary, queue = sys.argv[1:4]
    policy = FailoverPolicy(attempt_timeout=5.0)
    # The "preload": made at import time in the parent, and used there first.
    sender = georep.sync.GeoSender.from_connection_strings(
        primary, secondary, queue_name=queue, policy=policy
    )
    first = sender.send_messages(ServiceBusMessage("p", message_id="parent-before"))
    receiver = georep.sync.GeoReceiver.from_connection_strings(
        primary, secondary, queue_name=queue, seen=InMemorySeenSet()
    )
    loop = asyncio.new_event_loop()

    async def make() -> GeoSender:
        return await GeoSender.from_connection_strings(
            primary, secondary, queue_name=queue, policy=policy
        ).__aenter__()

    loop_sender = loop.run_until_complete(make())
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker
        os.close(read)
        line = json.dumps(child(sender, receiver, loop_sender))
        os.write(write, line.encode() + b"\n")
        os._exit(0)
    os.close(write)
    status = wait_for(pid)
    with os.fdopen(read) as pipe:
        child_line = pipe.read().strip()
    after = sender.send_messages(ServiceBusMessage("p", message_id="parent-after"))
    report = {
        "child": json.loads(child_line) if child_line else None,
        "child_status": status,
        "parent": [list(first.accepted), list(after.accepted)],
    }
    loop.run_until_complete(loop_sender.aclose())
    leftovers = asyncio.all_tasks(loop)  # the SDK's keep-alive tasks, as asyncio.run does
    for task in leftovers:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*leftovers, return_exceptions=True))
    loop.close()
    receiver.close()
    sender.close()
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
