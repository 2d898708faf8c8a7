"""Raw samples for tests: store one figure as a collection would, and read every stored figure
back a row each (``collectors.readings`` keeps them a reading per collection, a column per
metric).

``host_sample(node, Metric.MEM_AVAILABLE, at, value)`` puts the figure into the node's reading
at ``at``, made when there is none, so several figures of one instant are one reading, as a
collection writes them. An interval minimum is seen inside its collection's window: pass
``reading_at`` (the collection's time) when it belongs to a reading later than the minimum.
"""

from __future__ import annotations

from datetime import datetime

from collectors.models import Engine, EngineReading, HostReading, Node
from collectors.readings import ENGINE, HOST, Layout, Sample


def host_sample(node: Node, metric: int, at: datetime, value: float | None, note: str = "",
                reading_at: datetime | None = None) -> HostReading:
    """Store one host figure (``note``: why it is unknown, when ``value`` is None)."""
    return _store(HOST, node, reading_at or at, Sample(metric, at, value, note))


def engine_sample(engine: Engine, metric: int, at: datetime, value: float | None
                  ) -> EngineReading:
    """Store one engine figure in the engine's reading at ``at``."""
    return _store(ENGINE, engine, at, Sample(metric, at, value))


def host_samples(node: Node | None = None, metric: int | None = None) -> list[Sample]:
    """Every stored host figure (of ``node``, of ``metric``), by time then metric."""
    rows = HostReading.objects.all() if node is None else HostReading.objects.filter(node=node)
    return _unfold(HOST, rows, metric)


def engine_samples(engine: Engine | None = None, metric: int | None = None) -> list[Sample]:
    """Every stored engine figure (of ``engine``, of ``metric``), by time then metric."""
    rows = EngineReading.objects.all() if engine is None else \
        EngineReading.objects.filter(engine=engine)
    return _unfold(ENGINE, rows, metric)


def _store(layout: Layout, owner, at: datetime, sample: Sample):
    existing = layout.model.objects.filter(**{layout.owner: owner, "at": at}).first()
    held = [] if existing is None else list(layout.samples(existing).values())
    reading = layout.reading(owner, at, [*held, sample])
    if existing is not None:
        reading.pk = existing.pk
    reading.save()
    return reading


def _unfold(layout: Layout, rows, metric: int | None) -> list[Sample]:
    metrics = None if metric is None else [metric]
    found = [sample for reading in rows for sample in layout.samples(reading, metrics).values()]
    return sorted(found, key=lambda sample: (sample.at, sample.metric))
