"""Where georep meets the azure-servicebus SDK.

Install with ``pip install 'georep[servicebus]'``.
"""

from __future__ import annotations

try:
    import azure.servicebus  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "georep.adapters.servicebus needs azure-servicebus: pip install 'georep[servicebus]'"
    ) from exc

__all__: list[str] = []
