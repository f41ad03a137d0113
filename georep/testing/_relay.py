"""An in-memory relay endpoint, for unit tests of :class:`georep.FailoverChannel`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from georep._classify import region_error
from georep.ports import ErrorKind, RelayRequest, RelayResponse

__all__ = ["InMemoryRelayEndpoint"]

RelayHandler = Callable[[RelayRequest], Awaitable[RelayResponse]]


async def _echo(request: RelayRequest) -> RelayResponse:
    return RelayResponse(200, {}, request.body)


class InMemoryRelayEndpoint:
    """A relay endpoint served by ``handler`` in-process; it can fail or hang on demand.

    Args:
        region: The endpoint's label.
        handler: Answers each request (default: echo the body with 200).
        address: Its address (default ``memory://{region}``).
    """

    def __init__(
        self, region: str, handler: RelayHandler | None = None, *, address: str | None = None
    ) -> None:
        self._region = region
        self._address = address or f"memory://{region}"
        self._handler = handler or _echo
        self._failure: ErrorKind | None = None
        self._hang = False
        self.requests: list[RelayRequest] = []
        self.attempts = 0
        self.closed = False

    @property
    def region(self) -> str:
        return self._region

    @property
    def address(self) -> str:
        return self._address

    def fail_with(self, kind: ErrorKind | str) -> None:
        """Fail every request with ``kind`` until :meth:`restore`."""
        self._failure = ErrorKind(kind)

    def hang(self) -> None:
        """Never answer (until the caller's deadline) until :meth:`restore`."""
        self._hang = True

    def restore(self) -> None:
        """Answer normally again."""
        self._failure = None
        self._hang = False

    async def request(
        self,
        method: str,
        target: str,
        *,
        body: bytes,
        headers: dict[str, str],
        timeout: float,
    ) -> RelayResponse:
        self.attempts += 1
        # As the real endpoints: no answer within ``timeout`` is a TIMEOUT region error.
        try:
            async with asyncio.timeout(timeout):
                return await self._answer(method, target, body, headers)
        except TimeoutError:
            raise region_error(
                f"{self._region}: no answer within {timeout} s",
                region=self._region,
                kind=ErrorKind.TIMEOUT,
            ) from None

    async def _answer(
        self, method: str, target: str, body: bytes, headers: dict[str, str]
    ) -> RelayResponse:
        # One scheduling point, so concurrent requests really interleave.
        await asyncio.sleep(0)
        if self._hang:
            await asyncio.Event().wait()
        if self._failure is not None:
            # The class the one classification table gives the kind, as the adapters raise.
            raise region_error(
                f"{self._region} failed ({self._failure})", region=self._region, kind=self._failure
            )
        request = RelayRequest(method, target, dict(headers), body)
        self.requests.append(request)
        response = await self._handler(request)
        return RelayResponse(response.status, response.headers, response.body, self._region)

    async def close(self) -> None:
        self.closed = True
