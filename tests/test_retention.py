from datetime import UTC, datetime, timedelta

from collectors.models import Collection, HostReading, Metric, Rollup
from collectors.readings import HOST, Sample
from collectors.retention import prune_node, rollup_node
from tests.stored import engine_sample, engine_samples, host_sample, host_samples

T0 = datetime(2026, 11, 1, 12, 0, 0, tzinfo=UTC)


def _sample(node, at, value, metric=Metric.MEM_AVAILABLE):
    """An unsaved reading of ``node`` at ``at`` holding one figure."""
    return HOST.reading(node, at, [Sample(metric, at, value)])


def test_rollup_makes_min_mean_max_per_minute_and_skips_unknowns(node):
    HostReading.objects.bulk_create([
        _sample(node, T0 + timedelta(seconds=5), 10.0),
        _sample(node, T0 + timedelta(seconds=10), 4.0),
        _sample(node, T0 + timedelta(seconds=15), None),  # unknown: not averaged as 0
        _sample(node, T0 + timedelta(seconds=20), 7.0),
        _sample(node, T0 + timedelta(minutes=1, seconds=1), 3.0),
    ])
    host_sample(node, Metric.SWAP_USED, T0 + timedelta(seconds=5), 1.5)  # same collection

    written = rollup_node(node, now=T0 + timedelta(minutes=5))

    assert written == 3
    first = Rollup.objects.get(node=node, metric=Metric.MEM_AVAILABLE, start=T0)
    assert (first.min, first.mean, first.max, first.count) == (4.0, 7.0, 10.0, 3)
    second = Rollup.objects.get(node=node, metric=Metric.MEM_AVAILABLE,
                                start=T0 + timedelta(minutes=1))
    assert (second.min, second.max, second.count) == (3.0, 3.0, 1)
    node.refresh_from_db()
    assert node.rolled_up_until == T0 + timedelta(minutes=4, seconds=0)


def test_rollup_waits_for_the_grace_period_and_is_idempotent(node):
    host_sample(node, Metric.MEM_AVAILABLE, T0 + timedelta(seconds=50), 5.0)

    assert rollup_node(node, now=T0 + timedelta(seconds=70)) == 0  # minute closed 10 s ago
    assert rollup_node(node, now=T0 + timedelta(seconds=95)) == 1
    node.rolled_up_until = None  # history rolled up again from the start: same rows, once
    node.save()
    assert rollup_node(node, now=T0 + timedelta(seconds=95)) == 1
    assert Rollup.objects.count() == 1


def test_prune_keeps_raw_for_its_retention_and_rollups_longer(node):
    now = T0 + timedelta(days=100)
    HostReading.objects.bulk_create([
        _sample(node, now - timedelta(days=8), 1.0),
        _sample(node, now - timedelta(days=6), 2.0),
    ])
    Collection.objects.create(node=node, at=now - timedelta(days=8),
                              window_started_at=now - timedelta(days=8), ok=True)
    Rollup.objects.bulk_create([
        Rollup(node=node, metric=Metric.MEM_AVAILABLE, resolution=resolution,
               start=now - timedelta(days=days), min=1, max=1, mean=1, count=1)
        for resolution, days in [(60, 1), (60, 3), (600, 30), (600, 40), (3600, 89), (3600, 91)]
    ])
    node.rolled_up_until = now - timedelta(minutes=1)
    node.save()

    result = prune_node(node, now, raw_days=7, rollup_days=90)

    assert (result.samples, result.collections, result.rollups) == (1, 1, 3)
    assert [s.value for s in host_samples()] == [2.0]
    # Minute buckets for 2 days, ten-minute buckets for 35, hourly ones as long as history.
    kept = {(r.resolution, round((now - r.start) / timedelta(days=1)))
            for r in Rollup.objects.all()}
    assert kept == {(60, 1), (600, 30), (3600, 89)}


def test_prune_never_drops_raw_samples_that_are_not_rolled_up(node):
    now = T0 + timedelta(days=30)
    host_sample(node, Metric.MEM_AVAILABLE, now - timedelta(days=10), 1.0)
    node.rolled_up_until = now - timedelta(days=12)  # roll-up fell behind (beat was stopped)
    node.save()

    assert prune_node(node, now, raw_days=7, rollup_days=90).samples == 0
    rollup_node(node, now)  # catches up in bounded chunks
    assert Rollup.objects.filter(node=node).exists()


def test_prune_removes_old_engine_samples_events_and_ledger_changes(node):
    from collectors.models import Engine, EngineMetric, Event, LedgerChange

    now = T0 + timedelta(days=100)
    engine = Engine.objects.create(node=node, name="gemma", container_id="c" * 64,
                                   container_state="running")
    engine_sample(engine, EngineMetric.DECODE_TPS, now - timedelta(days=8), 1.0)
    engine_sample(engine, EngineMetric.DECODE_TPS, now - timedelta(days=1), 2.0)
    Event.objects.create(node=node, at=now - timedelta(days=91), kind="k", message="old")
    Event.objects.create(node=node, at=now - timedelta(days=89), kind="k", message="kept")
    LedgerChange.objects.create(node=node, component="page_cache", label="page cache",
                                at=now - timedelta(days=91), before_bytes=1, after_bytes=2)
    node.rolled_up_until = now
    node.save()

    prune_node(node, now, raw_days=7, rollup_days=90)

    assert [s.value for s in engine_samples()] == [2.0]
    assert list(Event.objects.values_list("message", flat=True)) == ["kept"]
    assert not LedgerChange.objects.exists()


def test_engine_samples_roll_up_like_host_samples(node):
    from collectors.models import Engine, EngineMetric, EngineRollup

    engine = Engine.objects.create(node=node, name="gemma", container_id="c" * 64,
                                   container_state="running")
    for s, v in [(5, 30.0), (10, None), (15, 10.0), (20, 20.0)]:
        engine_sample(engine, EngineMetric.DECODE_TPS, T0 + timedelta(seconds=s), v)

    rollup_node(node, now=T0 + timedelta(minutes=5))

    row = EngineRollup.objects.get(engine=engine, resolution=60)
    assert (row.start, row.min, row.mean, row.max, row.count) == (T0, 10.0, 20.0, 30.0, 3)


def test_coarser_tiers_keep_the_dip_and_weigh_the_mean_by_samples(node):
    """A ten-minute bucket is made from its minutes once the last one is rolled up: the lowest
    minimum survives, and the mean counts every sample once."""
    HostReading.objects.bulk_create(
        [_sample(node, T0 + timedelta(seconds=5 * i), 10.0) for i in range(1, 12)]  # minute 0
        + [_sample(node, T0 + timedelta(minutes=4, seconds=30), 1.0)]  # a lone dip in minute 4
    )

    rollup_node(node, now=T0 + timedelta(minutes=9, seconds=59))
    assert not Rollup.objects.filter(resolution=600).exists()  # minute 9 is not closed yet

    rollup_node(node, now=T0 + timedelta(minutes=10, seconds=31))
    bucket = Rollup.objects.get(resolution=600)
    assert (bucket.start, bucket.min, bucket.max, bucket.count) == (T0, 1.0, 10.0, 12)
    assert bucket.mean == (11 * 10.0 + 1.0) / 12


def test_coarse_buckets_are_completed_across_a_pause_in_collection(node):
    """Samples stop mid-hour and resume hours later: the buckets that ended in the pause are
    still made from the minutes before it."""
    host_sample(node, Metric.MEM_AVAILABLE, T0 + timedelta(minutes=3), 5.0)
    rollup_node(node, now=T0 + timedelta(minutes=5))
    host_sample(node, Metric.MEM_AVAILABLE, T0 + timedelta(hours=5), 7.0)

    rollup_node(node, now=T0 + timedelta(hours=5, minutes=2))

    coarse = {(r.resolution, r.start): r.mean for r in Rollup.objects.exclude(resolution=60)}
    assert coarse == {(600, T0): 5.0, (3600, T0): 5.0}


def test_two_runs_racing_on_one_node_write_each_bucket_once(node):
    """Two workers read the node before either rolls it up: the second one's compare-and-set
    of the watermark fails, and it writes nothing."""
    from collectors.models import Node

    host_sample(node, Metric.MEM_AVAILABLE, T0 + timedelta(seconds=5), 5.0)
    first, second = Node.objects.get(pk=node.pk), Node.objects.get(pk=node.pk)

    assert rollup_node(first, now=T0 + timedelta(hours=2)) > 0
    assert rollup_node(second, now=T0 + timedelta(hours=2)) == 0

    assert Rollup.objects.filter(resolution=60).count() == 1
    assert Rollup.objects.filter(resolution=3600).count() == 1
    second.refresh_from_db()
    assert second.rolled_up_until == T0 + timedelta(hours=1, minutes=59)
