"""An in-memory relay endpoint, for unit tests of :class:`georep.FailoverChannel`."""

from __future__ import annotations

__all__ = ["InMemoryRelayEndpoint"]

import asyncio
from collections.abc import Awaitable, Callable

from georep.exceptions import region_error
from georep.ports import ErrorKind, RelayRequest, RelayResponse
from georep.relay.endpoint import RelayEndpointBase
from georep.testing._faults import FaultSwitch

RelayHandler = Callable[[RelayRequest], Awaitable[RelayResponse]]


async def _echo(request: RelayRequest) -> RelayResponse:
    return RelayResponse(200, {}, request.body)


class InMemoryRelayEndpoint(FaultSwitch, RelayEndpointBase):
    """A relay endpoint served by ``handler`` in-process; it can fail or hang on demand.

    Args:
        region: The endpoint's label.
        handler: Answers each request (default: echo the body with 200).
        address: Its address (default ``memory://{region}``).
    """

    def __init__(
        self, region: str, handler: RelayHandler | None = None, *, address: str | None = None
    ) -> None:
        FaultSwitch.__init__(self, region)
        RelayEndpointBase.__init__(self, region, address or f"memory://{region}")
        self._handler = handler or _echo
        self.requests: list[RelayRequest] = []
        self.attempts = 0
        self.closed = False

    async def _exchange(
        self, method: str, target: str, body: bytes, headers: dict[str, str]
    ) -> RelayResponse:
        self.attempts += 1
        # One scheduling point, so concurrent requests really interleave.
        await asyncio.sleep(0)
        await self._injected_fault()
        request = RelayRequest(method, target, dict(headers), body)
        self.requests.append(request)
        response = await self._handler(request)
        return RelayResponse(response.status, response.headers, response.body, self._region)

    def _translate(self, exc: Exception) -> Exception | None:
        # As the real endpoints: no answer within the deadline is a TIMEOUT region error.
        if isinstance(exc, TimeoutError):
            return region_error(
                f"{self._region}: no answer in time", region=self._region, kind=ErrorKind.TIMEOUT
            )
        return None

    async def close(self) -> None:
        self.closed = True
