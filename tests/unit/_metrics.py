"""Reading metrics back from the OpenTelemetry SDK's in-memory reader, for unit tests
(imported as ``from _metrics import ...``)."""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry.sdk.metrics.export import InMemoryMetricReader


def metric_points(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, object], float]]]:
    """Every data point, by metric name: (attributes, value; a histogram's count)."""
    data = reader.get_metrics_data()
    points: dict[str, list[tuple[dict[str, object], float]]] = {}
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = getattr(point, "value", None)
                    if value is None:
                        value = point.count  # type: ignore[union-attr]
                    points.setdefault(metric.name, []).append((dict(point.attributes or {}), value))
    return points


def metric_sums(reader: InMemoryMetricReader, names: Iterable[str]) -> dict[str, float]:
    """The sum over all points of each of ``names`` that was recorded (absent ones left out)."""
    points = metric_points(reader)
    return {name: sum(value for _, value in points[name]) for name in names if name in points}
