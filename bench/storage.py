"""Benchmark 5: bytes per node per day at the default interval, and the 30-day total.

The 30-day dataset (see ``bench.dataset``) is written one day at a time, oldest first, and the
database is measured after each day: the SQLite file (write-ahead log folded in) and, on
PostgreSQL, ``pg_total_relation_size`` of SparkOps' four sample tables. Days inside the raw
window (the last 7) hold raw host samples, collections, engine samples and roll-ups; older days
hold the roll-ups only, as retention leaves them. Each kind of day gives one
growth sample per day; the 30-day figure is measured, and also extrapolated from the medians
(7 raw days + 23 older days) as a check. Per-table sizes at the end give bytes per row, from
which the report estimates what other retention choices would cost.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from bench.dataset import DAY, Generator, PostgresWriter, SqliteWriter
from bench.stats import summarize

MIB = 1024**2


@dataclass
class DayGrowth:
    raw: bool
    days: float  # share of a day this stretch covers
    bytes: int
    rows: dict[str, int]
    seconds: float


def generate_and_measure(writer: SqliteWriter | PostgresWriter, generator: Generator,
                         plan: list) -> list[DayGrowth]:
    """Write the plan's days one by one; the database growth of each."""
    previous = writer.size()
    growth = []
    for start, stop, raw in plan:
        began = time.perf_counter()
        span = generator.span(start, stop, raw=raw)
        writer.write(span)
        size = writer.size()
        rows = {table: len(table_rows) for table, table_rows in
                zip(writer.tables.columns(), (span.collection, span.sample, span.rollup,
                                              span.engine_sample), strict=True)}
        growth.append(DayGrowth(raw=raw, days=(stop - start) / DAY, bytes=size - previous,
                                rows=rows, seconds=time.perf_counter() - began))
        previous = size
    return growth


def summarize_storage(growth: list[DayGrowth], writer: SqliteWriter | PostgresWriter,
                      raw_days: float) -> dict:
    """Per-day growth by kind of day, per-table sizes and bytes per row, and the 30-day total
    (measured, and extrapolated as raw_days raw days + the rest older days)."""
    # Growth per day of each stretch; a short stretch (at the raw window's edge) is too noisy.
    raw = summarize(g.bytes / g.days / MIB for g in growth if g.raw and g.days >= 0.25)
    old = summarize(g.bytes / g.days / MIB for g in growth if not g.raw and g.days >= 0.25)
    table_sizes = writer.table_sizes()
    rows: dict[str, int] = {}
    for day in growth:
        for table, count in day.rows.items():
            rows[table] = rows.get(table, 0) + count
    days = sum(g.days for g in growth)
    tables = {
        table: {
            "mib": size / MIB,
            "rows": rows.get(table, 0),
            "bytes_per_row": size / rows[table] if rows.get(table) else None,
        }
        for table, size in table_sizes.items() if table in rows
    }
    total = writer.size()
    result = {
        "days": days,
        "raw_days": raw_days,
        "raw_day_mib": raw.as_dict() if raw else None,
        "older_day_mib": old.as_dict() if old else None,
        "total_mib": total / MIB,
        "tables": tables,
        "generation_seconds": sum(g.seconds for g in growth),
    }
    if raw and old:
        older = max(days - raw_days, 0)
        result["extrapolated_30d_mib"] = raw_days * raw.median + (30 - raw_days) * old.median
        result["extrapolated_span_mib"] = raw_days * raw.median + older * old.median
    if isinstance(writer, PostgresWriter):
        result["database_mib"] = writer.database_size() / MIB
    return result


def retention_estimates(storage: dict, tables: dict[str, str], engines: int,
                        engine_metrics: int, raw_days: float) -> dict:
    """30-day size under retention choices, from measured bytes per row (an estimate).

    ``tables`` maps the roles "collection", "sample", "rollup", "engine_sample" to table names.
    """
    per_row = {role: storage["tables"].get(name, {}).get("bytes_per_row") or 0.0
               for role, name in tables.items()}
    collections_per_day = 86400 / 5
    host_raw_day = collections_per_day * (16 * per_row["sample"] + per_row["collection"])
    rollup_day = 1440 * 16 * per_row["rollup"]
    engine_raw_day = collections_per_day * engines * engine_metrics * per_row["engine_sample"]
    # Engine roll-ups do not exist yet; sized like host roll-up rows.
    engine_rollup_day = 1440 * engines * engine_metrics * per_row["rollup"]
    raw_day = host_raw_day + engine_raw_day
    return {
        "current_30d_mib": (raw_days * raw_day + 30 * rollup_day) / MIB,
        "with_engine_rollups_30d_mib": (raw_days * raw_day + 30 * (rollup_day + engine_rollup_day))
        / MIB,
        "one_day_raw_30d_mib": (raw_day + 30 * (rollup_day + engine_rollup_day)) / MIB,
        "host_raw_day_mib": host_raw_day / MIB,
        "engine_raw_day_mib": engine_raw_day / MIB,
        "rollup_day_mib": rollup_day / MIB,
        "engine_rollup_day_mib": engine_rollup_day / MIB,
    }
