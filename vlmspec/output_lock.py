"""One writer per output file: an exclusive lock on a file beside it (`<output>.lock`), taken without waiting.

The lock is `flock`'s, so the kernel releases it when the process ends, however it ends: a run killed with SIGKILL
leaves the lock file behind but not the lock, and a `--resume` takes it again at once.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class OutputLock:
    """The lock of `output`, held from `acquire` until `release` or the end of the process."""

    def __init__(self, output: Path):
        self.path = output.with_name(f"{output.name}.lock")
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Take the lock now; False when another process holds it. The holder's pid is written into the file."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    def holder(self) -> str:
        """The pid written by the process that holds (or last held) the lock, if any."""
        try:
            return self.path.read_text().strip()
        except OSError:
            return ""

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
