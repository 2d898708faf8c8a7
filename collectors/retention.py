"""Roll raw samples up into per-minute rows, and prune both by age.

Raw samples are kept ``SPARKOPS_RAW_RETENTION_DAYS`` (default 7), per-minute roll-ups
``SPARKOPS_ROLLUP_RETENTION_DAYS`` (default 90). Roll-up is idempotent (a minute is recomputed
whole) and advances a per-node watermark; prune never deletes raw samples that are not rolled up
yet, so a stopped beat loses no history.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Avg, Count, Max, Min
from django.db.models.functions import TruncMinute

from collectors.models import (
    Collection,
    Engine,
    EngineMetric,
    EngineSample,
    Event,
    LedgerChange,
    Metric,
    Node,
    Rollup,
    Sample,
)

# A minute is rolled up only once it is this far in the past: the interval minimum of a
# collection is written a few seconds after the instant it belongs to.
ROLLUP_GRACE = timedelta(seconds=30)
# At most this much history is rolled up per node per run, so catching up stays bounded.
ROLLUP_CHUNK = timedelta(hours=6)


@dataclass(frozen=True)
class PruneResult:
    samples: int
    collections: int
    rollups: int


def floor_minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def rollup_node(node: Node, now: datetime, max_chunks: int = 8) -> int:
    """Roll up the node's complete minutes since its watermark; return rows written.

    Works in chunks of ``ROLLUP_CHUNK``, skipping stretches without samples, at most
    ``max_chunks`` per call so one run after a long stop stays bounded.
    """
    end = floor_minute(now - ROLLUP_GRACE)
    start = node.rolled_up_until
    written = 0
    for _ in range(max_chunks):
        first = _first_sample_at(node, start)
        if first is None or first >= end:
            _advance(node, end, [], start or end)
            break
        start = floor_minute(first)
        chunk_end = min(end, start + ROLLUP_CHUNK)
        rows = _rollup_rows(node, start, chunk_end)
        _advance(node, chunk_end, rows, start)
        written += len(rows)
        start = chunk_end
    return written


def _first_sample_at(node: Node, since: datetime | None) -> datetime | None:
    rows = Sample.objects.filter(node=node)
    if since is not None:
        rows = rows.filter(at__gte=since)
    return rows.order_by("at").values_list("at", flat=True).first()


def _rollup_rows(node: Node, start: datetime, end: datetime) -> list[Rollup]:
    groups = (
        Sample.objects.filter(node=node, at__gte=start, at__lt=end, value__isnull=False)
        .annotate(minute=TruncMinute("at"))
        .values("metric", "minute")
        .annotate(lo=Min("value"), hi=Max("value"), mean=Avg("value"), n=Count("id"))
    )
    return [
        Rollup(
            node=node, metric=g["metric"], minute=g["minute"],
            min=g["lo"], max=g["hi"], mean=g["mean"], count=g["n"],
        )
        for g in groups
    ]


def _advance(node: Node, until: datetime, rows: list[Rollup], start: datetime) -> None:
    """Replace the roll-ups of [start, until) with ``rows`` and move the watermark, atomically."""
    if node.rolled_up_until is not None and until <= node.rolled_up_until:
        return
    with transaction.atomic():
        Rollup.objects.filter(node=node, minute__gte=start, minute__lt=until).delete()
        Rollup.objects.bulk_create(rows)
        node.rolled_up_until = until
        node.save(update_fields=["rolled_up_until"])


def prune_node(node: Node, now: datetime, raw_days: float, rollup_days: float) -> PruneResult:
    """Delete raw samples older than ``raw_days`` (once rolled up) and roll-ups past
    ``rollup_days``."""
    raw_cutoff = now - timedelta(days=raw_days)
    if node.rolled_up_until is not None:
        raw_cutoff = min(raw_cutoff, node.rolled_up_until)
    else:
        raw_cutoff = min(raw_cutoff, now - timedelta(days=rollup_days))
    samples = 0
    for metric in Metric.values:  # one (node, metric, at) index range per delete
        samples += Sample.objects.filter(node=node, metric=metric, at__lt=raw_cutoff).delete()[0]
    collections = Collection.objects.filter(node=node, at__lt=raw_cutoff).delete()[0]
    history_cutoff = now - timedelta(days=rollup_days)
    rollups = Rollup.objects.filter(node=node, minute__lt=history_cutoff).delete()[0]
    # Engine series have no roll-up yet: they are kept as long as raw host samples. Events and
    # ledger changes (alert causes, timeline markers) are few and kept as long as roll-ups.
    engine_cutoff = now - timedelta(days=raw_days)
    for engine_id in Engine.objects.filter(node=node).values_list("pk", flat=True):
        for metric in EngineMetric.values:  # one (engine, metric, at) index range per delete
            samples += EngineSample.objects.filter(engine_id=engine_id, metric=metric,
                                                   at__lt=engine_cutoff).delete()[0]
    Event.objects.filter(node=node, at__lt=history_cutoff).delete()
    LedgerChange.objects.filter(node=node, at__lt=history_cutoff).delete()
    return PruneResult(samples=samples, collections=collections, rollups=rollups)
