"""What georep's SDK-backed region ports share: identity, error translation, ownership."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from georep._region_identity import RegionLabels
from georep.exceptions import GeoReplicationError

from ._errors import translate_error

_T = TypeVar("_T")
_UNBLOCKED = "_georep_close_unblocked"


def close_without_keep_alive_wait(sdk: Any) -> Any:
    """Let ``sdk`` (an SDK sender or receiver, sync or async) close its AMQP handler without
    waiting for the handler's keep-alive loop; return ``sdk``.

    The SDK's AMQP client keeps the connection alive from a loop that sleeps in one-second
    steps, and closing the handler waits for that loop to notice (it awaits the task, or
    joins the thread). The SDK closes its handler after every connection error, before it
    retries: so a region that dropped an open connection cost up to a second (0.54 s on
    average) before the error reached georep and it could fail over. The loop ends by itself
    at its next wake-up (it stops once the handler is shut down), so close need not wait:
    this forgets the loop just before the SDK closes the handler. Nothing else changes, and
    an SDK without these private names is left as it is.
    """
    close_handler = getattr(sdk, "_close_handler", None)
    if close_handler is None or getattr(close_handler, _UNBLOCKED, False):
        return sdk

    def forget_keep_alive() -> None:
        handler = getattr(sdk, "_handler", None)
        if getattr(handler, "_keep_alive_thread", None) is not None:
            handler._keep_alive_thread = None  # type: ignore[union-attr]

    if inspect.iscoroutinefunction(close_handler):

        async def unblocked() -> None:
            forget_keep_alive()
            await close_handler()

        replacement: Callable[[], Any] = unblocked
    else:

        def unblocked_sync() -> None:
            forget_keep_alive()
            close_handler()

        replacement = unblocked_sync
    setattr(replacement, _UNBLOCKED, True)
    sdk._close_handler = replacement
    return sdk


class SdkRegion(RegionLabels):
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
        super().__init__(region, namespace, entity)
        self._sdk = close_without_keep_alive_wait(sdk)
        self._client = client

    def _translate(self, exc: Exception) -> Exception:
        return translate_error(exc, region=self._region, namespace=self._namespace) or exc

    async def _call(self, operation: Callable[[], Awaitable[_T]]) -> _T:
        """Run one SDK call, its errors translated to georep's (the SDK's kept as cause)."""
        try:
            return await operation()
        except GeoReplicationError:
            raise  # georep's own error (a closed adapter, a lost lock): as it is
        except Exception as exc:
            raise self._translate(exc) from exc

    async def close(self) -> None:
        if self._client is None:
            return
        try:
            await self._sdk.close()
        finally:
            await self._client.close()
