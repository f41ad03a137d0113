"""The emulator enforces what Azure enforces: SAS scope and claims, the 128-character id
limit, and a control endpoint that a web page on the developer's machine cannot use.

Scope rule (docs/emulator.md): a token covers the entity its ``sr`` names and everything
below it by whole path segments; ``sb://ns/`` covers the namespace.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import pytest
import websockets
from _helpers import sdk_sender
from azure.core.credentials import AzureSasCredential
from azure.core.exceptions import ClientAuthenticationError, HttpResponseError
from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient
from azure.servicebus.amqp import AmqpAnnotatedMessage
from azure.servicebus.exceptions import (
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
    ServiceBusError,
)
from azure.servicebus.management import ServiceBusAdministrationClient
from websockets.exceptions import ConnectionClosed

from georep.adapters.emulator import Emulator
from georep.adapters.relay import mint_sas_token

pytestmark = pytest.mark.integration

EmulatorFactory = Callable[..., Emulator]
REFUSED = (ServiceBusAuthenticationError, ServiceBusAuthorizationError)


@pytest.fixture(scope="module")
def emu() -> Emulator:  # type: ignore[misc]
    with Emulator(queues=("orders", "other", "ord"), hybrid_connections=("svc", "elsewhere")) as e:
        yield e


def _fields(connection_string: str) -> dict[str, str]:
    return dict(p.split("=", 1) for p in connection_string.split(";") if p)


def _root_token(emu: Emulator, scope: str) -> tuple[str, str]:
    """(host, a root-key token for sb://host/scope)."""
    control = emu.namespace("primary")
    host = f"127.0.0.1:{control.port}"
    fields = _fields(control.connection_string)
    key_name, key = fields["SharedAccessKeyName"], fields["SharedAccessKey"]
    token = mint_sas_token(f"sb://{host}/{scope}", key_name, key, time.time() + 3600)
    return host, token


async def _send_with_token(host: str, token: str, queue: str) -> None:
    async with (
        ServiceBusClient(host, AzureSasCredential(token), retry_total=0, use_tls=False) as client,
        client.get_queue_sender(queue) as sender,
    ):
        await sender.send_messages(ServiceBusMessage("m"))


async def _peek_with_token(host: str, token: str, queue: str) -> list[object]:
    async with (
        ServiceBusClient(host, AzureSasCredential(token), retry_total=0, use_tls=False) as client,
        client.get_queue_receiver(queue) as receiver,
    ):
        return list(await receiver.peek_messages(max_message_count=5))


# -- scope ---------------------------------------------------------------------------------


@pytest.mark.parametrize("scope", ["other", "ord", "orders/sub", "orders2"])
async def test_a_token_for_another_entity_or_a_character_prefix_cannot_send_or_peek(
    emu: Emulator, scope: str
) -> None:
    host, token = _root_token(emu, scope)
    before = emu.namespace("primary").message_count("orders")
    with pytest.raises(REFUSED):
        await _send_with_token(host, token, "orders")
    with pytest.raises(REFUSED):
        await _peek_with_token(host, token, "orders")
    assert emu.namespace("primary").message_count("orders") == before


@pytest.mark.parametrize("scope", ["orders", "ORDERS", ""])
async def test_a_token_for_the_entity_or_the_namespace_can(emu: Emulator, scope: str) -> None:
    host, token = _root_token(emu, scope)
    before = emu.namespace("primary").message_count("orders")
    await _send_with_token(host, token, "orders")
    assert len(await _peek_with_token(host, token, "orders")) >= 1
    assert emu.namespace("primary").message_count("orders") == before + 1


# -- claims --------------------------------------------------------------------------------


async def test_a_send_only_rule_sends_but_cannot_receive_or_peek(emu: Emulator) -> None:
    send_only = emu.namespace("primary").connection_string_for("SendOnly")
    async with ServiceBusClient.from_connection_string(send_only, retry_total=0) as client:
        async with client.get_queue_sender("other") as sender:
            await sender.send_messages(ServiceBusMessage("by a sender"))
        with pytest.raises(ServiceBusAuthorizationError, match="Listen"):
            async with client.get_queue_receiver("other", max_wait_time=1) as receiver:
                await receiver.receive_messages(max_wait_time=1)
        with pytest.raises(ServiceBusAuthorizationError):
            async with client.get_queue_receiver("other") as receiver:
                await receiver.peek_messages()


async def test_a_listen_only_rule_receives_but_cannot_send_or_schedule(emu: Emulator) -> None:
    control = emu.namespace("primary")
    listen_only = control.connection_string_for("ListenOnly")
    async with sdk_sender(emu.connection_string("primary"), "ord") as sender:
        await sender.send_messages(ServiceBusMessage("for the listener"))
    before = control.message_count("ord")
    async with ServiceBusClient.from_connection_string(listen_only, retry_total=0) as client:
        with pytest.raises(ServiceBusAuthorizationError, match="Send"):
            async with client.get_queue_sender("ord") as sender:
                await sender.send_messages(ServiceBusMessage("m"))
        with pytest.raises(ServiceBusAuthorizationError, match="Send"):
            async with client.get_queue_sender("ord") as sender:
                await sender.schedule_messages(
                    ServiceBusMessage("later"), datetime.now(UTC) + timedelta(seconds=60)
                )
        assert control.message_count("ord") == before, "nothing was sent or scheduled"
        async with client.get_queue_receiver("ord", max_wait_time=5) as receiver:
            received = await receiver.receive_messages(max_message_count=10, max_wait_time=5)
            assert [str(m) for m in received] == ["for the listener"]
            await receiver.complete_message(received[0])
    assert control.message_count("ord") == before - 1


def _admin(emu: Emulator, credential_part: str) -> ServiceBusAdministrationClient:
    host = f"127.0.0.1:{emu.namespace('primary').port}"
    return ServiceBusAdministrationClient.from_connection_string(
        f"Endpoint=sb://{host};{credential_part};UseDevelopmentEmulator=true",
        connection_verify=str(emu.ca_file),
    )


def test_an_entity_scoped_token_cannot_list_the_namespace(emu: Emulator) -> None:
    _, token = _root_token(emu, "orders")
    with _admin(emu, f"SharedAccessSignature={token}") as admin:
        with pytest.raises((ClientAuthenticationError, HttpResponseError)) as refused:
            list(admin.list_queues())
        assert "InvalidAudience" in str(refused.value)
        assert admin.get_queue("orders").name == "orders"  # its own entity: allowed
        with pytest.raises((ClientAuthenticationError, HttpResponseError)):
            admin.get_queue("other")


def test_the_management_api_needs_the_manage_claim(emu: Emulator) -> None:
    fields = _fields(emu.namespace("primary").connection_string_for("SendOnly"))
    credential = f"SharedAccessKeyName=SendOnly;SharedAccessKey={fields['SharedAccessKey']}"
    with (
        _admin(emu, credential) as admin,
        pytest.raises((ClientAuthenticationError, HttpResponseError), match="Manage"),
    ):
        admin.get_queue("orders")
    with emu.admin_client("primary") as admin:
        assert {q.name for q in admin.list_queues()} >= {"orders", "other", "ord"}


# -- relay ---------------------------------------------------------------------------------


async def test_a_listener_cannot_renew_with_a_token_for_another_path(emu: Emulator) -> None:
    hc = emu.namespace("primary").hybrid_connection("svc")
    good = mint_sas_token(hc.audience, hc.key_name, hc.key, time.time() + 60)
    other = mint_sas_token(
        f"http://{hc.namespace}/elsewhere", hc.key_name, hc.key, time.time() + 60
    )
    socket = await websockets.connect(
        hc.websocket_url("listen", **{"sb-hc-token": good}), ssl=emu.ssl_context(), proxy=None
    )
    await socket.send(json.dumps({"renewToken": {"token": other}}))
    with pytest.raises(ConnectionClosed) as closed:
        async with asyncio.timeout(10):
            await socket.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


async def test_a_send_only_key_cannot_listen_on_the_relay(emu: Emulator) -> None:
    hc = emu.namespace("primary").hybrid_connection("svc")
    key = _fields(emu.namespace("primary").connection_string_for("SendOnly"))["SharedAccessKey"]
    token = mint_sas_token(hc.audience, "SendOnly", key, time.time() + 60)
    with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
        await websockets.connect(
            hc.websocket_url("listen", **{"sb-hc-token": token}),
            ssl=emu.ssl_context(),
            proxy=None,
        )
    assert refused.value.response.status_code == 403


# -- message id length ---------------------------------------------------------------------


async def test_a_message_id_over_128_characters_is_refused_as_the_service_does(
    emu: Emulator,
) -> None:
    control = emu.namespace("primary")
    before = control.message_count("other")
    async with sdk_sender(control.connection_string, "other", retry_total=0) as sender:
        # ServiceBusMessage refuses such an id itself; an AmqpAnnotatedMessage (or a
        # message decoded from elsewhere) reaches the service with it.
        too_long = AmqpAnnotatedMessage(data_body=b"m", properties={"message_id": "x" * 200})
        with pytest.raises(ServiceBusError, match="128") as refused:
            await sender.send_messages(too_long)
        # Not an outage: not a connection, timeout or server-busy error.
        assert type(refused.value) is ServiceBusError
        assert control.message_count("other") == before
        longest = AmqpAnnotatedMessage(data_body=b"m", properties={"message_id": "y" * 128})
        await sender.send_messages(longest)
    assert control.message_count("other") == before + 1


# -- control endpoint ----------------------------------------------------------------------


def _control(
    emu: Emulator,
    method: str,
    path: str,
    *,
    headers: dict[str, str],
    body: bytes | None = None,
) -> tuple[int, str]:
    url = urlsplit(emu.control_url)
    connection = http.client.HTTPConnection(url.hostname or "", url.port, timeout=10)
    try:
        connection.putrequest(method, path, skip_host=True)
        for name, value in headers.items():
            connection.putheader(name, value)
        if body is not None:
            connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def _host(emu: Emulator) -> str:
    return urlsplit(emu.control_url).netloc


def test_the_control_endpoint_needs_the_token(emu: Emulator) -> None:
    key = _fields(emu.connection_string("primary"))["SharedAccessKey"]
    for headers in (
        {"Host": _host(emu)},
        {"Host": _host(emu), "Authorization": "Bearer not-the-token"},
        {"Host": _host(emu), "Authorization": emu.control_token},  # no Bearer
    ):
        status, text = _control(emu, "GET", "/", headers=headers)
        assert status == 401, text
        assert key not in text
    status, text = _control(
        emu,
        "GET",
        "/",
        headers={"Host": _host(emu), "Authorization": f"Bearer {emu.control_token}"},
    )
    assert status == 200 and key in text


@pytest.mark.parametrize("host", ["evil.example:80", "attacker.test", "127.0.0.1:1", ""])
def test_a_foreign_host_is_refused_even_with_the_token(emu: Emulator, host: str) -> None:
    # DNS rebinding: the browser sends the attacker's name as Host.
    status, text = _control(
        emu, "GET", "/", headers={"Host": host, "Authorization": f"Bearer {emu.control_token}"}
    )
    assert status == 403, text
    assert "SharedAccessKey" not in text


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]
)
def test_a_post_that_is_not_json_is_refused(emu: Emulator, content_type: str) -> None:
    headers = {
        "Host": _host(emu),
        "Authorization": f"Bearer {emu.control_token}",
        "Content-Type": content_type,
    }
    status, text = _control(
        emu, "POST", "/namespaces/primary/faults/outage", headers=headers, body=b"{}"
    )
    assert status == 415, text
    assert emu.namespace("primary").faults()["down"] is False


def test_a_cross_site_post_without_the_token_injects_nothing(emu: Emulator) -> None:
    headers = {"Host": _host(emu), "Content-Type": "text/plain", "Origin": "http://evil.example"}
    status, _ = _control(
        emu, "POST", "/namespaces/primary/faults/outage", headers=headers, body=b""
    )
    assert status == 401
    assert emu.namespace("primary").faults()["down"] is False


def test_localhost_with_the_token_and_json_works(emu: Emulator) -> None:
    port = urlsplit(emu.control_url).port
    headers = {"Host": f"localhost:{port}", **emu.control_headers()}
    status, text = _control(
        emu, "POST", "/namespaces/primary/faults/latency", headers=headers, body=b'{"seconds": 0}'
    )
    assert status == 200, text


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ("PartitionKey", {"annotations": {"x-opt-partition-key": "p" * 129}}),
        ("SessionId", {"properties": {"group_id": "s" * 129}}),
    ],
)
async def test_session_id_and_partition_key_over_128_characters_are_refused(
    emu: Emulator, field: str, message: dict[str, dict[str, str]]
) -> None:
    control = emu.namespace("primary")
    before = control.message_count("other")
    async with sdk_sender(control.connection_string, "other", retry_total=0) as sender:
        with pytest.raises(ServiceBusError, match=f"{field} of 129 characters"):
            await sender.send_messages(AmqpAnnotatedMessage(data_body=b"m", **message))  # type: ignore[arg-type]
    assert control.message_count("other") == before
