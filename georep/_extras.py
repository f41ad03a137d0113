"""Optional dependencies: each adapter names the extra that installs what it needs."""

from __future__ import annotations

import importlib.util


def require_extra(adapter: str, extra: str, *modules: str) -> None:
    """Raise a clear ImportError if any of ``modules`` is not installed.

    Args:
        adapter: The adapter package asking, e.g. ``"georep.adapters.redis"``.
        extra: The pip extra that installs the modules, e.g. ``"redis"``.
        modules: Top-level module names to look for.

    Raises:
        ImportError: Naming the missing modules and the ``pip install 'georep[extra]'`` fix.
    """
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(f"{adapter} needs {' and '.join(missing)}: pip install 'georep[{extra}]'")
