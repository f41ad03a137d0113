"""Failures on demand, shared by the fakes of a region (sender, relay endpoint)."""

from __future__ import annotations

__all__ = ["FaultSwitch"]

import asyncio

from georep._region_identity import RegionLabel
from georep.exceptions import region_error
from georep.ports import ErrorKind


class FaultSwitch(RegionLabel):
    """``fail_with``, ``hang`` and ``restore`` for a fake that stands for one region.

    The fake calls :meth:`_injected_fault` where the real one would reach the service.
    Errors are the class the one classification table gives the kind, as the adapters
    raise them.
    """

    def __init__(self, region: str) -> None:
        # Not super(): a fake's next base may be RegionLabels, which takes more.
        RegionLabel.__init__(self, region)
        self._failure: ErrorKind | None = None
        self._failures_left: int | None = None
        self._hanging = False

    def fail_with(self, kind: ErrorKind | str, *, times: int | None = None) -> None:
        """Fail every call (or the next ``times``) with an error of ``kind``."""
        self._failure = ErrorKind(kind)
        self._failures_left = times
        self._hanging = False

    def hang(self) -> None:
        """Never answer (like a blackholed namespace) until :meth:`restore`."""
        self._hanging = True
        self._failure = None

    def restore(self) -> None:
        """Answer normally again."""
        self._failure = None
        self._hanging = False

    async def _injected_fault(self) -> None:
        """Hang (until the caller's deadline cancels the call) or raise, as switched."""
        if self._hanging:
            await asyncio.Event().wait()
        kind = self._failure
        if kind is None:
            return
        if self._failures_left is not None:
            self._failures_left -= 1
            if self._failures_left <= 0:
                self._failure = None
        raise region_error(f"{self._region}: injected {kind.value}", region=self._region, kind=kind)
