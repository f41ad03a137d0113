"""Fidelity: transports, credentials and refusals: rows of the
fidelity table in docs/emulator.md (see ``_fidelity.py``)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import time
from typing import Any
from urllib.parse import quote_plus

import pytest
from _fidelity import (
    bodies,
    check,
    checks_test,
    make_queue,
    receive_all,
    send,
    unique_name,
)
from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential
from azure.servicebus import (
    ServiceBusClient,
    ServiceBusMessage,
    TransportType,
)
from azure.servicebus.exceptions import (
    MessageSizeExceededError,
    MessagingEntityNotFoundError,
    ServiceBusAuthenticationError,
)

from georep.adapters.emulator import Emulator

pytestmark = pytest.mark.integration


def _tls_round_trip(emu: Emulator, credential: Any, transport: TransportType) -> None:
    queue = make_queue(emu)
    port = emu.namespace("primary").port
    with ServiceBusClient(
        "127.0.0.1",
        credential,
        custom_endpoint_address=f"sb://127.0.0.1:{port}",
        transport_type=transport,
        connection_verify=str(emu.ca_file),
    ) as client:
        with client.get_queue_sender(queue) as sender:
            sender.send_messages(ServiceBusMessage(b"tls"))
        with client.get_queue_receiver(queue) as receiver:
            [message] = receive_all(receiver, 1)
            receiver.complete_message(message)
            assert bodies([message]) == [b"tls"]


def _named_key(emu: Emulator) -> AzureNamedKeyCredential:
    return AzureNamedKeyCredential("RootManageSharedAccessKey", emu.namespace("primary").key)


@check("AMQPS: `ServiceBusClient(namespace, credential)` over TLS")
def _amqps(emu: Emulator) -> None:
    _tls_round_trip(emu, _named_key(emu), TransportType.Amqp)


@check("AMQP over WebSockets (`TransportType.AmqpOverWebsocket`)")
def _websockets(emu: Emulator) -> None:
    _tls_round_trip(emu, _named_key(emu), TransportType.AmqpOverWebsocket)


@check("`AzureNamedKeyCredential`")
def _named_key_credential(emu: Emulator) -> None:
    _tls_round_trip(emu, _named_key(emu), TransportType.Amqp)


@check("`AzureSasCredential` with `sr` encoded, unencoded or with lowercase escapes")
def _sas_credential(emu: Emulator) -> None:
    key = emu.namespace("primary").key.encode()
    expiry = str(int(time.time()) + 600)
    resource = "sb://127.0.0.1/"
    for sr in (quote_plus(resource), resource, quote_plus(resource).lower()):
        digest = hmac.new(key, f"{sr}\n{expiry}".encode(), hashlib.sha256).digest()
        signature = quote_plus(base64.b64encode(digest).decode())
        token = (
            f"SharedAccessSignature sr={sr}&sig={signature}&se={expiry}"
            "&skn=RootManageSharedAccessKey"
        )
        _tls_round_trip(emu, AzureSasCredential(token), TransportType.Amqp)


@check("Microsoft Entra ID tokens (`TokenCredential`, `AsyncTokenCredential`)")
def _entra_id(emu: Emulator) -> None:
    _tls_round_trip(emu, emu.token_credential("owner"), TransportType.Amqp)
    queue = make_queue(emu)
    for credential in (
        emu.token_credential(lifetime=-3600),
        emu.token_credential(audience="https://storage.azure.com"),
    ):
        with (
            ServiceBusClient(
                credential=credential, retry_total=0, **emu.client_options("primary", tls=False)
            ) as client,
            pytest.raises(ServiceBusAuthenticationError),
            client.get_queue_sender(queue) as sender,
        ):
            sender.send_messages(ServiceBusMessage(b"x"))


# -- refusals -------------------------------------------------------------------------------
@check("Oversize message refused (`MessageSizeExceededError`)")
def _oversize(emu: Emulator) -> None:
    queue = make_queue(emu)
    with pytest.raises(MessageSizeExceededError):
        send(emu, queue, ServiceBusMessage(b"x" * (300 * 1024)))
    assert emu.namespace("primary").message_count(queue) == 0


@check("Unknown entity refused (`MessagingEntityNotFoundError`)")
def _unknown_entity(emu: Emulator) -> None:
    with pytest.raises(MessagingEntityNotFoundError):
        send(emu, unique_name("missing"), ServiceBusMessage(b"x"))


@check("Wrong key refused (`ServiceBusAuthenticationError`)")
def _wrong_key(emu: Emulator) -> None:
    queue = make_queue(emu)
    good = emu.connection_string("primary")
    bad = re.sub(r"SharedAccessKey=[^;]+", "SharedAccessKey=" + "A" * 44, good)
    with (
        ServiceBusClient.from_connection_string(bad, retry_total=0) as client,
        pytest.raises(ServiceBusAuthenticationError),
        client.get_queue_sender(queue) as sender,
    ):
        sender.send_messages(ServiceBusMessage(b"x"))


test_supported_operation_works = checks_test(__name__)
