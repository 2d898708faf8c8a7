"""The alert rules over stored state, and the pipeline that turns them into notifications."""

from datetime import UTC, datetime, timedelta

import pytest

from collectors.ledger import build_ledger, record_changes
from collectors.models import (
    Engine,
    EngineMetric,
    EngineStart,
    Event,
    Metric,
)
from dashboard.alerting.models import Alert
from dashboard.alerting.pipeline import run_alerts
from dashboard.alerting.rules import (
    RULES,
    engine_down,
    headroom_floor,
    overcommit,
    prefill_squeeze,
    prefill_stall,
    queue_backlog,
    restart_failed,
)
from dashboard.alerting.settings import rule_settings
from dashboard.notify.models import Channel, Notification
from dashboard.restarts.fit import MemoryReturn
from dashboard.restarts.models import Restart
from sparkops.units import GIB
from tests.stored import engine_sample, host_sample

T0 = datetime(2026, 11, 30, 14, 0, tzinfo=UTC)


def _engine(node, name, kv_gib, **extra):
    values = dict(node=node, name=name, container_id=name * 8, container_state="running",
                  phase="ready", startup={"weights_gib": 15.0, "kv_cache_gib": kv_gib,
                                          "cuda_graph_gib": 0.5},
                  config={"max_num_batched_tokens": 8192, "kv_cache_memory_bytes": 1})
    values.update(extra)
    return Engine.objects.create(**values)


def _figures(available_gib, minimum_gib=None, swap=0):
    return {"mem_total": int(121.69 * GIB), "mem_available": int(available_gib * GIB),
            "mem_available_min": int((minimum_gib or available_gib) * GIB),
            "page_cache_reclaimable": 2 * GIB, "swap_used": swap}


def _thresholds(rule):
    return dict(rule_settings(rule).thresholds)


def _ledger(node, at, figures, engines):
    record_changes(node, build_ledger(node, at, figures, engines, []), at)
    node.refresh_from_db()
    return node.ledger


def test_prefill_squeeze_names_the_engine_at_risk_and_the_neighbour_that_grew(node):
    a = _engine(node, "gemma", 8.0, prefill_bytes_per_token=4 * 131072)  # need 4 GiB
    b = _engine(node, "nemotron", 8.0)
    _ledger(node, T0, _figures(30), [a, b])
    b.startup = {**b.startup, "kv_cache_gib": 24.0}
    b.save()
    at = T0 + timedelta(minutes=2)
    ledger = _ledger(node, at, _figures(14, minimum_gib=5.5), [a, b])

    conditions = prefill_squeeze.evaluate(node, ledger, [a, b], _thresholds("prefill-squeeze"),
                                          at)

    at_risk = next(c for c in conditions if c.engine_id == a.pk)
    assert at_risk.value == pytest.approx(5.5 - 2.0)  # interval minimum − margin
    assert at_risk.threshold == pytest.approx(4.0)
    assert at_risk.crosses_threshold() is True
    cause = at_risk.details["causes"][0]
    assert cause["label"] == "nemotron's KV pool"
    assert (cause["before_bytes"], cause["after_bytes"]) == (8 * GIB, 24 * GIB)
    # The cause is its own field (the alert keeps the one it fired for), not part of the summary
    # that is refreshed at every evaluation.
    assert at_risk.details["cause"] == "nemotron's KV pool went 8.00 → 24.00 GiB at 14:02:00 UTC"
    assert "cause" not in at_risk.summary
    assert at_risk.details["prefill_need_source"] == "estimate"


def test_prefill_squeeze_is_unknown_without_a_need_and_skips_starting_engines(node):
    unknown = _engine(node, "unknown-need", 8.0)
    starting = _engine(node, "starting", 8.0, phase="loading", prefill_bytes_per_token=1)
    ledger = _ledger(node, T0, _figures(30), [unknown, starting])

    assert prefill_squeeze.evaluate(node, ledger, [unknown, starting],
                                    _thresholds("prefill-squeeze"), T0) == []


def test_headroom_floor_scales_on_small_machines_and_counts_growing_swap(node):
    ledger = {"mem_total": 24 * GIB, "mem_available": int(1.2 * GIB), "swap_used": 0}
    low = headroom_floor.evaluate(node, ledger, [], _thresholds("headroom-floor"), T0)[0]
    assert low.threshold == pytest.approx(24 * 0.065)  # not 8 GiB on a 24 GiB machine
    assert low.crosses_threshold()

    host_sample(node, Metric.SWAP_USED, T0 - timedelta(seconds=60), 0)
    swapping = {"mem_total": int(121.69 * GIB), "mem_available": 40 * GIB,
                "swap_used": 512 * 1024**2}
    cond = headroom_floor.evaluate(node, swapping, [], _thresholds("headroom-floor"), T0)[0]
    assert cond.crosses_threshold() and "swap in use grows 512 MiB/min" in cond.summary


def test_queue_backlog_measures_how_long_requests_have_waited(node):
    engine = _engine(node, "gemma", 8.0, config={"max_num_seqs": 16})
    for s, v in [(0, 4), (5, 4), (10, 3), (15, 2), (20, 1), (25, 0), (30, 0)]:
        engine_sample(engine, EngineMetric.REQUESTS_WAITING, T0 - timedelta(seconds=s), v)

    cond = queue_backlog.evaluate(node, {}, [engine], _thresholds("queue-backlog"), T0)[0]

    assert cond.value == 20.0 and cond.crosses_threshold()


def test_prefill_stall_compares_decode_with_its_recent_rate(node):
    engine = _engine(node, "gemma", 8.0, rates={"prefill_tokens_per_s": 1800.0,
                                                "decode_tokens_per_s": 1.0})
    for i in range(10):
        engine_sample(engine, EngineMetric.DECODE_TPS, T0 - timedelta(seconds=60 + 5 * i), 16.0)
    for s in (0, 5):
        engine_sample(engine, EngineMetric.DECODE_TPS, T0 - timedelta(seconds=s), 1.0)

    cond = prefill_stall.evaluate(node, {}, [engine], _thresholds("prefill-stall"), T0)[0]

    assert cond.value == pytest.approx(1.0 / 16.0) and cond.crosses_threshold()


@pytest.mark.parametrize(("fields", "reason"), [
    ({"container_state": "exited", "exit_code": 137}, "container exited (exit code 137)"),
    ({"phase": "failed", "startup": {"errors": [{"kind": "x", "message": "Free memory"}]}},
     "startup failed: Free memory"),
    ({"last_scrape_error": "connection refused"}, "/metrics: connection refused"),
    ({"phase": "loading", "last_scrape_error": "connection refused"}, ""),
])
def test_engine_down_reasons(node, fields, reason):
    engine = _engine(node, "gemma", 8.0, **fields)

    cond = engine_down.evaluate(node, {}, [engine], {}, T0)[0]

    assert cond.details["reason"] == reason
    assert cond.crosses_threshold() is bool(reason)


def test_overcommit_counts_pinned_pools_and_utilization_fractions(node):
    pinned = _engine(node, "pinned", 60.0)
    unpinned = _engine(node, "unpinned", None, config={"gpu_memory_utilization": 0.5},
                       startup={})
    ledger = _ledger(node, T0, _figures(30), [pinned, unpinned])

    cond = overcommit.evaluate(node, ledger, [pinned, unpinned], _thresholds("overcommit"),
                               T0)[0]

    # 15 + 60 + 0.5 GiB pinned, plus 0.5 × 121.69 GiB unpinned = 136.3 GiB of 121.69
    assert cond.value == pytest.approx(75.5 + 0.5 * 121.69 - 121.69, abs=0.01)
    assert cond.crosses_threshold()


def test_restart_failed_is_open_while_recent_unless_the_abort_left_the_engine_serving(node):
    failed, aborted_stopped, aborted_serving, old = (
        _engine(node, name, 8.0) for name in ("failed", "stopped", "serving", "old"))
    for engine, status, running, minutes_ago in [
        (failed, "failed", True, 5), (aborted_stopped, "aborted", False, 5),
        (aborted_serving, "aborted", True, 5), (old, "interrupted", False, 90),
    ]:
        Restart.objects.create(node=node, engine=engine, kind="planned", status=status,
                               requested_at=T0 - timedelta(minutes=minutes_ago + 1),
                               finished_at=T0 - timedelta(minutes=minutes_ago),
                               container_state={"running": running}, outcome=f"{status} here")

    conditions = restart_failed.evaluate(node, {}, [], _thresholds("restart-failed"), T0)

    by_engine = {c.engine_id: c for c in conditions}
    assert set(by_engine) == {failed.pk, aborted_stopped.pk, old.pk}
    assert by_engine[failed.pk].crosses_threshold() and by_engine[aborted_stopped.pk].value == 1
    assert by_engine[old.pk].value == 0.0  # ended 90 min ago: past the 60 min memory
    assert by_engine[failed.pk].summary == \
        "failed: planned restart failed at 2026-11-30 13:55:00 UTC: failed here"


def test_every_rule_names_its_conditions_after_itself(node):
    engine = _engine(node, "gemma", 8.0, prefill_bytes_per_token=1, container_state="exited")
    # A part of an engine spread over nodes (its label says so), for orphan-rank to judge.
    engine.span_key, engine.span = "label|gemma-tp2", {
        "role": "rank", "rank": 1, "ranks": 2, "backend": "label", "serves_api": False}
    engine.save(update_fields=["span_key", "span"])
    ledger = _ledger(node, T0, _figures(30), [engine])
    for kind, status in (("planned", "failed"), ("unplanned", "detected")):
        Restart.objects.create(node=node, engine=engine, kind=kind, status=status,
                               requested_at=T0 - timedelta(minutes=1))
    EngineStart.objects.create(engine=engine, node=node, identity="c1@t0", seen_at=T0,
                               predicted={"held": {"value": GIB, "confidence": "exact"}})
    Event.objects.create(node=node, kind="unexpected-reboot", severity="critical",
                         at=T0 - timedelta(minutes=1), message="Unexpected reboot")
    Restart.objects.create(
        node=node, engine=engine, kind="unplanned", status="detected",
        requested_at=T0 - timedelta(minutes=2), started_at=T0 - timedelta(minutes=2),
        after={"memory_return": {
            "verdict": "not returned", "stopped_at": (T0 - timedelta(minutes=1)).isoformat(),
            "accounts": [MemoryReturn("host", 20 * GIB, 24 * GIB, GIB, best=30 * GIB).as_dict()],
            "engines_held": {}}})

    named = {name: {c.rule for c in rule.evaluate(node, ledger, [engine],
                                                  _thresholds(name), T0)}
             for name, rule in RULES.items()}

    assert named == {name: {name} for name in RULES}


def test_pipeline_queues_one_notification_per_channel_when_an_alert_fires(node):
    Channel.objects.create(name="ops mail", kind="email", config={"to": ["ops@example.com"]})
    engine = _engine(node, "gemma", 8.0, container_state="exited", exit_code=1)
    node.ledger = {"mem_total": int(121.69 * GIB), "mem_available": 40 * GIB, "engines": []}
    node.save()

    run_alerts(node, T0)
    run_alerts(node, T0 + timedelta(seconds=61))  # engine-down fires after its 60 s
    run_alerts(node, T0 + timedelta(seconds=70))

    alert = Alert.objects.get(rule="engine-down", engine=engine)
    assert alert.state == "firing"
    notifications = Notification.objects.filter(alert_id=alert.pk)
    assert [(n.kind, n.channel.name) for n in notifications] == [("firing", "ops mail")]
    assert "gemma" in notifications[0].subject


def test_a_prefill_stall_that_ends_is_an_event_with_its_duration(node):
    from collectors.models import Event

    engine = _engine(node, "gemma", 8.0, rates={"prefill_tokens_per_s": 1800.0})
    node.ledger = {"mem_total": int(121.69 * GIB), "mem_available": 40 * GIB, "engines": []}
    node.save()
    for i in range(10):
        engine_sample(engine, EngineMetric.DECODE_TPS, T0 - timedelta(minutes=5, seconds=5 * i),
                      16.0)
    engine_sample(engine, EngineMetric.DECODE_TPS, T0, 0.5)

    run_alerts(node, T0)
    engine_sample(engine, EngineMetric.DECODE_TPS, T0 + timedelta(seconds=83), 16.0)
    run_alerts(node, T0 + timedelta(seconds=83))

    alert = Alert.objects.get(rule="prefill-stall")
    assert alert.state == "resolved"
    event = Event.objects.get(kind="prefill-stall")
    assert event.engine == engine and "stalled for 83 s" in event.message


def test_a_round_of_a_beating_node_reads_its_open_alerts_once(node):
    """The hold, the lifecycle and the stalls that ended share one read of the open alerts."""
    import re

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    _engine(node, "gemma", 8.0)
    node.ledger = {"mem_total": int(121.69 * GIB), "mem_available": 40 * GIB, "engines": []}
    node.heartbeat_at = T0  # beating: the hold asks for an open node-unreachable alert
    node.save()
    alert_reads = re.compile(r'^SELECT .* FROM "dashboard_alert"\s')
    for round_at in (T0, T0 + timedelta(seconds=5)):
        with CaptureQueriesContext(connection) as captured:
            run_alerts(node, round_at)
        reads = [q["sql"] for q in captured.captured_queries if alert_reads.match(q["sql"])]
        assert len(reads) == 1, reads


def test_causes_are_net_growth_per_component_not_the_biggest_single_step(node):
    from collectors.models import LedgerChange

    at_risk = _engine(node, "gemma", 8.0)
    neighbour = _engine(node, "nemotron", 8.0)
    rows = [  # weights loading in steps (non-KV), then the pool: 8 → 24 GiB
        ("engine:2:non_kv", "nemotron's non-KV memory", 0, 6), ("engine:2:non_kv",
         "nemotron's non-KV memory", 6, 12), ("engine:2:kv_pool", "nemotron's KV pool", 8, 24),
        ("page_cache", "page cache", 4, 9), ("page_cache", "page cache", 9, 4),
    ]
    for i, (component, label, before, after) in enumerate(rows):
        LedgerChange.objects.create(node=node, engine=neighbour if "engine" in component else None,
                                    component=component, label=label,
                                    at=T0 + timedelta(seconds=i), before_bytes=before * GIB,
                                    after_bytes=after * GIB)

    causes = prefill_squeeze.causes(node, at_risk, T0 + timedelta(minutes=1), 30)

    assert [(c["label"], c["growth_bytes"]) for c in causes] == [
        ("nemotron's KV pool", 16 * GIB), ("nemotron's non-KV memory", 12 * GIB)]
