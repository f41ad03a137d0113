"""Relay endpoint failover: one service on two hybrid connections, lose the active namespace.

Runnable: ``python examples/relay_failover.py`` (starts its own emulator with a local
Hybrid Connections relay per namespace).
"""

from __future__ import annotations

import asyncio
import json
import random

from georep import AllRegionsUnavailableError, FailoverChannel, RelayRequest, RelayResponse
from georep.adapters.emulator import Emulator
from georep.adapters.relay import HybridConnectionEndpoint, HybridConnectionListener

# Two namespaces, two different names for the same service (SPEC §2.5).
PATHS = {"primary": "ordersPrimary", "secondary": "ordersSecondary"}


async def orders_service(request: RelayRequest) -> RelayResponse:
    """The service: one handler, served on both hybrid connections."""
    if request.method != "POST" or not request.body:
        return RelayResponse(400, {"content-type": "text/plain"}, b"POST an order")
    order = json.loads(request.body)
    return RelayResponse(201, {"content-type": "application/json"}, json.dumps(order).encode())


async def main() -> None:
    async with Emulator(hybrid_connections=tuple(PATHS.values())) as emu:
        # Each hybrid connection: namespace host, name, and a key to mint SAS tokens from.
        connections = {
            region: emu.namespace(region).hybrid_connection(path) for region, path in PATHS.items()
        }
        tls = emu.ssl_context()  # the emulator's relay speaks wss/https like Azure
        async with HybridConnectionListener(
            list(connections.values()), orders_service, ssl_context=tls
        ):
            endpoints = (
                HybridConnectionEndpoint(connections["primary"], ssl_context=tls),
                HybridConnectionEndpoint(connections["secondary"], ssl_context=tls),
            )
            async with FailoverChannel(endpoints, rng=random.Random(4)) as channel:
                print(f"active endpoint picked at random: {channel.active}")
                for i in range(3):
                    response = await channel.request("POST", "/orders", body=json.dumps({"id": i}))
                    print(f"order {i}: {response.status} from {response.region}")
                rejected = await channel.request("POST", "/orders")
                print(f"empty order: {rejected.status} from {rejected.region} (no failover)")

                down = channel.active
                print(f"-- namespace {down} goes down")
                emu.namespace(down).outage()
                for i in range(3, 6):
                    response = await channel.request("POST", "/orders", body=json.dumps({"id": i}))
                    print(f"order {i}: {response.status} from {response.region}")
                print(
                    f"failovers: {channel.stats.failovers}, role swaps: {channel.stats.role_swaps}"
                )

                print(f"-- namespace {channel.active} goes down too")
                emu.namespace(channel.active).outage()
                try:
                    await channel.request("POST", "/orders", body=b'{"id": 6}')
                except AllRegionsUnavailableError as error:
                    kinds = {region: cause.kind.value for region, cause in error.causes.items()}  # type: ignore[attr-defined]
                    print(f"both endpoints failed: {kinds}")
                print(f"active endpoint: {channel.active}")


if __name__ == "__main__":
    asyncio.run(main())
