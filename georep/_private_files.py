"""Files that hold message data, kept from other users: the outbox and the ledger.

The outbox holds message bodies and the ledger message ids; with the usual umask (022)
a plain ``open`` makes them readable by every user of the machine. So georep creates
their files ``0600`` and the directories it makes for them ``0700``, whatever the umask,
and warns (once per file and process) about an existing file that other users can open.
"""

from __future__ import annotations

__all__ = [
    "DIRECTORY_MODE",
    "FILE_MODE",
    "create_private_file",
    "make_private_directory",
    "open_private_for_writing",
    "warn_if_shared",
]

import logging
import os
import stat
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Final

FILE_MODE: Final = 0o600
"""Read and write for the owner only."""
DIRECTORY_MODE: Final = 0o700
"""List, enter and create for the owner only."""

_warned: set[Path] = set()
_warned_lock = threading.Lock()


def make_private_directory(directory: Path) -> None:
    """Create ``directory`` and its missing parents, each ``0700``; existing ones are
    left as they are (a directory the user made is the user's choice)."""
    missing: list[Path] = []
    current = directory
    while not current.exists():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for path in reversed(missing):
        try:
            path.mkdir(mode=DIRECTORY_MODE)
        except FileExistsError:
            continue  # another process made it meanwhile
        # mkdir's mode passes through the umask; an unusual umask (e.g. 0o277) must not
        # leave the owner unable to use the directory it just made.
        os.chmod(path, DIRECTORY_MODE)


def create_private_file(path: Path) -> bool:
    """Create ``path`` empty with mode ``0600`` if it does not exist; True if it made it.

    Raises:
        OSError: The file could not be created (other than: it exists already).
    """
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        return False
    try:
        os.fchmod(descriptor, FILE_MODE)  # whatever the umask took away
    finally:
        os.close(descriptor)
    return True


def open_private_for_writing(path: Path) -> int:
    """A descriptor of ``path`` opened for writing (created or truncated), mode ``0600``."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        os.fchmod(descriptor, FILE_MODE)
    except OSError:
        os.close(descriptor)
        raise
    return descriptor


def warn_if_shared(paths: Iterable[Path], *, what: str, holds: str, log: logging.Logger) -> None:
    """Log one WARNING per file (per process) that other users may read or write.

    Args:
        paths: The files to check; missing ones are skipped.
        what: What the files are, for the message (``"outbox /data/outbox.db"``).
        holds: What a reader would see (``"message bodies"``).
        log: The logger to warn on.
    """
    for path in paths:
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
        except OSError:
            continue
        if not mode & 0o077:
            continue
        key = path.resolve()
        with _warned_lock:
            if key in _warned:
                continue
            _warned.add(key)
        log.warning(
            "%s: %s is open to other users (mode %04o) and holds %s: run `chmod 600 %s` "
            "(georep creates these files 0600)",
            what,
            path,
            mode,
            holds,
            path,
        )
