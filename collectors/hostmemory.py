"""Collect one interval of a node's host memory and store it as a collection and its samples."""

from __future__ import annotations

from django.db import transaction

from collectors.meminfo import MemInfo
from collectors.models import Collection, Metric, Node, Sample
from collectors.procfs import Procfs
from collectors.sampling import Clock, WindowReading, watch_host_memory

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


def collect_host_memory(
    node: Node, procfs: Procfs, *, duration: float, period: float, clock: Clock | None = None
) -> tuple[Collection, WindowReading]:
    """Watch the node's memory for ``duration`` seconds and store what was seen.

    Blocks for ``duration``. Writes one :class:`Collection` and, when meminfo was readable,
    one :class:`Sample` per metric, all in one transaction.
    """
    window = watch_host_memory(procfs, duration=duration, period=period, clock=clock)
    return record_window(node, window), window


def window_figures(window: WindowReading) -> dict[str, int | None]:
    """The host numbers of one interval the ledger needs, in bytes (None: unknown)."""
    info = window.last
    if info is None:
        return {}
    return {
        "mem_total": info.get("MemTotal"),
        "mem_available": info.mem_available,
        "mem_available_min": window.min_available,
        "page_cache_reclaimable": info.page_cache_reclaimable(),
        "swap_used": info.swap_used(),
    }


def record_window(node: Node, window: WindowReading) -> Collection:
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
            Sample.objects.bulk_create(_samples(node, window, window.last))
            total = window.last.get("MemTotal")
            if total is not None and total != node.mem_total_bytes:
                node.mem_total_bytes = total
        node.last_collection_at = window.finished_at
        node.save(update_fields=["mem_total_bytes", "last_collection_at"])
    return collection


def _samples(node: Node, window: WindowReading, info: MemInfo) -> list[Sample]:
    at = window.finished_at
    samples = [
        _sample(node, metric, at, info.get(field), info.unknown.get(field, ""))
        for field, metric in _FIELD_METRICS.items()
        if field in info.values or field in info.unknown
    ]
    samples.append(
        _sample(
            node,
            Metric.PAGE_CACHE_RECLAIMABLE,
            at,
            info.page_cache_reclaimable(),
            info.derived_unknown_reason("Cached", "Shmem", "Buffers", "SReclaimable"),
        )
    )
    samples.append(
        _sample(
            node, Metric.SWAP_USED, at, info.swap_used(),
            info.derived_unknown_reason("SwapTotal", "SwapFree"),
        )
    )
    # The minimum is stored at the instant it was seen, so a dip is drawn where it happened.
    samples.append(
        _sample(
            node,
            Metric.MEM_AVAILABLE_MIN,
            window.min_available_at or at,
            window.min_available,
            "" if window.min_available is not None else "MemAvailable unknown all interval",
        )
    )
    pressure = window.pressure
    no_psi = "no /proc/pressure/memory (kernel without PSI)"
    samples.append(
        _sample(node, Metric.PSI_SOME_AVG10, at, pressure and pressure.some_avg10,
                no_psi if pressure is None else "no 'some' line in /proc/pressure/memory")
    )
    samples.append(
        _sample(node, Metric.PSI_FULL_AVG10, at, pressure and pressure.full_avg10,
                no_psi if pressure is None else "no 'full' line in /proc/pressure/memory")
    )
    return samples


def _sample(node: Node, metric: Metric, at, value: float | None, note: str) -> Sample:
    return Sample(
        node=node, metric=metric, at=at, value=value, note="" if value is not None else note[:200]
    )
