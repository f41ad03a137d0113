"""One sender process of the fleet test (test_fleet_roles.py): sends passively until told
to stop, sharing its roles through Redis, and prints what it saw as one JSON line.

    python _fleet_worker.py PRIMARY SECONDARY QUEUE REDIS_URL APP CONTROL_DIR INDEX

Control files in CONTROL_DIR: ``pause`` (stop sending until it is gone, except the worker
whose ``send-INDEX`` file exists: it sends one message per file it finds, then deletes
it), ``stop`` (finish and report). The worker keeps ``state-INDEX.json`` there up to date
(messages accepted per region, its roles, whether it is paused) for tests that wait on it.
"""

from __future__ import annotations

import asyncio
import faulthandler
import json
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from azure.servicebus import ServiceBusMessage

from georep import FailoverPolicy, GeoSender
from georep.adapters.redis import RedisRoleStore


def _dump_tasks() -> None:
    for task in asyncio.all_tasks():
        task.print_stack(file=sys.stderr)


def write_state(path: Path, state: dict[str, Any]) -> None:
    """``state`` as JSON at ``path``, replaced at once (a reader never sees half of it)."""
    part = path.with_suffix(".part")
    part.write_text(json.dumps(state))
    os.replace(part, path)


async def main() -> None:
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, _dump_tasks)
    primary, secondary, queue, redis_url, app, control, index = sys.argv[1:8]
    control_dir = Path(control)
    pause, stop, send_one = (control_dir / name for name in ("pause", "stop", f"send-{index}"))
    accepted: dict[str, str] = {}
    failed: list[str] = []
    changes: list[tuple[float, str, int]] = []
    by_region: Counter[str] = Counter()
    state_file = control_dir / f"state-{index}.json"
    async with (
        RedisRoleStore.from_url(redis_url, app=app) as store,
        GeoSender.from_connection_strings(
            primary,
            secondary,
            queue_name=queue,
            role_store=store,
            policy=FailoverPolicy(attempt_timeout=3.0),
        ) as sender,
    ):
        roles = sender.roles
        roles.on_change(
            lambda snapshot: changes.append(
                (time.time(), sender.active_region, snapshot.generation)
            )
        )
        print("ready", flush=True)
        count = 0
        written = 0.0
        while not stop.exists():
            paused = pause.exists()
            if time.monotonic() - written > 0.1:
                written = time.monotonic()
                write_state(
                    state_file,
                    {
                        "accepted": by_region,
                        "failed": len(failed),
                        "active": sender.active_region,
                        "generation": roles.current.generation,
                        "departed": roles.departed_from is not None,
                        "paused": paused,
                    },
                )
            if paused:
                if not send_one.exists():
                    await asyncio.sleep(0.02)
                    continue
                send_one.unlink()
            message_id = f"w{index}-{count}"
            count += 1
            try:
                result = await sender.send_messages(ServiceBusMessage("x", message_id=message_id))
            except Exception as exc:  # reported, counted by the test
                failed.append(f"{message_id}: {type(exc).__name__}: {exc}")
            else:
                accepted[message_id] = result.accepted[0]
                by_region[result.accepted[0]] += 1
            await asyncio.sleep(0.03)
        report = {
            "accepted": accepted,
            "failed": failed,
            "changes": changes,
            "swaps": roles.swaps,
            "departures": roles.departures,
            "pid": os.getpid(),
            "shared": roles.shared,
            "active": sender.active_region,
            "generation": roles.current.generation,
        }
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    # The test asks a worker that does not finish for its stacks (into its log).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    asyncio.run(main())
