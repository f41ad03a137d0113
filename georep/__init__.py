"""georep: keep Azure Service Bus applications running through a regional outage."""

from __future__ import annotations

from georep.exceptions import ConfigurationError, EmulatorError, GeoReplicationError

__all__ = [
    "ConfigurationError",
    "EmulatorError",
    "GeoReplicationError",
    "__version__",
]

__version__ = "0.1.0"
