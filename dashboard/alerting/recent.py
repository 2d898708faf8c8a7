"""The engines' recent figures that rules judge, read once per evaluation for every rule that asks.

Two rules judge an engine by its last minutes of samples: queue backlog (is anyone waiting now,
and since when) and prefill stall (the best decode rate of the last seconds against the usual
one of the last minutes). Each asks here for no more than it uses: the newest figure
(:func:`latest_value`), the largest (:func:`peak_value`), the figures without their times
(:func:`values_since`), or the rows with their times (:func:`newest_samples`), which queue
backlog reads only for the engines on which someone waits. A time is read only where a rule
needs it: on SQLite every time read is text parsed into a datetime, which cost more than the
rest of a 30-minute read.

During one evaluation (:func:`one_read`, which ``evaluate_rules`` opens) the first question of
each kind about a metric and a start reads it for every engine of the round: one query per
question instead of one per engine and rule, whatever the engine count. The rules ask with a
start relative to the round's ``now``, so every engine's question is the same one. Outside an
evaluation (a rule called on its own) each question is its own query. Each query is bounded by
its start time, so a node's age does not grow it, and each is a prepared read
(``sparkops.prepared``, one per question and metric): the ORM compiles it once, not every
round.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import Any

from django.db.models import Max, OuterRef, QuerySet, Subquery

from collectors.models import Engine
from collectors.readings import ENGINE
from sparkops.prepared import PreparedRead

Rows = list[tuple[datetime, float]]
# What one question read for its engines: engine id -> its answer (absent: nothing read).
ByEngine = dict[int, Any]


@dataclass
class _Read:
    """The answers read in one evaluation: (question, metric, since, …) -> answers by engine."""

    engine_ids: frozenset[int]
    answers: dict[tuple, ByEngine] = field(default_factory=dict)

    def answer(self, key: tuple, read: Callable[[frozenset[int]], ByEngine]) -> ByEngine:
        if key not in self.answers:
            self.answers[key] = read(self.engine_ids)
        return self.answers[key]


_current: ContextVar[_Read | None] = ContextVar("recent_engine_figures", default=None)


@contextmanager
def one_read(engines: Iterable[Engine]) -> Iterator[None]:
    """Within it, each question of this module is read once for all of ``engines``."""
    token = _current.set(_Read(engine_ids=frozenset(engine.pk for engine in engines)))
    try:
        yield
    finally:
        _current.reset(token)


def _asked(engine: Engine, key: tuple, read: Callable[[frozenset[int]], ByEngine]) -> ByEngine:
    """The answers to the question ``key`` that hold ``engine``'s: the round's, read once for
    all of its engines, or, outside a round, read for ``engine`` alone."""
    round_ = _current.get()
    if round_ is None or engine.pk not in round_.engine_ids:
        return read(frozenset([engine.pk]))
    return round_.answer(key, read)


def latest_value(engine: Engine, metric: int, since: datetime) -> float | None:
    """``engine``'s newest figure of ``metric`` at or after ``since``; None without one.
    Cost: one query for the round's engines (the newest reading of each that holds one, found
    from its end of the readings' (engine, time) index)."""
    def read(engine_ids: frozenset[int]) -> ByEngine:
        return {engine_id: value for engine_id, value
                in _latest(int(metric))(sorted(engine_ids), since) if value is not None}
    return _asked(engine, ("latest", metric, since), read).get(engine.pk)


def peak_value(engine: Engine, metric: int, since: datetime) -> float | None:
    """``engine``'s largest figure of ``metric`` at or after ``since``; None without one.
    Cost: one grouped query for the round's engines."""
    def read(engine_ids: frozenset[int]) -> ByEngine:
        return dict(_peak(int(metric))(sorted(engine_ids), since))
    return _asked(engine, ("peak", metric, since), read).get(engine.pk)


def values_since(engine: Engine, metric: int, since: datetime, *,
                 above: float | None = None) -> list[float]:
    """``engine``'s figures of ``metric`` at or after ``since`` (only those above ``above``,
    when given), oldest first, without their times. Cost: one query for the round's engines."""
    floor = None if above is None else float(above)  # the column's kind: one prepared shape

    def read(engine_ids: frozenset[int]) -> ByEngine:
        found: ByEngine = {}
        for engine_id, value in _values(int(metric))(sorted(engine_ids), since, floor):
            found.setdefault(engine_id, []).append(value)
        return found
    return _asked(engine, ("values", metric, since, above), read).get(engine.pk, [])


def newest_samples(engines: list[Engine], metric: int, since: datetime,
                   limit: int) -> dict[int, Rows]:
    """``(at, value)`` of each of ``engines``' newest ``limit`` figures of ``metric`` at or after
    ``since``, newest first, by engine id. Cost: one query for all of ``engines`` (none for
    none), every figure since ``since`` read with its time."""
    if not engines:
        return {}
    found: dict[int, Rows] = {}
    for engine_id, at, value in _newest(int(metric))(sorted(engine.pk for engine in engines),
                                                           since):
        rows = found.setdefault(engine_id, [])
        if len(rows) < limit:
            rows.append((at, value))
    return found


def _since(engine_ids: Iterable[int], metric: int, since: datetime) -> QuerySet:
    """The engines' readings that hold a figure of ``metric`` at or after ``since``."""
    return ENGINE.holding(metric).filter(engine_id__in=engine_ids, at__gte=since)


# The questions of a round, each a prepared read per metric (the metric names the column), made
# once: they run after every collection.
@cache
def _latest(metric: int) -> PreparedRead:
    def build(engine_ids: list[int], since: datetime) -> QuerySet:
        newest = ENGINE.holding(metric).filter(engine_id=OuterRef("pk"), at__gte=since) \
            .order_by("-at").values("value")[:1]
        return Engine.objects.filter(pk__in=engine_ids).annotate(newest=Subquery(newest)) \
            .order_by().values_list("pk", "newest")
    return PreparedRead(build)


@cache
def _peak(metric: int) -> PreparedRead:
    return PreparedRead(lambda engine_ids, since: _since(engine_ids, metric, since)
                        .values("engine_id").annotate(peak=Max(ENGINE.column(metric)))
                        .values_list("engine_id", "peak"))


@cache
def _values(metric: int) -> PreparedRead:
    def build(engine_ids: list[int], since: datetime, above: float | None) -> QuerySet:
        rows = _since(engine_ids, metric, since)
        if above is not None:
            rows = rows.filter(value__gt=above)
        return rows.order_by("engine_id", "at").values_list("engine_id", "value")
    return PreparedRead(build)


@cache
def _newest(metric: int) -> PreparedRead:
    return PreparedRead(lambda engine_ids, since: _since(engine_ids, metric, since)
                        .order_by("engine_id", "-at").values_list("engine_id", "at", "value"))

