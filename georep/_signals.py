"""Stop a command's event loop on SIGINT/SIGTERM, and leave the process's handlers as found.

Removing a handler that ``loop.add_signal_handler`` set (or closing the loop, which removes
them all) sets SIGINT to ``default_int_handler`` and the others to ``SIG_DFL``, whatever they
were before: a process started with SIGINT ignored (``nohup``, a script's background job)
then raised KeyboardInterrupt at the next one. :func:`stop_on_signals` puts back the
handlers it found. While the block runs the signals stop the command even where they were
ignored: ``kill -INT`` and Ctrl-C stop ``georep syphon`` and ``georep emulator`` however
they were started, as they always did.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator


@contextlib.contextmanager
def stop_on_signals(
    stop: asyncio.Event, signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)
) -> Iterator[None]:
    """Set ``stop`` on each of ``signals`` while the block runs, on the running loop; then
    restore the handlers that were there before."""
    loop = asyncio.get_running_loop()
    found = {sig: signal.getsignal(sig) for sig in signals}
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    try:
        yield
    finally:
        for sig, previous in found.items():
            loop.remove_signal_handler(sig)
            if previous is not None:  # None: set outside Python, left as the loop left it
                signal.signal(sig, previous)
