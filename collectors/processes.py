"""The host's process table, for the "everything else" part of the memory ledger.

One seam (psutil, reading /proc) and one function: resident memory by process name, largest
first. Engine processes are left out by PID so that nothing is counted twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class ProcessGroup:
    name: str
    rss_bytes: int
    count: int


def memory_by_process_name(exclude_pids: set[int] = frozenset()) -> list[ProcessGroup]:
    """Resident memory summed per process name, largest first. Cost: one pass over /proc."""
    totals: dict[str, list[int]] = {}
    for process in psutil.process_iter(["pid", "name", "memory_info"]):
        info = process.info
        if info["pid"] in exclude_pids or info.get("memory_info") is None:
            continue
        entry = totals.setdefault(info["name"] or f"pid {info['pid']}", [0, 0])
        entry[0] += info["memory_info"].rss
        entry[1] += 1
    groups = [ProcessGroup(name, rss, count) for name, (rss, count) in totals.items()]
    return sorted(groups, key=lambda group: group.rss_bytes, reverse=True)
