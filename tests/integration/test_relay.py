"""FailoverChannel end to end: the real listener and senders through the emulator's relay."""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
import time
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest
import websockets
from websockets.exceptions import ConnectionClosed, InvalidStatus

from georep import (
    AllRegionsUnavailableError,
    ErrorKind,
    FailoverChannel,
    RegionError,
    RelayPolicy,
    RelayRequest,
    RelayResponse,
)
from georep.adapters.emulator import Emulator
from georep.adapters.relay import (
    HybridConnection,
    HybridConnectionEndpoint,
    HybridConnectionListener,
    PlainHttpEndpoint,
    mint_sas_token,
)

pytestmark = pytest.mark.integration

PATHS = {"primary": "svc-primary", "secondary": "svc-secondary"}
MODES = ["http", "websocket"]


@pytest.fixture(scope="module")
def emulator() -> Iterator[Emulator]:
    # A private emulator: these tests take namespaces down.
    with Emulator(hybrid_connections=tuple(PATHS.values())) as emu:
        yield emu


@pytest.fixture(autouse=True)
def restore_faults(emulator: Emulator) -> Iterator[None]:
    yield
    for name in emulator.namespaces:
        emulator.namespace(name).restore()


def connection(emulator: Emulator, region: str) -> HybridConnection:
    return emulator.namespace(region).hybrid_connection(PATHS[region])


async def handler(request: RelayRequest) -> RelayResponse:
    if request.target.startswith("/big"):
        return RelayResponse(200, {}, b"z" * 100_000)
    if request.target.startswith("/bad"):
        return RelayResponse(400, {"content-type": "text/plain"}, b"bad input")
    return RelayResponse(200, {"x-target": request.target}, b"echo:" + request.body)


@pytest.fixture
async def listener(emulator: Emulator) -> AsyncIterator[HybridConnectionListener]:
    async with HybridConnectionListener(
        [connection(emulator, "primary"), connection(emulator, "secondary")],
        handler,
        ssl_context=emulator.ssl_context(),
    ) as serving:
        await serving.wait_online()
        yield serving


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    """A test that takes ``mode`` runs once per relay mode (its ids: http, websocket)."""
    return str(request.param)


@pytest.fixture
async def channel(
    emulator: Emulator, listener: HybridConnectionListener, mode: str
) -> AsyncIterator[FailoverChannel]:
    """A FailoverChannel in ``mode`` to the listener's two endpoints (see ``make_channel``)."""
    async with make_channel(emulator, mode) as opened:
        yield opened


def make_channel(emulator: Emulator, mode: str, seed: int = 0) -> FailoverChannel:
    context = emulator.ssl_context()
    endpoints = tuple(
        HybridConnectionEndpoint(connection(emulator, region), mode=mode, ssl_context=context)
        for region in ("primary", "secondary")
    )
    return FailoverChannel(endpoints, rng=random.Random(seed))  # type: ignore[arg-type]


async def restore_and_wait(emulator: Emulator, listener: HybridConnectionListener) -> None:
    for name in emulator.namespaces:
        await asyncio.to_thread(emulator.namespace(name).restore)
    await listener.wait_online()


async def test_listener_serves_on_both_endpoints(
    emulator: Emulator, listener: HybridConnectionListener, mode: str
) -> None:
    for region in ("primary", "secondary"):
        endpoint = HybridConnectionEndpoint(
            connection(emulator, region), mode=mode, ssl_context=emulator.ssl_context()
        )
        try:
            response = await endpoint.request(
                "POST", "/orders?id=7", body=b"hi", headers={}, timeout=10
            )
        finally:
            await endpoint.close()
        assert (response.status, response.body, response.region) == (200, b"echo:hi", region)
        # The handler sees the target below the endpoint, whatever the endpoint's name.
        assert response.headers["x-target"] == "/orders?id=7"


async def test_outage_halfway_through_200_requests_every_request_answered_one_swap(
    emulator: Emulator, channel: FailoverChannel
) -> None:
    first_active = channel.active
    backup = channel.backup
    answered: list[RelayResponse] = []
    halfway = asyncio.Event()
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(200):
        queue.put_nowait(i)

    async def worker() -> None:
        while not queue.empty():
            i = queue.get_nowait()
            response = await channel.request("POST", f"/r/{i}", body=str(i))
            assert (response.status, response.body) == (200, f"echo:{i}".encode())
            answered.append(response)
            if len(answered) == 100:
                halfway.set()
            if len(answered) >= 100:
                # The other half waits for the outage, so it really lands mid-run.
                await outage_done.wait()

    outage_done = asyncio.Event()

    async def take_down() -> None:
        await halfway.wait()
        await asyncio.to_thread(emulator.namespace(first_active).outage)
        outage_done.set()

    await asyncio.gather(take_down(), *(worker() for _ in range(8)))
    assert len(answered) == 200
    assert channel.stats.role_swaps == 1
    assert channel.active == backup
    assert {r.region for r in answered[:100]} == {first_active}
    assert answered[-1].region == backup
    assert channel.stats.failures == 0


async def test_both_namespaces_down_error_names_both_causes(
    emulator: Emulator, channel: FailoverChannel
) -> None:
    before = channel.active
    for name in emulator.namespaces:
        await asyncio.to_thread(emulator.namespace(name).outage)
    with pytest.raises(AllRegionsUnavailableError) as caught:
        await channel.request("GET", "/ping")
    assert set(caught.value.causes) == {"primary", "secondary"}
    for cause in caught.value.causes.values():
        assert isinstance(cause, RegionError)
        assert cause.kind == ErrorKind.CONNECTION
    assert channel.active == before
    assert "sig=" not in str(caught.value)


async def test_random_initial_pick_covers_both_endpoints_over_seeds(
    emulator: Emulator, listener: HybridConnectionListener
) -> None:
    regions = set()
    for seed in range(12):
        async with make_channel(emulator, "http", seed) as channel:
            regions.add((await channel.request("GET", "/ping")).region)
    assert regions == {"primary", "secondary"}


async def test_a_400_from_the_handler_is_returned_not_failed_over(channel: FailoverChannel) -> None:
    active = channel.active
    response = await channel.request("POST", "/bad", body=b"x")
    assert (response.status, response.body, response.region) == (400, b"bad input", active)
    assert channel.stats.failovers == 0


async def test_no_listener_fails_over_to_the_other_endpoint(
    emulator: Emulator, channel: FailoverChannel, mode: str
) -> None:
    active, backup = channel.active, channel.backup
    emulator.namespace(active).relay_no_listener(PATHS[active])
    endpoint = HybridConnectionEndpoint(
        connection(emulator, active), mode=mode, ssl_context=emulator.ssl_context()
    )
    with pytest.raises(RegionError) as caught:
        await endpoint.request("GET", "/", body=b"", headers={}, timeout=5)
    await endpoint.close()
    # HTTP: the relay answers 503 without a Via header; WebSocket: handshake 404.
    expected = ErrorKind.SERVICE_ERROR if mode == "http" else ErrorKind.ENTITY_NOT_FOUND
    assert caught.value.kind == expected
    response = await channel.request("GET", "/ping")
    assert response.region == backup
    assert channel.stats.role_swaps == 1


async def test_expired_token_is_refused_in_both_modes(
    emulator: Emulator, listener: HybridConnectionListener
) -> None:
    hc = connection(emulator, "primary")
    expired = mint_sas_token(hc.audience, hc.key_name, hc.key, time.time() - 60)
    context = emulator.ssl_context()
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            hc.https_url + "/ping", headers={"ServiceBusAuthorization": expired}, ssl=context
        ) as response,
    ):
        assert response.status == 401
        assert "expired" in await response.text()
    for action in ("listen", "connect"):
        with pytest.raises(InvalidStatus) as caught:
            await websockets.connect(
                hc.websocket_url(action, **{"sb-hc-token": expired}), ssl=context, proxy=None
            )
        assert caught.value.response.status_code == 401
    wrong_key = HybridConnection(
        namespace=hc.namespace, path=hc.path, key_name=hc.key_name, key="d3Jvbmc=", region="p"
    )
    endpoint = HybridConnectionEndpoint(wrong_key, mode="websocket", ssl_context=context)
    with pytest.raises(RegionError) as refused:
        await endpoint.request("GET", "/", body=b"", headers={}, timeout=5)
    await endpoint.close()
    assert refused.value.kind == ErrorKind.AUTHENTICATION
    assert "sig=" not in str(refused.value) and hc.key not in str(refused.value)


async def test_listener_renews_its_token_and_stays_connected(emulator: Emulator) -> None:
    hc = connection(emulator, "primary")
    context = emulator.ssl_context()
    # Without renewal, the relay closes a control channel whose token expires (1008).
    short = mint_sas_token(hc.audience, hc.key_name, hc.key, time.time() + 2)
    raw = await websockets.connect(
        hc.websocket_url("listen", **{"sb-hc-token": short}), ssl=context, proxy=None
    )
    with pytest.raises(ConnectionClosed) as closed:
        async with asyncio.timeout(10):
            await raw.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    # The listener renews before expiry: same control channel, still serving.
    async with HybridConnectionListener(
        [hc], handler, ssl_context=context, token_ttl=3, renew_before=1.5
    ) as serving:
        await serving.wait_online()
        await asyncio.sleep(5)
        assert serving.stats.renewals >= 2
        assert serving.stats.connects == 1
        endpoint = HybridConnectionEndpoint(hc, ssl_context=context)
        response = await endpoint.request("GET", "/after", body=b"", headers={}, timeout=5)
        await endpoint.close()
        assert response.status == 200


async def test_plain_http_endpoint_gateway_errors_are_unavailability(
    emulator: Emulator,
) -> None:
    # The relay's HTTPS port answers plain HTTP requests; a missing hybrid connection is a
    # plain 404 for this endpoint type (returned), a refused port is a connection error.
    context = emulator.ssl_context()
    relay = f"https://{emulator.namespace('primary').relay_host}"
    endpoint = PlainHttpEndpoint(relay, region="primary", ssl_context=context)
    response = await endpoint.request("GET", "/nothing-here", body=b"", headers={}, timeout=5)
    assert response.status == 404
    await endpoint.close()
    dead = PlainHttpEndpoint(
        "https://127.0.0.1:1", region="dead", ssl_context=ssl.create_default_context()
    )
    with pytest.raises(RegionError) as caught:
        await dead.request("GET", "/", body=b"", headers={}, timeout=5)
    await dead.close()
    assert caught.value.kind == ErrorKind.CONNECTION


async def test_relay_latency_delays_requests_and_past_the_deadline_fails_over(
    emulator: Emulator, listener: HybridConnectionListener, mode: str
) -> None:
    context = emulator.ssl_context()
    endpoints = tuple(
        HybridConnectionEndpoint(connection(emulator, region), mode=mode, ssl_context=context)
        for region in ("primary", "secondary")
    )
    policy = RelayPolicy(attempt_timeout=1.0)
    async with FailoverChannel(endpoints, policy=policy, rng=random.Random(3)) as channel:  # type: ignore[arg-type]
        await channel.request("GET", "/warm")  # connections open before the fault
        active, backup = channel.active, channel.backup
        emulator.namespace(active).latency(0.3)
        started = time.monotonic()
        slow = await channel.request("GET", "/slow")
        assert time.monotonic() - started >= 0.3
        assert slow.region == active
        emulator.namespace(active).latency(5)
        response = await channel.request("GET", "/too-slow")
        assert response.region == backup
        assert channel.stats.role_swaps == 1


async def test_tokens_and_keys_never_reach_the_logs(
    emulator: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    hc = connection(emulator, "primary")
    context = emulator.ssl_context()
    async with HybridConnectionListener(
        [hc], handler, ssl_context=context, token_ttl=3, renew_before=2
    ) as serving:
        await serving.wait_online()
        for mode in MODES:
            endpoint = HybridConnectionEndpoint(hc, mode=mode, ssl_context=context)
            await endpoint.request("POST", "/x", body=b"1", headers={}, timeout=5)
            await endpoint.close()
        await asyncio.sleep(1.5)  # one renewToken
        assert serving.stats.renewals >= 1
    emulator.namespace("primary").outage()  # reconnect attempts log their failures
    async with HybridConnectionListener([hc], handler, ssl_context=context, start_timeout=0.5):
        await asyncio.sleep(0.5)
    assert caplog.records, "nothing was logged at all: the test would prove nothing"
    assert "sig=" not in caplog.text and "sb-hc-token" not in caplog.text
    assert hc.key not in caplog.text


@pytest.mark.parametrize("size", [10, 100_000])
async def test_large_requests_and_responses_take_the_rendezvous_path(
    emulator: Emulator, listener: HybridConnectionListener, size: int
) -> None:
    hc = connection(emulator, "primary")
    endpoint = HybridConnectionEndpoint(hc, ssl_context=emulator.ssl_context())
    try:
        # Over 64 kB: the request arrives on a rendezvous socket, the echo goes back on one.
        body = bytes(range(256)) * (size // 256 + 1)
        response = await endpoint.request("PUT", "/blob?x=1", body=body, headers={}, timeout=10)
    finally:
        await endpoint.close()
    assert response.status == 200
    assert response.body == b"echo:" + body
    assert response.headers["x-target"] == "/blob?x=1"
    assert response.headers["Via"].endswith(hc.namespace)


async def test_a_small_request_with_a_large_response_answers_on_a_rendezvous(
    emulator: Emulator, listener: HybridConnectionListener
) -> None:
    endpoint = HybridConnectionEndpoint(
        connection(emulator, "secondary"), ssl_context=emulator.ssl_context()
    )
    try:
        response = await endpoint.request("GET", "/big", body=b"", headers={}, timeout=10)
    finally:
        await endpoint.close()
    assert (response.status, len(response.body)) == (200, 100_000)


async def test_a_token_for_another_path_is_forbidden(emulator: Emulator) -> None:
    primary = connection(emulator, "primary")
    other = mint_sas_token(
        f"http://{primary.namespace}/elsewhere", primary.key_name, primary.key, time.time() + 60
    )
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            primary.https_url + "/",
            headers={"ServiceBusAuthorization": other},
            ssl=emulator.ssl_context(),
        ) as response,
    ):
        assert response.status == 403
        assert "Via" not in response.headers


async def test_a_stopped_listener_fails_over_to_the_one_on_the_other_namespace(
    emulator: Emulator, mode: str
) -> None:
    context = emulator.ssl_context()
    serving = {
        region: HybridConnectionListener(
            [connection(emulator, region)], handler, ssl_context=context
        )
        for region in ("primary", "secondary")
    }
    for listener_ in serving.values():
        await listener_.start()
    try:
        async with make_channel(emulator, mode) as channel:
            active, backup = channel.active, channel.backup
            assert (await channel.request("GET", "/one")).region == active
            await serving[active].aclose()  # the service instance on the active side stops
            response = await channel.request("GET", "/two")
            assert (response.status, response.region) == (200, backup)
            assert channel.stats.role_swaps == 1
    finally:
        for listener_ in serving.values():
            await listener_.aclose()
