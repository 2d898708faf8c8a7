"""Settled roll-up rows kept between chart requests (dashboard.settled): a chart drawn from them
is row for row the chart read afresh, and only what settled since the last request is read."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from collectors.models import Engine, EngineMetric, EngineRollup, Metric, Node, Rollup
from dashboard.series import engine_points, host_points
from dashboard.settled import SettledRows, settled_rows

T0 = datetime(2026, 11, 20, 0, 0, tzinfo=UTC)
MINUTE = 60_000


class Reads:
    """A fetch that records what it was asked for; each bucket's row is (epoch, epoch)."""

    def __init__(self, step: int = MINUTE) -> None:
        self.asked: list[tuple[int, int]] = []
        self.step = step

    def __call__(self, first: int, end: int) -> list[tuple]:
        self.asked.append((first, end))
        return [(at, at) for at in range(first, end, self.step)][::-1]  # in no order


def test_a_request_reads_only_the_buckets_settled_since_the_last():
    store, fetch = SettledRows(), Reads()

    first = store.rows("chart", 0, 10 * MINUTE, 0, fetch)
    again = store.rows("chart", 0, 10 * MINUTE, 0, fetch)
    later = store.rows("chart", 2 * MINUTE, 12 * MINUTE, 0, fetch)

    assert fetch.asked == [(0, 10 * MINUTE), (10 * MINUTE, 12 * MINUTE)]
    assert first == again == [(at, at) for at in range(0, 10 * MINUTE, MINUTE)]
    assert later == [(at, at) for at in range(2 * MINUTE, 12 * MINUTE, MINUTE)]


def test_a_settled_end_set_back_or_a_range_past_what_is_held_reads_the_range_whole():
    store, fetch = SettledRows(), Reads()
    store.rows("chart", 0, 10 * MINUTE, 0, fetch)

    back = store.rows("chart", 0, 8 * MINUTE, 0, fetch)  # the watermark was set back
    past = store.rows("chart", 20 * MINUTE, 25 * MINUTE, 0, fetch)  # nothing held is in range
    older = store.rows("chart", 10 * MINUTE, 25 * MINUTE, 0, fetch)  # earlier than held

    assert fetch.asked == [(0, 10 * MINUTE), (0, 8 * MINUTE), (20 * MINUTE, 25 * MINUTE),
                           (10 * MINUTE, 25 * MINUTE)]
    assert back == [(at, at) for at in range(0, 8 * MINUTE, MINUTE)]
    assert past == [(at, at) for at in range(20 * MINUTE, 25 * MINUTE, MINUTE)]
    assert older == [(at, at) for at in range(10 * MINUTE, 25 * MINUTE, MINUTE)]


def test_the_least_recently_used_entry_goes_first_and_the_rows_stay_bounded():
    store, fetch = SettledRows(max_entries=2, max_rows=25), Reads()
    store.rows("a", 0, 10 * MINUTE, 0, fetch)
    store.rows("b", 0, 10 * MINUTE, 0, fetch)
    store.rows("a", 0, 10 * MINUTE, 0, fetch)  # "a" is used again, so "b" is the oldest
    store.rows("c", 0, 10 * MINUTE, 0, fetch)
    assert len(store) == 2
    store.rows("a", 0, 10 * MINUTE, 0, fetch)
    assert fetch.asked.count((0, 10 * MINUTE)) == 3  # a, b, c: "a" was kept

    store.rows("d", 0, 20 * MINUTE, 0, fetch)  # 20 rows: "a" and "c" (10 each) make room
    assert len(store) == 1
    huge = store.rows("e", 0, 30 * MINUTE, 0, fetch)  # more than the bound: served, not kept
    assert len(huge) == 30 and len(store) == 1


def _minutes(node: Node, metric: int, start: datetime, end: datetime, rnd: random.Random
             ) -> list[Rollup]:
    count = int((end - start).total_seconds() // 60)
    return [Rollup(node=node, metric=metric, resolution=60, start=start + timedelta(minutes=m),
                   min=(low := rnd.uniform(1, 100)), max=low + rnd.uniform(0, 5), mean=low,
                   count=12)
            for m in range(count)]


def _afresh(call):
    """What ``call`` returns with nothing kept, then with what it kept."""
    settled_rows.clear()
    fresh = call()
    return fresh, call()


def _drawn(rows, keys, since: datetime, until: datetime, width: int) -> dict:
    """What a chart must draw of roll-up ``rows`` in [since, until), worked out here: grouped
    into ``width``-second buckets on the epoch's grid (lowest min, highest max) when ``width``
    is at least twice the tier's, else a point per row."""
    found: dict = {}
    for row in rows:
        if not since <= row.start < until:
            continue
        seconds = int(row.start.timestamp())
        at = (seconds // width * width if width >= 2 * row.resolution else seconds) * 1000
        points = found.setdefault(tuple(getattr(row, key) for key in keys), {})
        low, high = points.get(at, (row.min, row.max))
        points[at] = (min(low, row.min), max(high, row.max))
    return {key: [(at, *figures) for at, figures in sorted(points.items())]
            for key, points in found.items()}


def _plain(points: dict) -> dict:
    return {key: [(p.at, p.low, p.high) for p in series] for key, series in points.items()
            if series}


@pytest.mark.parametrize("bucket_seconds", [259, 90])  # grouped by the database, and not
def test_a_chart_from_settled_rows_is_the_chart_read_afresh_as_the_watermark_moves(
        node, bucket_seconds):
    rnd = random.Random(7)
    metrics = [Metric.MEM_AVAILABLE, Metric.MEM_FREE]
    for metric in metrics:
        Rollup.objects.bulk_create(_minutes(node, metric, T0, T0 + timedelta(hours=6), rnd))
    node.rolled_up_until = T0 + timedelta(hours=6)

    def chart(start):
        return host_points(node, metrics, start, 60, bucket_seconds=bucket_seconds)

    def drawn(start):
        return {metric: series for (metric,), series in _drawn(
            Rollup.objects.all(), ("metric",), start, node.rolled_up_until,
            bucket_seconds).items()}

    start = T0 + timedelta(minutes=7, seconds=13)
    assert _plain(chart(start)) == drawn(start)
    assert chart(start) == _afresh(lambda: chart(start))[0]

    # An hour later: an hour more of roll-ups, the watermark past them, the range moved on.
    for metric in metrics:
        Rollup.objects.bulk_create(_minutes(node, metric, T0 + timedelta(hours=6),
                                            T0 + timedelta(hours=7), rnd))
    node.rolled_up_until = T0 + timedelta(hours=7)
    start += timedelta(hours=1, seconds=3)
    kept = chart(start)
    assert _plain(kept) == drawn(start) and len(kept[Metric.MEM_AVAILABLE]) > 50
    assert kept == _afresh(lambda: chart(start))[0]

    # The watermark set back (a database restored under the running server).
    Rollup.objects.filter(start__gte=T0 + timedelta(hours=6, minutes=30)).delete()
    node.rolled_up_until = T0 + timedelta(hours=6, minutes=30)
    assert _plain(chart(start)) == drawn(start)


def test_a_request_with_nothing_newly_settled_reads_only_the_unsettled_part(node):
    Rollup.objects.bulk_create(_minutes(node, Metric.MEM_AVAILABLE, T0,
                                        T0 + timedelta(hours=6), random.Random(3)))
    node.rolled_up_until = T0 + timedelta(hours=6)
    start = T0 + timedelta(minutes=1, seconds=1)

    with CaptureQueriesContext(connection) as cold:
        first = host_points(node, [Metric.MEM_AVAILABLE], start, 60, bucket_seconds=259)
    with CaptureQueriesContext(connection) as warm:
        second = host_points(node, [Metric.MEM_AVAILABLE], start, 60, bucket_seconds=259)

    assert first == second
    # Cold: the settled buckets, then the rest (the roll-ups' union; the raw readings).
    assert len(cold.captured_queries) == 3
    assert len(warm.captured_queries) == 2  # the rest only


def test_an_engine_chart_from_settled_rows_is_the_chart_read_afresh(node):
    rnd = random.Random(11)
    engines = [Engine.objects.create(node=node, name=f"e{i}", container_id=f"{i:064x}",
                                     first_seen=T0) for i in range(2)]
    metrics = [EngineMetric.KV_CACHE_USAGE, EngineMetric.DECODE_TPS]
    EngineRollup.objects.bulk_create([
        EngineRollup(engine=engine, metric=metric, resolution=600,
                     start=T0 + timedelta(minutes=10 * b), min=(low := rnd.random()),
                     max=low + 0.1, mean=low, count=120)
        for engine in engines for metric in metrics for b in range(6 * 24 * 3)])
    node.rolled_up_until = T0 + timedelta(days=3)
    for engine in engines:
        engine.node = node

    def chart():
        return engine_points(engines, metrics, T0 + timedelta(hours=1, minutes=3), None, 600,
                             bucket_seconds=1800)

    kept = chart()
    assert _plain(kept) == {
        (engine, metric): series for (engine, metric), series in _drawn(
            EngineRollup.objects.all(), ("engine_id", "metric"),
            T0 + timedelta(hours=1, minutes=3), node.rolled_up_until, 1800).items()}
    assert kept == _afresh(chart)[0] and len(kept[(engines[0].pk, metrics[0])]) > 100


def test_a_new_node_under_a_reused_key_does_not_meet_the_old_nodes_rows(db):
    rnd = random.Random(5)
    old = Node.objects.create(name="old", hostname="old", mem_total_bytes=1,
                              rolled_up_until=T0 + timedelta(hours=2))
    Rollup.objects.bulk_create(_minutes(old, Metric.MEM_AVAILABLE, T0,
                                        T0 + timedelta(hours=2), rnd))
    before = host_points(old, [Metric.MEM_AVAILABLE], T0, 60, bucket_seconds=259)
    key = old.pk
    old.delete()
    new = Node.objects.create(pk=key, name="new", hostname="new", mem_total_bytes=1,
                              rolled_up_until=T0 + timedelta(hours=2))
    Rollup.objects.bulk_create(_minutes(new, Metric.MEM_AVAILABLE, T0,
                                        T0 + timedelta(hours=2), rnd))

    after = host_points(new, [Metric.MEM_AVAILABLE], T0, 60, bucket_seconds=259)

    assert after != before
    assert _plain(after) == {metric: series for (_, metric), series in _drawn(
        Rollup.objects.all(), ("node_id", "metric"), T0, new.rolled_up_until, 259).items()}
