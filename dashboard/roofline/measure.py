"""The roofline's measurements from the database: the single-stream decode rate, the engines
generating beside it, and the node's memory pressure meanwhile."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Max, Q

from collectors.models import Engine, EngineMetric, EngineReading, Metric
from collectors.readings import ENGINE, HOST

SINGLE_STREAM_LOOKBACK = timedelta(days=7)
SINGLE_STREAM_SAMPLES = 30


@dataclass(frozen=True)
class Measured:
    """The measured single-stream decode (None: no qualifying moment yet)."""

    tps: float | None
    samples: int = 0
    first_at: datetime | None = None
    last_at: datetime | None = None
    moments: list[datetime] = field(default_factory=list)


def single_stream_decode(engine: Engine, now: datetime, interval: float) -> Measured:
    """Median decode tok/s of the latest collections with exactly one request running.

    A collection counts when it and the one before (at most 1.5 collection intervals earlier)
    both saw one running request and the decode rate was above 0 (a lone request still in its
    prefill decodes nothing). Uses the latest :data:`SINGLE_STREAM_SAMPLES` within a week, as
    far back as raw samples are kept (``SPARKOPS_RAW_RETENTION_DAYS``, a day by default).
    """
    since = now - SINGLE_STREAM_LOOKBACK
    ones = list(ENGINE.holding(EngineMetric.REQUESTS_RUNNING).filter(
        engine=engine, value=1, at__gte=since, at__lte=now,
    ).order_by("at").values_list("at", flat=True))
    most = timedelta(seconds=1.5 * interval)
    qualifying = [at for before, at in zip(ones, ones[1:], strict=False) if at - before <= most]
    if not qualifying:
        return Measured(None)
    decode = list(ENGINE.holding(EngineMetric.DECODE_TPS).filter(
        engine=engine, value__gt=0, at__in=qualifying[-5 * SINGLE_STREAM_SAMPLES:],
    ).order_by("-at").values_list("at", "value")[:SINGLE_STREAM_SAMPLES])
    if not decode:
        return Measured(None)
    moments = sorted(at for at, _ in decode)
    return Measured(statistics.median(v for _, v in decode), len(decode), moments[0], moments[-1],
                    moments)


def busy_neighbours(engine: Engine, moments: list[datetime]) -> dict[str, int]:
    """Other engines of the node generating (decode or prefill above 0) at the measured moments:
    name → how many of those moments. They read the same memory at the same time. (One
    collection scrapes every engine of a node and stamps their samples with the same instant.)"""
    if not moments:
        return {}
    decode, prefill = (ENGINE.column(EngineMetric.DECODE_TPS),
                       ENGINE.column(EngineMetric.PREFILL_TPS))
    rows = EngineReading.objects.filter(
        Q(**{f"{decode}__gt": 0}) | Q(**{f"{prefill}__gt": 0}),
        engine__node_id=engine.node_id, at__in=moments,
    ).exclude(engine=engine).values_list("engine__name", "at")
    seen: dict[str, set[datetime]] = {}
    for name, at in rows:
        seen.setdefault(name, set()).add(at)
    return {name: len(ats) for name, ats in sorted(seen.items())}


def peak_pressure(engine: Engine, measured: Measured) -> float | None:
    """The highest PSI (some, avg10, %) of the node while the measurement was taken."""
    if measured.first_at is None or measured.last_at is None:
        return None
    return HOST.holding(Metric.PSI_SOME_AVG10).filter(
        node_id=engine.node_id,
        at__gte=measured.first_at - timedelta(seconds=30), at__lte=measured.last_at,
    ).aggregate(peak=Max("value"))["peak"]
