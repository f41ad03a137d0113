"""The RelayEndpoint contract, run against every implementation of the port.

Parameters: ``memory`` (:class:`georep.testing.InMemoryRelayEndpoint`), ``hybrid-http`` and
``hybrid-websocket`` (:class:`HybridConnectionEndpoint` through the emulator's relay to a
real :class:`HybridConnectionListener`), and ``plain-http`` (:class:`PlainHttpEndpoint` to
an aiohttp server in this process). The service behind each is the same handler.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass

import pytest
from aiohttp import web

from georep._classify import RELAY_FAILOVER_KINDS
from georep.adapters.emulator import Emulator
from georep.adapters.relay import (
    HybridConnectionEndpoint,
    HybridConnectionListener,
    PlainHttpEndpoint,
)
from georep.exceptions import RegionError, error_type
from georep.ports import ErrorKind, RelayEndpoint, RelayRequest, RelayResponse
from georep.testing import InMemoryRelayEndpoint

pytestmark = pytest.mark.integration

IMPLEMENTATIONS = ["memory", "hybrid-http", "hybrid-websocket", "plain-http"]
PATH = "svc-contract"
SLOW = 3.0
"""Seconds the service takes on ``/slow``: past the deadline the tests give it."""


async def service(request: RelayRequest) -> RelayResponse:
    """The service behind every endpoint."""
    if "/bad" in request.target:  # plain HTTP: below its base path
        return RelayResponse(400, {"content-type": "text/plain"}, b"bad input")
    if "/slow" in request.target:
        await asyncio.sleep(SLOW)
    return RelayResponse(
        200, {"x-target": request.target, "x-method": request.method}, b"echo:" + request.body
    )


async def plain_http_handler(request: web.Request) -> web.Response:
    answer = await service(
        RelayRequest(request.method, request.path_qs, dict(request.headers), await request.read())
    )
    return web.Response(status=answer.status, headers=answer.headers, body=answer.body)


@pytest.fixture(scope="module")
def emu() -> Iterator[Emulator]:
    """A private emulator for this module: these tests take the relay down."""
    with Emulator(hybrid_connections=(PATH,)) as emulator:
        yield emulator


@dataclass
class Harness:
    kind: str
    endpoint: RelayEndpoint
    down: object  # an async callable taking the endpoint's service away


@pytest.fixture(params=IMPLEMENTATIONS)
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    async with AsyncExitStack() as stack:
        if request.param == "memory":
            double = InMemoryRelayEndpoint("primary", service)

            async def down_memory() -> None:
                double.fail_with(ErrorKind.CONNECTION)

            yield Harness("memory", double, down_memory)
        elif request.param == "plain-http":
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", plain_http_handler)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = runner.addresses[0][1]
            endpoint = PlainHttpEndpoint(f"http://127.0.0.1:{port}/api", region="primary")
            stack.push_async_callback(endpoint.close)

            async def down_plain() -> None:
                await runner.cleanup()

            yield Harness("plain-http", endpoint, down_plain)
            await runner.cleanup()
        else:
            emu: Emulator = request.getfixturevalue("emu")
            connection = emu.namespace("primary").hybrid_connection(PATH)
            listener = await stack.enter_async_context(
                HybridConnectionListener([connection], service, ssl_context=emu.ssl_context())
            )
            await listener.wait_online()
            mode = request.param.removeprefix("hybrid-")
            hybrid = HybridConnectionEndpoint(connection, mode=mode, ssl_context=emu.ssl_context())
            stack.push_async_callback(hybrid.close)

            async def down_hybrid() -> None:
                await asyncio.to_thread(emu.namespace("primary").outage)

            try:
                yield Harness(request.param, hybrid, down_hybrid)
            finally:
                await asyncio.to_thread(emu.namespace("primary").restore)


async def test_is_a_relay_endpoint_with_a_label_and_an_address(harness: Harness) -> None:
    assert isinstance(harness.endpoint, RelayEndpoint)
    assert harness.endpoint.region == "primary"
    assert harness.endpoint.address
    assert "sig=" not in harness.endpoint.address


async def test_a_request_returns_the_services_answer(harness: Harness) -> None:
    response = await harness.endpoint.request(
        "POST", "/orders?id=7", body=b"hi", headers={"x-tenant": "t1"}, timeout=10
    )
    assert (response.status, response.body, response.region) == (200, b"echo:hi", "primary")
    assert response.headers["x-method"] == "POST"
    # Plain HTTP keeps its base path; the service sees the target below the endpoint.
    assert response.headers["x-target"].endswith("/orders?id=7")


async def test_an_error_status_from_the_service_is_returned_not_raised(
    harness: Harness,
) -> None:
    response = await harness.endpoint.request("POST", "/bad", body=b"x", headers={}, timeout=10)
    assert (response.status, response.body, response.region) == (400, b"bad input", "primary")


async def test_concurrent_requests_each_get_their_own_answer(harness: Harness) -> None:
    answers = await asyncio.gather(
        *(
            harness.endpoint.request(
                "POST", f"/r/{i}", body=str(i).encode(), headers={}, timeout=10
            )
            for i in range(8)
        )
    )
    assert [a.body for a in answers] == [f"echo:{i}".encode() for i in range(8)]


async def test_past_the_deadline_raises_a_timeout_region_error(harness: Harness) -> None:
    with pytest.raises(RegionError) as caught:
        await harness.endpoint.request("GET", "/slow", body=b"", headers={}, timeout=0.5)
    assert caught.value.kind == ErrorKind.TIMEOUT
    assert type(caught.value) is error_type(caught.value.kind)
    assert caught.value.region == "primary"


async def test_an_unavailable_endpoint_raises_a_region_error_that_fails_over(
    harness: Harness,
) -> None:
    await harness.endpoint.request("GET", "/warm", body=b"", headers={}, timeout=10)
    await harness.down()  # type: ignore[operator]
    with pytest.raises(RegionError) as caught:
        await harness.endpoint.request("GET", "/ping", body=b"", headers={}, timeout=5)
    assert caught.value.kind in RELAY_FAILOVER_KINDS
    # The one classification table decides the error's class, for the double as well.
    assert type(caught.value) is error_type(caught.value.kind)
    assert caught.value.region == "primary"


async def test_close_is_idempotent(harness: Harness) -> None:
    await harness.endpoint.request("GET", "/warm", body=b"", headers={}, timeout=10)
    await harness.endpoint.close()
    await harness.endpoint.close()
