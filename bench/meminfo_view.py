"""An isolated view of host memory for the alert benchmark, on a machine shared with other work.

Both stacks decide on MemAvailable, which on a shared machine moves by gigabytes whenever other
work starts or stops, so a threshold crossed by the neighbour could be uncrossed (or crossed
early) by someone else. In ``isolated`` mode the monitors read their ``/proc`` from a directory
of this module's own (SparkOps through ``SPARKOPS_PROCFS``, node_exporter through
``--path.procfs``): every entry is a link to the real one, except ``meminfo``, which is the real
file rewritten every 10 ms with MemFree and MemAvailable replaced by their values when the view
started minus what the neighbour has resident now (its ``statm``). The neighbour's allocation
is real and its pages are counted as the kernel counts them; only other tenants' swings are
left out. In ``real`` mode nothing is redirected and the benchmark checks, trial by trial,
that nobody else moved MemAvailable across the threshold (see ``bench.alert_latency``).
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")
_FIELD = re.compile(r"^(MemFree|MemAvailable):\s+(\d+) kB$", re.MULTILINE)


def real_mem_available() -> int:
    """MemAvailable now, in bytes, from the real /proc/meminfo."""
    match = re.search(r"^MemAvailable:\s+(\d+) kB$", Path("/proc/meminfo").read_text(),
                      re.MULTILINE)
    if match is None:
        raise RuntimeError("no MemAvailable in /proc/meminfo")
    return int(match.group(1)) * 1024


class MeminfoView(threading.Thread):
    """The directory ``root`` as a ``/proc`` whose MemFree and MemAvailable move only with the
    neighbour's resident memory. ``mem_available()`` is the value last written."""

    def __init__(self, root: Path, period: float = 0.01) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.period = period
        self.neighbour_pid: int | None = None
        self._base: dict[str, int] = {}
        self._available = 0
        self._halt = threading.Event()  # not `_stop`: threading.Thread has a method of that name
        self._build()

    def _build(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for name in os.listdir("/proc"):
            # Process directories are left out (the monitors read their own through the real
            # /proc); "1" stays for node_exporter's filesystem collector (/proc/1/mounts).
            if name == "meminfo" or (name.isdigit() and name != "1"):
                continue
            link = self.root / name
            if not link.exists() and not link.is_symlink():
                link.symlink_to(f"/proc/{name}")
        text = Path("/proc/meminfo").read_text()
        self._base = {name: int(kib) * 1024 for name, kib in _FIELD.findall(text)}
        self._write(text, 0)

    def mem_available(self) -> int:
        return self._available

    def _neighbour_resident(self) -> int:
        pid = self.neighbour_pid
        if pid is None:
            return 0
        try:
            return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
        except (OSError, IndexError, ValueError):
            return 0

    def _write(self, text: str, taken: int) -> None:
        values = {name: max(base - taken, 0) for name, base in self._base.items()}

        def replace(match: re.Match) -> str:
            return f"{match.group(1) + ':':<16}{values[match.group(1)] // 1024:>8} kB"

        tmp = self.root / ".meminfo.tmp"
        tmp.write_text(_FIELD.sub(replace, text))
        os.replace(tmp, self.root / "meminfo")
        self._available = values.get("MemAvailable", 0)

    def run(self) -> None:
        while not self._halt.wait(self.period):
            self._write(Path("/proc/meminfo").read_text(), self._neighbour_resident())

    def stop(self) -> None:
        self._halt.set()
