"""Each engine start's prediction, its outcome and the predicted-squeeze alert, on the seed's node.

The seed: gemma (12.5 GiB prefill need) and nemotron share a GB10 with 30 GiB of headroom;
nemotron is recreated with its KV pool raised from 8 to 24 GiB, which leaves 14 GiB: less than
gemma's need plus the 2 GiB margin. While nemotron loads, SparkOps predicts that
(``collectors.starts``) and ``predicted-squeeze`` fires; once it is ready the alert settles with
how close the prediction came. The container side of the same story runs in
``tests/test_predicted_squeeze_scenario.py``.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from collectors.ledger import build_ledger
from collectors.models import Engine, EngineStart
from collectors.starts import accuracy_text, figure_errors, history_for, observe_starts
from collectors.vllm.flags import parse_command_line
from dashboard.alerting.models import Alert, AlertState, ResolveReason, RuleSetting
from dashboard.alerting.pipeline import run_alerts
from dashboard.alerting.rules import predicted_squeeze
from dashboard.alerting.settings import RULES
from tests.test_planner import GEMMA_NEED, NEMOTRON_COMMAND, TOTAL, seed_node

pytestmark = pytest.mark.django_db
GIB = 1024**3
T0 = timezone.now().replace(microsecond=0)
THRESHOLDS = {"hysteresis_gib": 0.5}


def _figures(available: float) -> dict:
    return {"mem_total": TOTAL, "mem_available": int(available * GIB),
            "mem_available_min": int(available * GIB),
            "page_cache_reclaimable": int(3.2 * GIB), "swap_used": 0}


def _recreate(engine: Engine, kv: str, at, container: str = "n2") -> Engine:
    """The container recreated with another pool: a new id and start, its log just begun."""
    command = NEMOTRON_COMMAND.format(kv=kv, util="0.8")
    engine.container_id = container * 32
    engine.started_at = at
    engine.phase = "loading"
    engine.command = command.split()
    engine.config = parse_command_line(command).as_dict()
    engine.startup = {"phase": "loading", "version": "0.33.0"}
    engine.metrics = {}
    engine.gpu_memory_bytes = 5 * GIB  # a fifth of its weights loaded
    engine.save()
    return engine


def _ready(engine: Engine, kv_gib: float) -> Engine:
    engine.phase = "ready"
    engine.startup = {"phase": "ready", "version": "0.33.0", "weights_gib": 62.9,
                      "kv_cache_gib": kv_gib, "kv_cache_pinned": True, "cuda_graph_gib": 0.6,
                      "startup_seconds": 540.0}
    engine.gpu_memory_bytes = int((62.9 + kv_gib + 0.6) * GIB)
    engine.save()
    return engine


def _collect(node, available: float, at) -> list[Engine]:
    """One cycle: the engine collection (the starts, against the ledger stored before), then
    the host collection that writes the ledger."""
    engines = list(node.engines.all())
    observe_starts(node, engines, at)
    node.ledger = build_ledger(node, at, _figures(available), engines, []).as_dict()
    node.save()
    return engines


@pytest.fixture
def seed():
    node = seed_node()
    return node, node.engines.get(name="gemma-4-26b"), node.engines.get(name="nemotron-120b")


def test_a_start_seen_while_loading_is_predicted_and_measured_once_ready(seed):
    node, gemma, nemotron = seed
    observe_starts(node, [gemma, nemotron], T0)  # the running engines: seen already ready
    assert {s.no_prediction for s in EngineStart.objects.all()} == {
        "SparkOps first saw this start in phase ready, after its KV pool was allocated"}

    _recreate(nemotron, "24G", T0)
    observe_starts(node, list(node.engines.all()), T0 + timedelta(seconds=5))
    start = nemotron.starts.get(outcome="starting")
    predicted = start.predicted
    assert predicted["kv_pool"]["value"] == 24 * GIB and predicted["kv_pool"]["confidence"] \
        == "exact"
    # Its weights and graphs as the start before reported them (the ledger still holds them).
    assert predicted["weights"]["value"] == int(62.9 * GIB)
    assert predicted["held"]["value"] == int(62.9 * GIB) + 24 * GIB + int(0.6 * GIB)
    assert predicted["startup_seconds"]["value"] is None  # no earlier start measured
    assert start.version == "0.33.0" and start.predicted_at is not None

    _ready(nemotron, 24.0)
    observe_starts(node, list(node.engines.all()), T0 + timedelta(minutes=9))
    start.refresh_from_db()
    assert start.outcome == EngineStart.Outcome.READY
    assert start.actual["kv_pool"]["value"] == 24 * GIB  # the flag, which the log confirms
    errors = {row["name"]: row for row in figure_errors(start)}
    assert errors["kv_pool"]["error"] == "exact"
    assert errors["weights"]["predicted"] == "62.90 GiB"
    assert errors["startup_seconds"]["error"] == "unknown — not predicted"
    assert "KV pool predicted 24.00 GiB, actual 24.00 GiB (exact)" in accuracy_text(start)


def test_a_start_replaced_before_it_was_ready_is_gone_and_a_failed_one_failed(seed):
    node, gemma, nemotron = seed
    _recreate(nemotron, "24G", T0)
    observe_starts(node, [gemma, nemotron], T0)
    _recreate(nemotron, "12G", T0 + timedelta(minutes=1), container="n3")
    observe_starts(node, [gemma, nemotron], T0 + timedelta(minutes=1))
    first, second = nemotron.starts.order_by("pk")
    assert first.outcome == EngineStart.Outcome.GONE and second.outcome == "starting"
    nemotron.phase = "failed"
    nemotron.save()
    observe_starts(node, [gemma, nemotron], T0 + timedelta(minutes=2))
    second.refresh_from_db()
    assert second.outcome == EngineStart.Outcome.FAILED and second.predicted
    # A container seen stopped under a start never seen running is no start at all.
    Engine.objects.filter(pk=gemma.pk).update(container_state="exited", phase="stopped",
                                              container_id="x" * 64)
    observe_starts(node, list(node.engines.all()), T0 + timedelta(minutes=3))
    assert not gemma.starts.filter(identity__startswith="x" * 64).exists()


def test_a_cycle_reads_the_starts_once_and_writes_only_a_start_that_ended(seed):
    node, gemma, nemotron = seed
    _recreate(nemotron, "24G", T0)
    observe_starts(node, [gemma, nemotron], T0)
    loading = nemotron.starts.get()
    with CaptureQueriesContext(connection) as steady:
        observe_starts(node, [gemma, nemotron], T0 + timedelta(seconds=5))
    starts_sql = [q["sql"] for q in steady.captured_queries if "enginestart" in q["sql"]]
    assert len(starts_sql) == 1 and starts_sql[0].startswith("SELECT"), starts_sql
    # The engine vanished from the node (not merely stopped): its open start ended unseen.
    observe_starts(node, [gemma], T0 + timedelta(seconds=10))
    loading.refresh_from_db()
    assert loading.outcome == EngineStart.Outcome.GONE
    assert loading.finished_at == T0 + timedelta(seconds=10)


def test_history_corrects_weights_time_to_ready_and_free_memory_at_boot(seed):
    node, gemma, nemotron = seed
    _recreate(nemotron, "8G", T0)
    # A profiled start: no pinned pool, its pool follows the free memory at boot.
    profiled = "vllm serve nvidia/Nemotron-3-Super-120B-A12B-NVFP4 --gpu-memory-utilization " \
               "0.8 --max-num-batched-tokens 8192"
    nemotron.command, nemotron.config = profiled.split(), parse_command_line(profiled).as_dict()
    nemotron.save()
    observe_starts(node, [gemma, nemotron], T0)
    first = nemotron.starts.get(outcome="starting")
    predicted_free = first.predicted["free_at_boot"]["value"]
    _ready(nemotron, 20.0)
    nemotron.startup = {**nemotron.startup, "startup_free_gib": predicted_free / GIB - 3.0}
    nemotron.save()
    observe_starts(node, [gemma, nemotron], T0 + timedelta(minutes=9))

    # The next start: the ledger no longer knows the weights of a container that just began.
    _recreate(nemotron, "24G", T0 + timedelta(minutes=30), container="n4")
    node.ledger = build_ledger(node, T0 + timedelta(minutes=30), _figures(30 + 62.9 + 20 + 0.6 - 5),
                               list(node.engines.all()), []).as_dict()
    node.save()
    history = history_for(nemotron, node)
    assert history.weights_bytes == int(62.9 * GIB)
    assert history.free_at_boot_offset == pytest.approx(-3 * GIB, abs=GIB // 100)
    assert any("free memory at boot − 3.00 GiB" in note for note in history.notes)
    observe_starts(node, list(node.engines.all()), T0 + timedelta(minutes=30))
    second = nemotron.starts.get(outcome="starting")
    assert second.predicted["weights"]["value"] == int(62.9 * GIB)
    assert "as the latest start of this model reported" in second.predicted["weights"]["basis"]
    assert second.predicted["startup_seconds"]["value"] == 540.0
    assert any("free memory at boot" in c for c in second.corrections)


def test_a_neighbour_that_will_squeeze_fires_while_it_loads_and_one_that_fits_does_not(seed):
    node, gemma, nemotron = seed
    observe_starts(node, [gemma, nemotron], T0 - timedelta(hours=1))  # running, seen ready
    # Nemotron held 62.9 + 8 + 0.6 GiB; recreated, it holds 5 GiB of weights so far.
    loading_available = 30 + 71.5 - 5
    _recreate(nemotron, "8G", T0)
    engines = _collect(node, loading_available, T0)
    conditions = predicted_squeeze.evaluate(node, node.ledger, engines, THRESHOLDS, T0)
    at_risk = next(c for c in conditions if c.engine_id == gemma.pk)
    assert at_risk.settled is None and not at_risk.crosses_threshold()
    assert at_risk.value == pytest.approx(30.0 - 2.0, abs=0.01)  # 30 GiB after: 12.5 + 2 fit

    _recreate(nemotron, "24G", T0 + timedelta(minutes=1), container="n5")
    engines = _collect(node, loading_available, T0 + timedelta(minutes=1))
    conditions = predicted_squeeze.evaluate(node, node.ledger, engines, THRESHOLDS,
                                            T0 + timedelta(minutes=1))
    at_risk = next(c for c in conditions if c.engine_id == gemma.pk)
    assert at_risk.crosses_threshold()
    assert at_risk.value == pytest.approx(14.0 - 2.0, abs=0.01)  # 14 GiB after, less the margin
    assert at_risk.threshold == pytest.approx(GEMMA_NEED / GIB)
    assert at_risk.details["starting_engine"] == "nemotron-120b"
    assert at_risk.details["cause"].startswith(
        "nemotron-120b is starting and will hold 87.50 GiB (reported) (KV pool 24.00 GiB "
        "(exact), weights 62.90 GiB (reported), CUDA graphs 0.60 GiB (reported))")
    assert "gemma-4-26b's next prefill will not fit once nemotron-120b has loaded" \
        in at_risk.summary
    floor = next(c for c in conditions if c.engine_id == nemotron.pk)
    assert floor.details["at_risk"] == "host floor" and not floor.crosses_threshold()


def test_the_alert_fires_at_once_and_settles_when_the_engine_is_ready(seed):
    node, gemma, nemotron = seed
    for rule in RULES:
        if rule != "predicted-squeeze":
            RuleSetting.objects.create(rule=rule, enabled=False)
    observe_starts(node, [gemma, nemotron], T0 - timedelta(hours=1))  # running, seen ready
    _recreate(nemotron, "24G", T0)
    _collect(node, 30 + 71.5 - 5, T0)
    run_alerts(node, T0)
    alert = Alert.objects.get()
    assert alert.state == AlertState.FIRING and alert.engine == gemma
    assert alert.fired_cause.startswith("nemotron-120b is starting")

    _ready(nemotron, 24.0)
    later = T0 + timedelta(minutes=9)
    _collect(node, 14.0, later)
    run_alerts(node, later)
    alert.refresh_from_db()
    assert alert.state == AlertState.RESOLVED and alert.resolve_reason == ResolveReason.SETTLED
    assert alert.summary.startswith("nemotron-120b is ready: ")
    assert "KV pool predicted 24.00 GiB, actual 24.00 GiB (exact)" in alert.details["accuracy"]
    assert alert.fired_cause.startswith("nemotron-120b is starting")  # the cause it fired for
    last = alert.events.order_by("-pk").first()
    assert last.notice == "resolved" and last.message.startswith("resolved (settled): ")

    run_alerts(node, later + timedelta(seconds=5))  # a settled start opens nothing new
    assert Alert.objects.count() == 1


def test_the_engine_page_shows_each_start_predicted_and_measured(seed, admin_client):
    node, gemma, nemotron = seed
    _recreate(nemotron, "24G", T0)
    _collect(node, 30 + 71.5 - 5, T0)
    _ready(nemotron, 23.5)
    observe_starts(node, list(node.engines.all()), T0 + timedelta(minutes=9))

    page = admin_client.get(f"/nodes/{node.name}/engines/nemotron-120b/").content.decode()
    assert "Starts: predicted and measured" in page
    row = page.split('data-figure="kv_pool"')[1].split("</tr>")[0]
    assert "24.00 GiB" in row and "23.50 GiB" in row and "-2.1%" in row


def test_one_condition_per_scope_when_a_settled_start_is_a_neighbour_of_another(seed):
    node, gemma, nemotron = seed
    observe_starts(node, [gemma, nemotron], T0 - timedelta(hours=1))
    _recreate(nemotron, "24G", T0)
    _collect(node, 30 + 71.5 - 5, T0)
    _ready(nemotron, 24.0)
    _collect(node, 14.0, T0 + timedelta(minutes=9))  # nemotron's start settles
    gemma.container_id, gemma.started_at, gemma.phase = "g2" * 32, T0 + timedelta(minutes=10), \
        "loading"
    gemma.startup = {"phase": "loading", "version": "0.33.0"}
    gemma.save()
    engines = _collect(node, 14.0, T0 + timedelta(minutes=10))

    conditions = predicted_squeeze.evaluate(node, node.ledger, engines, THRESHOLDS,
                                            T0 + timedelta(minutes=10))

    scopes = [condition.scope for condition in conditions]
    assert len(scopes) == len(set(scopes)), scopes
    by_engine = {condition.engine_id: condition for condition in conditions}
    assert by_engine[nemotron.pk].settled is None  # judged against gemma's start, not settled
    assert by_engine[gemma.pk].details["at_risk"] == "host floor"
