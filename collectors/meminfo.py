"""Parse ``/proc/meminfo`` and ``/proc/pressure/memory`` into a reading with explicit unknowns.

On GB10 the CPU and GPU share one pool, so these files *are* the GPU memory report (NVML's
memory query is not supported there). Three "free" figures disagree and are kept apart:

* ``MemAvailable`` – what the kernel estimates can be allocated without swapping, counting
  reclaimable page cache;
* ``MemFree`` – truly unused pages; ``cudaMemGetInfo`` follows this on GB10, so an engine that
  starts sees this, not MemAvailable;
* reclaimable page cache – ``Cached - Shmem + Buffers + SReclaimable``: what dropping caches could
  hand back (shared memory counts as Cached but cannot be dropped).

A field that is missing or garbled is *unknown* with a reason, never 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# Fields every Linux kernel this project supports prints; missing one is worth a reason.
REQUIRED_FIELDS = (
    "MemTotal",
    "MemFree",
    "MemAvailable",
    "Buffers",
    "Cached",
    "SReclaimable",
    "Shmem",
    "Dirty",
    "SwapTotal",
    "SwapFree",
)
# Present only on kernels with CMA; absence is normal, not an unknown.
OPTIONAL_FIELDS = ("CmaFree",)

_KEPT_FIELDS = frozenset(REQUIRED_FIELDS + OPTIONAL_FIELDS)
_PSI_LINE = re.compile(
    r"^(?P<kind>some|full)\s+avg10=(?P<avg10>[0-9.]+)\s+avg60=(?P<avg60>[0-9.]+)\s+"
    r"avg300=(?P<avg300>[0-9.]+)\s+total=(?P<total>[0-9]+)\s*$"
)


@dataclass
class MemInfo:
    """Bytes per field; ``unknown`` maps a field to why it has no value."""

    values: dict[str, int] = field(default_factory=dict)
    unknown: dict[str, str] = field(default_factory=dict)

    def get(self, name: str) -> int | None:
        return self.values.get(name)

    @property
    def mem_available(self) -> int | None:
        return self.values.get("MemAvailable")

    def page_cache_reclaimable(self) -> int | None:
        parts = [self.values.get(n) for n in ("Cached", "Shmem", "Buffers", "SReclaimable")]
        if any(p is None for p in parts):
            return None
        cached, shmem, buffers, sreclaimable = parts  # type: ignore[misc]
        return max(cached - shmem, 0) + buffers + sreclaimable

    def swap_used(self) -> int | None:
        total, free = self.values.get("SwapTotal"), self.values.get("SwapFree")
        if total is None or free is None:
            return None
        return max(total - free, 0)

    def derived_unknown_reason(self, *names: str) -> str:
        missing = [n for n in names if n not in self.values]
        return "; ".join(f"{n}: {self.unknown.get(n, 'not reported')}" for n in missing)


@dataclass(frozen=True)
class MemoryPressure:
    """PSI memory averages (percent of wall time stalled over 10 s)."""

    some_avg10: float | None
    full_avg10: float | None


def parse_meminfo(text: str) -> MemInfo:
    """Parse meminfo text. Never raises: bad lines become unknowns with their reason.

    Values are in kB in the file (the kernel's "kB" means KiB); stored in bytes.
    """
    info = MemInfo()
    seen: set[str] = set()
    for raw_line in text.splitlines():
        # Only the fields kept are looked at (a line is "<name>:<rest>", the name never holds
        # a ':'), so the other ~45 lines cost a split each, not a regular expression.
        name, colon, rest = raw_line.strip().partition(":")
        if colon and name in _KEPT_FIELDS and name not in seen:
            seen.add(name)
            _store_field(info, name, rest.split())
    for name in REQUIRED_FIELDS:
        if name not in info.values and name not in info.unknown:
            info.unknown[name] = "missing from /proc/meminfo"
    return info


def _store_field(info: MemInfo, name: str, tokens: list[str]) -> None:
    if not tokens or len(tokens) > 2:
        info.unknown[name] = f"unreadable value {' '.join(tokens)!r}"
        return
    value, unit = tokens[0], (tokens[1] if len(tokens) == 2 else None)
    if not value.isdigit():
        info.unknown[name] = f"unreadable value {value!r}"
        return
    if unit not in ("kB", None):
        info.unknown[name] = f"unexpected unit {unit!r}"
        return
    info.values[name] = int(value) * 1024 if unit == "kB" else int(value)


def parse_pressure(text: str | None) -> MemoryPressure | None:
    """Parse /proc/pressure/memory; None when PSI is absent or the text is unusable."""
    if not text:
        return None
    averages: dict[str, float] = {}
    for line in text.splitlines():
        match = _PSI_LINE.match(line.strip())
        if match:
            averages[match["kind"]] = float(match["avg10"])
    if not averages:
        return None
    return MemoryPressure(some_avg10=averages.get("some"), full_avg10=averages.get("full"))
