"""A relay endpoint and its requests."""

from __future__ import annotations

__all__ = ["RelayEndpoint", "RelayRequest", "RelayResponse"]

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class RelayRequest:
    """One HTTP-style request as a relay listener's handler receives it.

    Attributes:
        method: HTTP method, upper case (``"GET"``, ``"POST"``...).
        target: Path and query below the endpoint, starting with ``/`` (``"/orders?id=7"``).
        headers: Request headers (names as sent).
        body: The request body (empty when there is none).
    """

    method: str
    target: str
    headers: dict[str, str]
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class RelayResponse:
    """A service's answer, as a relay endpoint returns it (any status the service chose).

    Attributes:
        status: HTTP status code. A 4xx/5xx from the service itself is a normal answer:
            only relay-level failures raise.
        headers: Response headers.
        body: Response body.
        region: Label of the endpoint that answered (``"primary"``...); empty when built
            by a handler.
    """

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    region: str = ""


@runtime_checkable
class RelayEndpoint(Protocol):
    """One endpoint of a service reachable through a relay (or plain HTTP).

    ``request`` returns every answer the service gave, whatever its status. A failure that
    says the endpoint is unavailable (connection refused or lost, timeout, relay handshake
    refused, no listener, gateway errors, websocket closed 1001/1008/1011) raises
    :class:`georep.exceptions.RegionError` with an :class:`ErrorKind`; the
    :class:`georep.FailoverChannel` decides by kind whether to try the other endpoint.
    """

    @property
    def region(self) -> str:
        """The endpoint's label in results, errors and telemetry (``"primary"``)."""
        ...

    @property
    def address(self) -> str:
        """Where requests go (no secrets), e.g. ``https://ns.servicebus.windows.net/svc``."""
        ...

    async def request(
        self, method: str, target: str, *, body: bytes, headers: dict[str, str], timeout: float
    ) -> RelayResponse:
        """Send one request and return the service's answer within ``timeout`` seconds."""
        ...

    async def close(self) -> None:
        """Close the connections this endpoint opened (idempotent)."""
        ...
