"""A node's history as SparkOps stores it, generated in bulk: 30 days of 5 s collections.

What a node with four engines accumulates at the default interval, under the tiers the code
keeps (``collectors.retention``):

* raw rows — every 5 s a collection row, one host reading (``collectors.readings.HOST``: 21
  figures in columns, 11 meminfo fields, 5 derived, 5 of fragmentation:
  ``collectors.fragmentation``; the interval minimum's own time) and one engine reading per
  engine (``ENGINE``: 12 figures, container memory, 3 gauges, 8 rates) — for the last
  ``SPARKOPS_RAW_RETENTION_DAYS`` (1);
* roll-ups (min/mean/max/count) of every host and engine metric, per minute for the last 2 days,
  per ten minutes for the last 35 days and per hour for the whole span.

Where raw rows are kept the roll-ups are made from them; further back, each minute's figures
are drawn directly (three draws stand for its twelve collections), which gives the same rows at
a fraction of the cost. The caller then runs the project's own ``prune_node`` over the result,
so the database holds what retention keeps even if the code changes after this was written.

Values are synthetic but shaped like real ones (byte counts in whole KiB, rates and fractions
with decimals), which matters for SQLite's variable-length records. Rows go straight in with
the driver's bulk path (``executemany`` on SQLite, ``COPY`` on PostgreSQL), one day per
transaction, oldest first; after each day the caller can measure how much the database grew.
"""

from __future__ import annotations

import math
import random
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

GIB = 1024**3
INTERVAL = timedelta(seconds=5)
WINDOW = timedelta(seconds=4.75)  # collectors.sampling.window_seconds(5)
DAY = timedelta(days=1)

# EngineMetric values written per engine per collection by an engine under load.
ENGINE_METRICS = (13, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12)
# Metric 1..16 and the fragmentation samples 20..24 (the memory budget's 17..19 only with one).
HOST_METRICS = (*range(1, 17), *range(20, 25))
# Of those, the metrics whose figure has a time column of its own (``HOST.timed``): the
# interval minimum of MemAvailable, seen inside the collection's window.
HOST_TIMED = (4,)
MEM_TOTAL = 121.69 * GIB
ENGINE_POOL = 997


@dataclass(frozen=True)
class Tables:
    """Table and column names, read from the models and their layouts
    (``collectors.readings.HOST`` and ``ENGINE``) so the SQL follows the schema."""

    collection: str
    host_reading: str
    rollup: str
    engine_reading: str
    engine_rollup: str
    # A reading's columns after (owner, at): a figure column per metric of HOST_METRICS or
    # ENGINE_METRICS, in that order, then the time columns of its timed metrics, then notes.
    host_columns: tuple[str, ...]
    engine_columns: tuple[str, ...]

    @classmethod
    def from_models(cls) -> Tables:
        from collectors.models import Collection, EngineRollup, Rollup
        from collectors.readings import ENGINE, HOST

        return cls(Collection._meta.db_table, HOST.model._meta.db_table, Rollup._meta.db_table,
                   ENGINE.model._meta.db_table, EngineRollup._meta.db_table,
                   _reading_columns(HOST, HOST_METRICS, HOST_TIMED),
                   _reading_columns(ENGINE, ENGINE_METRICS, ()))

    def columns(self) -> dict[str, tuple[str, ...]]:
        """Columns by table, in the order of :class:`Span`'s rows."""
        bucket = ("metric", "resolution", "start", "min", "max", "mean", "count")
        return {
            self.collection: ("node_id", "at", "window_started_at", "reads", "ok", "error"),
            self.host_reading: self.host_columns,
            self.rollup: ("node_id", *bucket),
            self.engine_reading: self.engine_columns,
            self.engine_rollup: ("engine_id", *bucket),
        }

    def roles(self) -> dict[str, str]:
        """Role (a :class:`Span` field) → table name."""
        return {"collection": self.collection, "host_reading": self.host_reading,
                "rollup": self.rollup, "engine_reading": self.engine_reading,
                "engine_rollup": self.engine_rollup}

    def figures_per_row(self) -> dict[str, int]:
        """Figures a generated row of each reading table holds (every figure column filled)."""
        return {self.host_reading: len(HOST_METRICS), self.engine_reading: len(ENGINE_METRICS)}


def _reading_columns(layout, metrics: tuple[int, ...], timed: tuple[int, ...]
                     ) -> tuple[str, ...]:
    """(owner column, at, the figure columns of ``metrics``, the time columns of ``timed``,
    notes); ``timed`` must be the metrics the layout times on their own, as the generator
    writes a time for those alone."""
    own_time = tuple(metric for metric in metrics if layout.time(metric) != "at")
    if own_time != timed:
        raise RuntimeError(f"{layout.model.__name__}: the metrics with a time column of their "
                           f"own are {own_time}, bench.dataset writes one for {timed}")
    owner = layout.model._meta.get_field(layout.owner).column
    return (owner, "at", *(layout.column(metric) for metric in metrics),
            *(layout.time(metric) for metric in timed), "notes")


def _kib(value: float) -> float:
    """A byte count as meminfo reports it: whole KiB."""
    return float(int(value) // 1024 * 1024)


def host_values(t: float, rnd: random.Random) -> dict[int, float]:
    """One collection's host figures at Unix time ``t`` (a daily cycle plus noise)."""
    daily = math.sin(2 * math.pi * (t % 86400) / 86400)
    available = MEM_TOTAL * (0.35 + 0.08 * daily) + rnd.uniform(-0.3, 0.3) * GIB
    cached = 18 * GIB + 2 * GIB * daily + rnd.uniform(0, 0.2) * GIB
    free = available - cached + 3 * GIB
    swap_total = 16 * GIB
    swap_free = swap_total - rnd.uniform(0, 0.05) * GIB
    return {
        1: _kib(MEM_TOTAL), 2: _kib(free), 3: _kib(available),
        4: _kib(available - rnd.uniform(0, 0.5) * GIB),
        5: _kib(0.2 * GIB), 6: _kib(cached), 7: _kib(1.1 * GIB), 8: _kib(0.3 * GIB),
        9: _kib(rnd.uniform(0, 64) * 1024**2), 10: _kib(swap_total), 11: _kib(swap_free),
        12: _kib(0.5 * GIB), 13: _kib(cached - 0.3 * GIB + 1.3 * GIB),
        14: _kib(swap_total - swap_free), 15: round(rnd.uniform(0, 3), 2),
        16: round(rnd.uniform(0, 1), 2),
        20: _kib(free * 0.9), 21: _kib(free * rnd.uniform(0.2, 0.6)), 22: float(4 * 1024**2),
        23: round(rnd.uniform(0, 2), 2), 24: round(rnd.uniform(0, 0.5), 2),
    }


def engine_values(rnd: random.Random) -> dict[int, float]:
    """One engine's figures of one collection, keyed by EngineMetric value."""
    running = rnd.randint(0, 24)
    return {
        13: float(rnd.randint(30_000, 40_000) * 4096), 1: float(running),
        2: float(rnd.choice((0, 0, 0, 0, 1, 2))), 3: round(rnd.uniform(0, 0.9), 6),
        4: round(rnd.uniform(0, 9000), 3), 5: round(running * rnd.uniform(30, 45), 3),
        6: round(rnd.uniform(0.05, 0.4), 6), 7: round(rnd.uniform(0.4, 2.5), 6),
        8: round(rnd.uniform(0.02, 0.03), 6), 9: round(rnd.uniform(0.03, 0.08), 6),
        10: round(rnd.uniform(0, 0.6), 6), 12: 0.0,
    }


NO_NOTES = "{}"  # a reading's notes (JSON by metric id) when no figure was read as unknown
RAW = 0  # the raw tier in a stretch's set of kept tiers; roll-up tiers are their seconds
DRAWS_PER_MINUTE = 3  # figures drawn per minute where no raw rows are kept


@dataclass
class Span:
    """Rows of one stretch of time, by table."""

    collection: list[tuple] = field(default_factory=list)
    host_reading: list[tuple] = field(default_factory=list)
    rollup: list[tuple] = field(default_factory=list)
    engine_reading: list[tuple] = field(default_factory=list)
    engine_rollup: list[tuple] = field(default_factory=list)

    def by_role(self) -> dict[str, list[tuple]]:
        return {"collection": self.collection, "host_reading": self.host_reading,
                "rollup": self.rollup, "engine_reading": self.engine_reading,
                "engine_rollup": self.engine_rollup}


class Generator:
    """Builds the rows of ``[start, end)`` for one node and its engines.

    ``timestamp`` formats a UTC datetime for the target database (SQLite stores Django's naive
    UTC text; PostgreSQL takes ISO text with an offset). Spans must be asked for in time order:
    a coarse bucket that a span leaves incomplete is finished by the next one.
    """

    def __init__(self, node_id: int, engine_ids: list[int],
                 timestamp: Callable[[datetime], str], seed: int = 7) -> None:
        self.node_id = node_id
        self.engine_ids = engine_ids
        self.timestamp = timestamp
        self.rnd = random.Random(seed)
        # Engine figures are drawn from a pool: the values' shape matters for storage, their
        # sequence does not, and drawing ~50 random numbers per collection would dominate.
        # Each entry: the figures by metric, and their columns' values (ENGINE_METRICS order).
        self.engine_pool = []
        for _ in range(ENGINE_POOL):
            figures = engine_values(self.rnd)
            self.engine_pool.append((list(figures.items()),
                                     tuple(figures[metric] for metric in ENGINE_METRICS)))
        self._next = 0
        # Open coarse buckets: resolution → (bucket start, {(owner kind, id, metric): stats}).
        self._open: dict[int, tuple[datetime, dict]] = {}

    def span(self, start: datetime, end: datetime, tiers: Iterable[int]) -> Span:
        """Rows of ``[start, end)`` (whole minutes) for the tiers kept there: ``RAW`` and/or
        roll-up resolutions in seconds (60, 600, 3600)."""
        tiers = frozenset(tiers)
        span = Span()
        minute = _floor_minute(start)
        while minute < end:
            seen = (self._raw_minute(minute, min(minute + timedelta(minutes=1), end), span)
                    if RAW in tiers else self._drawn_minute(minute))
            stats = {key: (min(v), max(v), sum(v) / len(v), 12) for key, v in seen.items()}
            if 60 in tiers:
                self._emit(span, 60, minute, stats)
            for resolution in sorted(t for t in tiers if t > 60):
                self._merge(span, resolution, minute, stats)
            minute += timedelta(minutes=1)
        for resolution, (bucket, stats) in list(self._open.items()):
            if bucket + timedelta(seconds=resolution) <= end:  # complete: written now
                self._emit(span, resolution, bucket, stats)
                del self._open[resolution]
        return span

    def _raw_minute(self, minute: datetime, until: datetime, span: Span
                    ) -> dict[tuple, list[float]]:
        rnd, ts, node = self.rnd, self.timestamp, self.node_id
        seen: dict[tuple, list[float]] = {}
        for at in _ticks(minute, until):
            jittered = at + timedelta(microseconds=rnd.randint(20_000, 90_000))
            stamp = ts(jittered)
            host = host_values(jittered.timestamp(), rnd)
            span.collection.append((node, stamp, ts(jittered - WINDOW), 48, True, ""))
            # One host reading: its figures, then the interval minimum's own time (when it was
            # seen, inside the window and minute), no figure unknown (Tables.host_columns).
            dip = ts(max(jittered - timedelta(seconds=rnd.uniform(0, 4.75)), minute))
            span.host_reading.append((node, stamp, *(host[metric] for metric in HOST_METRICS),
                                      *(dip for _ in HOST_TIMED), NO_NOTES))
            for metric, value in host.items():
                seen.setdefault(("node", node, metric), []).append(value)
            for engine in self.engine_ids:
                figures, values = self._engine_figures()
                span.engine_reading.append((engine, stamp, *values, NO_NOTES))
                for metric, value in figures:
                    seen.setdefault(("engine", engine, metric), []).append(value)
        return seen

    def _drawn_minute(self, minute: datetime) -> dict[tuple, list[float]]:
        seen: dict[tuple, list[float]] = {}
        for draw in range(DRAWS_PER_MINUTE):
            at = minute + timedelta(seconds=20 * draw)
            for metric, value in host_values(at.timestamp(), self.rnd).items():
                seen.setdefault(("node", self.node_id, metric), []).append(value)
            for engine in self.engine_ids:
                for metric, value in self._engine_figures()[0]:
                    seen.setdefault(("engine", engine, metric), []).append(value)
        return seen

    def _engine_figures(self) -> tuple[list[tuple[int, float]], tuple[float, ...]]:
        self._next = (self._next + 1) % ENGINE_POOL
        return self.engine_pool[self._next]

    def _merge(self, span: Span, resolution: int, minute: datetime, stats: dict) -> None:
        bucket = _floor_to(minute, resolution)
        opened = self._open.get(resolution)
        if opened is not None and opened[0] != bucket:
            self._emit(span, resolution, *opened)
            opened = None
        if opened is None:
            opened = self._open[resolution] = (bucket, {})
        merged = opened[1]
        for key, (lo, hi, mean, count) in stats.items():
            if key in merged:
                m_lo, m_hi, m_mean, m_count = merged[key]
                total = m_count + count
                merged[key] = (min(lo, m_lo), max(hi, m_hi),
                               (m_mean * m_count + mean * count) / total, total)
            else:
                merged[key] = (lo, hi, mean, count)

    def _emit(self, span: Span, resolution: int, bucket: datetime, stats: dict) -> None:
        stamp = self.timestamp(bucket)
        for (owner, owner_id, metric), (lo, hi, mean, count) in stats.items():
            row = (owner_id, metric, resolution, stamp, lo, hi, mean, count)
            (span.rollup if owner == "node" else span.engine_rollup).append(row)


def _floor_minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def _floor_to(moment: datetime, seconds: int) -> datetime:
    stamp = moment.timestamp()
    return datetime.fromtimestamp(stamp - stamp % seconds, UTC)


def _ticks(start: datetime, end: datetime) -> Iterator[datetime]:
    at = start
    while at < end:
        yield at
        at += INTERVAL


def sqlite_timestamp(moment: datetime) -> str:
    """How Django's SQLite backend stores an aware datetime: naive UTC text."""
    return str(moment.astimezone(UTC).replace(tzinfo=None))


def postgres_timestamp(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(sep=" ")


def day_plan(end: datetime, days: float, keep: dict[int, float]
             ) -> list[tuple[datetime, datetime, frozenset[int]]]:
    """(start, stop, tiers kept) per generated day, oldest first.

    ``keep`` maps each tier (``RAW`` or a roll-up resolution) to the days it is kept; a day is
    split where a tier's window begins, so each stretch keeps one set of tiers.
    """
    start = end - timedelta(days=days)
    edges = sorted({end - timedelta(days=d) for d in keep.values()
                    if start < end - timedelta(days=d) < end})
    plan = []
    at = start
    while at < end:
        stop = min([at + DAY, end] + [edge for edge in edges if at < edge])
        tiers = frozenset(tier for tier, d in keep.items() if at >= end - timedelta(days=d))
        plan.append((at, stop, tiers))
        at = stop
    return plan


class SqliteWriter:
    """Bulk rows into a SQLite file (one transaction per span); sizes from the file and
    ``dbstat``."""

    def __init__(self, path: Path, tables: Tables) -> None:
        self.path = path
        self.tables = tables
        self.conn = sqlite3.connect(path)

    def write(self, span: Span) -> None:
        with self.conn:
            for table, rows in _by_table(self.tables, span):
                columns = self.tables.columns()[table]
                self.conn.executemany(
                    f"INSERT INTO {table} ({', '.join(columns)}) "  # noqa: S608 - model names
                    f"VALUES ({', '.join('?' * len(columns))})", rows)

    def size(self) -> int:
        """Bytes on disk once the write-ahead log is folded into the file."""
        self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        wal = self.path.with_name(self.path.name + "-wal")
        return self.path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)

    def table_sizes(self) -> dict[str, int]:
        """Bytes per table, its indexes included."""
        owner = dict(self.conn.execute("SELECT name, tbl_name FROM sqlite_master "
                                       "WHERE type IN ('table', 'index')"))
        sizes: dict[str, int] = {}
        for name, size in self.conn.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name"):
            table = owner.get(name, name)
            sizes[table] = sizes.get(table, 0) + size
        return sizes

    def settle(self) -> None:
        """Nothing to do: SQLite keeps no statistics unless asked, and SparkOps does not ask."""

    def finish(self) -> None:
        self.conn.close()


class PostgresWriter:
    """Bulk rows into PostgreSQL with ``COPY`` (one transaction per span); sizes from
    ``pg_total_relation_size`` (table, indexes, TOAST, free-space and visibility maps)."""

    def __init__(self, url: str, tables: Tables) -> None:
        import psycopg

        self.tables = tables
        self.conn = psycopg.connect(url, autocommit=True)

    def write(self, span: Span) -> None:
        with self.conn.transaction(), self.conn.cursor() as cursor:
            for table, rows in _by_table(self.tables, span):
                columns = self.tables.columns()[table]
                with cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(row)

    def size(self) -> int:
        return sum(self.table_sizes().values())

    def table_sizes(self) -> dict[str, int]:
        with self.conn.cursor() as cursor:
            return {table: cursor.execute("SELECT pg_total_relation_size(%s)",
                                          (table,)).fetchone()[0]
                    for table in self.tables.columns()}

    def database_size(self) -> int:
        with self.conn.cursor() as cursor:
            return cursor.execute("SELECT pg_database_size(current_database())").fetchone()[0]

    def settle(self) -> None:
        """What autovacuum would have done by now: VACUUM ANALYZE the bulk-loaded tables."""
        with self.conn.cursor() as cursor:
            for table in self.tables.columns():
                cursor.execute(f"VACUUM ANALYZE {table}")

    def finish(self) -> None:
        self.conn.close()


def _by_table(tables: Tables, span: Span) -> list[tuple[str, list[tuple]]]:
    roles = tables.roles()
    return [(roles[role], rows) for role, rows in span.by_role().items()]
