"""A node's host memory as rows: one interval collected and stored as a collection and its
samples, and the one reader of the latest of them (what the overview, ``/metrics`` and the API
call the node's current figures).

When the node's engines run in a memory budget (``SPARKOPS_MEMORY_BUDGET_CGROUP``, a memory
cgroup), each collection also stores the budget's limit, its room and the interval's lowest room;
an unlimited or unreadable budget is stored as unknown with the reason, never as 0.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction

from collectors.fragmentation import FragmentationReading, read_compaction, read_fragmentation
from collectors.fragmentation import sample_figures as fragmentation_figures
from collectors.meminfo import MemInfo
from collectors.models import Collection, HostReading, Metric, Node
from collectors.procfs import BudgetReading, Procfs
from collectors.readings import HOST, Sample
from collectors.sampling import PACED, Clock, WindowReading, stale_after, watch_host_memory
from sparkops.prepared import PreparedRead
from sparkops.rowwrites import insert_rows, save_fields

# meminfo field -> stored metric
_FIELD_METRICS = {
    "MemTotal": Metric.MEM_TOTAL,
    "MemFree": Metric.MEM_FREE,
    "MemAvailable": Metric.MEM_AVAILABLE,
    "Buffers": Metric.BUFFERS,
    "Cached": Metric.CACHED,
    "SReclaimable": Metric.SRECLAIMABLE,
    "Shmem": Metric.SHMEM,
    "Dirty": Metric.DIRTY,
    "SwapTotal": Metric.SWAP_TOTAL,
    "SwapFree": Metric.SWAP_FREE,
    "CmaFree": Metric.CMA_FREE,
}


def configured_budget() -> Path | None:
    """This node's memory budget cgroup (``SPARKOPS_MEMORY_BUDGET_CGROUP``), or None."""
    configured = settings.SPARKOPS_MEMORY_BUDGET_CGROUP
    return Path(configured) if configured else None


def collect_host_memory(
    node: Node, procfs: Procfs, *, duration: float, period: float, clock: Clock | None = None,
    budget: Path | None = None, method: str = PACED,
) -> tuple[Collection, WindowReading]:
    """Watch the node's memory (and ``budget``, a memory cgroup, when given) for ``duration``
    seconds and store what was seen; ``method`` paces the reads
    (:func:`collectors.sampling.watch_host_memory`).

    Blocks for ``duration``. Writes one :class:`Collection` and, when meminfo was readable,
    its :class:`HostReading` (a figure per metric), in one transaction. Fragmentation is read
    with it (``collectors.fragmentation``: compaction counters before and after the window).
    """
    compaction_before = read_compaction(procfs)
    window = watch_host_memory(procfs, duration=duration, period=period, clock=clock,
                               budget=budget, method=method)
    fragmentation = None if window.last is None else read_fragmentation(
        procfs, compaction_before, (window.finished_at - window.started_at).total_seconds())
    return record_window(node, window, fragmentation), window


def window_figures(window: WindowReading) -> dict[str, Any]:
    """The host numbers of one interval the ledger needs, in bytes (None: unknown), and the
    memory budget's under ``"budget"`` when one is watched (see :func:`budget_figures`)."""
    info = window.last
    if info is None:
        return {}
    figures: dict[str, Any] = {
        "mem_total": info.get("MemTotal"),
        "mem_available": info.mem_available,
        "mem_available_min": window.min_available,
        "page_cache_reclaimable": info.page_cache_reclaimable(),
        "swap_used": info.swap_used(),
    }
    if window.budget is not None:
        figures["budget"] = budget_figures(window.budget, window.min_budget_room)
    return figures


def budget_figures(budget: BudgetReading, room_min: int | None) -> dict[str, Any]:
    """The memory budget of one interval: its cgroup, limit, working set, room at the end and
    lowest room (bytes, None when unknown or unlimited), cgroup version, and ``note``: why the
    room is None ("" when known)."""
    return {
        "cgroup": budget.cgroup,
        "version": budget.version,
        "limit": budget.limit,
        "unlimited": budget.unlimited,
        "working_set": budget.working_set,
        "room": budget.room,
        "room_min": room_min,
        "note": budget.room_note,
    }


def record_window(node: Node, window: WindowReading,
                  fragmentation: FragmentationReading | None = None) -> Collection:
    with transaction.atomic():
        collection = Collection.objects.create(
            node=node,
            at=window.finished_at,
            window_started_at=window.started_at,
            reads=window.reads,
            ok=window.last is not None,
            error=window.error or "",
        )
        if window.last is not None:
            insert_rows([HOST.reading(node, window.finished_at,
                                      _samples(window, window.last, fragmentation))])
            total = window.last.get("MemTotal")
            if total is not None and total != node.mem_total_bytes:
                node.mem_total_bytes = total
        node.last_collection_at = window.finished_at
        save_fields(node, ["mem_total_bytes", "last_collection_at"])
    return collection


def _samples(window: WindowReading, info: MemInfo,
             fragmentation: FragmentationReading | None = None) -> list[Sample]:
    at = window.finished_at
    samples = [
        _sample(metric, at, info.get(field), info.unknown.get(field, ""))
        for field, metric in _FIELD_METRICS.items()
        if field in info.values or field in info.unknown
    ]
    samples.append(
        _sample(
            Metric.PAGE_CACHE_RECLAIMABLE,
            at,
            info.page_cache_reclaimable(),
            info.derived_unknown_reason("Cached", "Shmem", "Buffers", "SReclaimable"),
        )
    )
    samples.append(
        _sample(
            Metric.SWAP_USED, at, info.swap_used(),
            info.derived_unknown_reason("SwapTotal", "SwapFree"),
        )
    )
    # The minimum is stored at the instant it was seen, so a dip is drawn where it happened.
    samples.append(
        _sample(
            Metric.MEM_AVAILABLE_MIN,
            window.min_available_at or at,
            window.min_available,
            "" if window.min_available is not None else "MemAvailable unknown all interval",
        )
    )
    pressure = window.pressure
    no_psi = "no /proc/pressure/memory (kernel without PSI)"
    samples.append(
        _sample(Metric.PSI_SOME_AVG10, at, pressure and pressure.some_avg10,
                no_psi if pressure is None else "no 'some' line in /proc/pressure/memory")
    )
    samples.append(
        _sample(Metric.PSI_FULL_AVG10, at, pressure and pressure.full_avg10,
                no_psi if pressure is None else "no 'full' line in /proc/pressure/memory")
    )
    if fragmentation is not None:
        samples += [_sample(metric, at, value, note)
                    for metric, value, note in fragmentation_figures(fragmentation)]
    if window.budget is not None:
        samples += _budget_samples(window, window.budget)
    return samples


def _budget_samples(window: WindowReading, budget: BudgetReading) -> list[Sample]:
    at = window.finished_at
    room_min_note = f"room unknown all interval: {budget.room_note}" if budget.room_note else \
        "room unknown all interval"
    return [
        _sample(Metric.MEMORY_BUDGET_LIMIT, at, budget.limit, budget.limit_note),
        _sample(Metric.MEMORY_BUDGET_ROOM, at, budget.room, budget.room_note),
        # Like MemAvailable's, the lowest room is stored at the instant it was seen.
        _sample(Metric.MEMORY_BUDGET_ROOM_MIN, window.min_budget_room_at or at,
                window.min_budget_room, room_min_note),
    ]


def _sample(metric: Metric, at, value: float | None, note: str) -> Sample:
    return Sample(metric, at, value, "" if value is not None else note[:200])


@dataclass(frozen=True)
class LatestCollection:
    """A node's latest collection as seen at some instant, with the samples of its window.

    ``collection`` is None before the first collection; then ``age_seconds`` is None and
    ``stale`` is True. ``age_seconds`` is the instant less the collection's time (negative when
    the node's clock runs ahead of this one). ``stale`` applies :func:`stale_after`.
    ``samples`` maps each asked metric to its sample in the collection's window; it is empty
    when there is no collection or the latest one failed (a failed collection stores none).
    """

    collection: Collection | None
    age_seconds: float | None
    stale: bool
    samples: dict[int, Sample]

    @property
    def ok(self) -> bool | None:
        """Whether the latest collection succeeded; None before the first one."""
        return None if self.collection is None else self.collection.ok

    @property
    def error(self) -> str:
        """Why the latest collection failed; "" when it succeeded or there is none."""
        return self.collection.error if self.collection is not None and not self.ok else ""


# A node's latest collection, and its host reading at a time (prepared reads: every alert round
# and every overview poll makes them).
_LATEST_COLLECTION = PreparedRead(lambda node_id: Collection.objects.filter(node_id=node_id)
                                  .order_by("-at")[:1])
_HOST_READING_AT = PreparedRead(lambda node_id, at: HostReading.objects
                                .filter(node_id=node_id, at=at)[:1])  # unique: one or none


def latest_collection(node: Node, now: datetime, interval: float, metrics: Iterable[int]
                      ) -> LatestCollection:
    """Read ``node``'s latest collection as of ``now`` and its samples of ``metrics``.

    ``interval`` is the collection interval, for the staleness rule. Whether a stale figure is
    shown (the overview, with a warning) or treated as unknown (the exports) is the caller's
    choice. Cost: two indexed queries (the latest collection, then its reading); one when there
    is no successful latest collection.
    """
    found = _LATEST_COLLECTION(node.pk)
    if not found:
        return LatestCollection(None, None, True, {})
    latest = found[0]
    age = (now - latest.at).total_seconds()
    samples: dict[int, Sample] = {}
    if latest.ok:
        readings = _HOST_READING_AT(node.pk, latest.at)
        if readings:
            samples = HOST.samples(readings[0], metrics)
    return LatestCollection(latest, age, age > stale_after(interval), samples)
