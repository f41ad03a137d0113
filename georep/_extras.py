"""Optional dependencies: each adapter names the extra that installs what it needs, and
packages import their public names on first use."""

from __future__ import annotations

import importlib.util
from collections.abc import MutableMapping
from typing import Any


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


def import_on_first_use(namespace: MutableMapping[str, Any], module: str, name: str) -> Any:
    """``name`` from ``module``, kept in ``namespace`` so that the next lookup finds it: what
    a package's module-level ``__getattr__`` returns for a public name it does not import
    at start-up (``georep``, ``georep.adapters.emulator``, ``georep.adapters.spark``).

    Args:
        namespace: The package's ``globals()``.
        module: The module that defines ``name``; relative (``"._audit"``) to the package.
        name: The attribute asked for.
    """
    value = getattr(importlib.import_module(module, namespace["__name__"]), name)
    namespace[name] = value
    return value
