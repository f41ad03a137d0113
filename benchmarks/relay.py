"""Relay requests direct to one endpoint vs through FailoverChannel, and failover time.

One run, on the emulator's relay (TLS on loopback) with the real listener and senders:

1. Request latency, p50 and p99, for ``--requests`` sequential requests (256-byte bodies),
   HTTP mode and WebSocket mode: a ``HybridConnectionEndpoint`` used directly (the
   baseline) and the same two endpoints behind a ``FailoverChannel``. The two variants
   take turns in chunks so that machine-speed drift hits both alike; the ratio is
   channel / direct in the same run.
2. Failover time, ``--trials`` per mode: the active namespace goes ``outage()`` (its relay
   closes every websocket with 1001 and stops listening), or its relay reports no listener
   (HTTP mode, 503), then the time of the next ``channel.request`` (refused or closed on
   the active, reissued to the backup) and the latency it added over a normal request.

3. Throughput: the same requests from ``--concurrency`` callers sharing one endpoint (or
   one channel): HTTP mode uses a pool of HTTPS connections, WebSocket mode multiplexes
   every caller over one relayed websocket.

    .venv/bin/python benchmarks/relay.py [--requests 2000] [--trials 10] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from _record import write_record

from georep import FailoverChannel, RelayRequest, RelayResponse
from georep.adapters.emulator import Emulator
from georep.adapters.relay import HybridConnectionEndpoint, HybridConnectionListener

BODY = b"x" * 256
PATHS = {"primary": "bench-primary", "secondary": "bench-secondary"}


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))]


async def echo(request: RelayRequest) -> RelayResponse:
    return RelayResponse(200, {}, request.body)


def endpoints(emu: Emulator, mode: str) -> tuple[HybridConnectionEndpoint, ...]:
    context = emu.ssl_context()
    return tuple(
        HybridConnectionEndpoint(
            emu.namespace(region).hybrid_connection(PATHS[region]), mode=mode, ssl_context=context
        )
        for region in ("primary", "secondary")
    )


Call = Callable[[], Awaitable[RelayResponse]]


async def timed(call: Call, count: int, into: list[float]) -> None:
    for _ in range(count):
        started = time.perf_counter()
        response = await call()
        into.append(time.perf_counter() - started)
        assert response.status == 200


@contextlib.asynccontextmanager
async def variants(emu: Emulator, mode: str, timeout: float) -> AsyncIterator[dict[str, Call]]:
    """The two variants compared, by name: one endpoint used directly (the one the channel
    has active) and a FailoverChannel over both; closed after the block."""
    direct_pair = endpoints(emu, mode)
    channel = FailoverChannel(endpoints(emu, mode), rng=random.Random(0))  # type: ignore[arg-type]
    direct = direct_pair[0] if channel.active == "primary" else direct_pair[1]

    async def direct_call() -> RelayResponse:
        return await direct.request("POST", "/echo", body=BODY, headers={}, timeout=timeout)

    async def channel_call() -> RelayResponse:
        return await channel.request("POST", "/echo", body=BODY)

    yield {"direct endpoint": direct_call, "FailoverChannel": channel_call}
    for endpoint in direct_pair:
        await endpoint.close()
    await channel.aclose()


async def latency(emu: Emulator, mode: str, requests: int, chunks: int = 20) -> None:
    async with variants(emu, mode, timeout=10) as calls:
        samples = await latency_samples(calls, requests, chunks)
    base = statistics.median(samples["direct endpoint"])
    base_p99 = percentile(samples["direct endpoint"], 0.99)
    for name, values in samples.items():
        p50, p99 = statistics.median(values), percentile(values, 0.99)
        print(
            f"{mode:10} {name:18} {p50 * 1e3:8.2f} {p99 * 1e3:8.2f} "
            f"{p50 / base:9.2f} {p99 / base_p99:9.2f}"
        )


async def latency_samples(
    calls: dict[str, Call], requests: int, chunks: int
) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():  # warm-up: connections, TLS sessions, tokens
        await timed(call, 50, [])
    per_chunk = max(1, requests // chunks)
    for chunk in range(chunks):
        # Alternate which variant goes first, so neither always follows the other.
        order = list(calls.items()) if chunk % 2 == 0 else list(reversed(calls.items()))
        for name, call in order:
            await timed(call, per_chunk, samples[name])
    return samples


async def throughput(emu: Emulator, mode: str, requests: int, concurrency: int) -> float:
    """Print requests per second of both variants; return FailoverChannel / direct."""
    """Requests per second with ``concurrency`` callers sharing one endpoint or channel."""
    async with variants(emu, mode, timeout=30) as calls:
        elapsed = dict.fromkeys(calls, 0.0)
        per_caller = max(1, requests // concurrency // 4)
        for call in calls.values():  # warm-up: every caller's connection
            await asyncio.gather(*(timed(call, 5, []) for _ in range(concurrency)))
        # Rounds in the order A B B A, so drift in machine speed hits both alike.
        for name in ("direct endpoint", "FailoverChannel", "FailoverChannel", "direct endpoint"):
            started = time.perf_counter()
            await asyncio.gather(*(timed(calls[name], per_caller, []) for _ in range(concurrency)))
            elapsed[name] += time.perf_counter() - started
    rates = {name: 2 * per_caller * concurrency / seconds for name, seconds in elapsed.items()}
    for name, rate in rates.items():
        print(f"{mode:10} {name:18} {rate:9,.0f} {rate / rates['direct endpoint']:9.2f}")
    return rates["FailoverChannel"] / rates["direct endpoint"]


async def failover(
    emu: Emulator, listener: HybridConnectionListener, mode: str, fault: str, trials: int
) -> dict[str, float]:
    times: list[float] = []
    added: list[float] = []
    for trial in range(trials):
        channel = FailoverChannel(endpoints(emu, mode), rng=random.Random(trial))  # type: ignore[arg-type]
        normal: list[float] = []
        await timed(lambda c=channel: c.request("POST", "/echo", body=BODY), 30, normal)
        active = channel.active
        if fault == "outage":
            await asyncio.to_thread(emu.namespace(active).outage)
        else:
            await asyncio.to_thread(emu.namespace(active).relay_no_listener, PATHS[active])
        fault_at = time.perf_counter()
        response = await channel.request("POST", "/echo", body=BODY)
        done_at = time.perf_counter()
        assert response.region != active and channel.stats.role_swaps == 1
        times.append(done_at - fault_at)
        added.append(done_at - fault_at - statistics.median(normal))
        await channel.aclose()
        await asyncio.to_thread(emu.namespace(active).restore)
        await listener.wait_online()
    print(
        f"{mode:10} {fault:12} {statistics.median(times) * 1e3:8.1f}"
        f" {percentile(times, 0.99) * 1e3:8.1f}"
        f" {statistics.median(added) * 1e3:10.1f} {percentile(added, 0.99) * 1e3:10.1f}"
    )
    return {
        "p50_ms": round(statistics.median(times) * 1e3, 1),
        "p99_ms": round(percentile(times, 0.99) * 1e3, 1),
    }


async def main(requests: int, trials: int, concurrency: int) -> None:
    async with Emulator(hybrid_connections=tuple(PATHS.values())) as emu:
        connections = [emu.namespace(r).hybrid_connection(p) for r, p in PATHS.items()]
        async with HybridConnectionListener(
            connections, echo, ssl_context=emu.ssl_context()
        ) as listener:
            await listener.wait_online()
            print(f"Request latency, {requests} sequential requests per variant (256-byte body)")
            print(
                f"{'mode':10} {'variant':18} {'p50 ms':>8} {'p99 ms':>8} "
                f"{'p50 x dir':>9} {'p99 x dir':>9}"
            )
            for mode in ("http", "websocket"):
                await latency(emu, mode, requests)
            print(f"\nThroughput, {requests} requests from {concurrency} concurrent callers")
            print(f"{'mode':10} {'variant':18} {'req/s':>9} {'x direct':>9}")
            ratios = {
                f"{mode} FailoverChannel throughput": await throughput(
                    emu, mode, requests, concurrency
                )
                for mode in ("http", "websocket")
            }
            print(f"\nFailover, {trials} trials per mode (outage -> answer from the backup)")
            print(
                f"{'mode':10} {'fault':12} {'p50 ms':>8} {'p99 ms':>8} "
                f"{'added p50':>10} {'added p99':>10}"
            )
            # "no listener" only affects new relayed connections: HTTP mode meets it on
            # every request, WebSocket mode only when it (re)connects.
            failovers = {
                f"{mode} {fault}": await failover(emu, listener, mode, fault, trials)
                for mode, fault in (
                    ("http", "outage"),
                    ("websocket", "outage"),
                    ("http", "no listener"),
                )
            }
    write_record(
        "relay",
        quick=False,
        ratios=ratios,
        figures={"requests": requests, "trials": trials, "failover": failovers},
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=32)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.requests, arguments.trials, arguments.concurrency))
