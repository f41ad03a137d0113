"""A GeoSender over two in-memory regions, for the sender's unit modules (imported as
``from _senders import ...``)."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from georep import ErrorKind, GeoSender, RoleState
from georep.testing import FakeClock, InMemoryOutbox, InMemoryRegionSender


def regions(
    entity: str = "orders",
    *,
    cls: type[InMemoryRegionSender] = InMemoryRegionSender,
    clock: FakeClock | None = None,
) -> tuple[Any, Any]:
    """A primary (east.example) and a secondary (west.example) region of ``entity``."""
    return (
        cls("primary", "east.example", entity, clock=clock),
        cls("secondary", "west.example", entity, clock=clock),
    )


def geo(
    primary: Any, secondary: Any, *, reader: InMemoryMetricReader | None = None, **kwargs: Any
) -> GeoSender:
    """A GeoSender over the two regions, the primary active; its metrics go to ``reader``,
    if given."""
    kwargs.setdefault("role_state", RoleState(primary.namespace))
    if reader is not None:
        kwargs["meter_provider"] = MeterProvider(metric_readers=[reader])
    return GeoSender(primary, secondary, **kwargs)


def queueing(
    outbox: InMemoryOutbox | None = None, **kwargs: Any
) -> tuple[GeoSender, Any, Any, Any]:
    """A sender (as :func:`geo`, with ``kwargs``) over two new :func:`regions` that queues to
    ``outbox`` (a new InMemoryOutbox if not given): ``(sender, outbox, primary, secondary)``."""
    primary, secondary = regions()
    outbox = InMemoryOutbox() if outbox is None else outbox
    return geo(primary, secondary, outbox=outbox, **kwargs), outbox, primary, secondary


def down(*regions: InMemoryRegionSender) -> None:
    """Each of ``regions`` fails every call with a connection error until restored."""
    for region in regions:
        region.fail_with(ErrorKind.CONNECTION)


def up(*regions: InMemoryRegionSender) -> None:
    """Each of ``regions`` answers again."""
    for region in regions:
        region.restore()
