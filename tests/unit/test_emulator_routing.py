"""What a namespace's TLS port serves, chosen by the first decrypted bytes."""

from __future__ import annotations

import asyncio

import pytest

from georep.adapters.emulator._amqp import AmqpConnection
from georep.adapters.emulator._server import NamespaceServer, NamespaceSpec


class AdminProtocol(asyncio.Protocol):
    pass


@pytest.fixture
def server() -> NamespaceServer:
    return NamespaceServer(NamespaceSpec(name="p"), ssl_context=None, admin_handler=AdminProtocol)


@pytest.mark.parametrize("header", [b"AMQP\x00\x01\x00\x00", b"AMQP\x03\x01\x00\x00"])
def test_amqp_header_after_tls_is_amqps(server: NamespaceServer, header: bytes) -> None:
    assert isinstance(server._after_tls(header), AmqpConnection)


async def test_websocket_upgrade_is_amqp_over_websockets(server: NamespaceServer) -> None:
    protocol = server._after_tls(b"GET /$servicebus/websocket HTTP/1.1\r\nHost: x\r\n")
    assert protocol is not None
    assert not isinstance(protocol, AmqpConnection | AdminProtocol)


def test_other_http_is_the_admin_api(server: NamespaceServer) -> None:
    first = b"GET /orders?api-version=2021-05 HTTP/1.1\r\n"
    assert isinstance(server._after_tls(first), AdminProtocol)


@pytest.mark.parametrize("partial", [b"AM", b"GET /$servicebus/web"])
def test_waits_until_the_bytes_decide(server: NamespaceServer, partial: bytes) -> None:
    assert server._after_tls(partial) is None


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True


@pytest.mark.parametrize("fault", ["none", "down", "paused"])
def test_a_connection_set_up_after_a_fault_began_meets_it_as_the_others_did(
    server: NamespaceServer, fault: str
) -> None:
    """Accepted before ``outage()``/``blackhole()`` and handed to the loop after it swept the
    connections: it must not outlive the outage or answer in the blackhole."""
    server.faults.down = fault == "down"
    server.faults.paused = fault == "paused"
    connection, transport = AmqpConnection(server), _Transport()

    connection.connection_made(transport)
    assert transport.aborted == (fault == "down")
    assert connection.paused == (fault == "paused")
