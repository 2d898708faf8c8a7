"""Raw samples as they are stored: a reading (a row) per collection, a column per metric.

A collection writes about 70 figures at four engines. Stored a row each (node, metric, time,
value), their row headers and index entries cost more than the figures themselves: 170–180
bytes a figure on PostgreSQL, two thirds of 30 days of history in its last day. So a collection's
host figures are one :class:`~collectors.models.HostReading` and each engine's one
:class:`~collectors.models.EngineReading`, and this module is the one place that knows how a
metric is kept in them:

- a figure's column is its metric's name in lower case (``Metric.MEM_AVAILABLE`` is
  ``mem_available``);
- its time is the reading's ``at``, except an interval minimum's, which has a column of its own
  (``mem_available_min_at``): the instant it was seen, so a dip is drawn where it happened;
- a NULL figure with no note was not read (a memory budget that is not watched: nothing to
  draw); a NULL figure with a note in ``notes`` (by metric id) was read as unknown, and the note
  says why (a gap in a chart, the reason on a page).

The collectors build readings from :class:`Sample` values (:meth:`Layout.reading`,
:func:`engine_readings`); rules and pages ask for one metric's figures (:meth:`Layout.holding`)
or a reading's (:meth:`Layout.samples`); the roll-ups group the columns per minute in SQL
(:meth:`Layout.minute_rows`) and the charts read every asked column of a reading at once and
unfold it into a row per figure (``dashboard.series``, by :meth:`Layout.column`,
:meth:`Layout.time` and :meth:`Layout.is_read`), so the tiers above the raw one, and what a
chart receives, are what they were when each figure was a row.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import (
    Avg,
    Count,
    F,
    IntegerChoices,
    Max,
    Min,
    Model,
    Q,
    QuerySet,
)
from django.db.models.functions import TruncMinute

from collectors.models import Engine, EngineMetric, EngineReading, HostReading, Metric


@dataclass(frozen=True)
class Sample:
    """One figure of one metric at one instant: ``value`` None when it was read as unknown,
    ``note`` then saying why."""

    metric: int
    at: datetime
    value: float | None
    note: str = ""


@dataclass(frozen=True)
class Layout:
    """How the figures of one kind of reading are kept: the model, the field naming what a
    reading belongs to (``node`` or ``engine``), its metrics, and the metrics whose time is a
    column of its own."""

    model: type[Model]
    owner: str
    metrics: type[IntegerChoices]
    timed: Mapping[int, str] = field(default_factory=dict)

    def column(self, metric: int) -> str:
        """The column holding ``metric``'s figure."""
        return self.metrics(metric).name.lower()

    def time(self, metric: int) -> str:
        """The column holding the time of ``metric``'s figure."""
        return self.timed.get(metric, "at")

    def holding(self, metric: int) -> QuerySet:
        """The readings that hold a known figure of ``metric``, with it as ``value``:
        ``holding(M).filter(node=n, value__gt=0).values_list("at", "value")``. Its time is
        ``at``, except for a metric of :attr:`timed`, whose time is :meth:`time`."""
        column = self.column(metric)
        return self.model.objects.filter(**{f"{column}__isnull": False}) \
            .annotate(value=F(column))

    def holding_any(self, metrics: Iterable[int]) -> Q:
        """Readings that hold a known figure of any of ``metrics``."""
        condition = Q()
        for metric in metrics:
            condition |= Q(**{f"{self.column(metric)}__isnull": False})
        return condition

    def is_read(self, metric: int, value: float | None, notes: Mapping[str, str]) -> bool:
        """Whether a reading with ``value`` and ``notes`` read ``metric``: known, or unknown with
        a note."""
        return value is not None or str(int(metric)) in notes

    def minute_rows(self, readings: QuerySet, owner_keys: tuple[str, ...], start: datetime,
                    until: datetime) -> list[dict[str, Any]]:
        """Per owner (``owner_keys``, e.g. ``("engine_id",)``; none when ``readings`` belong to
        one node), minute and metric: min, max, mean and count of the known figures timed in
        [start, until), in one grouped query per time column."""
        found: list[dict[str, Any]] = []
        for time, metrics in self._by_time().items():
            rows = readings.filter(**{f"{time}__gte": start, f"{time}__lt": until})
            if time != "at":
                rows = rows.filter(at__gte=start)
            aggregates: dict[str, Any] = {}
            for metric in metrics:
                column = self.column(metric)
                aggregates |= {f"lo_{column}": Min(column), f"hi_{column}": Max(column),
                               f"avg_{column}": Avg(column), f"n_{column}": Count(column)}
            groups = rows.annotate(bucket=TruncMinute(time)).values(*owner_keys, "bucket") \
                .annotate(**aggregates).order_by()
            for group in groups:
                owner = {key: group[key] for key in owner_keys}
                for metric in metrics:
                    column = self.column(metric)
                    if group[f"n_{column}"]:
                        found.append({**owner, "metric": int(metric), "start": group["bucket"],
                                      "min": group[f"lo_{column}"], "max": group[f"hi_{column}"],
                                      "mean": group[f"avg_{column}"],
                                      "count": group[f"n_{column}"]})
        return found

    def first_at(self, readings: QuerySet, since: datetime | None) -> datetime | None:
        """The earliest time of a figure in ``readings`` at or after ``since``."""
        rows = readings if since is None else readings.filter(at__gte=since)
        times = ("at", *self.timed.values())
        firsts = rows.aggregate(**{time: Min(time) for time in times})
        return min((moment for moment in firsts.values()
                    if moment is not None and (since is None or moment >= since)), default=None)

    def samples(self, reading: Model, metrics: Iterable[int] | None = None) -> dict[int, Sample]:
        """A reading's figures (of ``metrics``, else all) by metric: those it holds and those it
        read as unknown."""
        found: dict[int, Sample] = {}
        for metric in self.metrics if metrics is None else metrics:
            value = getattr(reading, self.column(metric))
            if not self.is_read(metric, value, reading.notes):
                continue
            at = getattr(reading, self.time(metric)) or reading.at
            found[int(metric)] = Sample(int(metric), at, value,
                                        reading.notes.get(str(int(metric)), ""))
        return found

    def reading(self, owner: Model, at: datetime, samples: Iterable[Sample]) -> Model:
        """An unsaved reading of ``owner`` at ``at`` holding ``samples`` (a later sample of a
        metric replaces an earlier one)."""
        row = self.model(**{self.owner: owner, "at": at})
        notes: dict[str, str] = {}
        for sample in samples:
            setattr(row, self.column(sample.metric), sample.value)
            if sample.metric in self.timed:
                setattr(row, self.timed[sample.metric], sample.at)
            notes.pop(str(int(sample.metric)), None)
            if sample.value is None:
                notes[str(int(sample.metric))] = sample.note
        row.notes = notes
        return row

    def _by_time(self) -> dict[str, list[int]]:
        by_time: dict[str, list[int]] = {}
        for metric in self.metrics:
            by_time.setdefault(self.time(metric), []).append(int(metric))
        return by_time


HOST = Layout(HostReading, "node", Metric, {
    Metric.MEM_AVAILABLE_MIN: "mem_available_min_at",
    Metric.MEMORY_BUDGET_ROOM_MIN: "memory_budget_room_min_at",
})
ENGINE = Layout(EngineReading, "engine", EngineMetric)


def stored_notes(raw: str | Mapping[str, str] | None) -> Mapping[str, str]:
    """A reading's ``notes`` as a database cursor returns them: JSON text (SQLite), already a
    dict (PostgreSQL's jsonb through psycopg), or NULL."""
    if not raw or raw == "{}":
        return {}
    return json.loads(raw) if isinstance(raw, str) else raw


def engine_readings(samples: Iterable[tuple[Engine, Sample]]) -> list[EngineReading]:
    """Unsaved readings of the engines' ``samples``: one per engine and instant."""
    grouped: dict[tuple[int, datetime], tuple[Engine, list[Sample]]] = {}
    for engine, sample in samples:
        grouped.setdefault((engine.pk, sample.at), (engine, []))[1].append(sample)
    return [ENGINE.reading(engine, at, held) for (_, at), (engine, held) in grouped.items()]
