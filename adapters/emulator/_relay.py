"""A local Azure Relay Hybrid Connections endpoint for one emulated namespace.

It speaks the subset of the documented protocol georep uses, over TLS with the emulator's
certificate (``wss://`` and ``https://`` on its own loopback port, like Azure):

- Listener control channel: ``GET /$hc/{path}?sb-hc-action=listen&sb-hc-token=…``
  (or the ``ServiceBusAuthorization`` header). The relay sends ``accept`` and ``request``
  frames on it and takes ``response`` frames (one binary body frame after the head when
  ``body`` is true) and ``renewToken``. A token that expires without renewal closes the
  channel with 1008.
- Sender websocket: ``GET /$hc/{path}?sb-hc-action=connect&sb-hc-token=…``. The relay
  sends ``accept`` (``address``, ``id``, ``connectHeaders``) to a listener, waits for its
  rendezvous websocket (``sb-hc-action=accept&sb-hc-id=…``), completes the sender's
  handshake and pipes frames both ways; a close on one side closes the other with the
  same code.
- HTTP mode: any method on ``/{path}/…`` with the token in ``ServiceBusAuthorization``;
  the relay forwards it as a ``request`` frame (``id``, ``method``, ``requestTarget``,
  ``requestHeaders``, ``body``) and answers with the listener's ``response``.

Bodies over 64 kB take the rendezvous path: the control channel gets a ``request`` with
only ``address`` and ``id``, the listener opens ``sb-hc-action=request&sb-hc-id=…`` and
the whole request travels there; a listener may also answer any request on such a socket
(required for responses over 64 kB). The relay closes a rendezvous socket after its answer.

Relay-level refusals carry ``TrackingId:`` in the body, and answers from a listener carry a
``Via`` header naming the relay, which is how a sender tells them apart (as with Azure):
401 (token missing, malformed, wrong key or expired), 403 (token for another path), 404
(no such hybrid connection; at a websocket handshake also "no listener"), 503 (HTTP: no
listener connected), 502 (the listener went away mid-request), 504 (no answer within 60 s).

Faults: the namespace's outage closes every websocket with 1001 and stops listening;
``restore`` listens again on the same port; latency delays every relayed request and
handshake; "no listener" makes a hybrid connection refuse senders as if none were
connected.
"""

from __future__ import annotations

__all__ = ["RelayServer"]

import asyncio
import contextlib
import datetime
import json
import logging
import random
import socket
import ssl
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from aiohttp import WSCloseCode, WSMsgType, web

from ._namespace_host import NamespaceHost
from ._sas import LISTEN, SEND, SasGrant
from ._sockets import bind_loopback

_LOG = logging.getLogger("georep.emulator.relay")
_BODY_LIMIT = 64 * 1024
# A listener must answer a request within 60 s, or the delivery counts as failed.
_ANSWER_TIMEOUT = 60.0
# The rendezvous URL is good for about as long as a sender waits for a connection.
_ACCEPT_TIMEOUT = 30.0
# Never forwarded: the token, and the RFC 7230 connection headers (Via is annotated).
_RELAY_HEADERS = frozenset(
    {
        "servicebusauthorization",
        "authorization",
        "connection",
        "content-length",
        "host",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "close",
        "via",
        "sec-websocket-key",
        "sec-websocket-version",
        "sec-websocket-extensions",
    }
)


@dataclass(eq=False)
class _ControlChannel:
    path: str
    socket: web.WebSocketResponse
    expires_at: float
    send_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    pending: dict[str, asyncio.Future[tuple[dict[str, Any], bytes]]] = field(default_factory=dict)

    async def send(self, head: dict[str, Any], body: bytes | None = None) -> None:
        async with self.send_lock:
            await self.socket.send_str(json.dumps(head))
            if body:
                await self.socket.send_bytes(body)


class RelayServer:
    """The Hybrid Connections relay of one namespace (see the module docstring)."""

    def __init__(
        self,
        namespace: NamespaceHost,
        *,
        ssl_context: ssl.SSLContext,
        hybrid_connections: Iterable[str] = (),
        port: int = 0,
    ) -> None:
        self._namespace = namespace
        self._ssl = ssl_context
        self.port = port
        self.hybrid_connections: set[str] = {p.strip("/") for p in hybrid_connections}
        self.no_listener: set[str] = set()
        self._channels: dict[str, list[_ControlChannel]] = {}
        # Pending sender connections by accept id: the listener's rendezvous socket, and
        # an event the sender's side sets once the pipe between them is over.
        self._accepts: dict[str, asyncio.Future[tuple[web.WebSocketResponse, asyncio.Event]]] = {}
        self._sockets: set[web.WebSocketResponse] = set()
        self._runner: web.AppRunner | None = None
        self._reserved: socket.socket | None = None
        self.requests = 0

    # -- lifecycle ---------------------------------------------------------------------
    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("GET", "/$hc/{path:.+}", self._websocket)
        app.router.add_route("*", "/{path:.*}", self._http)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        # Bound while an outage's reservation still holds the port (bind_loopback), which
        # is let go only once this listens.
        sock = bind_loopback(self.port)
        try:
            site = web.SockSite(runner, sock, ssl_context=self._ssl)
            await site.start()
        except BaseException:
            sock.close()
            await runner.cleanup()
            raise
        self.port = sock.getsockname()[1]
        self._runner = runner
        if self._reserved is not None:
            self._reserved.close()
            self._reserved = None

    async def stop(self, *, hold_port: bool = False) -> None:
        """Close every websocket with 1001 (going away) and stop listening; with
        ``hold_port`` (an outage) keep the port bound, refusing connections, for
        :meth:`start` to listen on again."""
        if hold_port and self._runner is not None and self._reserved is None:
            try:
                self._reserved = bind_loopback(self.port)
            except OSError as exc:  # start() binds again, and says so if it cannot
                _LOG.warning("relay on port %d: could not hold it while down: %s", self.port, exc)
        elif not hold_port and self._reserved is not None:
            self._reserved.close()
            self._reserved = None
        sockets = list(self._sockets)
        self._sockets.clear()
        for channels in self._channels.values():
            for channel in channels:
                self._fail_pending(channel)
        self._channels.clear()
        for future in self._accepts.values():
            if not future.done():
                future.set_exception(ConnectionError("the namespace went down"))
        self._accepts.clear()
        await asyncio.gather(
            *(s.close(code=WSCloseCode.GOING_AWAY, message=b"namespace down") for s in sockets),
            return_exceptions=True,
        )
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    def describe(self) -> dict[str, Any]:
        return {
            "port": self.port,
            "hybrid_connections": sorted(self.hybrid_connections),
            "listeners": {p: len(c) for p, c in self._channels.items() if c},
            "no_listener": sorted(self.no_listener),
        }

    # -- helpers ------------------------------------------------------------------------
    def _refuse(self, status: int, reason: str, detail: str, path: str = "") -> web.Response:
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S")
        text = (
            f"{detail} TrackingId:{uuid.uuid4()}, "
            f"SystemTracker:{self.host}:HybridConnection:{path}, Timestamp:{stamp}"
        )
        return web.Response(status=status, reason=reason, text=text)

    def _match(self, path: str) -> str | None:
        path = path.strip("/")
        for name in sorted(self.hybrid_connections, key=len, reverse=True):
            if path == name or path.startswith(name + "/"):
                return name
        return None

    def _authorize(self, request: web.Request, path: str, right: str) -> float | web.Response:
        """The token's expiry, or the 401/403 refusal (never echoing the token).

        The token's ``sr`` must cover ``path`` (by whole segments, see ``_sas``) and its
        rule must have ``right``: ``Listen`` to listen, ``Send`` to send.
        """
        token = (
            request.headers.get("ServiceBusAuthorization")
            or request.headers.get("Authorization")
            or request.query.get("sb-hc-token")
        )
        if not token:
            return self._refuse(401, "Unauthorized", "MissingToken: no SAS token.", path)
        try:
            granted = self._namespace.grant(token, port=self.port)
        except PermissionError as exc:
            return self._refuse(401, "Unauthorized", f"InvalidToken: {exc}", path)
        refusal = _refusal(granted, path, right)
        if refusal is not None:
            return self._refuse(403, "Forbidden", refusal, path)
        return granted.expiry

    def _listener_for(self, path: str) -> _ControlChannel | None:
        if path in self.no_listener:
            return None
        channels = [c for c in self._channels.get(path, ()) if not c.socket.closed]
        if not channels:
            return None
        # Azure spreads connections over a hybrid connection's listeners at random.
        return random.choice(channels)

    @staticmethod
    def _fail_pending(channel: _ControlChannel) -> None:
        for future in channel.pending.values():
            if not future.done():
                future.set_exception(ConnectionError("the listener went away"))
        channel.pending.clear()

    async def _delay(self) -> None:
        latency = self._namespace.faults.latency
        if latency > 0:
            await asyncio.sleep(latency)

    # -- websocket endpoints -------------------------------------------------------------
    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        action = request.query.get("sb-hc-action", "")
        path = self._match(request.match_info["path"])
        if action in ("accept", "request"):
            return await self._rendezvous(request)
        if path is None:
            return self._refuse(
                404, "Not Found", "EndpointNotFound: no such hybrid connection.", ""
            )
        authorized = self._authorize(request, path, LISTEN if action == "listen" else SEND)
        if isinstance(authorized, web.Response):
            return authorized
        if action == "listen":
            return await self._listen(request, path, authorized)
        if action == "connect":
            return await self._connect(request, path)
        return self._refuse(400, "Bad Request", f"Unknown sb-hc-action '{action}'.", path)

    async def _listen(self, request: web.Request, path: str, expiry: float) -> web.StreamResponse:
        socket = web.WebSocketResponse(max_msg_size=0, compress=False)
        await socket.prepare(request)
        channel = _ControlChannel(path, socket, expiry)
        self._sockets.add(socket)
        self._channels.setdefault(path, []).append(channel)
        watchdog = asyncio.create_task(self._expire(channel))
        try:
            await self._read_control(channel)
        finally:
            watchdog.cancel()
            self._sockets.discard(socket)
            with contextlib.suppress(ValueError, KeyError):
                self._channels[path].remove(channel)
            self._fail_pending(channel)
        return socket

    async def _expire(self, channel: _ControlChannel) -> None:
        while True:
            await asyncio.sleep(max(0.0, channel.expires_at - time.time()))
            if time.time() >= channel.expires_at:
                await channel.socket.close(
                    code=WSCloseCode.POLICY_VIOLATION, message=b"token expired"
                )
                return

    async def _read_control(self, channel: _ControlChannel) -> None:
        socket = channel.socket
        expecting: tuple[asyncio.Future[tuple[dict[str, Any], bytes]], dict[str, Any]] | None
        expecting = None
        async for message in socket:
            if message.type == WSMsgType.BINARY and expecting is not None:
                future, head = expecting
                expecting = None
                if not future.done():
                    future.set_result((head, message.data))
                continue
            if message.type != WSMsgType.TEXT:
                continue
            try:
                frame = json.loads(message.data)
            except ValueError:
                await socket.close(code=WSCloseCode.PROTOCOL_ERROR, message=b"bad frame")
                return
            if "renewToken" in frame:
                try:
                    token = str(frame["renewToken"]["token"])
                    granted = self._namespace.grant(token, port=self.port)
                    if _refusal(granted, channel.path, LISTEN) is not None:
                        raise PermissionError("the renewed token does not cover this listener")
                    channel.expires_at = granted.expiry
                except (PermissionError, KeyError, TypeError):
                    await socket.close(
                        code=WSCloseCode.POLICY_VIOLATION, message=b"renewToken refused"
                    )
                    return
            elif "response" in frame:
                head = frame["response"]
                found = channel.pending.pop(str(head.get("requestId")), None)
                if head.get("body"):
                    expecting = (found or asyncio.get_running_loop().create_future(), head)
                elif found is not None and not found.done():
                    found.set_result((head, b""))

    async def _connect(self, request: web.Request, path: str) -> web.StreamResponse:
        await self._delay()
        channel = self._listener_for(path)
        if channel is None:
            return self._refuse(
                404, "Not Found", "There are no listeners connected for the endpoint.", path
            )
        accept_id = uuid.uuid4().hex
        future: asyncio.Future[tuple[web.WebSocketResponse, asyncio.Event]] = (
            asyncio.get_running_loop().create_future()
        )
        self._accepts[accept_id] = future
        accept = {
            "accept": {
                "address": f"wss://{self.host}/$hc/{path}?sb-hc-action=accept&sb-hc-id={accept_id}",
                "id": accept_id,
                "connectHeaders": _forwarded_headers(request),
                "remoteEndpoint": _remote_endpoint(request),
            }
        }
        try:
            await channel.send(accept)
            async with asyncio.timeout(_ACCEPT_TIMEOUT):
                listener_side, piped = await future
        except (TimeoutError, ConnectionError):
            # Handshake 500: the listener did not accept in time, or went away (or the
            # namespace went down, which closes this connection anyway).
            return self._refuse(
                500, "Internal Server Error", "The listener did not accept the connection.", path
            )
        finally:
            self._accepts.pop(accept_id, None)
        sender_side = web.WebSocketResponse(max_msg_size=0, compress=False)
        try:
            await sender_side.prepare(request)
            self._sockets.add(sender_side)
            await self._pipe(sender_side, listener_side)
        finally:
            self._sockets.discard(sender_side)
            piped.set()
            if not listener_side.closed:
                await listener_side.close(code=WSCloseCode.GOING_AWAY)
        return sender_side

    async def _rendezvous(self, request: web.Request) -> web.StreamResponse:
        future = self._accepts.get(request.query.get("sb-hc-id", ""))
        if future is None or future.done():
            return self._refuse(403, "Forbidden", "The rendezvous URL is not valid (expired?).", "")
        socket = web.WebSocketResponse(max_msg_size=0, compress=False)
        await socket.prepare(request)
        self._sockets.add(socket)
        piped = asyncio.Event()
        future.set_result((socket, piped))
        # The sender's handler pipes this socket; this request lives until that is over.
        try:
            await piped.wait()
        finally:
            self._sockets.discard(socket)
        return socket

    async def _pipe(self, sender: web.WebSocketResponse, listener: web.WebSocketResponse) -> None:
        async def forward(
            source: web.WebSocketResponse, target: web.WebSocketResponse, delayed: bool
        ) -> int:
            async for message in source:
                if delayed:
                    await self._delay()
                if message.type == WSMsgType.TEXT:
                    await target.send_str(message.data)
                elif message.type == WSMsgType.BINARY:
                    await target.send_bytes(message.data)
            return source.close_code or WSCloseCode.OK

        upstream = asyncio.create_task(forward(sender, listener, True))
        downstream = asyncio.create_task(forward(listener, sender, False))
        done, pending = await asyncio.wait(
            {upstream, downstream}, return_when=asyncio.FIRST_COMPLETED
        )
        code: int = WSCloseCode.GOING_AWAY
        for task in done:
            if not task.cancelled() and task.exception() is None:
                code = task.result()
        for peer in (sender, listener):
            if not peer.closed:
                await peer.close(code=code)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    # -- HTTP mode ----------------------------------------------------------------------------
    async def _http(self, request: web.Request) -> web.StreamResponse:
        path = self._match(request.match_info["path"])
        if path is None:
            return self._refuse(404, "Not Found", "EndpointNotFound: no such hybrid connection.")
        authorized = self._authorize(request, path, SEND)
        if isinstance(authorized, web.Response):
            return authorized
        body = await request.read()
        await self._delay()
        channel = self._listener_for(path)
        if channel is None:
            return self._refuse(
                503,
                "Service Unavailable",
                "There are no listeners connected for the endpoint.",
                path,
            )
        self.requests += 1
        request_id = uuid.uuid4().hex
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[tuple[dict[str, Any], bytes]] = loop.create_future()
        rendezvous: asyncio.Future[tuple[web.WebSocketResponse, asyncio.Event]] = (
            loop.create_future()
        )
        self._accepts[request_id] = rendezvous
        address = f"wss://{self.host}/$hc/{path}?sb-hc-action=request&sb-hc-id={request_id}"
        head = {
            "request": {
                "address": address,
                "id": request_id,
                "requestTarget": _request_target(request),
                "method": request.method,
                "requestHeaders": {**_forwarded_headers(request), "Via": self._via(request)},
                "remoteEndpoint": _remote_endpoint(request),
                "body": bool(body),
            }
        }
        socket: web.WebSocketResponse | None = None
        piped: asyncio.Event | None = None
        try:
            async with asyncio.timeout(_ANSWER_TIMEOUT):
                if len(body) > _BODY_LIMIT:
                    # Too large for the control channel: only the address goes there, and
                    # the whole request travels on the rendezvous socket the listener opens.
                    await channel.send({"request": {"address": address, "id": request_id}})
                    socket, piped = await rendezvous
                    await socket.send_str(json.dumps(head))
                    await socket.send_bytes(body)
                    answer, payload = await _read_response(socket)
                else:
                    channel.pending[request_id] = answered
                    await channel.send(head, body)
                    # The listener answers on the control channel, or (a response over
                    # 64 kB) on a rendezvous socket it opens at the request's address.
                    either: set[asyncio.Future[Any]] = {answered, rendezvous}
                    await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
                    if answered.done():
                        answer, payload = answered.result()
                    else:
                        socket, piped = rendezvous.result()
                        answer, payload = await _read_response(socket)
        except TimeoutError:
            return self._refuse(
                504, "Gateway Timeout", "The listener did not answer in time.", path
            )
        except (ConnectionError, ValueError, KeyError):
            return self._refuse(502, "Bad Gateway", "The listener went away.", path)
        finally:
            channel.pending.pop(request_id, None)
            self._accepts.pop(request_id, None)
            if not answered.done():
                answered.cancel()
            if socket is not None and not socket.closed:
                await socket.close()
            if piped is not None:
                piped.set()
        headers = {
            k: str(v)
            for k, v in dict(answer.get("responseHeaders") or {}).items()
            if k.lower() not in _RELAY_HEADERS
        }
        # Via tells the sender the answer came from the listener, not from the relay.
        headers["Via"] = self._via(request)
        return web.Response(
            status=int(answer.get("statusCode", 200)),
            reason=answer.get("statusDescription") or None,
            headers=headers,
            body=payload,
        )

    def _via(self, request: web.Request) -> str:
        hop = f"1.1 {self.host}"
        previous = request.headers.get("Via")
        return f"{previous}, {hop}" if previous else hop


async def _read_response(socket: web.WebSocketResponse) -> tuple[dict[str, Any], bytes]:
    """A ``response`` head and its body frame from a rendezvous socket."""
    message = await socket.receive()
    if message.type != WSMsgType.TEXT:
        raise ConnectionError("the rendezvous socket closed before the response")
    head = json.loads(message.data)["response"]
    if not head.get("body"):
        return head, b""
    message = await socket.receive()
    if message.type != WSMsgType.BINARY:
        raise ConnectionError("the rendezvous socket closed before the response body")
    return head, message.data


def _request_target(request: web.Request) -> str:
    """Path and query as the sender gave them, without the relay's own ``sb-hc-`` parameters."""
    query = [(k, v) for k, v in request.query.items() if not k.lower().startswith("sb-hc-")]
    return request.path + ("?" + urlencode(query) if query else "")


def _refusal(granted: SasGrant, path: str, right: str) -> str | None:
    """Why ``granted`` may not ``right`` on ``path``, or None when it may."""
    if not granted.covers(path):
        return f"The token is not valid for this path ({granted.scope or '/'})."
    if right not in granted.rights:
        return f"The token's rule '{granted.rule}' lacks the '{right}' claim for this path."
    return None


def _forwarded_headers(request: web.Request) -> dict[str, str]:
    """The sender's headers as the listener sees them (never the token)."""
    return {k: v for k, v in request.headers.items() if k.lower() not in _RELAY_HEADERS}


def _remote_endpoint(request: web.Request) -> dict[str, Any]:
    peer = request.transport.get_extra_info("peername") if request.transport else None
    return {"address": peer[0] if peer else "", "port": peer[1] if peer else 0}
