"""The runbook's decisions without containers: the memory arithmetic with explicit numbers,
claiming, staleness, dispatch, recovery and refusals."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from unittest import mock

import pytest
from django.db import IntegrityError

from collectors.ledger import EngineShare
from collectors.models import Engine, Event
from collectors.sampling import Clock
from dashboard.audit.models import AuditEntry
from dashboard.restarts import dispatch, tasks
from dashboard.restarts.dispatch import (
    claim_restart,
    interrupt_stale_restarts,
    restarts_to_dispatch,
    stale_reason,
)
from dashboard.restarts.fit import (
    Fit,
    engine_holds,
    engine_need,
    precheck_fit,
    recheck_fit,
    startup_deadline_seconds,
)
from dashboard.restarts.models import Restart
from dashboard.restarts.runbook import run_restart
from tests.restarts.plan_factories import make_engine, make_window

GIB = 1024**3
T0 = datetime(2026, 11, 29, 18, 0, tzinfo=UTC)  # Monday 03:00 in Seoul


def share(*, weights: float | None = 20, kv: float | None = 20, graphs: float | None = 1,
          prefill: float | None = 2, actual: float | None = None) -> EngineShare:
    """An engine's ledger share from GiB figures (None: not reported)."""

    def b(gib: float | None) -> int | None:
        return None if gib is None else int(gib * GIB)

    return EngineShare(engine_id=1, name="gemma", weights=b(weights), kv_pool=b(kv),
                       cuda_graphs=b(graphs), actual=b(actual), prefill_estimate=b(prefill),
                       prefill_observed=None, prefill_need=b(prefill),
                       prefill_need_source="estimate" if prefill is not None else None)


def plan(engine: Engine, *, at: datetime = T0, **fields) -> Restart:
    return Restart.objects.create(node=engine.node, engine=engine, kind=Restart.Kind.PLANNED,
                                  status=Restart.Status.SCHEDULED, requested_at=at,
                                  scheduled_for=at, **fields)


# --- the arithmetic ------------------------------------------------------------------------------


def test_need_is_weights_kv_graphs_and_prefill():
    need, parts, missing = engine_need(share(weights=20, kv=20, graphs=1, prefill=2))

    assert need == 43 * GIB and missing == ()
    assert parts == {"weights": 20 * GIB, "kv_pool": 20 * GIB, "cuda_graphs": GIB,
                     "prefill": 2 * GIB}


def test_unknown_graphs_and_prefill_are_left_out_but_weights_and_kv_are_required():
    assert engine_need(share(graphs=None, prefill=None))[0] == 40 * GIB
    need, _, missing = engine_need(share(weights=None))
    assert need is None and missing == ("its weights",)


def test_what_a_running_engine_gives_back_is_the_larger_of_report_and_observation():
    # On GB10 the cgroup sees 2 GiB of a 41 GiB engine: the engine's own report wins.
    assert engine_holds(share(actual=2), running=True) == 41 * GIB
    # The emulator's memory is charged to its cgroup, CUDA context and all: observation wins.
    assert engine_holds(share(actual=44), running=True) == 44 * GIB
    assert engine_holds(share(weights=None, actual=None), running=True) is None
    assert engine_holds(share(weights=None, actual=None), running=False) == 0


def test_an_ollama_server_needs_what_its_loaded_models_hold():
    # Ollama reports each loaded model's whole size (weights, KV cache and compute graph) and
    # no parts: that size is its need, with no prefill buffer on top (it is in the size).
    ollama = replace(share(weights=None, kv=None, graphs=None, prefill=2, actual=20),
                     loaded_models=19 * GIB)

    assert engine_need(ollama) == (19 * GIB, {"loaded_models": 19 * GIB}, ())
    assert engine_holds(ollama, running=True) == 20 * GIB  # its cgroup sees a little more
    assert engine_holds(replace(ollama, actual=None), running=True) == 19 * GIB
    fit = precheck_fit(replace(ollama, actual=None), mem_available=GIB, running=True,
                       margin=GIB)
    assert fit.fits is True and fit.describe("would be free") == \
        "needs 19.0 GiB (+ 1.0 GiB margin), 20.0 GiB would be free"
    idle = replace(ollama, loaded_models=0)
    assert engine_need(idle)[0] == 0  # nothing loaded: it starts into no memory of its own


def test_precheck_fits_when_available_plus_its_own_share_covers_need_and_margin():
    fit = precheck_fit(share(actual=41), mem_available=int(3.5 * GIB), running=True,
                       margin=GIB)

    # need 43 GiB + 1 GiB margin <= 3.5 GiB available + 41 GiB it holds
    assert fit.need == 43 * GIB and fit.room == int(44.5 * GIB)
    assert fit.fits is True
    assert fit.parts["engine_holds"] == 41 * GIB


def test_precheck_refuses_with_the_numbers():
    # The seed's case: the engine is down, 24 GiB are available, it needs 31.2 GiB.
    fit = precheck_fit(share(weights=15, kv=14, graphs=0.2, prefill=2), mem_available=24 * GIB,
                       running=False, margin=int(1.2 * GIB))

    assert fit.fits is False
    assert fit.describe("would be free") == \
        "needs 31.2 GiB (+ 1.2 GiB margin), 24.0 GiB would be free"


def test_precheck_boundary_is_inclusive_and_stopped_engines_hold_nothing():
    exact = precheck_fit(share(), mem_available=44 * GIB, running=False, margin=GIB)
    short = precheck_fit(share(), mem_available=44 * GIB - 1, running=False, margin=GIB)

    assert exact.fits is True and exact.parts["engine_holds"] == 0
    assert short.fits is False


def test_precheck_with_an_unknown_figure_cannot_say():
    no_memory = precheck_fit(share(), mem_available=None, running=True, margin=0)
    no_report = precheck_fit(share(kv=None, actual=3), mem_available=50 * GIB, running=True,
                             margin=0)

    assert no_memory.fits is None and "MemAvailable" in no_memory.describe("")
    assert no_report.fits is None and no_report.missing == ("its kv pool",)


def test_recheck_compares_memfree_with_the_need():
    assert recheck_fit(43 * GIB, mem_free=45 * GIB, margin=GIB).fits is True
    low = recheck_fit(43 * GIB, mem_free=30 * GIB, margin=GIB)
    assert low.fits is False
    assert low.describe("is free (MemFree)") == \
        "needs 43.0 GiB (+ 1.0 GiB margin), 30.0 GiB is free (MemFree)"
    assert recheck_fit(43 * GIB, mem_free=None, margin=GIB).fits is None


def test_small_figures_are_shown_in_mib():
    assert Fit(need=96 * 1024**2, room=20 * GIB, margin=0).describe("free") == \
        "needs 96 MiB (+ 0 KiB margin), 20.0 GiB free"


def test_startup_deadline_is_expected_times_factor_but_at_least_the_minimum(settings):
    settings.SPARKOPS_RESTART_DEADLINE_FACTOR = 1.5
    settings.SPARKOPS_RESTART_MIN_DEADLINE_SECONDS = 900
    assert startup_deadline_seconds(600) == 900
    assert startup_deadline_seconds(1200) == 1800


# --- claiming ------------------------------------------------------------------------------------


def test_one_running_restart_per_node(node):
    a, b = make_engine(node, "a"), make_engine(node, "b")
    first, second = plan(a), plan(b)

    assert claim_restart(first, now=T0, worker="worker:x") is True
    assert claim_restart(second, now=T0, worker="worker:x") is False
    second.refresh_from_db()
    assert second.status == Restart.Status.SCHEDULED

    Restart.objects.filter(pk=first.pk).update(status=Restart.Status.SUCCEEDED, finished_at=T0)
    assert claim_restart(second, now=T0, worker="worker:x") is True
    first.refresh_from_db()
    second.refresh_from_db()
    assert second.status == Restart.Status.RUNNING and second.worker == "worker:x"
    assert second.heartbeat_at == T0 and second.deadline > T0


def test_restarts_of_different_nodes_run_side_by_side(node, django_user_model):
    other = type(node).objects.create(name="spark-b", mem_total_bytes=node.mem_total_bytes)
    assert claim_restart(plan(make_engine(node, "a")), now=T0, worker="w") is True
    assert claim_restart(plan(make_engine(other, "a")), now=T0, worker="w") is True


def test_a_claim_that_loses_the_race_at_the_index_is_not_a_claim(node):
    # On PostgreSQL the second of two simultaneous claims passes the NOT EXISTS and is stopped
    # by the unique index instead.
    restart = plan(make_engine(node, "a"))
    with mock.patch.object(dispatch, "_conditional_claim",
                           side_effect=IntegrityError("restart_one_running_per_node")):
        assert claim_restart(restart, now=T0, worker="w") is False
    restart.refresh_from_db()
    assert restart.status == Restart.Status.SCHEDULED


def test_a_claim_is_only_from_scheduled(node):
    restart = plan(make_engine(node, "a"))
    Restart.objects.filter(pk=restart.pk).update(status=Restart.Status.CANCELLED)
    assert claim_restart(restart, now=T0, worker="w") is False


# --- staleness -----------------------------------------------------------------------------------


def test_a_restart_queued_during_an_outage_is_stale(node, settings):
    settings.SPARKOPS_RESTART_START_GRACE_SECONDS = 300
    restart = plan(make_engine(node, "a"), at=T0 - timedelta(hours=3))

    assert stale_reason(restart, T0 - timedelta(hours=3) + timedelta(seconds=299)) == ""
    reason = stale_reason(restart, T0)
    assert "queued during an outage" in reason and "3 h 0 min late" in reason


def test_waiting_behind_another_restart_of_the_node_is_not_stale(node, settings):
    settings.SPARKOPS_RESTART_START_GRACE_SECONDS = 300
    first = plan(make_engine(node, "a"), at=T0 - timedelta(minutes=20))
    second = plan(make_engine(node, "b"), at=T0 - timedelta(minutes=20))
    assert claim_restart(first, now=T0 - timedelta(minutes=20), worker="w")

    assert stale_reason(second, T0) == ""  # still waiting its turn
    Restart.objects.filter(pk=first.pk).update(status=Restart.Status.SUCCEEDED,
                                               finished_at=T0 - timedelta(minutes=1))
    assert stale_reason(second, T0) == ""  # its turn came a minute ago
    assert "not started within 300 s" in stale_reason(second, T0 + timedelta(minutes=5))


def test_a_restart_that_would_overrun_its_window_is_stale(node):
    engine = make_engine(node, "a")
    window = make_window(node, minutes=15)  # Sundays 03:00–03:15 Seoul = Sat 18:00–18:15 UTC
    opened = datetime(2026, 11, 28, 18, 0, tzinfo=UTC)
    restart = plan(engine, at=opened, window=window, expected_drain_seconds=120,
                   expected_startup_seconds=600)

    assert stale_reason(restart, opened + timedelta(minutes=2)) == ""
    reason = stale_reason(restart, opened + timedelta(minutes=4, seconds=30))
    assert "its window ends at 18:15:00 UTC" in reason  # 12 minutes of outage from 18:04:30


def test_run_restart_cancels_a_stale_restart_and_audits_it(node, settings):
    settings.SPARKOPS_RESTART_START_GRACE_SECONDS = 300
    restart = plan(make_engine(node, "a"), at=T0 - timedelta(hours=2))
    clock = Clock(wall=lambda: T0)

    result = run_restart(restart.pk, api=None, clock=clock)

    assert result.status == Restart.Status.CANCELLED
    assert result.outcome.startswith("Not started: due at") and result.steps.count() == 0
    entry = AuditEntry.objects.get(action="run-restart", restart=restart)
    assert entry.allowed is False and "cancelled" in entry.outcome
    assert Event.objects.filter(kind="restart-cancelled", engine=restart.engine).exists()


# --- refusals and no-ops -------------------------------------------------------------------------


def test_an_unmanaged_engine_is_refused_and_audited(node):
    restart = plan(make_engine(node, "a", managed=False))

    result = run_restart(restart.pk, api=None, clock=Clock(wall=lambda: T0))

    assert result.status == Restart.Status.REFUSED and result.steps.count() == 0
    entry = AuditEntry.objects.get(action="run-restart", restart=restart)
    assert entry.allowed is False and "not enabled for management" in entry.outcome


def test_a_restart_not_due_or_not_scheduled_is_left_alone(node):
    early = plan(make_engine(node, "a"), at=T0 + timedelta(minutes=5))
    assert run_restart(early.pk, api=None, clock=Clock(wall=lambda: T0)).status == \
        Restart.Status.SCHEDULED
    Restart.objects.filter(pk=early.pk).update(status=Restart.Status.SUCCEEDED)
    assert run_restart(early.pk, api=None, clock=Clock(
        wall=lambda: T0 + timedelta(hours=1))).status == Restart.Status.SUCCEEDED
    assert not AuditEntry.objects.exists()


def test_without_a_container_engine_the_restart_is_aborted_untouched(node):
    restart = plan(make_engine(node, "a"))

    result = run_restart(restart.pk, api=None, api_error="no socket",
                         clock=Clock(wall=lambda: T0))

    assert result.status == Restart.Status.ABORTED
    assert "Container engine unreachable (no socket)" in result.outcome
    assert list(result.steps.values_list("step", "ok")) == [("precheck", False), ("record", False)]
    assert result.container_state["running"] is None


def test_a_task_for_another_node_is_refused(node, settings):
    settings.SPARKOPS_NODE_NAME = "spark-z"
    restart = plan(make_engine(node, "a"))

    with pytest.raises(tasks.WrongNodeError):
        tasks.run_restart_task(restart.pk)

    restart.refresh_from_db()
    assert restart.status == Restart.Status.SCHEDULED
    assert AuditEntry.objects.get(restart=restart).allowed is False


# --- dispatch ------------------------------------------------------------------------------------


def test_dispatch_hands_each_nodes_oldest_due_restart_once(node, settings):
    settings.SPARKOPS_RESTART_START_GRACE_SECONDS = 300
    other = type(node).objects.create(name="spark-b", mem_total_bytes=node.mem_total_bytes)
    older = plan(make_engine(node, "a"), at=T0 - timedelta(seconds=30))
    newer = plan(make_engine(node, "b"), at=T0 - timedelta(seconds=10))
    remote = plan(make_engine(other, "a"), at=T0)
    plan(make_engine(node, "c"), at=T0 + timedelta(minutes=1))  # not due

    handed = restarts_to_dispatch(T0)

    assert {r.pk for r in handed} == {older.pk, remote.pk}
    older.refresh_from_db()
    assert older.phase == "queued" and older.heartbeat_at == T0
    assert restarts_to_dispatch(T0 + timedelta(seconds=5)) == []  # handed already
    again = restarts_to_dispatch(T0 + timedelta(seconds=dispatch.REDISPATCH_SECONDS + 1))
    assert {r.pk for r in again} == {older.pk, remote.pk}
    assert newer.pk not in {r.pk for r in again}


def test_dispatch_skips_a_busy_node_and_cancels_stale_restarts(node, settings):
    settings.SPARKOPS_RESTART_START_GRACE_SECONDS = 300
    running = plan(make_engine(node, "a"), at=T0)
    assert claim_restart(running, now=T0, worker="w")
    plan(make_engine(node, "b"), at=T0)
    other = type(node).objects.create(name="spark-b", mem_total_bytes=node.mem_total_bytes)
    stale = plan(make_engine(other, "a"), at=T0 - timedelta(hours=5))

    assert restarts_to_dispatch(T0 + timedelta(seconds=10)) == []

    stale.refresh_from_db()
    assert stale.status == Restart.Status.CANCELLED
    assert AuditEntry.objects.get(restart=stale).actor == "dispatcher"


def test_the_dispatch_task_sends_to_the_nodes_queue_with_an_expiry(node, monkeypatch):
    restart = plan(make_engine(node, "a"), at=datetime.now(UTC) - timedelta(seconds=1))
    sent = []
    monkeypatch.setattr(tasks.run_restart_task, "apply_async",
                        lambda **kwargs: sent.append(kwargs))

    assert tasks.dispatch_due_restarts() == 1

    assert sent == [{"args": (restart.pk,), "queue": "node.spark-a",
                     "expires": dispatch.REDISPATCH_SECONDS}]


# --- recovery ------------------------------------------------------------------------------------


def test_a_restart_whose_worker_went_silent_is_interrupted(node, settings):
    settings.SPARKOPS_RESTART_HEARTBEAT_STALE_SECONDS = 120
    engine = make_engine(node, "a")
    Engine.objects.filter(pk=engine.pk).update(container_state="exited", exit_code=0,
                                               last_seen=T0)
    silent = plan(engine, at=T0)
    claim_restart(silent, now=T0, worker="worker:spark-a")
    Restart.objects.filter(pk=silent.pk).update(phase="follow")
    other = type(node).objects.create(name="spark-b")
    alive = plan(make_engine(other, "b"), at=T0)
    claim_restart(alive, now=T0 + timedelta(seconds=100), worker="worker:spark-b")

    marked = interrupt_stale_restarts(T0 + timedelta(seconds=121), local_node="elsewhere",
                                      api=None)

    assert [r.pk for r in marked] == [silent.pk]
    silent.refresh_from_db()
    assert silent.status == Restart.Status.INTERRUPTED
    assert silent.container_state["running"] is False
    assert silent.container_state["source"] == "last collection"
    assert "during step 'follow'" in silent.outcome and "exited" in silent.outcome
    event = Event.objects.get(kind="restart-interrupted")
    assert event.severity == "critical" and event.engine_id == engine.pk
    alive.refresh_from_db()
    assert alive.status == Restart.Status.RUNNING


def test_recovery_never_overwrites_a_heartbeat_written_meanwhile(node, settings):
    settings.SPARKOPS_RESTART_HEARTBEAT_STALE_SECONDS = 120
    restart = plan(make_engine(node, "a"), at=T0)
    claim_restart(restart, now=T0, worker="w")
    real_filter = Restart.objects.filter

    def heartbeat_sneaks_in(*args, **kwargs):
        if "heartbeat_at" in kwargs:  # the conditional update: the run beat just before it
            real_filter(pk=restart.pk).update(heartbeat_at=T0 + timedelta(seconds=200))
        return real_filter(*args, **kwargs)

    with mock.patch.object(Restart.objects, "filter", side_effect=heartbeat_sneaks_in):
        marked = interrupt_stale_restarts(T0 + timedelta(seconds=200), local_node="x", api=None)

    assert marked == []
    restart.refresh_from_db()
    assert restart.status == Restart.Status.RUNNING
