"""The georep application: the ``georep`` command line and what its commands run.

It sits above the library: it composes the core (``georep``) with the adapters
(``georep.adapters``: the emulator, Redis, Spark), which the core itself never imports.

- ``_app``: the typer commands (``georep emulator|fault|demo|syphon|cost|doctor|bench|audit|
  outbox``) and :func:`main`, the console entry point.
- ``_scenario``: one replication run end to end on the emulator (demo and bench share it).
- ``_demo``: ``georep demo``'s live view; ``_bench``: ``georep bench``'s scenarios.
- ``_cost``: ``georep cost``'s model of billed operations.

Install with ``pip install 'georep[cli]'``.
"""

from __future__ import annotations

from georep.cli._app import app, main

__all__ = ["app", "main"]
