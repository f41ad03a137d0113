"""georep: keep Azure Service Bus applications running through a regional outage."""

from __future__ import annotations

from pathlib import Path as _Path

from georep.exceptions import ConfigurationError, EmulatorError, GeoReplicationError

# Installed, georep.adapters lives inside this package (setuptools maps the top-level
# adapters/ folder there). Imported straight from a source checkout (the repository root on
# sys.path, e.g. `python -m pytest`), it is the sibling folder: let the import system find it.
_checkout_root = _Path(__file__).resolve().parent.parent
if (
    not (_Path(__file__).parent / "adapters").is_dir()
    and (_checkout_root / "adapters" / "__init__.py").is_file()
):
    __path__.append(str(_checkout_root))

__all__ = [
    "ConfigurationError",
    "EmulatorError",
    "GeoReplicationError",
    "__version__",
]

__version__ = "0.1.0"
