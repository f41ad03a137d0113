"""Seen-set claims held by competing drop-in receivers: a diagnostic, not a ratio.

Several OS processes each run the blocking drop-in client's receive loop, the way SDK
programs are written (``for message in receiver: ... receiver.complete_message(message)``),
on one active-mode queue sharing one Redis seen-set. Every half second this prints how
many messages are done and how many seen-set claims each process's region loops hold.

A claim is held from the moment a receiver takes a message until it is completed. A
process that is SIGKILLed leaves its claims to wait for the lease (60 s by default), so
what a receiver holds beyond what the program asked for (one message, plus the read-ahead
of at most 8) is what a crash delays.

    .venv/bin/python benchmarks/competing_claims.py              # 3 processes, 600 messages
    .venv/bin/python benchmarks/competing_claims.py --processes 1

Measured on 2026-11-27 (two cores), active mode, 600 messages: with one process the claims
held stay at 1 to 3. With three, each process held 139 to 200 claims within the first
second (almost every message of the queue claimed at once), the last ones were reported
"lost the claim ... while its handler ran", and a SIGKILLed process left 38 to 59 messages
waiting for its lease. The cause: an idle receiver's sweep (which settles twins whose key
is final at the head of a region) took the next copies when those twins were locked by
another receiver, and claimed and buffered them. Since the fix (a sweep hands back what
nobody asked for, then pauses) each region loop holds 1 to 4 claims, and a SIGKILLed
process leaves 2 or 3.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis
from azure.servicebus import ServiceBusMessage

from georep.adapters.emulator import Emulator
from georep.adapters.redis import RedisSeenSet
from georep.servicebus import ServiceBusClient

REDIS_URL = "redis://127.0.0.1:6379/0"

WORKER = """
import sys, time
from georep.adapters.redis import RedisSeenSet
from georep.servicebus import ServiceBusClient
primary, secondary, queue, group, out = sys.argv[1:6]
seen = RedisSeenSet.from_url({redis!r}, group=group, window=600)
client = ServiceBusClient.from_connection_strings(primary, secondary, seen=seen, mode="active")
with open(out, "a", buffering=1) as done, client:
    with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
        for message in receiver:
            time.sleep(0.02)  # the program's work
            receiver.complete_message(message)
            done.write(str(message.message_id) + "\\n")
"""


def claims_by_owner(client: redis.Redis, group: str) -> dict[str, int]:
    """The claims in flight per owner (its last 20 characters: process id and region)."""
    held: collections.Counter[str] = collections.Counter()
    for key in client.scan_iter(match=f"georep:seen:{group}:*:c", count=1000):
        for value in client.hgetall(key).values():
            held[value.partition(b"|")[2].decode(errors="replace")[-20:]] += 1
    return dict(held)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--messages", type=int, default=600)
    parser.add_argument("--seconds", type=float, default=10.0, help="how long to watch")
    args = parser.parse_args()
    with Emulator() as emu, tempfile.TemporaryDirectory() as scratch:
        queue = f"claims-{uuid.uuid4().hex[:6]}"
        for namespace in emu.namespaces:
            emu.namespace(namespace).create_queue(queue, lock_duration=5)
        primary, secondary = emu.connection_string("primary"), emu.connection_string("secondary")
        group = f"claims-{uuid.uuid4().hex[:8]}"
        seen = RedisSeenSet.from_url(REDIS_URL, group=group, window=600)
        with (
            ServiceBusClient.from_connection_strings(
                primary, secondary, seen=seen, mode="active"
            ) as client,
            client.get_queue_sender(queue) as sender,
        ):
            for start in range(0, args.messages, 100):
                count = min(100, args.messages - start)
                sender.send_messages([ServiceBusMessage(f"m{start + i}") for i in range(count)])
        worker = Path(scratch) / "worker.py"
        worker.write_text(WORKER.format(redis=REDIS_URL))
        out = Path(scratch) / "done.txt"
        out.touch()
        command = [sys.executable, str(worker), primary, secondary, queue, group, str(out)]
        processes = [subprocess.Popen(command) for _ in range(args.processes)]
        store = redis.Redis.from_url(REDIS_URL)
        try:
            started = time.monotonic()
            while time.monotonic() - started < args.seconds:
                time.sleep(0.5)
                done = len(out.read_text().splitlines())
                held = claims_by_owner(store, group)
                print(f"t+{time.monotonic() - started:4.1f}s done {done:5d} claims {held}")
        finally:
            for process in processes:
                process.kill()
                process.wait()


if __name__ == "__main__":
    main()
