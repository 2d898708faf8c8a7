"""One run at a time per data directory, without waiting: ``flock`` on a lock file.

Two opens of one file conflict even within one process, so the lock bounds threads and processes
alike, and the kernel drops it when its holder dies. The file is created with the process's
umask; nothing is written to it.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def only_run(lock_path: Path) -> Iterator[bool]:
    """Yield True while this is the only holder of ``lock_path``, else False at once."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
