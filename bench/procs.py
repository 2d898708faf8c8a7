"""Resident memory and CPU time of process trees, read from /proc.

Three ways to add up a stack's memory, all reported:

* **RSS sum** — what the issue asks for. It counts a page shared by several processes once per
  process, and prefork servers (gunicorn's workers, Celery's pool) share much of their
  parent's memory copy-on-write, so the sum overstates what they occupy.
* **PSS sum** — each shared page split between its sharers. Fair within a stack, but a page
  shared with processes outside it (another Python on the machine, another Prometheus) is
  split with them too, so it depends on what else runs.
* **Distinct resident pages** — every physical page mapped by any process of the stack,
  counted once (from ``/proc/<pid>/pagemap``; needs root, else None): what the stack holds in
  RAM, independent of the rest of the machine.
"""

from __future__ import annotations

import array
import os
from dataclasses import dataclass

import psutil

MIB = 1024**2
PAGE = os.sysconf("SC_PAGE_SIZE")
_PRESENT = 1 << 63
_PFN = (1 << 55) - 1


@dataclass(frozen=True)
class ProcessSample:
    role: str
    pid: int
    rss: int
    pss: int
    uss: int
    cpu_seconds: float  # user + system since the process started, its reaped children included


@dataclass(frozen=True)
class StackSample:
    """One reading of every process of a stack."""

    processes: tuple[ProcessSample, ...]
    distinct: int | None = None  # bytes of distinct physical pages (None: pagemap unreadable)

    @property
    def rss(self) -> int:
        return sum(p.rss for p in self.processes)

    @property
    def pss(self) -> int:
        return sum(p.pss for p in self.processes)

    @property
    def uss(self) -> int:
        return sum(p.uss for p in self.processes)

    @property
    def cpu_seconds(self) -> float:
        return sum(p.cpu_seconds for p in self.processes)

    def by_role(self) -> dict[str, int]:
        """RSS by role (several processes of one role are summed)."""
        totals: dict[str, int] = {}
        for process in self.processes:
            totals[process.role] = totals.get(process.role, 0) + process.rss
        return totals


def _role(process: psutil.Process, parent_role: str | None, default: str) -> str:
    """A readable role from the command line: what runs, and master or child of a prefork."""
    try:
        cmdline = " ".join(process.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return default
    if "sparkops.onestack" in cmdline:  # runstack execs the one process (the default stack)
        return "one process (worker, beat, web)"
    if "runstack" in cmdline or "supervise.py" in cmdline:  # or, with processes, the supervisor
        return "runstack supervisor"
    if "gunicorn" in cmdline:
        return "gunicorn worker" if parent_role == "gunicorn master" else "gunicorn master"
    if " beat" in cmdline:
        return "celery beat"
    if "celery" in cmdline or "sparkops.runworker" in cmdline:
        # With the thread pool (the default) there are no children; with prefork there are.
        return "celery pool child" if parent_role == "celery worker" else "celery worker"
    return default


def _sample(process: psutil.Process, role: str) -> ProcessSample | None:
    try:
        with process.oneshot():
            memory = process.memory_full_info()
            cpu = process.cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return ProcessSample(role=role, pid=process.pid, rss=memory.rss, pss=memory.pss,
                         uss=memory.uss,
                         cpu_seconds=cpu.user + cpu.system + cpu.children_user
                         + cpu.children_system)


def sample_tree(root_pid: int, root_role: str) -> list[ProcessSample]:
    """The root and all its descendants, each with a role."""
    try:
        root = psutil.Process(root_pid)
    except psutil.NoSuchProcess:
        return []
    roles = {root.pid: _role(root, None, root_role)}
    samples = []
    first = _sample(root, roles[root.pid])
    if first is not None:
        samples.append(first)
    try:
        descendants = root.children(recursive=True)
    except psutil.NoSuchProcess:
        descendants = []
    for child in descendants:
        try:
            parent_role = roles.get(child.ppid())
        except psutil.NoSuchProcess:
            continue
        roles[child.pid] = _role(child, parent_role, f"{root_role} child")
        sample = _sample(child, roles[child.pid])
        if sample is not None:
            samples.append(sample)
    return samples


def physical_pages(pid: int) -> set[int]:
    """Frame numbers of every page of ``pid`` that is resident now (root only: others see 0)."""
    frames: set[int] = set()
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/pagemap", "rb") as pagemap:
        for line in maps:
            if line.rstrip().endswith("[vsyscall]"):
                continue
            start, end = (int(edge, 16) for edge in line.split(None, 1)[0].split("-"))
            pagemap.seek(start // PAGE * 8)
            entries = array.array("Q")
            entries.frombytes(pagemap.read((end - start) // PAGE * 8))
            frames.update(entry & _PFN for entry in entries if entry & _PRESENT)
    return frames


def distinct_resident(pids: list[int]) -> int | None:
    """Bytes of the distinct physical pages mapped by ``pids`` together."""
    frames: set[int] = set()
    try:
        for pid in pids:
            frames |= physical_pages(pid)
    except FileNotFoundError:
        pass  # a process that just exited holds nothing
    except PermissionError:
        return None
    if frames and frames <= {0}:
        return None  # frame numbers are hidden from non-root readers
    return len(frames) * PAGE


def sample_stack(roots: dict[int, str]) -> StackSample:
    """Every tree of a stack, given as {root pid: role}."""
    processes: list[ProcessSample] = []
    for pid, role in roots.items():
        processes.extend(sample_tree(pid, role))
    return StackSample(tuple(processes), distinct_resident([p.pid for p in processes]))
