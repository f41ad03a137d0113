"""The georep application: the ``georep`` command line and what its commands run.

It sits above the library: it composes the core (``georep``) with the adapters
(``georep.adapters``: the emulator, Redis, Spark), which the core itself never imports.

- ``_app``: the typer commands (``georep emulator|fault|demo|syphon|cost|doctor|bench|soak|
  audit|outbox``) and :func:`main`, the console entry point.
- ``_scenario``: one replication run end to end on the emulator (demo and bench share it).
- ``_demo``: ``georep demo``'s live view; ``_bench``: ``georep bench``'s scenarios.
- ``_cost``: ``georep cost``'s model of billed operations.
- ``_soak`` and ``soak/``: ``georep soak``, the randomized fault soak (docs/soak.md).

Install with ``pip install 'georep[cli]'``. Without that extra, the ``georep`` command
prints that line and exits 2 (no traceback).
"""

from __future__ import annotations

__all__ = ["app", "main"]

import importlib
import sys
from typing import TYPE_CHECKING, Any, NoReturn

#: What ``georep`` prints when the extra is missing.
EXTRA_HINT = "georep's command line needs its extra: pip install 'georep[cli]'"
#: The modules the extra installs.
_EXTRA_MODULES = ("typer", "rich")


def _extra_missing() -> bool:
    """True when a module of the extra cannot be imported (absent, or broken)."""
    for name in _EXTRA_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            return True
    return False


if TYPE_CHECKING:
    from georep.cli._app import app, main
else:
    try:
        from georep.cli._app import app, main
    except ImportError as _error:
        if not _extra_missing():
            raise  # another import failed: not the extra's fault, so no hint hiding it
        _missing_extra = _error

        def main() -> NoReturn:
            """The console entry point without the extra: one line on stderr, exit 2."""
            print(EXTRA_HINT, file=sys.stderr)
            raise SystemExit(2)

        def __getattr__(name: str) -> Any:
            if name == "app":
                raise ImportError(EXTRA_HINT) from _missing_extra
            raise AttributeError(f"module 'georep.cli' has no attribute {name!r}")
