"""Senders: a hybrid connection in HTTP or WebSocket mode, and a plain HTTP(S) service.

Each implements :class:`georep.ports.RelayEndpoint`: it returns every answer of the
service, whatever its status, and raises :class:`georep.exceptions.RegionError` only for a
relay-level failure.
"""

from __future__ import annotations

__all__ = ["HybridConnectionEndpoint", "PlainHttpEndpoint", "RelayMode", "quiet_logger"]

import asyncio
import enum
import json
import logging
import ssl
import uuid
from typing import Any

import aiohttp
import websockets
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from georep._lifecycle import stop_task
from georep.exceptions import ClosedError, ConfigurationError, RegionError
from georep.ports import ErrorKind, RelayResponse
from georep.relay.endpoint import RelayEndpointBase

from ._errors import (
    GATEWAY_STATUSES,
    closed_error,
    http_status_kind,
    is_relay_refusal,
    translate,
    unavailable,
)
from ._sas import HybridConnection, SasTokenProvider

# Handshake lines logged by websockets at DEBUG level hold the URL, and with it the token:
# this logger belongs to no hierarchy and drops everything below ERROR.
quiet_logger = logging.Logger("georep.relay.wire", level=logging.ERROR)

# Headers the relay or aiohttp set per hop; never copied into a RelayResponse or request.
_HOP_HEADERS = frozenset(
    {"connection", "transfer-encoding", "content-length", "keep-alive", "upgrade", "host"}
)


# What the relay means by its own answers (Hybrid Connections protocol, HTTP requests).
_RELAY_REASONS = {
    401: "(token missing, malformed or expired)",
    403: "(token not valid for this path)",
    404: "(no such hybrid connection)",
    500: "(relay error)",
    502: "(bad gateway)",
    503: "(no listener could take the request)",
    504: "(the listener did not answer in time)",
}


class RelayMode(enum.StrEnum):
    """How a :class:`HybridConnectionEndpoint` reaches the listener."""

    HTTP = "http"
    """One HTTPS request per call to ``https://{ns}/{path}``, SAS in the
    ``ServiceBusAuthorization`` header; the relay hands it to the listener as a
    ``request`` frame. Simple, and no connection to keep."""
    WEBSOCKET = "websocket"
    """One relayed websocket (``sb-hc-action=connect``) kept open and shared by every call;
    requests and responses travel on it as JSON head frames plus a binary body frame,
    matched by id (georep's framing, the same shape as the relay's HTTP frames)."""


def _client_ssl(ssl_context: ssl.SSLContext | None) -> ssl.SSLContext:
    return ssl_context if ssl_context is not None else ssl.create_default_context()


def _clean(headers: Any) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _HOP_HEADERS}


class _HttpSession:
    """An aiohttp session opened on first use (the endpoint may live in any event loop)."""

    def __init__(self, ssl_context: ssl.SSLContext | None) -> None:
        self._ssl = ssl_context
        self._session: aiohttp.ClientSession | None = None
        self.closed = False

    def get(self) -> aiohttp.ClientSession:
        if self.closed:
            raise ClosedError("this endpoint is closed; create a new one")
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=_client_ssl(self._ssl), limit=100)
            # Proxies from the environment would see the relay's traffic: not by default.
            self._session = aiohttp.ClientSession(connector=connector, trust_env=False)
        return self._session

    async def close(self) -> None:
        self.closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None


class _Endpoint(RelayEndpointBase):
    """What both endpoints share: the one translation of a client failure."""

    def _translate(self, exc: Exception) -> Exception:
        return translate(self.region, exc)


class HybridConnectionEndpoint(_Endpoint):
    """A sender to one Azure Relay hybrid connection.

    Args:
        connection: The hybrid connection and its key (:class:`HybridConnection`).
        mode: :attr:`RelayMode.HTTP` (default) or :attr:`RelayMode.WEBSOCKET`.
        ssl_context: TLS settings; default the system's trust store. For the emulator:
            ``ssl.create_default_context(cafile=emulator.ca_file)``.
        token_ttl: Lifetime of the SAS tokens it mints, in seconds (renewed before they
            expire). Default 3600.
        open_timeout: Seconds to open the relayed websocket (WebSocket mode). Default 10.
    """

    def __init__(
        self,
        connection: HybridConnection,
        *,
        mode: RelayMode | str = RelayMode.HTTP,
        ssl_context: ssl.SSLContext | None = None,
        token_ttl: float = 3600.0,
        open_timeout: float = 10.0,
    ) -> None:
        try:
            self.mode = RelayMode(mode)
        except ValueError:
            raise ConfigurationError(
                f"mode {mode!r} is unknown: use 'http' or 'websocket'"
            ) from None
        super().__init__(connection.region, f"{connection.namespace}/{connection.path}")
        self._connection = connection
        self._tokens = SasTokenProvider(connection.key_name, connection.key, ttl=token_ttl)
        self._ssl = ssl_context
        self._open_timeout = open_timeout
        self._http = _HttpSession(ssl_context)
        self._socket: ClientConnection | None = None
        self._reader: asyncio.Task[None] | None = None
        self._open_lock = asyncio.Lock()
        self._send_lock = asyncio.Lock()
        self._pending: dict[str, asyncio.Future[RelayResponse]] = {}

    def __repr__(self) -> str:
        return f"HybridConnectionEndpoint({self.address!r}, mode={self.mode.value!r})"

    async def _exchange(
        self, method: str, target: str, body: bytes, headers: dict[str, str]
    ) -> RelayResponse:
        if self.mode is RelayMode.HTTP:
            return await self._http_request(method, target, body, headers)
        return await self._websocket_request(method, target, body, headers)

    # -- HTTP mode -----------------------------------------------------------------------
    async def _http_request(
        self, method: str, target: str, body: bytes, headers: dict[str, str]
    ) -> RelayResponse:
        token, _ = self._tokens.token(self._connection.audience)
        url = self._connection.https_url + target
        send_headers = {**_clean(headers), "ServiceBusAuthorization": token}
        async with self._http.get().request(
            method, url, data=body or None, headers=send_headers, allow_redirects=False
        ) as response:
            payload = await response.read()
            status = response.status
            if status in GATEWAY_STATUSES or is_relay_refusal(status, response.headers):
                raise unavailable(
                    self.region,
                    http_status_kind(status),
                    f"the relay answered {status} {_RELAY_REASONS.get(status, response.reason)}",
                )
            return RelayResponse(status, _clean(response.headers), payload, self.region)

    # -- WebSocket mode ------------------------------------------------------------------
    async def _open(self) -> ClientConnection:
        async with self._open_lock:
            if self._http.closed:
                raise ClosedError("this endpoint is closed; create a new one")
            if self._socket is not None:
                return self._socket
            token, _ = self._tokens.token(self._connection.audience)
            url = self._connection.websocket_url(
                "connect", **{"sb-hc-id": uuid.uuid4().hex, "sb-hc-token": token}
            )
            socket = await websockets.connect(
                url,
                ssl=_client_ssl(self._ssl),
                proxy=None,
                compression=None,
                open_timeout=self._open_timeout,
                max_size=None,
                logger=quiet_logger,
            )
            self._socket = socket
            self._reader = asyncio.create_task(self._read(socket), name=f"relay-{self.region}")
            return socket

    async def _read(self, socket: ClientConnection) -> None:
        failure: RegionError
        try:
            while True:
                head = json.loads(await socket.recv())
                response = head["response"]
                payload = await socket.recv() if response.get("body") else b""
                future = self._pending.pop(str(response.get("requestId")), None)
                if future is not None and not future.done():
                    future.set_result(
                        RelayResponse(
                            int(response["statusCode"]),
                            dict(response.get("responseHeaders") or {}),
                            payload if isinstance(payload, bytes) else payload.encode(),
                            self.region,
                        )
                    )
        except ConnectionClosed as exc:
            failure = closed_error(self.region, exc)
        except (ValueError, KeyError, TypeError):
            failure = unavailable(self.region, ErrorKind.SERVICE_ERROR, "malformed response frame")
            await socket.close(1002)
        if self._socket is socket:
            self._socket = None
        for future in self._pending.values():
            if not future.done():
                future.set_exception(failure)
        self._pending.clear()

    async def _websocket_request(
        self, method: str, target: str, body: bytes, headers: dict[str, str]
    ) -> RelayResponse:
        socket = await self._open()
        request_id = uuid.uuid4().hex
        future: asyncio.Future[RelayResponse] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        head = {
            "request": {
                "id": request_id,
                "method": method,
                "requestTarget": target,
                "requestHeaders": _clean(headers),
                "body": bool(body),
            }
        }
        try:
            # A head frame and its body frame must not interleave with another request's.
            async with self._send_lock:
                await socket.send(json.dumps(head))
                if body:
                    await socket.send(body)
            return await future
        finally:
            self._pending.pop(request_id, None)
            # When sending failed, the reader may have failed this future too: mark it
            # seen (the caller gets the send's error), or asyncio reports it as lost.
            if not future.done():
                future.cancel()
            elif not future.cancelled():
                future.exception()

    async def close(self) -> None:
        """Close the HTTP session and the relayed websocket (idempotent)."""
        await self._http.close()
        socket, reader = self._socket, self._reader
        self._socket = self._reader = None
        if socket is not None:
            await socket.close()
        if reader is not None:
            await stop_task(reader)


class PlainHttpEndpoint(_Endpoint):
    """A service reached over plain HTTP(S), for services not on Azure Relay.

    Gateway answers (502/503/504), connection failures and timeouts mean unavailable;
    every other answer is the service's and is returned.

    Args:
        base_url: The service's base URL (``https://orders-east.contoso.com/api``).
        region: The endpoint's label.
        ssl_context: TLS settings for ``https`` (default: the system's trust store).
        headers: Headers sent with every request (e.g. an API key; never logged).
    """

    def __init__(
        self,
        base_url: str,
        *,
        region: str,
        ssl_context: ssl.SSLContext | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ConfigurationError(f"base_url {base_url!r} must start with http:// or https://")
        super().__init__(region, base_url.rstrip("/"))
        self._headers = dict(headers or {})
        self._http = _HttpSession(ssl_context)

    def __repr__(self) -> str:
        return f"PlainHttpEndpoint({self.address!r}, region={self.region!r})"

    async def _exchange(
        self, method: str, target: str, body: bytes, headers: dict[str, str]
    ) -> RelayResponse:
        async with self._http.get().request(
            method,
            self.address + target,
            data=body or None,
            headers={**self._headers, **_clean(headers)},
            allow_redirects=False,
        ) as response:
            payload = await response.read()
        if response.status in GATEWAY_STATUSES:
            raise unavailable(
                self.region, ErrorKind.SERVICE_ERROR, f"the service answered {response.status}"
            )
        return RelayResponse(response.status, _clean(response.headers), payload, self.region)

    async def close(self) -> None:
        """Close the HTTP session (idempotent)."""
        await self._http.close()
