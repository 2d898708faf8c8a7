"""Roll raw samples up into tiers of coarser buckets, and prune every tier by age.

A GB10 collects every 5 s: 64 values per collection with four engines, over a million rows a
day. Kept raw for a month that is gigabytes, and a 30-day chart would read millions of rows. So,
as monitoring systems with long memories do, history is kept in tiers:

=========================  ==========  ===============================================
Tier                        Bucket      Kept
=========================  ==========  ===============================================
raw samples (readings)      5 s         ``SPARKOPS_RAW_RETENTION_DAYS`` (default 1)
minute roll-ups             1 min       2 days
ten-minute roll-ups         10 min      35 days
hourly roll-ups             1 h         ``SPARKOPS_ROLLUP_RETENTION_DAYS`` (default 90)
=========================  ==========  ===============================================

(no tier is kept past ``SPARKOPS_ROLLUP_RETENTION_DAYS``). Each roll-up row holds its bucket's
min, mean, max and sample count, for host metrics (:class:`Rollup`), engine metrics
(:class:`EngineRollup`) and GPU metrics (:class:`GpuRollup`) alike, so the minimum a transient
prefill buffer makes survives every tier, and a chart over any range reads at most a couple of
thousand rows per series (``dashboard.series``). The three are one :class:`Family` each: its
raw table, its roll-up table and the keys a series is told apart by. Host and engine samples
are raw readings, a row per collection with a column per metric (``collectors.readings``), and
their minutes are computed from the columns; GPU samples are a row each.

Roll-up is idempotent (a bucket is recomputed whole) and advances one per-node watermark; a
bucket of a coarser tier is computed from the tier below once its last minute is rolled up.
Prune never deletes raw samples that are not rolled up yet, so a stopped beat loses no history.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial

from django.db import transaction
from django.db.models import Avg, Count, Max, Min, Model, QuerySet
from django.db.models.functions import TruncMinute

from collectors.models import (
    Collection,
    Engine,
    EngineReading,
    EngineRollup,
    Event,
    GpuMetric,
    GpuRollup,
    GpuSample,
    HostReading,
    LedgerChange,
    Node,
    Rollup,
)
from collectors.readings import ENGINE, HOST, Layout

# A minute is rolled up only once it is this far in the past: the interval minimum of a
# collection is written a few seconds after the instant it belongs to.
ROLLUP_GRACE = timedelta(seconds=30)
# At most this much history is rolled up per node per run, so catching up stays bounded.
ROLLUP_CHUNK = timedelta(hours=6)


@dataclass(frozen=True)
class Tier:
    """One roll-up tier: buckets of ``resolution`` seconds kept ``keep`` (None: as long as
    history is kept, ``SPARKOPS_ROLLUP_RETENTION_DAYS``)."""

    resolution: int
    keep: timedelta | None
    label: str


MINUTE = Tier(60, timedelta(days=2), "1 min")
TIERS = (MINUTE, Tier(600, timedelta(days=35), "10 min"), Tier(3600, None, "1 h"))


@dataclass(frozen=True)
class PruneResult:
    samples: int  # raw rows: host and engine readings, GPU samples
    collections: int
    rollups: int


def floor_minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def floor_to(moment: datetime, seconds: int) -> datetime:
    """``moment`` rounded down to a multiple of ``seconds`` since the epoch (UTC)."""
    stamp = moment.timestamp()
    return datetime.fromtimestamp(stamp - stamp % seconds, UTC)


@dataclass(frozen=True)
class Family:
    """One kind of series of a node: its raw samples and roll-ups (querysets limited to the
    node), the keys that tell its series apart, how a roll-up row of it is made, and, for
    readings, their layout (None: a row per sample)."""

    samples: QuerySet
    rollups: QuerySet
    keys: tuple[str, ...]
    make: Callable[..., Model]
    layout: Layout | None = None

    def first_at(self, since: datetime | None) -> datetime | None:
        """The earliest raw sample at or after ``since``."""
        if self.layout is not None:
            return self.layout.first_at(self.samples, since)
        rows = self.samples if since is None else self.samples.filter(at__gte=since)
        return rows.aggregate(first=Min("at"))["first"]

    def minute_rows(self, start: datetime, until: datetime) -> list[dict]:
        """Per-minute min/max/mean/count of the raw samples in [start, until), by series."""
        if self.layout is not None:
            rows = self.layout.minute_rows(self.samples, self.keys[:-1], start, until)
            return [{**row, "resolution": MINUTE.resolution} for row in rows]
        return _minute_rows(self.samples, self.keys, start, until)


def families(node: Node, engine_ids: list[int]) -> tuple[Family, ...]:
    """The node's host, engine and GPU series, each rolled up and pruned the same way."""
    return (
        Family(HostReading.objects.filter(node=node), Rollup.objects.filter(node=node),
               ("metric",), partial(Rollup, node=node), HOST),
        Family(EngineReading.objects.filter(engine_id__in=engine_ids),
               EngineRollup.objects.filter(engine_id__in=engine_ids), ("engine_id", "metric"),
               EngineRollup, ENGINE),
        Family(GpuSample.objects.filter(node=node), GpuRollup.objects.filter(node=node),
               ("device_index", "metric"), partial(GpuRollup, node=node)),
    )


def rollup_node(node: Node, now: datetime, max_chunks: int = 8) -> int:
    """Roll up the node's complete minutes since its watermark, and the coarser buckets they
    complete; return the roll-up rows written.

    Works in chunks of ``ROLLUP_CHUNK``, skipping stretches without samples, at most
    ``max_chunks`` per call so one run after a long stop stays bounded.
    """
    end = floor_minute(now - ROLLUP_GRACE)
    start = node.rolled_up_until
    kinds = families(node, list(Engine.objects.filter(node=node).values_list("pk", flat=True)))
    written = 0
    for _ in range(max_chunks):
        first = _first_sample_at(kinds, start)
        if first is None or first >= end:
            if node.rolled_up_until is None or end > node.rolled_up_until:
                _advance(node, kinds, start or end, end)
            break
        start = floor_minute(first)
        chunk_end = min(end, start + ROLLUP_CHUNK)
        rows = _advance(node, kinds, start, chunk_end)
        if rows is None:  # another run rolled this node up meanwhile: it carries on
            break
        written += rows
        start = chunk_end
    return written


def _first_sample_at(kinds: tuple[Family, ...], since: datetime | None) -> datetime | None:
    firsts = [family.first_at(since) for family in kinds]
    return min((moment for moment in firsts if moment is not None), default=None)


def _advance(node: Node, kinds: tuple[Family, ...], start: datetime, until: datetime
             ) -> int | None:
    """Recompute the minutes of [start, until), the coarser buckets completed since the
    watermark (samples may have paused in between), and move the watermark, atomically.

    Returns the rows written, or None when another run moved the watermark first."""
    watermark = node.rolled_up_until
    if watermark is not None and until <= watermark:
        return 0
    completed_since = min(start, watermark or start)
    written = 0
    with transaction.atomic():
        # Compare-and-set first: a concurrent run that moved the watermark since ``node`` was
        # read wins, and this one writes nothing (the update also takes the write lock, so the
        # two never interleave).
        if not Node.objects.filter(pk=node.pk, rolled_up_until=watermark).update(
                rolled_up_until=until):
            node.refresh_from_db(fields=["rolled_up_until"])
            return None
        for family in kinds:
            minutes = family.minute_rows(start, until)
            written += _replace(family.rollups, start, until, MINUTE,
                                [family.make(**row) for row in minutes])
        for finer, tier in zip(TIERS, TIERS[1:], strict=False):
            written += _rollup_tier(kinds, finer, tier, completed_since, until)
        node.rolled_up_until = until
    return written


def _minute_rows(samples, keys: tuple[str, ...], start: datetime, until: datetime) -> list[dict]:
    """Per-minute min/max/mean/count of the samples (a row each) in [start, until), grouped by
    ``keys``."""
    groups = (
        samples.filter(at__gte=start, at__lt=until, value__isnull=False)
        .annotate(bucket=TruncMinute("at"))
        .values(*keys, "bucket")
        .annotate(lo=Min("value"), hi=Max("value"), avg=Avg("value"), n=Count("id"))
    )
    return [{**{key: g[key] for key in keys}, "resolution": MINUTE.resolution,
             "start": g["bucket"], "min": g["lo"], "max": g["hi"], "mean": g["avg"],
             "count": g["n"]} for g in groups]


def _rollup_tier(kinds: tuple[Family, ...], finer: Tier, tier: Tier, start: datetime,
                 until: datetime) -> int:
    """The buckets of ``tier`` that end in (start, until], from the rows of ``finer``."""
    first = floor_to(start, tier.resolution)
    last = floor_to(until, tier.resolution)  # buckets starting here are not complete yet
    if last <= first:
        return 0
    written = 0
    for family in kinds:
        rows = family.rollups.filter(resolution=finer.resolution, start__gte=first,
                                     start__lt=last)
        written += _replace(family.rollups, first, last, tier,
                            [family.make(**row) for row in _merge(rows, family.keys, tier)])
    return written


def _merge(rows, keys: tuple[str, ...], tier: Tier) -> Iterable[dict]:
    """Finer roll-up rows merged into ``tier``'s buckets: min of mins, max of maxes, the mean
    weighted by sample counts."""
    buckets: dict[tuple, list] = defaultdict(lambda: [float("inf"), float("-inf"), 0.0, 0])
    for row in rows.values_list(*keys, "start", "min", "max", "mean", "count"):
        *key_values, at, lo, hi, mean, count = row
        bucket = buckets[(*key_values, floor_to(at, tier.resolution))]
        bucket[0] = min(bucket[0], lo)
        bucket[1] = max(bucket[1], hi)
        bucket[2] += mean * count
        bucket[3] += count
    for (*key_values, at), (lo, hi, total, count) in buckets.items():
        yield {**dict(zip(keys, key_values, strict=True)), "resolution": tier.resolution,
               "start": at, "min": lo, "max": hi, "mean": total / count, "count": count}


def _replace(table, start: datetime, until: datetime, tier: Tier, rows: list) -> int:
    table.filter(resolution=tier.resolution, start__gte=start, start__lt=until).delete()
    table.model.objects.bulk_create(rows, batch_size=2000)
    return len(rows)


def prune_node(node: Node, now: datetime, raw_days: float, rollup_days: float) -> PruneResult:
    """Delete raw samples older than ``raw_days`` (once rolled up), each roll-up tier past its
    age, and events and ledger changes past ``rollup_days``."""
    raw_cutoff = now - timedelta(days=raw_days)
    if node.rolled_up_until is not None:
        raw_cutoff = min(raw_cutoff, node.rolled_up_until)
    else:
        raw_cutoff = min(raw_cutoff, now - timedelta(days=rollup_days))
    engine_ids = list(Engine.objects.filter(node=node).values_list("pk", flat=True))
    # One (node, at), (engine, at) or (node, metric, at) index range per delete.
    samples = HostReading.objects.filter(node=node, at__lt=raw_cutoff).delete()[0]
    for engine_id in engine_ids:
        samples += EngineReading.objects.filter(engine_id=engine_id,
                                                at__lt=raw_cutoff).delete()[0]
    for metric in GpuMetric.values:
        samples += GpuSample.objects.filter(node=node, metric=metric,
                                            at__lt=raw_cutoff).delete()[0]
    collections = Collection.objects.filter(node=node, at__lt=raw_cutoff).delete()[0]
    history = timedelta(days=rollup_days)
    rollups = 0
    for tier in TIERS:
        cutoff = now - min(tier.keep or history, history)
        for family in families(node, engine_ids):
            rollups += family.rollups.filter(resolution=tier.resolution,
                                             start__lt=cutoff).delete()[0]
    # Events and ledger changes (alert causes, timeline markers) are few: kept as long as history.
    Event.objects.filter(node=node, at__lt=now - history).delete()
    LedgerChange.objects.filter(node=node, at__lt=now - history).delete()
    return PruneResult(samples=samples, collections=collections, rollups=rollups)
