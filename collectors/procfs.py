"""The one seam to the kernel's /proc: host memory, and what a process's entry tells.

Every read of ``/proc/meminfo`` and ``/proc/pressure/memory`` goes through :class:`Procfs`, whose
root is configurable (``SPARKOPS_PROCFS``) so tests can point it at fixture files, as
node_exporter's ``--path.procfs`` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


class ProcfsError(Exception):
    """A /proc file could not be read at all (missing, unreadable, not text)."""


@dataclass(frozen=True)
class Procfs:
    root: Path = Path("/proc")

    def read_text(self, relative: str) -> str:
        """Read ``<root>/<relative>`` whole; raise :class:`ProcfsError` with the reason."""
        path = self.root / relative
        try:
            return path.read_bytes().decode("ascii")
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


def container_cgroups(pid: int, container_id: str, proc_root: Path = Path("/proc")
                      ) -> dict[str, str] | None:
    """controller ("" for the unified hierarchy) -> the cgroup path of the container itself,
    from ``/proc/<pid>/cgroup``; None unless the process is really in ``container_id``'s cgroup
    (from another PID namespace the PID names some other process)."""
    try:
        text = (proc_root / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        segments = [s for s in parts[2].split("/") if s]
        # The container's cgroup is the one named after it; its processes may sit below it.
        mine = next((i for i, s in enumerate(segments) if container_id in s), None)
        if mine is None or ".." in segments[:mine]:
            continue
        for controller in parts[1].split(",") if parts[1] else [""]:
            paths[controller] = "/".join(segments[:mine + 1])
    return paths or None
