"""What every relay endpoint does the same way: its labels, and a request within its deadline.

:class:`georep.ports.RelayEndpoint` is the contract. The endpoints of
``georep.adapters.relay`` and the test kit's :class:`georep.testing.InMemoryRelayEndpoint`
inherit :meth:`RelayEndpointBase.request` and write only their own exchange and how their
failures read as :class:`georep.exceptions.RegionError`.
"""

from __future__ import annotations

__all__ = ["RelayEndpointBase"]

import asyncio

from georep._region_identity import RegionLabel
from georep.exceptions import ClosedError
from georep.ports import RelayResponse


class RelayEndpointBase(RegionLabel):
    """A :class:`georep.ports.RelayEndpoint` but for :meth:`_exchange` and :meth:`_translate`.

    Args:
        region: The endpoint's label.
        address: Where requests go (no secrets).
    """

    def __init__(self, region: str, address: str) -> None:
        super().__init__(region)
        self._address = address

    @property
    def address(self) -> str:
        return self._address

    async def request(
        self, method: str, target: str, *, body: bytes, headers: dict[str, str], timeout: float
    ) -> RelayResponse:
        """As :meth:`georep.ports.RelayEndpoint.request`: a closed endpoint raises
        :class:`~georep.exceptions.ClosedError`, any other failure (no answer within
        ``timeout`` included) what :meth:`_translate` makes of it."""
        try:
            async with asyncio.timeout(timeout):
                return await self._exchange(method, target, body, headers)
        except ClosedError:
            raise
        except Exception as exc:
            failure = self._translate(exc)
            if failure is None:
                raise
            raise failure from None

    async def _exchange(
        self, method: str, target: str, body: bytes, headers: dict[str, str]
    ) -> RelayResponse:
        """Send one request and return the service's answer (the caller bounds the time)."""
        raise NotImplementedError

    def _translate(self, exc: Exception) -> Exception | None:
        """The error ``exc`` is raised as (never with the original as cause: its text may
        hold a URL and a token); None raises ``exc`` itself."""
        raise NotImplementedError
