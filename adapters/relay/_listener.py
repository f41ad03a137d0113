"""A Hybrid Connections listener that serves one handler on several hybrid connections.

Per hybrid connection it keeps a control channel open
(``wss://{ns}/$hc/{path}?sb-hc-action=listen&sb-hc-token=…``), reconnecting with bounded
backoff, and sends ``renewToken`` before its token expires. From the relay it takes:

- ``request`` frames (HTTP mode): method, ``requestTarget``, ``requestHeaders`` and, when
  ``body`` is true, the body in the next binary frame. The handler's answer goes back as a
  ``response`` frame (``requestId``, ``statusCode``, ``statusDescription``,
  ``responseHeaders``, ``body``) followed by one binary frame with the body.
- a ``request`` frame with only ``address`` (a request over 64 kB): it opens the rendezvous
  websocket there (``sb-hc-action=request``), takes the request and answers on it; a
  response over 64 kB also goes on a rendezvous socket opened at the request's address.
- ``accept`` frames (WebSocket mode): it opens the rendezvous websocket at ``address`` and
  serves georep's request framing on it (see :class:`RelayMode`).
"""

from __future__ import annotations

__all__ = ["HybridConnectionListener", "ListenerStats", "RelayHandler"]

import asyncio
import contextlib
import json
import logging
import random
import ssl
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import websockets
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from georep._lifecycle import STOP_TIMEOUT, AsyncResource, stop_task, stop_tasks
from georep.exceptions import ConfigurationError
from georep.ports import ErrorKind, RelayRequest, RelayResponse

from ._endpoint import _client_ssl, quiet_logger
from ._errors import translate
from ._sas import HybridConnection, SasTokenProvider

_LOG = logging.getLogger("georep.relay")

RelayHandler = Callable[[RelayRequest], Awaitable[RelayResponse]]

# The relay carries request and response bodies up to 64 kB on the control channel.
_CONTROL_BODY_LIMIT = 64 * 1024
#: Seconds a cancelled task of the listener (a control channel, a handler's answer) gets
#: to end when the listener closes; one still running then is logged and left behind.
_STOP_SECONDS = STOP_TIMEOUT


@dataclass(slots=True)
class ListenerStats:
    """Counters of one :class:`HybridConnectionListener`.

    Attributes:
        connects: Control channels opened (the first one per hybrid connection included).
        renewals: ``renewToken`` messages sent.
        requests: Requests handled (HTTP and WebSocket mode).
        accepts: Relayed websockets accepted.
        handler_errors: Requests whose handler raised (answered 500).
    """

    connects: int = 0
    renewals: int = 0
    requests: int = 0
    accepts: int = 0
    handler_errors: int = 0


def _response_head(request_id: str, response: RelayResponse, body: bool) -> str:
    try:
        description = HTTPStatus(response.status).phrase
    except ValueError:
        description = ""
    return json.dumps(
        {
            "response": {
                "requestId": request_id,
                "statusCode": response.status,
                "statusDescription": description,
                "responseHeaders": dict(response.headers),
                "body": body,
            }
        }
    )


class HybridConnectionListener(AsyncResource):
    """Serves ``handler`` on every hybrid connection given, until closed.

    Use it as an async context manager (``async with HybridConnectionListener(...)``), or
    call :meth:`start` and :meth:`aclose`. :meth:`start` returns once every control channel
    is open (or ``start_timeout`` passed; connecting goes on in the background).

    Args:
        connections: The hybrid connections to listen on (typically two, in different
            namespaces, with different names).
        handler: ``async def handler(request: RelayRequest) -> RelayResponse``. An
            exception becomes a 500 answer (its text is logged, not sent).
        ssl_context: TLS settings; default the system's trust store.
        token_ttl: Lifetime of each listen token in seconds. Default 3600.
        renew_before: Seconds before expiry at which ``renewToken`` is sent. Default a
            fifth of ``token_ttl``, at most 300.
        max_backoff: Upper bound, in seconds, of the wait between reconnect attempts.
        start_timeout: Seconds :meth:`start` waits for the control channels. Default 10.
    """

    def __init__(
        self,
        connections: Sequence[HybridConnection],
        handler: RelayHandler,
        *,
        ssl_context: ssl.SSLContext | None = None,
        token_ttl: float = 3600.0,
        renew_before: float | None = None,
        max_backoff: float = 5.0,
        start_timeout: float = 10.0,
    ) -> None:
        if not connections:
            raise ConfigurationError("give at least one HybridConnection to listen on")
        if len({(c.namespace, c.path) for c in connections}) != len(connections):
            raise ConfigurationError("each hybrid connection may be listed only once")
        self._connections = tuple(connections)
        self._handler = handler
        self._ssl = _client_ssl(ssl_context)
        self._token_ttl = token_ttl
        self._renew_before = renew_before
        self._max_backoff = max_backoff
        self._start_timeout = start_timeout
        self._tasks: list[asyncio.Task[None]] = []
        self._children: set[asyncio.Task[Any]] = set()
        self._online: dict[str, asyncio.Event] = {}
        self._closing = False
        self.stats = ListenerStats()

    def __repr__(self) -> str:
        paths = ", ".join(f"{c.namespace}/{c.path}" for c in self._connections)
        return f"HybridConnectionListener({paths})"

    def online(self, region: str) -> bool:
        """True while the control channel of the connection labelled ``region`` is open."""
        event = self._online.get(region)
        return event is not None and event.is_set()

    async def start(self) -> None:
        """Open a control channel per hybrid connection; return once all are open."""
        if self._tasks:
            return
        for connection in self._connections:
            self._online[connection.region] = asyncio.Event()
            self._tasks.append(
                asyncio.create_task(
                    self._listen_forever(connection), name=f"relay-listen-{connection.region}"
                )
            )
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._start_timeout):
                await asyncio.gather(*(event.wait() for event in self._online.values()))

    async def wait_online(self, timeout: float = 10.0) -> None:
        """Wait until every control channel is open.

        Raises:
            TimeoutError: Not all were open within ``timeout`` seconds.
        """
        async with asyncio.timeout(timeout):
            await asyncio.gather(*(event.wait() for event in self._online.values()))

    # -- control channel ---------------------------------------------------------------
    async def _listen_forever(self, connection: HybridConnection) -> None:
        tokens = SasTokenProvider(
            connection.key_name,
            connection.key,
            ttl=self._token_ttl,
            renew_before=self._renew_before,
        )
        failures = 0
        while not self._closing:
            try:
                await self._listen_once(connection, tokens)
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # reconnect whatever happened, with backoff
                failures += 1
                # The translated error never holds the URL (and with it the token).
                error = translate(connection.region, exc)
                refused = error.kind in (ErrorKind.AUTHENTICATION, ErrorKind.ENTITY_NOT_FOUND)
                _LOG.log(
                    logging.WARNING if refused else logging.INFO,
                    "relay listener: control channel failed (%s); reconnecting",
                    error,
                )
            finally:
                self._online[connection.region].clear()
            if self._closing:
                return
            delay = min(self._max_backoff, 0.05 * 2 ** min(failures, 10))
            await asyncio.sleep(delay * (0.5 + random.random() / 2))

    async def _listen_once(self, connection: HybridConnection, tokens: SasTokenProvider) -> None:
        token, expires_at = tokens.token(connection.audience)
        url = connection.websocket_url(
            "listen", **{"sb-hc-id": uuid.uuid4().hex, "sb-hc-token": token}
        )
        async with websockets.connect(
            url,
            ssl=self._ssl,
            proxy=None,
            compression=None,
            max_size=None,
            logger=quiet_logger,
        ) as control:
            self.stats.connects += 1
            self._online[connection.region].set()
            send_lock = asyncio.Lock()
            renewer = asyncio.create_task(
                self._renew(connection, tokens, expires_at, control, send_lock)
            )
            try:
                await self._serve_control(connection, control, send_lock)
            finally:
                await stop_task(renewer, timeout=_STOP_SECONDS)

    async def _renew(
        self,
        connection: HybridConnection,
        tokens: SasTokenProvider,
        expires_at: float,
        control: ClientConnection,
        send_lock: asyncio.Lock,
    ) -> None:
        while not self._closing:
            await asyncio.sleep(max(0.0, tokens.renew_at(expires_at) - time.time()))
            token, expires_at = tokens.token(connection.audience)
            async with send_lock:
                await control.send(json.dumps({"renewToken": {"token": token}}))
            self.stats.renewals += 1

    async def _serve_control(
        self, connection: HybridConnection, control: ClientConnection, send_lock: asyncio.Lock
    ) -> None:
        while True:
            message = json.loads(await control.recv())
            if "request" in message:
                request = message["request"]
                prefix = "/" + quote(connection.path)
                if "method" not in request:
                    # Over 64 kB: the request waits on a rendezvous socket at ``address``.
                    self._spawn(self._request_rendezvous(str(request["address"]), prefix))
                    continue
                body = b""
                if request.get("body"):
                    frame = await control.recv()
                    body = frame if isinstance(frame, bytes) else frame.encode()
                self._spawn(self._answer(request, body, control, send_lock, prefix=prefix))
            elif "accept" in message:
                self._spawn(self._accept(message["accept"]))
            else:
                _LOG.debug("relay listener %s: ignored %s", connection.region, list(message))

    def _spawn(self, coroutine: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._children.add(task)
        task.add_done_callback(self._children.discard)

    async def _call_handler(self, request: RelayRequest) -> RelayResponse:
        self.stats.requests += 1
        try:
            response = await self._handler(request)
        except Exception:
            self.stats.handler_errors += 1
            _LOG.exception("relay handler failed for %s %s", request.method, request.target)
            return RelayResponse(500, {"content-type": "text/plain"}, b"handler failed")
        if response.status in (502, 504):
            # The protocol reserves 502 and 504 for the relay itself (senders read them as
            # "the endpoint is unavailable"); a listener may not send them.
            _LOG.warning(
                "relay handler answered %d, which only the relay may send; sending 500",
                response.status,
            )
            return RelayResponse(500, response.headers, response.body)
        return response

    async def _answer(
        self,
        request: dict[str, Any],
        body: bytes,
        socket: ClientConnection,
        send_lock: asyncio.Lock,
        *,
        prefix: str = "",
        on_control_channel: bool = True,
    ) -> None:
        # The relay's requestTarget starts with the hybrid connection's path; the handler
        # sees the part below it, the same on every endpoint whatever its name.
        target = str(request.get("requestTarget", "/"))
        if prefix and (target == prefix or target.startswith((prefix + "/", prefix + "?"))):
            target = target[len(prefix) :]
        if not target.startswith("/"):
            target = "/" + target
        response = await self._call_handler(
            RelayRequest(
                str(request.get("method", "GET")).upper(),
                target,
                dict(request.get("requestHeaders") or {}),
                body,
            )
        )
        head = _response_head(str(request["id"]), response, bool(response.body))
        if on_control_channel and len(response.body) > _CONTROL_BODY_LIMIT:
            # Responses over 64 kB go on a rendezvous socket opened at the request's address.
            await self._send_on_rendezvous(str(request.get("address", "")), head, response.body)
            return
        with contextlib.suppress(ConnectionClosed):
            async with send_lock:
                await socket.send(head)
                if response.body:
                    await socket.send(response.body)

    async def _open_rendezvous(self, address: str) -> ClientConnection:
        return await websockets.connect(
            address, ssl=self._ssl, proxy=None, compression=None, max_size=None, logger=quiet_logger
        )

    async def _send_on_rendezvous(self, address: str, head: str, body: bytes) -> None:
        try:
            async with await self._open_rendezvous(address) as socket:
                await socket.send(head)
                await socket.send(body)
        except Exception as exc:
            _LOG.info("relay listener: response rendezvous failed (%s)", type(exc).__name__)

    async def _request_rendezvous(self, address: str, prefix: str) -> None:
        """Take a request (over 64 kB) from its rendezvous socket and answer there."""
        try:
            async with await self._open_rendezvous(address) as socket:
                request = json.loads(await socket.recv())["request"]
                body = b""
                if request.get("body"):
                    frame = await socket.recv()
                    body = frame if isinstance(frame, bytes) else frame.encode()
                await self._answer(
                    request, body, socket, asyncio.Lock(), prefix=prefix, on_control_channel=False
                )
        except Exception as exc:
            _LOG.info("relay listener: request rendezvous failed (%s)", type(exc).__name__)

    # -- rendezvous (WebSocket mode) -----------------------------------------------------
    async def _accept(self, accept: dict[str, Any]) -> None:
        try:
            socket = await self._open_rendezvous(str(accept["address"]))
        except Exception as exc:
            _LOG.info("relay listener: rendezvous failed (%s)", type(exc).__name__)
            return
        self.stats.accepts += 1
        send_lock = asyncio.Lock()
        try:
            async with socket:
                while True:
                    head = json.loads(await socket.recv())
                    request = head["request"]
                    body = b""
                    if request.get("body"):
                        frame = await socket.recv()
                        body = frame if isinstance(frame, bytes) else frame.encode()
                    self._spawn(
                        self._answer(request, body, socket, send_lock, on_control_channel=False)
                    )
        except ConnectionClosed:
            return
        except (ValueError, KeyError, TypeError):
            _LOG.info("relay listener: malformed frame on a relayed websocket; closing it")

    # -- lifecycle (AsyncResource: ``async with`` starts, aclose() is idempotent, shielded) --
    async def _open(self) -> None:
        await self.start()

    async def aclose(self) -> None:
        """Stop listening and close every channel (idempotent)."""
        await super().aclose()

    async def _close(self) -> None:
        self._closing = True
        tasks = [*self._tasks, *self._children]
        self._tasks.clear()
        # Bounded: a handler that swallows its cancellation must not hang the close.
        await stop_tasks(tasks, timeout=_STOP_SECONDS)
