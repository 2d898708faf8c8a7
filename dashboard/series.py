"""Read a host or engine series for a chart from the finest tier that stays small.

A chart over ``span`` reads the finest source of ``collectors.retention.TIERS`` (raw 5 s samples,
then minute, ten-minute and hourly roll-ups) that has at most ``MAX_ROWS`` buckets in the span:
raw up to about 2 hours, minutes up to a day, ten minutes up to 10 days, hours beyond. Roll-up
points carry their bucket's min and max, so the downsampler keeps every dip; when the chart's
own buckets are wider than the tier's, the database groups the rows into them (lowest min,
highest max), so only what the chart draws leaves it.

A tier is complete up to the node's roll-up watermark (``Node.rolled_up_until``), floored to its
bucket: the rest of the range is read from the minute tier up to the watermark and from raw
samples after it, so every chart reaches the latest collection whatever its resolution. With
no roll-up yet, a chart reads raw samples.

Times leave the database as whole milliseconds since the epoch (:class:`EpochMillis`), the unit
of ``dashboard.downsample`` and of the charts' ``x``: a chart reads tens of thousands of rows,
and a datetime per row (parsed from text, later written back as text) cost more than the query.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from operator import itemgetter

from django.db import connections
from django.db.models import BigIntegerField, F, Func, Max, Min, QuerySet

from collectors.models import (
    Engine,
    EngineReading,
    EngineRollup,
    GpuRollup,
    GpuSample,
    HostReading,
    Node,
    Rollup,
)
from collectors.readings import ENGINE, HOST, Layout, stored_notes
from collectors.retention import MINUTE, TIERS, floor_to
from dashboard.downsample import SeriesPoint, epoch_ms, from_epoch_ms
from dashboard.settled import settled_rows

MAX_ROWS = 1500  # per series per chart: the finest source with at most this many buckets wins
_time = itemgetter(0)  # a SeriesPoint's time


def resolution_for(span: timedelta, interval: float) -> int:
    """Seconds per bucket of the source a chart over ``span`` reads, with collections every
    ``interval`` seconds; 0 for raw samples."""
    seconds = span.total_seconds()
    if seconds / interval <= MAX_ROWS:
        return 0
    for tier in TIERS:
        if seconds / tier.resolution <= MAX_ROWS:
            return tier.resolution
    return TIERS[-1].resolution


def source_label(resolution: int) -> str:
    """How the JSON names a source: "raw" or the tier's bucket ("1 min", "10 min", "1 h")."""
    return "raw" if resolution == 0 else next(t.label for t in TIERS if t.resolution == resolution)


def chart_bucket_seconds(span: timedelta, max_points: int) -> float:
    """The width of the downsampler's buckets for a chart of ``max_points`` over ``span``
    (``dashboard.downsample``: a bucket emits at most three points)."""
    return span.total_seconds() / max(max_points // 3, 1)


def host_points(node: Node, metrics: Iterable[int], start: datetime, resolution: int,
                bucket_seconds: float = 0) -> dict[int, list[SeriesPoint]]:
    """Host-memory series from ``start`` to now at ``resolution`` (0: raw), by metric; roll-up
    rows grouped into buckets of ``bucket_seconds`` in the database when that is coarser."""
    found = _points(HostReading.objects.filter(node_id=node.pk),
                    Rollup.objects.filter(node_id=node.pk), ("metric",), list(metrics), start,
                    None, resolution, node.rolled_up_until, bucket_seconds, HOST,
                    ("host", *_owner(node)))
    return {metric: found.get((metric,), []) for metric in metrics}


def engine_points(engines: Iterable[Engine], metrics: Iterable[int], start: datetime,
                  end: datetime | None, resolution: int, bucket_seconds: float = 0
                  ) -> dict[tuple[int, int], list[SeriesPoint]]:
    """Series of one node's ``engines`` in [start, end] (``end`` None: to now) at
    ``resolution`` (0: raw), by (engine id, metric); grouped like :func:`host_points`."""
    engines, metrics = list(engines), list(metrics)
    if not engines:
        return {}
    ids = [engine.pk for engine in engines]
    found = _points(EngineReading.objects.filter(engine_id__in=ids),
                    EngineRollup.objects.filter(engine_id__in=ids), ("engine_id", "metric"),
                    metrics, start, end, resolution, engines[0].node.rolled_up_until,
                    bucket_seconds, ENGINE, ("engine", *(_owner(e) for e in engines)))
    return {(pk, metric): found.get((pk, metric), []) for pk in ids for metric in metrics}


def gpu_points(node: Node, metrics: Iterable[int], start: datetime, resolution: int,
               bucket_seconds: float = 0) -> dict[tuple[int, int], list[SeriesPoint]]:
    """The node's GPU series from ``start`` to now at ``resolution`` (0: raw), by (device
    index, metric), for every device with rows in range; grouped like :func:`host_points`."""
    return _points(GpuSample.objects.filter(node_id=node.pk),
                   GpuRollup.objects.filter(node_id=node.pk), ("device_index", "metric"),
                   list(metrics), start, None, resolution, node.rolled_up_until, bucket_seconds,
                   source=("gpu", *_owner(node)))


def _points(samples: QuerySet, rollups: QuerySet, keys: tuple[str, ...], metrics: list[int],
            start: datetime, end: datetime | None, resolution: int,
            rolled_up_until: datetime | None, bucket_seconds: float,
            layout: Layout | None = None, source: tuple | None = None
            ) -> dict[tuple, list[SeriesPoint]]:
    """Series by ``keys`` (e.g. (engine id, metric)), in one query for all of them: the chosen
    tier up to its last complete bucket, the minute tier up to the roll-up watermark, raw
    samples after it, each a part of one ``UNION ALL``. ``samples`` are readings of ``layout``
    (``collectors.readings``), read in a query of their own (:func:`_reading_rows`), or a row
    per sample when it is None.

    ``source`` names the roll-ups' owner (:func:`_owner`): the chosen tier's settled buckets
    are then kept between requests (``dashboard.settled``), and only the rest is read.

    The query asks for no order: PostgreSQL would sort tens of thousands of rows gathered from
    its index for every key (half of the query's time), while each series, already nearly in
    time order, is sorted here in one pass."""
    points: dict[tuple, list[SeriesPoint]] = {}
    pieces: list[tuple[int, datetime]] = []  # (resolution, covered until), oldest first
    if resolution and rolled_up_until is not None:
        pieces.append((resolution, floor_to(rolled_up_until, resolution)))
        if resolution != MINUTE.resolution:
            pieces.append((MINUTE.resolution, rolled_up_until))
    since = start
    width = int(bucket_seconds)
    parts: list[QuerySet] = []  # each (*keys, epoch ms, low, high)
    for seconds, until in pieces:
        if until <= since:
            continue
        stop = until if end is None else min(until, end)
        grouped = width >= 2 * seconds  # into the chart's own buckets, by the database

        def tier(first: datetime, last: datetime, seconds: int = seconds,
                 grouped: bool = grouped) -> QuerySet:
            rows = rollups.filter(resolution=seconds, metric__in=metrics, start__gte=first,
                                  start__lt=last)
            if grouped:
                return rows.annotate(epoch=EpochBucket("start", width)).values(*keys, "epoch") \
                    .annotate(low=Min("min"), high=Max("max")).order_by() \
                    .values_list(*keys, "epoch", "low", "high")
            return rows.annotate(epoch=EpochMillis("start")).order_by() \
                .values_list(*keys, "epoch", "min", "max")

        if source is not None and seconds == resolution:
            parts += _settled_and_rest(points, (*source, tuple(metrics), seconds,
                                                width if grouped else 0),
                                       width if grouped else seconds, len(keys), tier, since,
                                       stop)
        else:
            parts.append(tier(since, stop))
        since = until
    if layout is not None:  # readings: their own query, a row per reading
        _collect(points, _reading_rows(layout, samples, keys, metrics, since, end), len(keys))
    else:
        rows = samples.filter(metric__in=metrics, at__gte=since)
        if end is not None:
            rows = rows.filter(at__lte=end)
        parts.append(rows.annotate(epoch=EpochMillis("at"), low=F("value"), high=F("value"))
                     .order_by().values_list(*keys, "epoch", "low", "high"))
    if parts:
        query = parts[0].union(*parts[1:], all=True) if len(parts) > 1 else parts[0]
        _collect(points, _fetch(query), len(keys))
    for series in points.values():
        series.sort(key=_time)  # rows come in no order; the pieces do not overlap in time
    return points


def _settled_and_rest(points: dict[tuple, list[SeriesPoint]], key: tuple, unit: int,
                      epoch_at: int, tier: Callable[[datetime, datetime], QuerySet],
                      since: datetime, stop: datetime) -> list[QuerySet]:
    """Collect into ``points`` the rows of the whole ``unit``-second buckets in [since, stop)
    that the watermark has passed (``stop`` is at or before it), from ``settled_rows`` where
    it holds them; return the queries of the rest of [since, stop) (a partial bucket at each
    end), for the caller's ``UNION ALL``."""
    first = math.ceil(since.timestamp() / unit) * unit * 1000  # epoch ms, on the grid
    last = math.floor(stop.timestamp() / unit) * unit * 1000
    if first >= last:
        return [tier(since, stop)]
    settled = settled_rows.rows(
        key, first, last, epoch_at,
        lambda a, b: _fetch(tier(from_epoch_ms(a), from_epoch_ms(b))))
    _collect(points, settled, epoch_at)
    head_end, tail_start = from_epoch_ms(first), from_epoch_ms(last)
    return ([tier(since, head_end)] if since < head_end else []) + \
        ([tier(tail_start, stop)] if tail_start < stop else [])


def _owner(instance: Node | Engine) -> tuple:
    """A roll-up owner's identity for ``settled_rows``: its key and when it was created, so
    that a reused key is another owner."""
    if isinstance(instance, Engine):
        return (instance.pk, instance.first_seen)
    return (instance.pk, instance.created_at)


def _reading_rows(layout: Layout, readings: QuerySet, keys: tuple[str, ...], metrics: list[int],
                  since: datetime, end: datetime | None) -> list[tuple]:
    """The figures of ``metrics`` timed in [since, end] as rows (*keys, epoch ms, low, high),
    from one query that reads every asked column of each reading in range; a figure read as
    unknown is a row without values (a gap in the chart), one not read is no row.

    One query, not a part of the ``UNION ALL`` per metric: each part would be compiled and
    planned on its own, and a timeline asks for a dozen metrics."""
    owner = keys[:-1]
    times = list(dict.fromkeys(layout.time(metric) for metric in metrics))
    epochs = {f"epoch_{time}": EpochMillis(time) for time in times}
    rows = readings.filter(at__gte=since)  # a figure is never later than its reading
    if end is not None:
        rows = rows.filter(at__lte=end)
    query = rows.annotate(**epochs).order_by().values_list(
        *owner, *epochs, *(layout.column(metric) for metric in metrics), "notes")
    first, last = epoch_ms(since), None if end is None else epoch_ms(end)
    width = len(owner)
    where = [(metric, width + times.index(layout.time(metric)), width + len(times) + index)
             for index, metric in enumerate(metrics)]
    found: list[tuple] = []
    for row in _fetch(query):
        notes = None
        for metric, time_at, value_at in where:
            value, moment = row[value_at], row[time_at]
            if value is None:
                notes = stored_notes(row[-1]) if notes is None else notes
                if not layout.is_read(metric, value, notes):
                    continue
            if moment is None or moment < first or (last is not None and moment > last):
                continue
            found.append((*row[:width], metric, moment, value, value))
    return found


def _collect(points: dict[tuple, list[SeriesPoint]], rows: list[tuple], width: int) -> None:
    """Append ``rows`` ((*keys, epoch ms, low, high)) to the series of their keys in
    ``points``."""
    series: list[SeriesPoint] = []
    last: tuple | None = None
    point = SeriesPoint
    for row in rows:
        key = row[:width]
        if key != last:
            series = points.setdefault(key, [])
            last = key
        series.append(point(row[width], row[width + 1], row[width + 2]))


class EpochMillis(Func):
    """A timestamp in whole milliseconds since the epoch (SQLite and PostgreSQL, both rounding
    half a millisecond up, as :func:`dashboard.downsample.epoch_ms` does), so that a chart's
    times leave the database as numbers: no text to parse, no datetime per row."""

    output_field = BigIntegerField()

    def __init__(self, expression: str) -> None:
        super().__init__(F(expression))

    def as_sqlite(self, compiler, connection, **extra):
        sql, params = compiler.compile(self.source_expressions[0])
        return f"CAST(round((julianday({sql}) - 2440587.5) * 86400000) AS INTEGER)", params

    def as_postgresql(self, compiler, connection, **extra):
        sql, params = compiler.compile(self.source_expressions[0])
        return f"CAST(round(extract(epoch FROM {sql}) * 1000) AS BIGINT)", params


class EpochBucket(Func):
    """The start, in milliseconds since the epoch, of the ``seconds``-wide bucket (whole
    seconds since the epoch) a timestamp falls in (SQLite and PostgreSQL)."""

    output_field = BigIntegerField()

    def __init__(self, expression: str, seconds: int) -> None:
        super().__init__(F(expression))
        self.seconds = int(seconds)

    def _bucket(self, compiler, connection, epoch: str) -> tuple[str, list]:
        sql, params = compiler.compile(self.source_expressions[0])
        return f"(({epoch.format(sql)} / {self.seconds}) * {self.seconds * 1000})", params

    def as_sqlite(self, compiler, connection, **extra):
        return self._bucket(compiler, connection, "CAST(strftime('%%s', {}) AS INTEGER)")

    def as_postgresql(self, compiler, connection, **extra):
        return self._bucket(compiler, connection,
                            "CAST(floor(date_part('epoch', {})) AS BIGINT)")


def _fetch(rows: QuerySet) -> list[tuple]:
    """The rows of a ``values_list`` query, straight from the database's cursor.

    A chart reads tens of thousands of rows; its times are already numbers
    (:class:`EpochMillis`), so Django's per-value converters have nothing to do but cost.
    """
    connection = connections[rows.db]
    sql, params = rows.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()
