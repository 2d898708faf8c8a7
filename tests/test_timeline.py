"""The overview's one timeline: panels, exact and stepwise series, markers, the JSON endpoint."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.test import Client
from django.utils import timezone

from collectors.models import (
    Collection,
    Engine,
    EngineMetric,
    EngineReading,
    Event,
    HostReading,
    LedgerChange,
    Metric,
    Rollup,
)
from collectors.readings import ENGINE, HOST, Sample
from collectors.retention import floor_to
from dashboard.alerting.models import Alert
from dashboard.downsample import epoch_ms as ms
from dashboard.restarts.models import Restart
from dashboard.timeline import timeline
from tests.stored import engine_sample, host_sample

GIB = 1024**3


@pytest.fixture
def now() -> datetime:
    return timezone.now().replace(microsecond=0)


def _engine(node, name: str) -> Engine:
    return Engine.objects.create(node=node, name=name, container_id=f"{name}-id",
                                 container_state="running", phase="ready")


def _series(data: dict, key: str) -> dict:
    return next(s for s in data["series"] if s["key"] == key)


def _pairs(series: dict) -> list[tuple[int, float | None]]:
    return list(zip(series["x"], series["y"], strict=True))


def _collected(node, first: datetime, last: datetime, every: int = 10) -> None:
    """Host samples every ``every`` seconds from ``first`` to ``last``: SparkOps collecting."""
    count = int((last - first).total_seconds()) // every
    moments = [first + timedelta(seconds=every * i) for i in range(count + 1)]
    HostReading.objects.bulk_create([
        HOST.reading(node, at, [Sample(Metric.MEM_AVAILABLE, at, 30 * GIB)]) for at in moments])


def test_panels_share_one_range_and_host_series_are_in_gib_with_gaps(node, now):
    for i in range(10):
        at = now - timedelta(seconds=5 * (10 - i))
        host_sample(node, Metric.MEM_AVAILABLE, at, 30 * GIB)
    Collection.objects.create(node=node, at=now - timedelta(seconds=2), ok=False,
                              window_started_at=now - timedelta(seconds=7),
                              error="/proc/meminfo is not readable")

    data = timeline(node, "1h", now, 2000, 5.0)

    assert [p["key"] for p in data["panels"]] == ["markers", "headroom", "ledger", "kv",
                                                  "prefill", "decode"]
    assert data["start"] == (now - timedelta(hours=1)).isoformat()
    available = _series(data, "mem_available")
    assert available["panel"] == "headroom" and available["unit"] == "GiB"
    assert available["y"][:10] == [30.0] * 10
    assert available["y"][-1] is None  # the failed collection is a gap, not a zero
    assert data["failures"][0]["error"] == "/proc/meminfo is not readable"
    assert _series(data, "mem_free")["y"] == [None]  # nothing known: a gap only


def test_swap_in_use_is_no_line_while_the_machine_has_no_swap(node, now):
    """Swap added halfway: before it, SwapTotal 0 and 'used' 0 are no line (a 0 would read as
    'swap is fine'); after it, the real use is drawn."""
    rows = []
    for i in range(10):
        at = now - timedelta(seconds=10 * (10 - i))
        total = 0 if i < 5 else 8 * GIB
        used = 0 if i < 5 else GIB
        rows.append(HOST.reading(node, at, [Sample(Metric.SWAP_TOTAL, at, total),
                                            Sample(Metric.SWAP_USED, at, used)]))
    HostReading.objects.bulk_create(rows)

    data = timeline(node, "1h", now, max_points=500, interval=10)

    values = [y for _, y in _pairs(_series(data, "swap_used"))]
    assert values[:5] == [None] * 5
    assert [y for y in values[5:] if y is not None] == [1.0] * 5


def test_every_series_stays_within_max_points_and_keeps_the_dip(node, now):
    moments = [now - timedelta(seconds=2 * i) for i in range(1700)]
    rows = [HOST.reading(node, at, [Sample(Metric.MEM_AVAILABLE_MIN, at,
                                           (4 if i == 777 else 40) * GIB)])
            for i, at in enumerate(moments)]
    HostReading.objects.bulk_create(rows)
    engine = _engine(node, "gemma")
    EngineReading.objects.bulk_create([
        ENGINE.reading(engine, at, [Sample(EngineMetric.DECODE_TPS, at,
                                           0.0 if i == 500 else 41.1)])
        for i, at in enumerate(moments)
    ])

    data = timeline(node, "1h", now, 300, 5.0)

    minimum = _series(data, "mem_available_min")
    decode = _series(data, "gemma:decode_tps")
    assert all(len(s["x"]) <= 300 for s in data["series"])
    assert min(v for v in minimum["y"] if v is not None) == 4.0
    assert min(v for v in decode["y"] if v is not None) == 0.0  # the stall stays visible


def test_kv_pools_are_steps_rebuilt_from_ledger_changes(node, now):
    gemma, neighbour = _engine(node, "gemma"), _engine(node, "neighbour")
    node.ledger = {"engines": [{"engine_id": gemma.pk}, {"engine_id": neighbour.pk}]}
    node.save()
    appeared, grew = now - timedelta(minutes=40), now - timedelta(minutes=10)
    LedgerChange.objects.create(node=node, engine=neighbour, label="neighbour's KV pool",
                                component=f"engine:{neighbour.pk}:kv_pool", at=appeared,
                                before_bytes=0, after_bytes=8 * GIB)
    LedgerChange.objects.create(node=node, engine=neighbour, label="neighbour's KV pool",
                                component=f"engine:{neighbour.pk}:kv_pool", at=grew,
                                before_bytes=8 * GIB, after_bytes=24 * GIB)
    LedgerChange.objects.create(node=node, engine=gemma, label="gemma's KV pool",
                                component=f"engine:{gemma.pk}:kv_pool",
                                at=now - timedelta(hours=3), before_bytes=0, after_bytes=20 * GIB)
    _collected(node, now - timedelta(hours=1), now)

    data = timeline(node, "1h", now, 2000, 5.0)

    pool = _series(data, "neighbour:kv_pool")
    assert pool["exactness"] == "stepwise" and pool["panel"] == "ledger"
    # Unknown before SparkOps first saw it (no point at the range start), 8 then 24 GiB up to now.
    assert _pairs(pool) == [(ms(appeared), 8.0), (ms(grew), 24.0),
                            (ms(now), 24.0)]
    # A pool that last changed before the range holds that size from the first collection.
    assert _pairs(_series(data, "gemma:kv_pool")) == [
        (ms(now - timedelta(hours=1)), 20.0), (ms(now), 20.0)]


def test_a_gone_engines_pool_ends_when_it_was_last_seen(node, now):
    gone = _engine(node, "old")
    gone.present, gone.last_seen = False, now - timedelta(minutes=5)
    gone.save()
    LedgerChange.objects.create(node=node, engine=gone, label="old's KV pool",
                                component=f"engine:{gone.pk}:kv_pool",
                                at=now - timedelta(minutes=30), before_bytes=0,
                                after_bytes=4 * GIB)
    _collected(node, now - timedelta(hours=1), now)

    data = timeline(node, "1h", now, 2000, 5.0)

    assert _series(data, "old:kv_pool")["x"][-1] == ms(now - timedelta(minutes=5))


def test_other_processes_that_moved_are_drawn_as_steps(node, now):
    node.ledger = {"processes": [{"name": "postgres", "rss_bytes": 6 * GIB, "count": 4}]}
    node.save()
    moved = now - timedelta(minutes=20)
    LedgerChange.objects.create(node=node, component="process:postgres", label="process postgres",
                                at=moved, before_bytes=2 * GIB, after_bytes=6 * GIB)
    _collected(node, now - timedelta(hours=1), now)

    data = timeline(node, "1h", now, 2000, 5.0)

    process = _series(data, "process:postgres")
    assert process["label"] == "process postgres" and process["exactness"] == "stepwise"
    assert _pairs(process) == [(ms(now - timedelta(hours=1)), 2.0),
                               (ms(moved), 6.0), (ms(now), 6.0)]


def test_a_step_line_starts_at_the_first_collection_and_breaks_across_a_gap(node, now):
    gemma = _engine(node, "gemma")
    node.ledger = {"engines": [{"engine_id": gemma.pk}],
                   "processes": [{"name": "postgres", "rss_bytes": 6 * GIB, "count": 4}]}
    node.save()
    LedgerChange.objects.create(node=node, engine=gemma, label="gemma's KV pool",
                                component=f"engine:{gemma.pk}:kv_pool",
                                at=now - timedelta(hours=8), before_bytes=0, after_bytes=20 * GIB)
    moved = now - timedelta(minutes=100)
    LedgerChange.objects.create(node=node, component="process:postgres", label="process postgres",
                                at=moved, before_bytes=2 * GIB, after_bytes=6 * GIB)
    # Two runs of SparkOps in a 6 h range, an hour apart: nothing was collected before, between
    # or after them but in the last half hour.
    first_run, gap_from = now - timedelta(hours=2), now - timedelta(minutes=90)
    second_run = now - timedelta(minutes=30)
    _collected(node, first_run, gap_from)
    _collected(node, second_run, now)

    data = timeline(node, "6h", now, 2000, 5.0)

    pool = _pairs(_series(data, "gemma:kv_pool"))
    process = _pairs(_series(data, "process:postgres"))
    for points in (pool, process):
        known = [at for at, value in points if value is not None]
        assert min(known) == ms(first_run)  # nothing before the first collection
        breaks = [at for at, value in points if value is None]
        assert len(breaks) == 1 and ms(gap_from) < breaks[0] < ms(second_run)
    assert process == [(ms(first_run), 2.0), (ms(moved), 6.0),
                       (ms(gap_from), 6.0), (breaks[0], None),
                       (ms(second_run), 6.0), (ms(now), 6.0)]
    assert [value for _, value in pool] == [20.0, 20.0, None, 20.0, 20.0]


def test_engine_holdings_prefer_nvml_and_rates_are_per_engine(node, now):
    gemma = _engine(node, "gemma")
    at = now - timedelta(seconds=30)
    engine_sample(gemma, EngineMetric.GPU_MEMORY, at, 40 * GIB)
    engine_sample(gemma, EngineMetric.CONTAINER_MEMORY, at, 2 * GIB)
    engine_sample(gemma, EngineMetric.KV_CACHE_USAGE, at, 0.25)
    engine_sample(gemma, EngineMetric.PREFILL_TPS, at, 2383.0)
    engine_sample(gemma, EngineMetric.DECODE_TPS, at, None)

    data = timeline(node, "1h", now, 2000, 5.0)

    holds = _series(data, "gemma:holds")
    assert holds["label"] == "gemma holds (NVML per-process)" and holds["y"] == [40.0]
    assert _series(data, "gemma:kv_usage")["y"] == [25.0]  # percent
    assert _series(data, "gemma:prefill_tps")["y"] == [2383.0]
    assert _series(data, "gemma:decode_tps")["y"] == [None]  # unknown stays unknown
    assert data["engines"] == ["gemma"]


def test_markers_tell_restarts_alerts_phase_changes_and_stalls(node, now):
    gemma = _engine(node, "gemma")
    began = now - timedelta(minutes=50)
    Restart.objects.create(node=node, engine=gemma, kind="planned", status="succeeded",
                           started_at=began, finished_at=began + timedelta(minutes=9),
                           startup_seconds=480, reason="new weights")
    Restart.objects.create(node=node, engine=gemma, kind="unplanned", status="detected",
                           requested_at=now - timedelta(minutes=20),
                           started_at=now - timedelta(minutes=20), reason="exited")
    Restart.objects.create(node=node, engine=gemma, kind="planned", status="cancelled",
                           requested_at=now - timedelta(minutes=5),
                           finished_at=now - timedelta(minutes=4))
    Alert.objects.create(rule="prefill-squeeze", node=node, engine=gemma, scope="s1",
                         state="resolved", severity="critical", summary="gemma may not fit",
                         threshold=4.0, started_at=now - timedelta(minutes=31),
                         fired_at=now - timedelta(minutes=30),
                         resolved_at=now - timedelta(minutes=15),
                         last_evaluated_at=now - timedelta(minutes=15))
    Event.objects.create(node=node, engine=gemma, at=now - timedelta(minutes=41),
                         kind="phase-change", message="gemma: loading → ready")
    Event.objects.create(node=node, engine=gemma, at=now - timedelta(minutes=12),
                         kind="prefill-stall", severity="warning",
                         message="gemma: decode stalled for 83 s while a long prompt prefilled")
    Event.objects.create(node=node, engine=gemma, at=now - timedelta(minutes=11),
                         kind="scrape-failed", message="noise")

    markers = timeline(node, "1h", now, 2000, 5.0)["markers"]

    kinds = [m["kind"] for m in markers]
    assert kinds == ["restart-planned", "phase-change", "alert-fired", "restart-unplanned",
                     "alert-resolved", "prefill-stall"]
    planned = markers[0]
    assert planned["until"] == (began + timedelta(minutes=9)).isoformat()
    assert "ready after 8.0 min" in planned["text"] and "new weights" in planned["text"]
    assert markers[2]["lane"] == "alerts" and "gemma may not fit" in markers[2]["text"]
    assert "stalled for 83 s" in markers[5]["text"]


def test_long_ranges_read_the_ten_minute_tier_then_finer_rows_up_to_now(node, now):
    from collectors.models import EngineRollup

    bucket = floor_to(now - timedelta(days=2), 600)
    Rollup.objects.create(node=node, metric=Metric.MEM_AVAILABLE, resolution=600, start=bucket,
                          min=2 * GIB, max=9 * GIB, mean=5 * GIB, count=120)
    gemma = _engine(node, "gemma")
    EngineRollup.objects.create(engine=gemma, metric=EngineMetric.DECODE_TPS, resolution=600,
                                start=bucket, min=2.0, max=41.0, mean=30.0, count=480)
    # Newer than the last ten-minute bucket: a minute roll-up, then raw samples.
    EngineRollup.objects.create(engine=gemma, metric=EngineMetric.DECODE_TPS, resolution=60,
                                start=bucket + timedelta(minutes=10), min=7.0, max=7.0,
                                mean=7.0, count=12)
    engine_sample(gemma, EngineMetric.DECODE_TPS, bucket + timedelta(minutes=11, seconds=5), 8.0)
    node.rolled_up_until = bucket + timedelta(minutes=11)
    node.save()

    data = timeline(node, "7d", now, 2000, 5.0)

    assert data["source"] == "10 min"
    assert _series(data, "mem_available")["y"] == [2.0, 9.0]  # the bucket's min and max
    assert _series(data, "gemma:decode_tps")["y"] == [2.0, 41.0, 7.0, 8.0]


def test_timeline_json_needs_login_and_a_known_range(admin_client, node):
    assert Client().get("/api/nodes/spark-a/timeline.json").status_code == 302
    assert admin_client.get("/api/nodes/spark-a/timeline.json?range=2h").status_code == 400
    assert admin_client.get("/api/nodes/nope/timeline.json").status_code == 404

    data = admin_client.get("/api/nodes/spark-a/timeline.json?range=6h").json()

    assert data["range"] == "6h" and data["source"] == "1 min" and data["max_points"] == 2000


def test_a_new_installs_chart_starts_at_its_first_collection(node, now):
    first = now - timedelta(minutes=20)
    Collection.objects.create(node=node, at=first, window_started_at=first, ok=True)

    young = timeline(node, "6h", now, 2000, 5.0)
    Collection.objects.create(node=node, at=now - timedelta(hours=7),
                              window_started_at=now - timedelta(hours=7), ok=True)
    older = timeline(node, "6h", now, 2000, 5.0)

    assert young["shown_start"] == first.isoformat()
    assert young["start"] == (now - timedelta(hours=6)).isoformat()  # the range itself stays
    assert older["shown_start"] == older["start"]
