"""The one seam to the kernel's /proc: host memory, and what a process's entry tells (its start
time, what it sees through its mount namespace, its cgroups and so its container); and the one
reader of a memory budget, a memory cgroup's limit and usage under ``/sys/fs/cgroup``
(:func:`read_memory_budget`).

Every read of ``/proc/meminfo`` and ``/proc/pressure/memory`` goes through :class:`Procfs`, whose
root is configurable (``SPARKOPS_PROCFS``) so tests can point it at fixture files, as
node_exporter's ``--path.procfs`` does.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


class ProcfsError(Exception):
    """A /proc file could not be read at all (missing, unreadable, not text)."""


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    """The whole of a small file, through the descriptor calls (``os.open``, ``os.read``);
    OSError as ``open`` raises it.

    For the kernel's small files (``/proc/<pid>/stat``, a cgroup file) Python's file object
    costs more than the read itself: about 24 µs of CPU a ``/proc/<pid>/stat`` through
    ``open(path, "rb").read()``, 14 µs so. The collections read a few hundred of them.
    """
    descriptor = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(descriptor, _READ_SIZE)
        chunks = [data]
        while data:  # a kernel file may come in several reads; the last one is empty
            data = os.read(descriptor, _READ_SIZE)
            chunks.append(data)
        return chunks[0] if len(chunks) <= 2 else b"".join(chunks)
    finally:
        os.close(descriptor)


_READ_SIZE = 65536


@dataclass(frozen=True)
class Procfs:
    root: Path = Path("/proc")

    def read_text(self, relative: str) -> str:
        """Read ``<root>/<relative>`` whole; raise :class:`ProcfsError` with the reason."""
        path = self.root / relative
        try:
            return read_bytes(path).decode("ascii")
        except FileNotFoundError:
            raise ProcfsError(f"{path} does not exist") from None
        except PermissionError:
            raise ProcfsError(f"{path} is not readable (permission denied)") from None
        except UnicodeDecodeError:
            raise ProcfsError(f"{path} is not text") from None
        except OSError as error:
            raise ProcfsError(f"{path}: {error.strerror or error}") from None

    def meminfo(self) -> str:
        return self.read_text("meminfo")

    def memory_pressure(self) -> str | None:
        """The PSI memory file, or None on kernels built without PSI."""
        try:
            return self.read_text("pressure/memory")
        except ProcfsError:
            return None

    def meminfo_field(self, name: str) -> MeminfoField:
        """A reader of one ``meminfo`` field, for reading it many times a second at little cost
        (see :class:`MeminfoField`). It reads ``<root>/meminfo`` itself, not through
        :meth:`meminfo`. Close it when done (it is a context manager)."""
        return MeminfoField(self.root / "meminfo", name)


class MeminfoField:
    """One field of a meminfo file, in bytes, read again and again as cheaply as Python can.

    A full read of ``/proc/meminfo`` (open, read, decode, parse every line) costs ~50 µs hot
    and several times that right after a sleep, with caches cold; this one reads into a buffer
    kept across reads and finds the one line, ~3 µs hot. A kernel-generated file (one of size 0
    that reads as text, as ``/proc/meminfo`` does) is made afresh on every read, so its
    descriptor is kept open; a file with a size (a fixture tree, a rewritten copy) may be
    replaced by a rename, so it is opened for each read. Like
    :func:`collectors.meminfo.parse_meminfo`, the first line of the field counts, "kB" means
    KiB and a value without a unit is bytes.
    """

    def __init__(self, path: Path, name: str) -> None:
        self.path = path
        self._line = re.compile(rb"^" + re.escape(name.encode()) + rb":([^\n]*)", re.MULTILINE)
        self._buffer = bytearray(8192)
        self._held: int | None = None

    def read(self) -> int | None:
        """The field's value in bytes; None when the file could not be read or the field is
        missing or garbled (the next read may succeed)."""
        try:
            length = self._read_into_buffer()
        except OSError:
            return None
        match = self._line.search(self._buffer, 0, length)
        if match is None:
            return None
        tokens = match[1].split()
        if not tokens or not tokens[0].isdigit() or tokens[1:] not in ([], [b"kB"]):
            return None
        return int(tokens[0]) * 1024 if len(tokens) == 2 else int(tokens[0])

    def _read_into_buffer(self) -> int:
        descriptor = self._held
        if descriptor is None:
            descriptor = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            while True:
                length = os.preadv(descriptor, [self._buffer], 0)
                if length < len(self._buffer):
                    break
                self._buffer = bytearray(2 * len(self._buffer))  # the file outgrew the buffer
            if self._held is None and length and os.fstat(descriptor).st_size == 0:
                self._held, descriptor = descriptor, None  # text from a file of size 0
            return length
        finally:
            if descriptor is not None and descriptor != self._held:
                os.close(descriptor)

    def close(self) -> None:
        if self._held is not None:
            os.close(self._held)
            self._held = None

    def __enter__(self) -> MeminfoField:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def process_ids(proc_root: str | os.PathLike[str] = "/proc") -> list[int]:
    """The PIDs under ``proc_root``, lowest first; empty when it cannot be listed."""
    try:
        return sorted(int(entry) for entry in os.listdir(proc_root) if entry.isdigit())
    except OSError:
        return []


def process_root(pid: int, proc_root: Path = Path("/proc")) -> Path:
    """``/proc/<pid>/root``: the process's file system as it sees it (a container's own root).

    Looking through it needs the host PID namespace and the right to look into that process
    (root); reads below it fail with OSError otherwise.
    """
    return proc_root / str(pid) / "root"


def inode_seen_by_process(pid: int, path: str, proc_root: Path = Path("/proc")) -> int | None:
    """The inode of ``path`` as the process ``pid`` sees it (through its mount namespace).

    Reads ``/proc/<pid>/root/<path>``, which needs the host PID namespace and the right to
    look into that process (root). None when the path or the process is not there.
    """
    try:
        return (proc_root / str(pid) / "root" / path.lstrip("/")).stat().st_ino
    except OSError:
        return None


def process_start_time(pid: int, proc_root: Path = Path("/proc")) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22):
    with the PID, it names one process for the life of the host."""
    try:
        text = (proc_root / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else None


# --- /proc/<pid>/cgroup ------------------------------------------------------------------------

# A cgroup path segment naming a Docker or Podman container: "docker-<id>.scope" (systemd
# driver), "libpod-<id>.scope" / "libpod-<id>" (Podman, systemd or cgroupfs driver), or a bare
# "<id>" directly under "docker" (Docker's cgroupfs driver). "libpod-conmon-<id>.scope" holds
# Podman's monitor process, not the container, so it does not match.
_CONTAINER_SEGMENT = re.compile(r"^(?:docker-|libpod-)([0-9a-f]{64})(?:\.scope)?$")
_BARE_ID = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class CgroupEntry:
    """One line of ``/proc/<pid>/cgroup``: ``hierarchy-id:controllers:path``.

    ``controllers`` is empty for the unified (cgroup v2) hierarchy; ``path`` is relative to the
    reader's cgroup namespace and may itself contain ':'.
    """

    hierarchy: str
    controllers: tuple[str, ...]
    path: str

    @property
    def segments(self) -> list[str]:
        """The path's non-empty parts, outermost first."""
        return [segment for segment in self.path.split("/") if segment]


def parse_cgroup(text: str) -> list[CgroupEntry]:
    """The entries of a ``/proc/<pid>/cgroup`` file; malformed lines are skipped."""
    entries = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        controllers = tuple(parts[1].split(",")) if parts[1] else ()
        entries.append(CgroupEntry(parts[0], controllers, parts[2]))
    return entries


def cgroup_entries(pid: int, proc_root: str | os.PathLike[str] = "/proc"
                   ) -> list[CgroupEntry] | None:
    """The cgroups of process ``pid``; None when it has exited or its file is unreadable."""
    text = _cgroup_text(pid, proc_root)
    return None if text is None else parse_cgroup(text)


def _cgroup_text(pid: int, proc_root: str | os.PathLike[str]) -> str | None:
    try:
        return read_bytes(f"{os.fspath(proc_root)}/{pid}/cgroup").decode()
    except (OSError, UnicodeDecodeError):
        return None


def container_id_in_cgroup_path(path: str) -> str | None:
    """The 64-hex Docker/Podman container id a cgroup path names, outermost first; None when
    the path is no Docker or Podman container's."""
    segments = [s for s in path.split("/") if s]
    for position, segment in enumerate(segments):
        match = _CONTAINER_SEGMENT.match(segment)
        if match:
            return match.group(1)
        if _BARE_ID.match(segment) and position > 0 and segments[position - 1] == "docker":
            return segment
    return None


def container_id_for_pid(pid: int, proc_root: str | os.PathLike[str] = "/proc") -> str | None:
    """The 64-hex Docker/Podman container id that ``pid`` runs in, or None.

    Returns None for a process outside any Docker or Podman container (a host process, a
    Kubernetes/containerd one), for a PID that has exited, and for an unreadable file. For
    nested containers the outermost id is returned, because that is the one the host's
    container engine knows.

    Only meaningful from the host PID namespace: NVML reports host PIDs, and inside a container
    ``/proc/<pid>`` names a different process or none at all.
    """
    text = _cgroup_text(pid, proc_root)
    if text is None or ("docker" not in text and "libpod" not in text):
        return None  # every form container_id_in_cgroup_path knows names one of them
    for entry in parse_cgroup(text):
        found = container_id_in_cgroup_path(entry.path)
        if found is not None:
            return found
    return None


def container_ids_for_pids(pids: Iterable[int], proc_root: str | os.PathLike[str] = "/proc"
                           ) -> dict[int, str | None]:
    """:func:`container_id_for_pid` for each PID (e.g. a GPU report's ``pids()``)."""
    return {pid: container_id_for_pid(pid, proc_root) for pid in pids}


def container_cgroups(pid: int, container_id: str, proc_root: Path = Path("/proc")
                      ) -> dict[str, str] | None:
    """controller ("" for the unified hierarchy) -> the cgroup path of the container itself,
    from ``/proc/<pid>/cgroup``; None unless the process is really in ``container_id``'s cgroup
    (from another PID namespace the PID names some other process)."""
    entries = cgroup_entries(pid, proc_root)
    if entries is None:
        return None
    paths: dict[str, str] = {}
    for entry in entries:
        segments = entry.segments
        # The container's cgroup is the one named after it; its processes may sit below it.
        mine = next((i for i, s in enumerate(segments) if container_id in s), None)
        if mine is None or ".." in segments[:mine]:
            continue
        for controller in entry.controllers or ("",):
            paths[controller] = "/".join(segments[:mine + 1])
    return paths or None


# --- a process tree: what each process under a container's first process runs and holds -------

@dataclass(frozen=True)
class TreeProcess:
    """One process below a given root: its parent, its command line (the words of
    ``/proc/<pid>/cmdline``) and its resident memory (``VmRSS`` of ``/proc/<pid>/status``;
    None for a process without one, a zombie or a kernel thread)."""

    pid: int
    ppid: int
    command: tuple[str, ...]
    rss_bytes: int | None


def process_tree(root_pid: int, proc_root: Path = Path("/proc")) -> dict[int, TreeProcess]:
    """``root_pid`` and every process descended from it, by PID (empty when it has exited).

    Cost: one pass over ``/proc`` reading each process's ``stat`` (for its parent), then the
    ``cmdline`` and ``status`` of the tree's members only. Processes that exit meanwhile are
    left out.
    """
    parents: dict[int, int] = {}
    for pid in process_ids(proc_root):
        try:
            stat = (proc_root / str(pid) / "stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if len(fields) > 1 and fields[1].isdigit():
            parents[pid] = int(fields[1])
    members = {root_pid} if root_pid in parents else set()
    grew = True
    while grew:
        grew = False
        for pid, ppid in parents.items():
            if ppid in members and pid not in members:
                members.add(pid)
                grew = True
    tree = {}
    for pid in members:
        try:
            raw = (proc_root / str(pid) / "cmdline").read_bytes()
            status = (proc_root / str(pid) / "status").read_text()
        except OSError:
            continue
        command = tuple(word.decode("utf-8", "replace") for word in raw.split(b"\0") if word)
        rss = next((int(line.split()[1]) * 1024 for line in status.splitlines()
                    if line.startswith("VmRSS:") and line.split()[1].isdigit()), None)
        tree[pid] = TreeProcess(pid=pid, ppid=parents[pid], command=command, rss_bytes=rss)
    return tree


# --- a memory budget: one memory cgroup's limit and what it holds -----------------------------

CGROUP_ROOT = Path("/sys/fs/cgroup")
# cgroup v1 writes "no limit" as PAGE_COUNTER_MAX pages, i.e. LONG_MAX rounded down to a page:
# 9223372036854771712 with 4 KiB pages (linux include/linux/page_counter.h). Any limit past
# 4 EiB is that, whatever the page size.
V1_UNLIMITED_FROM = 1 << 62
# How the note of an unlimited budget's limit begins (a state, not an unknown figure).
NO_LIMIT_NOTE = "no limit"


@dataclass(frozen=True)
class BudgetReading:
    """One read of a memory budget: a memory cgroup directory, in bytes.

    ``usage`` is what the kernel charges to the cgroup and everything below it (page cache
    included); ``inactive_file`` the part of that cache reclaim hands back first. ``limit`` is
    None when the budget has no limit (``unlimited``) or could not be read; ``error`` says why
    a figure is missing.
    """

    cgroup: str
    version: int | None  # 1 or 2; None when no memory controller was found there
    limit: int | None
    usage: int | None
    inactive_file: int | None
    unlimited: bool = False
    error: str | None = None

    @property
    def working_set(self) -> int | None:
        """usage − inactive_file: what reclaim would not give back. The rule kubelet and
        cAdvisor use for ``container_memory_working_set_bytes``."""
        if self.usage is None or self.inactive_file is None:
            return None
        return max(self.usage - self.inactive_file, 0)

    @property
    def room(self) -> int | None:
        """limit − working set, never below 0. None for an unlimited budget (its room is the
        host's) and for an unknown figure."""
        working_set = self.working_set
        if self.limit is None or working_set is None:
            return None
        return max(self.limit - working_set, 0)

    @property
    def limit_note(self) -> str:
        """Why ``limit`` is None ("" when it is known)."""
        if self.limit is not None:
            return ""
        if self.unlimited:
            file = "memory.max is 'max'" if self.version == 2 else "memory.limit_in_bytes is unset"
            return f"{NO_LIMIT_NOTE} ({file} in {self.cgroup})"
        return self.error or f"{self.cgroup}: no limit read"

    @property
    def room_note(self) -> str:
        """Why ``room`` is None ("" when it is known)."""
        if self.room is not None:
            return ""
        if self.limit is None:
            return self.limit_note
        return self.error or f"{self.cgroup}: usage not read"


def read_memory_budget(cgroup: Path) -> BudgetReading:
    """Read the memory cgroup directory ``cgroup`` (cgroup v2 or a v1 memory controller).

    v2: ``memory.max`` ("max" for none), ``memory.current`` and ``inactive_file`` from
    ``memory.stat``. v1: ``memory.limit_in_bytes``, ``memory.usage_in_bytes`` and
    ``total_inactive_file`` from ``memory.stat`` (the ``total_`` figures count the children, as
    ``usage_in_bytes`` does under ``use_hierarchy``). Only this cgroup's own limit is read, not
    its ancestors'. Never raises: what could not be read is None, with the reason in ``error``.
    Cost: three small file reads (memory.stat is ~1.5 KB on v1), about 80 µs.
    """
    name = str(cgroup)
    if (cgroup / "memory.max").exists():
        version, limit_file, usage_file, inactive_key = 2, "memory.max", "memory.current", \
            "inactive_file"
    elif (cgroup / "memory.limit_in_bytes").exists():
        version, limit_file, usage_file, inactive_key = 1, "memory.limit_in_bytes", \
            "memory.usage_in_bytes", "total_inactive_file"
    else:
        reason = (f"{name} has no memory controller (neither memory.max nor "
                  "memory.limit_in_bytes)") if cgroup.is_dir() else f"{name} does not exist"
        return BudgetReading(name, None, None, None, None, error=reason)
    errors: list[str] = []
    limit_text = _cgroup_file(cgroup / limit_file, errors)
    unlimited = limit_text == "max"
    limit = None if unlimited else _cgroup_number(limit_text, cgroup / limit_file, errors)
    if version == 1 and limit is not None and limit >= V1_UNLIMITED_FROM:
        limit, unlimited = None, True
    usage = _cgroup_number(_cgroup_file(cgroup / usage_file, errors), cgroup / usage_file, errors)
    inactive = _stat_value(_cgroup_file(cgroup / "memory.stat", errors), inactive_key,
                           cgroup / "memory.stat", errors)
    return BudgetReading(name, version, limit, usage, inactive, unlimited=unlimited,
                         error="; ".join(errors) or None)


def _cgroup_file(path: Path, errors: list[str]) -> str | None:
    try:
        return path.read_text().strip()
    except OSError as error:
        errors.append(f"{path}: {error.strerror or error}")
        return None


def _cgroup_number(text: str | None, path: Path, errors: list[str]) -> int | None:
    if text is None:
        return None
    if not text.isdigit():
        errors.append(f"{path}: {text[:40]!r} is not a number of bytes")
        return None
    return int(text)


def _stat_value(text: str | None, key: str, path: Path, errors: list[str]) -> int | None:
    if text is None:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return _cgroup_number(value.strip(), path, errors)
    errors.append(f"{path}: no {key} line")
    return None


def cgroup_path_in_hierarchy(directory: Path) -> str | None:
    """``directory``'s path inside its cgroup hierarchy ("/sparkops-demo"), as
    ``/proc/<pid>/cgroup`` writes paths: the part below the mount point of the cgroup file
    system holding it. None when no mount point lies above it."""
    parts = Path(directory).parts
    for depth in range(len(parts), 1, -1):
        if os.path.ismount(Path(*parts[:depth])):
            return "/" + "/".join(parts[depth:])
    return None


def in_memory_cgroup(entries: list[CgroupEntry], path: str, version: int) -> bool:
    """Whether a process with these cgroup ``entries`` is at or below ``path`` of the memory
    hierarchy (v1: the hierarchy with the memory controller; v2: the unified one)."""
    wanted = [segment for segment in path.split("/") if segment]
    for entry in entries:
        memory = "memory" in entry.controllers if version == 1 else entry.controllers == () \
            and entry.hierarchy == "0"
        if memory and entry.segments[:len(wanted)] == wanted:
            return True
    return False
