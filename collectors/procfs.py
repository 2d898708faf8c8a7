"""The one seam to the kernel's /proc for host memory.

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
