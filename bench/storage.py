"""Benchmark 5: bytes per node per day at the default interval, and the 30-day total.

The 30-day dataset (see ``bench.dataset``) is written one day at a time, oldest first, and the
database is measured after each day: the SQLite file (write-ahead log folded in) and, on
PostgreSQL, ``pg_total_relation_size`` of the five tables the dataset writes (collections, host
readings, host roll-ups, engine readings, engine roll-ups). Each day holds what the tiers of
``collectors.retention`` keep at its age: a *raw day* (the last one) raw rows — per collection
a collection row, one host reading and one engine reading per engine — and every roll-up tier;
a *minute day* (the one before) minute, ten-minute and hourly roll-ups; an *older day*
ten-minute and hourly roll-ups. Each kind of day gives one growth sample per day; the 30-day
figure is measured, and also extrapolated from the medians as a check. Per-table sizes at the
end give bytes per row (a reading's also per figure it holds, to compare with the former row
per figure), from which the report estimates what other retention choices would cost.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from bench.dataset import DAY, HOST_METRICS, RAW, Generator, PostgresWriter, SqliteWriter
from bench.stats import summarize

MIB = 1024**2


@dataclass
class DayGrowth:
    kind: str  # "raw", "minute" or "older": what retention keeps at the day's age
    days: float  # share of a day this stretch covers
    bytes: int
    rows: dict[str, int]
    seconds: float


def generate_and_measure(writer: SqliteWriter | PostgresWriter, generator: Generator,
                         plan: list) -> list[DayGrowth]:
    """Write the plan's days one by one; the database growth of each."""
    previous = writer.size()
    growth = []
    roles = writer.tables.roles()
    for start, stop, tiers in plan:
        began = time.perf_counter()
        span = generator.span(start, stop, tiers)
        writer.write(span)
        size = writer.size()
        rows = {roles[role]: len(table_rows) for role, table_rows in span.by_role().items()}
        kind = "raw" if RAW in tiers else "minute" if 60 in tiers else "older"
        growth.append(DayGrowth(kind=kind, days=(stop - start) / DAY, bytes=size - previous,
                                rows=rows, seconds=time.perf_counter() - began))
        previous = size
    return growth


def summarize_storage(growth: list[DayGrowth], writer: SqliteWriter | PostgresWriter,
                      raw_days: float, minute_days: float) -> dict:
    """Per-day growth by kind of day, per-table sizes and bytes per row, and the 30-day total
    (measured, and extrapolated from the medians of each kind of day)."""
    # Growth per day of each stretch; a short stretch (at a window's edge) is too noisy.
    by_kind = {kind: summarize(g.bytes / g.days / MIB for g in growth
                               if g.kind == kind and g.days >= 0.25)
               for kind in ("raw", "minute", "older")}
    table_sizes = writer.table_sizes()
    rows: dict[str, int] = {}
    for day in growth:
        for table, count in day.rows.items():
            rows[table] = rows.get(table, 0) + count
    days = sum(g.days for g in growth)
    figures_per_row = writer.tables.figures_per_row()
    tables = {}
    for table, size in table_sizes.items():
        if table not in rows:
            continue
        count = rows[table]
        tables[table] = {"mib": size / MIB, "rows": count,
                         "bytes_per_row": size / count if count else None}
        if table in figures_per_row:  # a reading: its figures, and bytes per figure
            figures = count * figures_per_row[table]
            tables[table] |= {"figures_per_row": figures_per_row[table], "figures": figures,
                              "bytes_per_figure": size / figures if figures else None}
    total = writer.size()
    result = {
        "days": days,
        "raw_days": raw_days,
        "minute_days": minute_days,
        **{f"{kind}_day_mib": stats.as_dict() if stats else None
           for kind, stats in by_kind.items()},
        "total_mib": total / MIB,
        "roles": writer.tables.roles(),
        "tables": tables,
        "generation_seconds": sum(g.seconds for g in growth),
    }
    if all(by_kind.values()):
        raw, minute, old = (by_kind[k].median for k in ("raw", "minute", "older"))
        result["extrapolated_30d_mib"] = (raw_days * raw + (minute_days - raw_days) * minute
                                          + (30 - minute_days) * old)
    if isinstance(writer, PostgresWriter):
        result["database_mib"] = writer.database_size() / MIB
    return result


def retention_estimates(storage: dict, tables: dict[str, str], engines: int,
                        engine_metrics: int, keep: dict[str, float],
                        host_metrics: int = len(HOST_METRICS)) -> dict:
    """30-day size under retention choices, from measured bytes per row (an estimate).

    ``tables`` maps the roles of ``Tables.roles`` to table names; ``keep`` the days each tier is
    kept: "raw", "minute", "ten" (ten-minute) and "hour". A raw collection is a collection row,
    a host reading and a reading per engine; a roll-up bucket a row per host metric
    (``host_metrics``, those the dataset writes) and per engine metric of each engine.
    """
    per_row = {role: storage["tables"].get(name, {}).get("bytes_per_row") or 0.0
               for role, name in tables.items()}
    collections_per_day = 86400 / 5
    metrics = host_metrics + engines * engine_metrics
    # Host and engine roll-up rows weigh almost the same; their mix, weighted by count.
    rollup_row = (host_metrics * per_row["rollup"]
                  + engines * engine_metrics * per_row["engine_rollup"]) / metrics
    raw_day = collections_per_day * (per_row["collection"] + per_row["host_reading"]
                                     + engines * per_row["engine_reading"])
    tier_day = {tier: metrics * buckets * rollup_row
                for tier, buckets in (("minute", 1440), ("ten", 144), ("hour", 24))}

    def over_30_days(days: dict[str, float]) -> float:
        return (min(days["raw"], 30) * raw_day
                + sum(min(days[tier], 30) * size for tier, size in tier_day.items())) / MIB

    return {
        "current_30d_mib": over_30_days(keep),
        "seven_days_raw_30d_mib": over_30_days({**keep, "raw": 7}),
        "half_day_raw_30d_mib": over_30_days({**keep, "raw": 0.5}),
        "raw_day_mib": raw_day / MIB,
        **{f"{tier}_day_mib": size / MIB for tier, size in tier_day.items()},
    }
