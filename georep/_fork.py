"""georep objects in a process forked from the one that made them (issue 31).

gunicorn ``--preload``, Celery's prefork pool and multiprocessing's ``fork`` start method
copy a parent that may already hold georep objects. In the child their connections'
sockets are the parent's too, and the threads they rely on (``georep.sync``'s loop thread,
a sync SDK sender's worker, an outbox's) do not exist: a call waits for ever. georep counts
the forks (``os.register_at_fork``) and every object remembers the count it was made at,
so a use in a child is one integer comparison away from being noticed:

- every async object (:class:`georep._lifecycle.AsyncResource`) raises
  :class:`ForkedProcessError` at once when used in a child; ``aclose()`` there only marks
  it closed (closing would close the parent's connections);
- a ``georep.sync`` sender that owns its clients (``from_connection_strings``, given no
  outbox, ledger or role store) reopens in the child on first use, with its own loop
  thread and connections; every other ``georep.sync`` object raises.
"""

from __future__ import annotations

__all__ = ["abandon", "fork_count", "forked_error", "reopen_lock"]

import os
import threading
from typing import Any

from georep.exceptions import ForkedProcessError

_forks = 0
_abandoned: list[Any] = []
_reopen_lock = threading.Lock()


def _after_fork_in_child() -> None:
    global _forks, _reopen_lock
    _forks += 1
    # A thread of the parent may have held it at the fork; no thread of the parent exists here.
    _reopen_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def fork_count() -> int:
    """How many forks lie between the first process that imported georep and this one."""
    return _forks


def reopen_lock() -> threading.Lock:
    """The lock a ``georep.sync`` object holds while it reopens in a child."""
    return _reopen_lock


def forked_error(what: str, made_in: int) -> ForkedProcessError:
    """The error for ``what`` (e.g. ``"this GeoReceiver"``), made in process ``made_in``."""
    return ForkedProcessError(
        f"{what} was created in process {made_in} and used in process {os.getpid()}, "
        "forked from it: its connections belong to the parent. Create it in the child "
        "(gunicorn: in the app factory or a post_fork hook, not with --preload; Celery: "
        "worker_process_init; multiprocessing: the 'spawn' start method)"
    )


def abandon(resource: Any) -> None:
    """Keep ``resource`` (the parent's, in a child) alive and untouched for good: its
    finalizers must not run here, since what it holds belongs to the parent."""
    _abandoned.append(resource)
