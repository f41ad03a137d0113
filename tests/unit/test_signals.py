"""stop_on_signals: a command's loop stops on SIGINT/SIGTERM, even where the process was told
to ignore them, and every handler is as it was once the block ends (the loop's own removal
would leave SIGINT on default_int_handler and SIGTERM on SIG_DFL)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from georep._signals import stop_on_signals


@pytest.fixture
def handlers() -> Iterator[None]:
    """Put SIGINT's and SIGTERM's handlers back after the test, whatever it did."""
    found = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, found[0])
        signal.signal(signal.SIGTERM, found[1])


def _mine(signum: int, frame: Any) -> None:
    raise AssertionError("the block's handler should have had the signal")


def _stopped_by(sig: int) -> bool:
    """Whether ``sig``, sent to this process inside the block, set the block's stop."""

    async def scenario() -> bool:
        stop = asyncio.Event()
        with stop_on_signals(stop):
            os.kill(os.getpid(), sig)
            await asyncio.wait_for(stop.wait(), 10)
        return stop.is_set()

    return asyncio.run(scenario())


@pytest.mark.usefixtures("handlers")
def test_a_signal_sets_stop_and_the_handlers_found_are_back_after() -> None:
    signal.signal(signal.SIGINT, _mine)
    signal.signal(signal.SIGTERM, _mine)

    assert _stopped_by(signal.SIGTERM)
    assert signal.getsignal(signal.SIGINT) is _mine
    assert signal.getsignal(signal.SIGTERM) is _mine


@pytest.mark.usefixtures("handlers")
def test_an_ignored_signal_stops_the_block_and_is_ignored_again_after_it() -> None:
    """A command started with nohup still stops on ``kill -INT``; after it, the process
    ignores SIGINT again (asyncio alone leaves default_int_handler)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)

    assert _stopped_by(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
