"""Stop a command's event loop on SIGINT/SIGTERM, and leave the process's handlers as found.

``loop.add_signal_handler`` overrides a signal the process was told to ignore (a job started
with ``nohup`` or in the background of a script ignores SIGINT), and removing it, or closing
the loop, sets SIGINT to ``default_int_handler`` and the others to ``SIG_DFL`` whatever they
were before. :func:`stop_on_signals` keeps an ignored signal ignored and puts every handler
back when its block ends.
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
    """Set ``stop`` on each of ``signals`` (those not ignored) while the block runs, on the
    running loop; then restore the handlers that were there before."""
    loop = asyncio.get_running_loop()
    found = {sig: signal.getsignal(sig) for sig in signals}
    handled = [sig for sig, handler in found.items() if handler is not signal.SIG_IGN]
    for sig in handled:
        loop.add_signal_handler(sig, stop.set)
    try:
        yield
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
            previous = found[sig]
            if previous is not None:  # None: set outside Python, left as the loop left it
                signal.signal(sig, previous)
