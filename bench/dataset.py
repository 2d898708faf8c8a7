"""A node's history as SparkOps stores it, generated in bulk: 30 days of 5 s collections.

What a node with four engines accumulates at the default interval, under the retention the code
applies (``collectors.retention``):

* host samples (16 per collection: 11 meminfo fields, 5 derived), collections and engine
  samples (12 per engine per collection: container memory, 3 gauges, 8 rates) — raw, for the
  last ``SPARKOPS_RAW_RETENTION_DAYS`` (7) days only (engine samples have no roll-ups);
* per-minute roll-ups (min/mean/max) of every host metric — the whole span (kept 90 days).

The caller then runs the project's own ``prune_node`` over the result, so the database holds
what retention keeps even if the code changes after this was written.

Values are synthetic but shaped like real ones (byte counts in whole KiB, rates and fractions
with decimals), which matters for SQLite's variable-length records. Rows go straight in with
the driver's bulk path (``executemany`` on SQLite, ``COPY`` on PostgreSQL), one day per
transaction, oldest first; after each day the caller can measure how much the database grew.
"""

from __future__ import annotations

import math
import random
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

GIB = 1024**3
INTERVAL = timedelta(seconds=5)
WINDOW = timedelta(seconds=4.75)  # collectors.sampling.window_seconds(5)
DAY = timedelta(days=1)

# EngineMetric values written per engine per collection by an engine under load.
ENGINE_METRICS = (13, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12)
HOST_METRICS = tuple(range(1, 17))  # Metric 1..16
MEM_TOTAL = 121.69 * GIB
ENGINE_POOL = 997


@dataclass(frozen=True)
class Tables:
    """Table and column names, read from the models so the SQL follows the schema."""

    collection: str
    sample: str
    rollup: str
    engine_sample: str

    @classmethod
    def from_models(cls) -> Tables:
        from collectors.models import Collection, EngineSample, Rollup, Sample

        return cls(Collection._meta.db_table, Sample._meta.db_table, Rollup._meta.db_table,
                   EngineSample._meta.db_table)

    def columns(self) -> dict[str, tuple[str, ...]]:
        return {
            self.collection: ("node_id", "at", "window_started_at", "reads", "ok", "error"),
            self.sample: ("node_id", "metric", "at", "value", "note"),
            self.rollup: ("node_id", "metric", "minute", "min", "max", "mean", "count"),
            self.engine_sample: ("engine_id", "metric", "at", "value"),
        }


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


@dataclass
class Span:
    """Rows of one stretch of time, by table."""

    collection: list[tuple]
    sample: list[tuple]
    rollup: list[tuple]
    engine_sample: list[tuple]


class Generator:
    """Builds the rows of ``[start, end)`` for one node and its engines.

    ``timestamp`` formats a UTC datetime for the target database (SQLite stores Django's naive
    UTC text; PostgreSQL takes ISO text with an offset).
    """

    def __init__(self, node_id: int, engine_ids: list[int],
                 timestamp: Callable[[datetime], str], seed: int = 7) -> None:
        self.node_id = node_id
        self.engine_ids = engine_ids
        self.timestamp = timestamp
        self.rnd = random.Random(seed)
        # Engine figures are drawn from a pool: the values' shape matters for storage, their
        # sequence does not, and drawing ~50 random numbers per collection would dominate.
        self.engine_pool = [list(engine_values(self.rnd).items()) for _ in range(ENGINE_POOL)]
        self._next = 0

    def span(self, start: datetime, end: datetime, *, raw: bool) -> Span:
        """Rows of ``[start, end)``: roll-ups always; collections, host and engine samples
        when ``raw`` (the stretch lies in the raw-retention window)."""
        rnd, ts, node = self.rnd, self.timestamp, self.node_id
        span = Span([], [], [], [])
        minute_values: dict[int, list[float]] = {}
        minute = _floor_minute(start)
        for at in _ticks(start, end):
            jittered = at + timedelta(microseconds=rnd.randint(20_000, 90_000))
            stamp = ts(jittered)
            host = host_values(jittered.timestamp(), rnd)
            if raw:
                window_start = ts(jittered - WINDOW)
                span.collection.append((node, stamp, window_start, 48, True, ""))
                # The interval minimum is stored when it was seen, inside the window.
                dip = ts(max(jittered - timedelta(seconds=rnd.uniform(0, 4.75)), start))
                span.sample.extend((node, metric, dip if metric == 4 else stamp, value, "")
                                   for metric, value in host.items())
            for engine in self.engine_ids if raw else ():
                self._next = (self._next + 1) % ENGINE_POOL
                span.engine_sample.extend((engine, metric, stamp, value)
                                          for metric, value in self.engine_pool[self._next])
            if _floor_minute(jittered) != minute:
                span.rollup.extend(self._rollups(minute, minute_values))
                minute, minute_values = _floor_minute(jittered), {}
            for metric, value in host.items():
                minute_values.setdefault(metric, []).append(value)
        span.rollup.extend(self._rollups(minute, minute_values))
        return span

    def _rollups(self, minute: datetime, values: dict[int, list[float]]) -> Iterator[tuple]:
        stamp = self.timestamp(minute)
        for metric, seen in values.items():
            yield (self.node_id, metric, stamp, min(seen), max(seen), sum(seen) / len(seen),
                   len(seen))


def _floor_minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


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


def day_plan(end: datetime, days: float, raw_days: float) -> list[tuple[datetime, datetime, bool]]:
    """(start, end, raw host?) per generated day, oldest first; the last stretch may be short."""
    start = end - timedelta(days=days)
    raw_from = end - timedelta(days=raw_days)
    plan = []
    at = start
    while at < end:
        stop = min(at + DAY, end)
        # A day is "raw" when it lies in the raw-retention window (split exactly at its edge).
        if at < raw_from < stop:
            plan.append((at, raw_from, False))
            at = raw_from
            continue
        plan.append((at, stop, at >= raw_from))
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
    return [(tables.collection, span.collection), (tables.sample, span.sample),
            (tables.rollup, span.rollup), (tables.engine_sample, span.engine_sample)]
