"""Relay and HTTP failures translated into georep errors, in one place."""

from __future__ import annotations

__all__ = [
    "GATEWAY_STATUSES",
    "closed_error",
    "http_status_kind",
    "is_relay_refusal",
    "translate",
    "unavailable",
]

import asyncio
import ssl
from collections.abc import Mapping

import aiohttp
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from georep.exceptions import RegionError, region_error
from georep.ports import ErrorKind

#: Gateway answers: the relay (or a proxy) could not reach the service.
GATEWAY_STATUSES = frozenset({502, 503, 504})

# Close codes that mean "this endpoint is unavailable" (SPEC §2.5): going away (the relay
# or listener shut down), policy violation (token expired or revoked), internal error.
_CLOSE_KINDS = {
    1001: ErrorKind.CONNECTION,
    1008: ErrorKind.AUTHENTICATION,
    1011: ErrorKind.SERVICE_ERROR,
}


def http_status_kind(status: int) -> ErrorKind:
    """The error kind of a status the relay itself answered (handshake or gateway)."""
    if status in (401, 403):
        return ErrorKind.AUTHENTICATION
    if status == 404:
        return ErrorKind.ENTITY_NOT_FOUND
    if status == 429:
        return ErrorKind.SERVER_BUSY
    if status >= 500:
        return ErrorKind.SERVICE_ERROR
    return ErrorKind.UNKNOWN


def is_relay_refusal(status: int, headers: Mapping[str, str]) -> bool:
    """True when an HTTP-mode error answer comes from the relay, not from the listener.

    The relay adds a ``Via`` header to every answer it forwards from a listener, so an
    answer without one is the relay's own (documented in the Hybrid Connections protocol):
    401/403 (token refused), 404 (no such hybrid connection), 500, 503 (no listener).
    """
    return status >= 400 and "via" not in {name.lower() for name in headers}


def unavailable(region: str, kind: ErrorKind, message: str) -> RegionError:
    return region_error(f"{region}: {message}", region=region, kind=kind)


def closed_error(region: str, exc: ConnectionClosed) -> RegionError:
    """A relayed websocket that closed under a request."""
    close = exc.rcvd or exc.sent
    code = close.code if close is not None else 1006
    reason = close.reason if close is not None else ""
    kind = _CLOSE_KINDS.get(code, ErrorKind.CONNECTION)
    detail = f" ({reason})" if reason else ""
    return unavailable(region, kind, f"the websocket closed with code {code}{detail}")


def translate(region: str, exc: BaseException) -> RegionError:
    """Any client failure as a georep error (never a raw websockets/aiohttp exception).

    Messages are built here, never from the exception text, which may hold the URL and
    with it the token.
    """
    if isinstance(exc, RegionError):
        return exc
    if isinstance(exc, InvalidStatus):
        status = exc.response.status_code
        reason = exc.response.reason_phrase
        return unavailable(
            region, http_status_kind(status), f"the relay refused the handshake: {status} {reason}"
        )
    if isinstance(exc, ConnectionClosed):
        return closed_error(region, exc)
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return unavailable(region, ErrorKind.TIMEOUT, "no answer in time")
    if isinstance(exc, ssl.SSLError | aiohttp.ClientSSLError):
        return unavailable(region, ErrorKind.CONNECTION, f"TLS failed ({type(exc).__name__})")
    if isinstance(exc, InvalidHandshake):
        return unavailable(region, ErrorKind.CONNECTION, f"bad handshake ({type(exc).__name__})")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return unavailable(region, ErrorKind.CONNECTION, f"cannot connect ({exc.os_error})")
    if isinstance(exc, OSError | aiohttp.ClientError):
        return unavailable(
            region, ErrorKind.CONNECTION, f"connection failed ({type(exc).__name__})"
        )
    return RegionError(
        f"{region}: unexpected {type(exc).__name__}", region=region, kind=ErrorKind.UNKNOWN
    )
