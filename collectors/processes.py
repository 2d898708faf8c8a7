"""The host's process table, for the "everything else" part of the memory ledger.

One function: resident memory by process name, largest first. Engine processes are left out by
PID so that nothing is counted twice. Names and sizes are psutil's (``Process.name()`` and
``memory_info().rss``), read straight from ``/proc`` in one pass: the ledger reads the whole
table every collection, and psutil's objects around the same few reads cost several times the
reads themselves. The size is ``statm``'s, as psutil's: the resident pages in
``stat`` (field 24) are the kernel's quick reading of its per-CPU counters, which lags the sum
``statm`` reads by up to tens of pages a process.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

from collectors.procfs import process_ids, read_bytes

# The kernel keeps a process's name (``comm``) to TASK_COMM_LEN - 1 characters; a name that long
# may be cut, and is then completed from the command line as psutil does.
COMM_LENGTH = 15
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
# Places among the fields of /proc/<pid>/stat that follow the name (proc(5): the name is field
# 2 and the state field 3): the kernel flags (field 9) and the start time (field 22).
FLAGS_INDEX = 6
STARTTIME_INDEX = 19
# The flag of a kernel thread (PF_KTHREAD, include/linux/sched.h): it has no memory of its own,
# so its statm is all zeros and psutil gives it a resident size of 0.
PF_KTHREAD = 0x00200000


@dataclass(frozen=True)
class ProcessGroup:
    name: str
    rss_bytes: int
    count: int


def memory_by_process_name(exclude_pids: set[int] = frozenset(),
                           proc_root: Path = Path("/proc")) -> list[ProcessGroup]:
    """Resident memory summed per process name, largest first. Cost: one pass over /proc
    (``stat`` of every process, ``statm`` of every one but kernel threads, ``cmdline`` of a
    process whose name may be cut the first time it is seen)."""
    totals: dict[str, list[int]] = {}
    for pid, name, rss in process_table(proc_root):
        if pid in exclude_pids or rss is None:
            continue
        entry = totals.setdefault(name or f"pid {pid}", [0, 0])
        entry[0] += rss
        entry[1] += 1
    groups = [ProcessGroup(name, rss, count) for name, (rss, count) in totals.items()]
    return sorted(groups, key=lambda group: group.rss_bytes, reverse=True)


class _CompletedNames:
    """Cut names completed from command lines, kept per process (its PID, start time and cut
    name, so a PID reused by a new process, or a process that ran another program, is read
    again) for as long as the process is seen: the ledger reads the table every collection,
    and a long-lived process's completed name was a ``cmdline`` read each time. Bounded by
    the processes of the last pass."""

    def __init__(self) -> None:
        self._kept: dict[tuple[str, int, bytes, str], str] = {}
        self._lock = threading.Lock()

    def completed(self, root: str, pid: int, started: bytes, name: str) -> str:
        key = (root, pid, started, name)
        with self._lock:
            known = self._kept.get(key)
        if known is not None:
            return known
        completed = _completed_name(f"{root}/{pid}", name)  # OSError: not kept
        with self._lock:
            self._kept[key] = completed
        return completed

    def keep_only(self, root: str, seen: set[tuple[int, bytes, str]]) -> None:
        with self._lock:
            for key in [key for key in self._kept if key[0] == root and key[1:] not in seen]:
                del self._kept[key]


_completed_names = _CompletedNames()


def process_table(proc_root: Path = Path("/proc")) -> list[tuple[int, str, int | None]]:
    """``(pid, name, resident bytes)`` of every process, by PID; a process that exits while it
    is read is left out, and a size that may not be read is None. A kernel thread's size is 0
    without reading its ``statm`` (most of a host's PIDs are kernel threads: two in three
    here). Both files are read through :func:`collectors.procfs.read_bytes`."""
    root = os.fspath(proc_root)
    table = []
    long_named: set[tuple[int, bytes, str]] = set()
    for pid in process_ids(root):
        base = f"{root}/{pid}"
        try:
            stat = read_bytes(f"{base}/stat")
        except OSError:
            continue  # exited
        end = stat.rfind(b")")
        name = stat[stat.find(b"(") + 1:end].decode("utf-8", "surrogateescape")
        fields = stat[end + 2:].split()
        if len(fields) > FLAGS_INDEX and int(fields[FLAGS_INDEX]) & PF_KTHREAD:
            table.append((pid, name, 0))
            continue
        if len(name) >= COMM_LENGTH:
            # The start time (the 22nd field) tells this process from an earlier one of its PID.
            started = fields[STARTTIME_INDEX] if len(fields) > STARTTIME_INDEX else b""
            identity = (pid, started, name)
            long_named.add(identity)
            try:
                name = _completed_names.completed(root, *identity)
            except FileNotFoundError:
                continue  # exited
            except OSError:
                pass  # not readable: the cut name, as psutil keeps it
        try:
            rss: int | None = int(read_bytes(f"{base}/statm").split(None, 2)[1]) * PAGE_SIZE
        except PermissionError:
            rss = None
        except (OSError, IndexError, ValueError):
            continue  # exited
        table.append((pid, name, rss))
    _completed_names.keep_only(root, long_named)
    return table


def _completed_name(base: str, name: str) -> str:
    """A cut name completed from the command line's first word, where that word's file name
    begins with it (psutil's rule: "gnome-keyring-d" is "gnome-keyring-daemon")."""
    with open(f"{base}/cmdline", encoding="utf-8", errors="surrogateescape") as file:
        data = file.read()
    if not data:
        return name  # a zombie or a kernel thread
    separator = "\0" if data.endswith("\0") else " "
    if data.endswith(separator):
        data = data[:-1]
    words = data.split(separator)
    if separator == "\0" and len(words) == 1 and " " in data:
        words = data.split(" ")  # a title rewritten with spaces (setproctitle)
    extended = os.path.basename(words[0])
    return extended if extended.startswith(name) else name
