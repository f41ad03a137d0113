"""What georep's SDK-backed region ports share: identity, error translation, ownership."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ._errors import translate_error

_T = TypeVar("_T")


class SdkRegion:
    """One region's SDK object behind a georep port.

    Args:
        sdk: The SDK sender or receiver. Closed by :meth:`close` only if ``client`` is given
            (georep created both); a caller's object is never closed.
        region: The region's label.
        namespace: The namespace host the SDK object talks to.
        entity: The entity path.
        client: The client georep created for ``sdk``, closed with it.
    """

    def __init__(
        self, sdk: Any, *, region: str, namespace: str, entity: str, client: Any | None
    ) -> None:
        self._sdk = sdk
        self._client = client
        self._region = region
        self._namespace = namespace
        self._entity = entity

    @property
    def region(self) -> str:
        return self._region

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def entity(self) -> str:
        return self._entity

    def _translate(self, exc: Exception) -> Exception:
        return translate_error(exc, region=self._region, namespace=self._namespace) or exc

    async def _call(self, operation: Callable[[], Awaitable[_T]]) -> _T:
        """Run one SDK call, its errors translated to georep's (the SDK's kept as cause)."""
        try:
            return await operation()
        except Exception as exc:
            raise self._translate(exc) from exc

    async def close(self) -> None:
        if self._client is None:
            return
        try:
            await self._sdk.close()
        finally:
            await self._client.close()
