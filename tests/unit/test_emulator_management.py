"""The AMQP ``$management`` operations: one table from operation name to handler and claim.

``AmqpConnection.management_answer`` is what a request on ``<entity>/$management`` gets
(its application properties and body); the real SDK drives every operation end to end
in the emulator's integration tests.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from proton import Message, symbol

from georep.adapters.emulator._amqp import AmqpConnection
from georep.adapters.emulator._sas import LISTEN, SEND, SasGrant
from georep.adapters.emulator._server import NamespaceServer, NamespaceSpec


def connection(*rights: str) -> AmqpConnection:
    """A connection to a namespace with queue ``q``, holding a namespace token with ``rights``
    (as if put on ``$cbs``)."""
    server = NamespaceServer(
        NamespaceSpec(name="p", queues=("q",)), ssl_context=None, admin_handler=None
    )
    amqp = AmqpConnection(server)
    if rights:
        amqp._tokens["sb://127.0.0.1/"] = SasGrant("", frozenset(rights), time.time() + 3600, "r")
    return amqp


def request(body: dict[str, Any]) -> bytes:
    return bytes(Message(body=body).encode())


def test_an_unknown_operation_is_not_implemented() -> None:
    properties, body = connection(LISTEN).management_answer(
        "com.microsoft:meteor", "q", request({})
    )
    assert properties == {
        "statusCode": 400,
        "statusDescription": "Management operation 'com.microsoft:meteor' is not supported by "
        "the emulator.",
        "errorCondition": symbol("amqp:not-implemented"),
    }
    assert body is None


def test_the_claim_is_checked_before_the_operation_is_looked_up() -> None:
    properties, _ = connection().management_answer("com.microsoft:meteor", "q", request({}))
    assert properties["statusCode"] == 401
    assert properties["errorCondition"] == symbol("amqp:unauthorized-access")


@pytest.mark.parametrize(
    ("operation", "right", "status"),
    [
        ("com.microsoft:schedule-message", LISTEN, 401),
        ("com.microsoft:cancel-scheduled-message", LISTEN, 401),
        ("com.microsoft:peek-message", SEND, 401),
        ("com.microsoft:peek-message", LISTEN, 204),
        ("com.microsoft:cancel-scheduled-message", SEND, 200),
    ],
)
def test_each_operation_needs_its_claim(operation: str, right: str, status: int) -> None:
    body = {"sequence-numbers": [], "from-sequence-number": 1, "message-count": 1}
    properties, _ = connection(right).management_answer(operation, "q", request(body))
    assert properties["statusCode"] == status, properties


def test_a_session_operation_on_an_entity_without_sessions_is_refused() -> None:
    properties, _ = connection(LISTEN).management_answer(
        "com.microsoft:get-session-state", "q", request({"session-id": "s"})
    )
    assert properties["statusCode"] == 400
    assert properties["errorCondition"] == symbol("amqp:not-allowed")
    assert "'q' is not session-enabled" in properties["statusDescription"]


def test_a_request_missing_a_field_is_a_decode_error() -> None:
    properties, _ = connection(LISTEN).management_answer(
        "com.microsoft:renew-lock", "q", request({})
    )
    assert properties["statusCode"] == 400
    assert properties["errorCondition"] == symbol("amqp:decode-error")
    assert properties["statusDescription"] == "Bad management request: 'lock-tokens'"
