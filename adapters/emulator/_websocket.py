"""AMQP over WebSockets (``TransportType.AmqpOverWebsocket``), as Azure serves it.

The SDK opens ``wss://<host>:<port>/$servicebus/websocket`` with the subprotocol
``AMQPWSB10`` and then exchanges AMQP bytes in binary messages, split anywhere. The
emulator accepts the upgrade on the namespace's TLS port and feeds the bytes to an
ordinary :class:`AmqpConnection` through a transport that writes binary messages.
"""

from __future__ import annotations

__all__ = ["WEBSOCKET_PATH", "websocket_server"]

import asyncio
import contextlib
from typing import Any

from aiohttp import WSMsgType, web

from ._amqp import AmqpConnection
from ._namespace_host import NamespaceHost

WEBSOCKET_PATH = "/$servicebus/websocket"
_SUBPROTOCOL = "AMQPWSB10"


class _WebSocketTransport(asyncio.Transport):
    """What :class:`AmqpConnection` writes to: each write becomes one binary message."""

    def __init__(self, ws: web.WebSocketResponse, peer: Any) -> None:
        super().__init__()
        self._ws = ws
        self._peer = peer
        self._outgoing: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._closing:
            self._outgoing.put_nowait(bytes(data))

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            self._outgoing.put_nowait(None)

    def abort(self) -> None:
        self.close()

    def is_closing(self) -> bool:
        return self._closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._peer if name == "peername" else default

    async def pump(self) -> None:
        """Send what was written, in order, until closed; then close the WebSocket."""
        while (data := await self._outgoing.get()) is not None:
            try:
                await self._ws.send_bytes(data)
            except (ConnectionError, RuntimeError):
                break
        self._closing = True
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self._ws.close()


def websocket_server(server: NamespaceHost) -> web.Server:
    """An HTTP protocol factory that upgrades ``/$servicebus/websocket`` to AMQP."""

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        if request.path != WEBSOCKET_PATH:
            raise web.HTTPNotFound(text=f"AMQP over WebSockets is at {WEBSOCKET_PATH}.")
        ws = web.WebSocketResponse(protocols=(_SUBPROTOCOL,), max_msg_size=0, autoping=True)
        if not ws.can_prepare(request).ok:
            raise web.HTTPBadRequest(text="Expected a WebSocket upgrade (subprotocol AMQPWSB10).")
        await ws.prepare(request)
        transport = _WebSocketTransport(ws, request.remote)
        connection = AmqpConnection(server)
        connection.connection_made(transport)
        pump = asyncio.create_task(transport.pump())
        try:
            async for message in ws:
                if message.type is WSMsgType.BINARY:
                    connection.data_received(message.data)
                elif message.type in (WSMsgType.CLOSE, WSMsgType.ERROR):
                    break
                if transport.is_closing():
                    break
            if not transport.is_closing():
                connection.eof_received()
        finally:
            connection.connection_lost(None)
            transport.close()
            await pump
        return ws

    return web.Server(handle, access_log=None)
