"""The standard constructor: AMQP over TLS and AMQP over WebSockets on the namespace's port,
with a named key or a SAS token however its signer encoded ``sr``.

``ServiceBusClient(fully_qualified_namespace, credential)`` connects over TLS to port 5671
(AMQPS) or 443 (WebSockets); ``custom_endpoint_address`` is the SDK's way to reach another
port, and ``connection_verify`` trusts the emulator's certificate.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import quote_plus

import pytest
from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential
from azure.servicebus import ServiceBusClient as SyncClient, ServiceBusMessage, TransportType
from azure.servicebus.aio import ServiceBusClient

from georep.adapters.emulator import Emulator

pytestmark = pytest.mark.integration

TRANSPORTS = [TransportType.Amqp, TransportType.AmqpOverWebsocket]


def _options(emu: Emulator, transport: TransportType) -> dict[str, Any]:
    port = emu.namespace("primary").port
    return {
        "custom_endpoint_address": f"sb://127.0.0.1:{port}",
        "transport_type": transport,
        "connection_verify": str(emu.ca_file),
    }


def _named_key(emu: Emulator) -> AzureNamedKeyCredential:
    return AzureNamedKeyCredential("RootManageSharedAccessKey", emu.namespace("primary").key)


async def _round_trip(client: ServiceBusClient, queue: str) -> None:
    body = uuid.uuid4().hex
    async with client.get_queue_sender(queue) as sender:
        await sender.send_messages(ServiceBusMessage(body))
    async with client.get_queue_receiver(queue) as receiver:
        [got] = await receiver.receive_messages(max_wait_time=5)
        assert str(got) == body
        await receiver.complete_message(got)


def _round_trip_sync(client: SyncClient, queue: str) -> None:
    body = uuid.uuid4().hex
    with client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage(body))
    with client.get_queue_receiver(queue) as receiver:
        [got] = receiver.receive_messages(max_wait_time=5)
        assert str(got) == body
        receiver.complete_message(got)


@pytest.mark.parametrize("transport", TRANSPORTS, ids=["amqps", "websocket"])
async def test_standard_constructor_with_named_key(
    georep_emulator: Emulator, queue: str, transport: TransportType
) -> None:
    async with ServiceBusClient(
        "127.0.0.1", _named_key(georep_emulator), **_options(georep_emulator, transport)
    ) as client:
        await _round_trip(client, queue)


@pytest.mark.parametrize("transport", TRANSPORTS, ids=["amqps", "websocket"])
def test_standard_constructor_with_named_key_sync(
    georep_emulator: Emulator, queue: str, transport: TransportType
) -> None:
    if transport is TransportType.AmqpOverWebsocket:
        pytest.importorskip("websocket", reason="the sync SDK needs websocket-client for this")
    with SyncClient(
        "127.0.0.1", _named_key(georep_emulator), **_options(georep_emulator, transport)
    ) as client:
        _round_trip_sync(client, queue)


async def test_fully_qualified_namespace_may_carry_the_port(
    georep_emulator: Emulator, queue: str
) -> None:
    port = georep_emulator.namespace("primary").port
    async with ServiceBusClient(
        f"127.0.0.1:{port}",
        _named_key(georep_emulator),
        **_options(georep_emulator, TransportType.Amqp),
    ) as client:
        await _round_trip(client, queue)


def _sas_token(emu: Emulator, encode: Callable[[str], str]) -> str:
    """A namespace token built as its signer would: sign ``<sr as put in the token>\\n<se>``."""
    control = emu.namespace("primary")
    sr = encode(f"sb://127.0.0.1:{control.port}/")
    se = str(int(time.time() + 600))
    digest = hmac.new(control.key.encode(), f"{sr}\n{se}".encode(), hashlib.sha256).digest()
    sig = quote_plus(base64.b64encode(digest).decode())
    return f"SharedAccessSignature sr={sr}&sig={sig}&se={se}&skn=RootManageSharedAccessKey"


ENCODINGS: dict[str, Callable[[str], str]] = {
    "unencoded": lambda uri: uri,  # the SDK's AzureSasCredential samples
    "quote_plus": quote_plus,  # the SDK's own token generation
    "lowercase-escapes": lambda uri: re.sub(  # .NET's HttpUtility.UrlEncode
        "%[0-9A-F]{2}", lambda m: m.group().lower(), quote_plus(uri)
    ),
}


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_azure_sas_credential_whatever_the_sr_encoding(
    georep_emulator: Emulator, queue: str, encoding: str
) -> None:
    credential = AzureSasCredential(_sas_token(georep_emulator, ENCODINGS[encoding]))
    async with ServiceBusClient(
        "127.0.0.1", credential, **_options(georep_emulator, TransportType.Amqp)
    ) as client:
        await _round_trip(client, queue)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_azure_sas_credential_whatever_the_sr_encoding_sync(
    georep_emulator: Emulator, queue: str, encoding: str
) -> None:
    credential = AzureSasCredential(_sas_token(georep_emulator, ENCODINGS[encoding]))
    with SyncClient(
        "127.0.0.1", credential, **_options(georep_emulator, TransportType.Amqp)
    ) as client:
        _round_trip_sync(client, queue)
