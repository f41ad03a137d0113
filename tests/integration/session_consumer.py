"""One session-mode GeoReceiver process for test_georeceiver_sessions.py's SIGKILL test.

Usage: python session_consumer.py PRIMARY SECONDARY QUEUE REDIS_URL GROUP OUT_FILE

Appends ``time pid body`` per handled message to OUT_FILE (line-buffered, so a SIGKILL
loses nothing already handled); stops gracefully on SIGTERM.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from typing import Any, TextIO

from georep import GeoReceiver
from georep.adapters.redis import RedisSeenSet


async def main(
    primary: str, secondary: str, queue: str, redis_url: str, group: str, log: TextIO
) -> None:
    async with RedisSeenSet.from_url(redis_url, group=group, window=600) as seen:
        receiver = GeoReceiver.from_connection_strings(
            primary,
            secondary,
            queue_name=queue,
            seen=seen,
            sessions=True,
            max_sessions=4,
            max_wait=0.5,
            lease=3,  # a killed consumer's claims free up soon
            order_wait=60,
        )

        async def handle(message: Any) -> None:
            await asyncio.sleep(0.005)
            log.write(f"{time.time():.6f} {os.getpid()} {message}\n")

        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, lambda: asyncio.ensure_future(receiver.aclose()))
        print("ready", flush=True)
        await receiver.run(handle)


if __name__ == "__main__":
    with open(sys.argv[6], "a", buffering=1, encoding="utf-8") as out:
        asyncio.run(main(*sys.argv[1:6], out))
