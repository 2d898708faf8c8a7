"""The engines' recent samples, read once per evaluation for every rule that asks.

Rules that judge an engine by its last minutes of samples (prefill stall, queue backlog) ask
:func:`engine_samples`. During one evaluation (:func:`one_read`, which ``evaluate_rules`` opens)
the first question about a metric reads it for every engine of the round, from the earliest
moment asked so far: one query per metric instead of one or two per engine and rule. Outside an
evaluation (a rule called on its own) each question is its own query.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime

from collectors.models import Engine
from collectors.readings import ENGINE

Rows = list[tuple[datetime, float | None]]


@dataclass
class _Read:
    """The samples read in one evaluation: metric -> (from when, engine id -> rows by time)."""

    engine_ids: frozenset[int]
    by_metric: dict[str, tuple[datetime, dict[int, Rows]]] = field(default_factory=dict)
    queries: int = 0

    def rows(self, engine_id: int, metric: str, since: datetime) -> Rows:
        held = self.by_metric.get(metric)
        if held is None or since < held[0]:
            held = (since, _read(self.engine_ids, metric, since))
            self.by_metric[metric] = held
            self.queries += 1
        return [row for row in held[1].get(engine_id, []) if row[0] >= since]


_current: ContextVar[_Read | None] = ContextVar("recent_engine_samples", default=None)


@contextmanager
def one_read(engines: Iterable[Engine]) -> Iterator[None]:
    """Within it, :func:`engine_samples` reads each metric once for all of ``engines``."""
    token = _current.set(_Read(engine_ids=frozenset(engine.pk for engine in engines)))
    try:
        yield
    finally:
        _current.reset(token)


def engine_samples(engine: Engine, metric: str, since: datetime) -> Rows:
    """``(at, value)`` of ``engine``'s samples of ``metric`` at or after ``since``, oldest
    first."""
    read = _current.get()
    if read is None or engine.pk not in read.engine_ids:
        return _read(frozenset([engine.pk]), metric, since).get(engine.pk, [])
    return read.rows(engine.pk, metric, since)


def _read(engine_ids: frozenset[int], metric: str, since: datetime) -> dict[int, Rows]:
    """One query: the engines' samples of ``metric`` since ``since``, per engine, by time."""
    rows: dict[int, Rows] = {}
    for engine_id, at, value in ENGINE.holding(metric).filter(
            engine_id__in=engine_ids, at__gte=since,
    ).order_by("engine_id", "at").values_list("engine_id", "at", "value"):
        rows.setdefault(engine_id, []).append((at, value))
    return rows
