"""The senders' outbox directory on a small disk of its own, which the nemesis can fill.

``full-outbox-disk`` needs a filesystem whose free space the soak controls without
touching the machine's: a tmpfs mounted on the run's ``outbox/`` directory. Mounting needs
root (``CAP_SYS_ADMIN``); without it the outboxes stay on the run's disk and the fault is
logged as one that could not begin (the run goes on).
"""

from __future__ import annotations

__all__ = ["OutboxDisk"]

import errno
import os
import shutil
import subprocess
from pathlib import Path

#: The tmpfs's size: room for the outboxes of a soak (a few MiB each, at most).
SIZE_MIB = 64
_BALLAST = ".ballast"
_CHUNK = 1 << 20


class OutboxDisk:
    """``path`` (the outbox directory) on a tmpfs of :data:`SIZE_MIB`, while mounted."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.mounted = False
        self.why_not: str | None = "not mounted yet"

    def mount(self) -> bool:
        """Mount the tmpfs on the (empty) directory; False, with :attr:`why_not`, if this
        machine does not let the soak mount."""
        mount = shutil.which("mount")
        if os.name != "posix" or os.geteuid() != 0 or mount is None:
            self.why_not = "the outbox is not on a disk of its own: mounting a tmpfs needs root"
            return False
        self.path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            [mount, "-t", "tmpfs", "-o", f"size={SIZE_MIB}m,mode=0700", "georep-soak", self.path],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            self.why_not = (
                f"the outbox is not on a disk of its own: mount said {done.stderr.strip()!r}"
            )
            return False
        self.mounted, self.why_not = True, None
        return True

    def fill(self) -> int:
        """Take every free byte of the disk with a ballast file; the bytes it took.

        Raises:
            RuntimeError: The disk is not mounted (:attr:`why_not` says why).
        """
        if not self.mounted:
            raise RuntimeError(self.why_not)
        taken = 0
        with (self.path / _BALLAST).open("ab", buffering=0) as ballast:
            for size in (_CHUNK, 4096, 512):
                block = b"\0" * size
                while True:
                    try:
                        written = ballast.write(block)
                    except OSError as exc:
                        if exc.errno != errno.ENOSPC:
                            raise
                        break
                    taken += written or 0
        return taken

    def empty(self) -> None:
        """Give the ballast's space back."""
        (self.path / _BALLAST).unlink(missing_ok=True)

    def unmount(self) -> None:
        """Unmount (lazily: a process that still holds an outbox open lets go later)."""
        if self.mounted:
            subprocess.run(["umount", "-l", self.path], capture_output=True, check=False)
            self.mounted, self.why_not = False, "the outbox disk was unmounted"

    @staticmethod
    def release_stale(path: Path) -> None:
        """Unmount a tmpfs an earlier run left on ``path`` (it ended before it could)."""
        if os.path.ismount(path):
            subprocess.run(["umount", "-l", path], capture_output=True, check=False)
