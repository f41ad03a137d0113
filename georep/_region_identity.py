"""The labels a region object answers to, written once for every implementation.

:class:`georep.ports.RegionIdentity` declares them (``region``, ``namespace``, ``entity``)
and documents them; the adapters and the test kit's fakes inherit them from here as
read-only properties. A relay endpoint has only a region: :class:`RegionLabel`.
"""

from __future__ import annotations

__all__ = ["RegionLabel", "RegionLabels"]


class RegionLabel:
    """A read-only ``region``: the label in georep's results, errors and telemetry."""

    def __init__(self, region: str) -> None:
        self._region = region

    @property
    def region(self) -> str:
        return self._region


class RegionLabels(RegionLabel):
    """Read-only ``region``, ``namespace`` and ``entity`` (:class:`georep.ports.RegionIdentity`)."""

    def __init__(self, region: str, namespace: str, entity: str) -> None:
        super().__init__(region)
        self._namespace = namespace
        self._entity = entity

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def entity(self) -> str:
        return self._entity
