"""How fragmented the node's free memory is: free blocks by size from ``/proc/buddyinfo`` and
direct compaction from ``/proc/vmstat``, read once per host collection and stored as host
samples (``Metric.BUDDY_FREE`` … ``Metric.COMPACT_FAILS_PER_MIN``).

Why: after about a week of serving, GB10 operators report ~118 GiB MemAvailable while
``/proc/buddyinfo`` shows the high orders empty; weight loads then crawl (the kernel compacts on
every allocation) or the NVIDIA driver fails with NV_ERR_NO_MEMORY, and only a reboot gives the
large blocks back (FujitsuPolycom/sparkring#173; MiaAI-Lab/DeepSeek-v4.1-Flash-DGX-Sparks#23).
MemAvailable cannot see this, so these figures are stored beside it.

What is counted:

* **Zones.** The zones ordinary allocations are served from: every zone but ``DMA`` and
  ``DMA32``, which the kernel holds back for devices that cannot address more
  (``lowmem_reserve``); on a machine that has only those, all zones. Every NUMA node is summed.
* **Block size.** Order *n* is ``2**n`` pages (proc_buddyinfo(5)), so the page size is needed:
  ``KernelPageSize`` of ``<root>/self/smaps`` (fixture trees set it there), else this kernel's
  own (``os.sysconf``), which is also the host's when SparkOps runs in a container. GB10 kernels
  ship with 4 KiB or 64 KiB pages.
* **Huge-page-sized blocks.** Blocks of at least one PMD huge page: a page table page holds
  ``page_size / 8`` entries, so that is order ``log2(page_size) - 3`` (order 9 = 2 MiB on
  4 KiB pages, order 11 = 32 MiB on 16 KiB, order 13 = 512 MiB on 64 KiB), capped at the
  highest order the kernel lists.
* **Compaction.** ``compact_stall`` counts allocations that stalled to compact memory directly,
  ``compact_fail`` those whose compaction found no block. Both are cumulative since boot; they
  are read before and after the collection window, so the stored rates need no earlier row.

Cost: one ~0.5 KB and two ~6 KB reads per collection and the first line of ``self/smaps``,
about 0.1 ms.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field

from collectors.models import Metric
from collectors.procfs import Procfs, ProcfsError

# Zones the kernel keeps for devices with small DMA masks; ordinary allocations reach them
# only after Normal (and Movable) are exhausted, and then only above lowmem_reserve.
DEVICE_ZONES = frozenset({"DMA", "DMA32"})
COMPACTION_COUNTERS = ("compact_stall", "compact_fail", "compact_success")
_COMPACTION_LINE = re.compile(
    rf"^(?P<name>{'|'.join(COMPACTION_COUNTERS)}) (?P<value>[^\n]*)$", re.MULTILINE)
_ZONE_LINE = re.compile(r"^Node\s+(\d+),\s+zone\s+(\S+)\s+([\d\s]+)$")
_PAGE_SIZE_LINE = re.compile(r"^KernelPageSize:\s+(\d+)\s+kB\s*$")
# smaps lists a mapping's fields within its first ~25 lines; stop looking after this many.
_SMAPS_LINES = 64


@dataclass(frozen=True)
class ZoneFree:
    """One line of ``/proc/buddyinfo``: the free blocks of one zone of one NUMA node, by
    order (``counts[n]`` blocks of ``2**n`` pages)."""

    node: int
    zone: str
    counts: tuple[int, ...]


def parse_buddyinfo(text: str) -> list[ZoneFree]:
    """The zone lines of a buddyinfo text; lines that are not ``Node N, zone NAME counts…`` are
    skipped (the caller treats "no zone line at all" as unreadable)."""
    zones = []
    for line in text.splitlines():
        match = _ZONE_LINE.match(line.strip())
        if match:
            zones.append(ZoneFree(int(match[1]), match[2], tuple(int(c) for c in match[3].split())))
    return zones


def kernel_page_size(procfs: Procfs) -> tuple[int, str]:
    """The kernel's page size in bytes and where it was read.

    ``KernelPageSize`` of the first mapping in ``<root>/self/smaps`` (only its first lines are
    read); without that file, ``os.sysconf("SC_PAGE_SIZE")``, the running kernel's.
    """
    path = procfs.root / "self" / "smaps"
    try:
        with path.open("rb") as smaps:
            for _, raw in zip(range(_SMAPS_LINES), smaps, strict=False):
                match = _PAGE_SIZE_LINE.match(raw.decode("ascii", "replace"))
                if match:
                    return int(match[1]) * 1024, f"KernelPageSize in {path}"
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE"), "this kernel's page size (sysconf SC_PAGE_SIZE)"


def huge_page_order(page_size: int) -> int:
    """The order of one PMD huge page: ``log2(page_size / 8)`` (9 on 4 KiB pages, 13 on
    64 KiB), for 64-bit page table entries as on arm64 and x86-64."""
    return int(math.log2(page_size)) - 3


@dataclass(frozen=True)
class FreeBlocks:
    """One read of ``/proc/buddyinfo`` with the page size that turns orders into bytes.

    ``zones`` is every zone read; ``counted`` names the zones the figures add up (see the
    module's docstring). ``huge_order`` is the order from which a block counts as
    huge-page-sized.
    """

    page_size: int
    page_size_source: str
    zones: tuple[ZoneFree, ...]
    counted: tuple[str, ...]
    huge_order: int

    def _counted_zones(self) -> list[ZoneFree]:
        return [zone for zone in self.zones if zone.zone in self.counted]

    @property
    def orders(self) -> int:
        """How many orders the kernel lists (11 on 4 KiB pages, 14 on 64 KiB)."""
        return max(len(zone.counts) for zone in self.zones)

    def bytes_by_order(self) -> list[int]:
        """Free bytes in blocks of each order, over the counted zones."""
        totals = [0] * self.orders
        for zone in self._counted_zones():
            for order, count in enumerate(zone.counts):
                totals[order] += count * (self.page_size << order)
        return totals

    def blocks_by_order(self) -> list[int]:
        """Free blocks of each order, over the counted zones."""
        totals = [0] * self.orders
        for zone in self._counted_zones():
            for order, count in enumerate(zone.counts):
                totals[order] += count
        return totals

    @property
    def free_bytes(self) -> int:
        """All free memory the counted zones' buddy lists hold (per-CPU lists are not in
        buddyinfo, so this is a little below MemFree)."""
        return sum(self.bytes_by_order())

    @property
    def huge_block_bytes(self) -> int:
        """The size of one huge-page-sized block."""
        return self.page_size << self.huge_order

    @property
    def huge_free_bytes(self) -> int:
        """Free bytes in blocks of :attr:`huge_order` or more."""
        return sum(self.bytes_by_order()[self.huge_order:])

    @property
    def largest_order(self) -> int | None:
        """The highest order with a free block; None when the counted zones have none."""
        blocks = self.blocks_by_order()
        return next((order for order in range(len(blocks) - 1, -1, -1) if blocks[order]), None)

    @property
    def largest_block_bytes(self) -> int | None:
        order = self.largest_order
        return None if order is None else self.page_size << order


def read_free_blocks(procfs: Procfs) -> FreeBlocks:
    """Read ``/proc/buddyinfo`` and the page size; :class:`ProcfsError` with the reason when
    buddyinfo is missing or holds no zone line."""
    zones = parse_buddyinfo(procfs.read_text("buddyinfo"))
    if not zones:
        raise ProcfsError(f"{procfs.root / 'buddyinfo'} holds no 'Node N, zone NAME' line")
    page_size, source = kernel_page_size(procfs)
    names = sorted({zone.zone for zone in zones})
    counted = tuple(name for name in names if name not in DEVICE_ZONES) or tuple(names)
    top = max(len(zone.counts) for zone in zones) - 1
    return FreeBlocks(page_size=page_size, page_size_source=source, zones=tuple(zones),
                      counted=counted, huge_order=min(huge_page_order(page_size), top))


@dataclass(frozen=True)
class CompactionCounters:
    """The cumulative compaction counters of one ``/proc/vmstat`` read (those present), or
    ``error`` saying why the file could not be read."""

    values: dict[str, int] = field(default_factory=dict)
    error: str = ""


def parse_compaction(text: str) -> dict[str, int]:
    """The compaction counters among the ``name value`` lines of ``/proc/vmstat`` (the last
    line of a name, as the file has one); a line whose value is not a count is skipped. One
    regular expression finds their lines: the file's other ~180 lines are never split."""
    values = {}
    for match in _COMPACTION_LINE.finditer(text):
        value = match["value"].strip()
        if value.isdigit():
            values[match["name"]] = int(value)
    return values


def read_compaction(procfs: Procfs) -> CompactionCounters:
    """The compaction counters now; never raises."""
    try:
        return CompactionCounters(parse_compaction(procfs.read_text("vmstat")))
    except ProcfsError as error:
        return CompactionCounters(error=str(error))


@dataclass(frozen=True)
class FragmentationReading:
    """What one collection stores about fragmentation.

    ``blocks`` is None when buddyinfo could not be read (``blocks_error`` says why); a rate is
    None when it could not be computed (its note says why). ``counters`` are the cumulative
    compaction counters at the end of the window.
    """

    blocks: FreeBlocks | None
    blocks_error: str
    stalls_per_min: float | None
    fails_per_min: float | None
    stalls_note: str = ""
    fails_note: str = ""
    counters: dict[str, int] = field(default_factory=dict)


def compaction_rate(before: CompactionCounters, after: CompactionCounters, name: str,
                    seconds: float) -> tuple[float | None, str]:
    """Events of counter ``name`` per minute between two reads ``seconds`` apart, or None with
    the reason."""
    for reading in (before, after):
        if reading.error:
            return None, reading.error
        if name not in reading.values:
            return None, f"no {name} in /proc/vmstat (a kernel built without compaction)"
    if seconds <= 0:
        return None, "the collection window took no time: no rate"
    change = after.values[name] - before.values[name]
    if change < 0:
        return None, f"{name} went back between two reads (did the host restart?)"
    return change * 60 / seconds, ""


def read_fragmentation(procfs: Procfs, before: CompactionCounters,
                       seconds: float) -> FragmentationReading:
    """Read buddyinfo and the compaction counters now; the rates are since ``before``, read
    ``seconds`` earlier. Never raises."""
    try:
        blocks, blocks_error = read_free_blocks(procfs), ""
    except ProcfsError as error:
        blocks, blocks_error = None, str(error)
    after = read_compaction(procfs)
    stalls, stalls_note = compaction_rate(before, after, "compact_stall", seconds)
    fails, fails_note = compaction_rate(before, after, "compact_fail", seconds)
    return FragmentationReading(blocks=blocks, blocks_error=blocks_error,
                                stalls_per_min=stalls, fails_per_min=fails,
                                stalls_note=stalls_note, fails_note=fails_note,
                                counters=after.values)


def sample_figures(reading: FragmentationReading) -> list[tuple[Metric, float | None, str]]:
    """``(metric, value, why unknown)`` of every fragmentation sample a collection stores."""
    blocks = reading.blocks
    if blocks is None:
        figures: list[tuple[Metric, float | None, str]] = [
            (metric, None, reading.blocks_error)
            for metric in (Metric.BUDDY_FREE, Metric.FREE_IN_HUGE_BLOCKS,
                           Metric.LARGEST_FREE_BLOCK)]
    else:
        zones = ", ".join(blocks.counted)
        figures = [
            (Metric.BUDDY_FREE, blocks.free_bytes, ""),
            (Metric.FREE_IN_HUGE_BLOCKS, blocks.huge_free_bytes, ""),
            (Metric.LARGEST_FREE_BLOCK, blocks.largest_block_bytes,
             f"no free block at all in zone {zones}"),
        ]
    figures += [
        (Metric.COMPACT_STALLS_PER_MIN, reading.stalls_per_min, reading.stalls_note),
        (Metric.COMPACT_FAILS_PER_MIN, reading.fails_per_min, reading.fails_note),
    ]
    return figures
