"""Planning restarts: learned startup, expected outage, refusals (audited) and the node queue."""

from __future__ import annotations

import sys
import types
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Permission
from kombu.exceptions import OperationalError

from dashboard.audit.models import AuditEntry
from dashboard.restarts.models import Restart
from dashboard.restarts.planning import (
    DEFAULT_SOURCE,
    NOT_MANAGED,
    PermissionMissing,
    PlanRefused,
    cancel_restart,
    expected_outage,
    learned_startup_seconds,
    plan_restart,
    queue_forecast,
)
from tests.restarts.plan_factories import make_engine, make_window, measured_start

# Saturday noon UTC; the Seoul window "Sunday 03:00" opens at 18:00 UTC the same day.
NOW = datetime(2026, 11, 7, 12, 0, tzinfo=UTC)
OPENS = datetime(2026, 11, 7, 18, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _drain_two_minutes(settings):
    settings.SPARKOPS_RESTART_DRAIN_TIMEOUT_SECONDS = 120


@pytest.fixture
def admin(django_user_model):
    return django_user_model.objects.create_superuser("admin", "", None)


@pytest.fixture
def operator(django_user_model):
    """Not a superuser: holds exactly the restart permission (no password: nothing to hash)."""
    user = django_user_model.objects.create_user("operator")
    user.user_permissions.add(Permission.objects.get(codename="run_restarts"))
    return django_user_model.objects.get(pk=user.pk)  # fresh: no stale permission cache


@pytest.fixture
def viewer(django_user_model):
    return django_user_model.objects.create_user("viewer")


@pytest.fixture
def gemma(node):
    return make_engine(node, "gemma")


def refusals(action: str = "plan-restart") -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(action=action, allowed=False))


def test_learned_startup_is_the_default_until_an_engine_has_history(gemma):
    assert learned_startup_seconds(gemma) == (600.0, DEFAULT_SOURCE)


def test_learned_startup_is_the_median_of_the_latest_five_measured_starts(gemma):
    measured_start(gemma, 2000, NOW - timedelta(days=30))  # oldest: falls out of the five
    for day, seconds in enumerate([300, 320, 1000, 340]):
        measured_start(gemma, seconds, NOW - timedelta(days=10 - day))
    measured_start(gemma, 310, NOW - timedelta(days=1), kind=Restart.Kind.UNPLANNED,
                   status=Restart.Status.DETECTED)
    measured_start(gemma, 5000, NOW - timedelta(hours=1), status=Restart.Status.FAILED)
    other = make_engine(gemma.node, "nemotron")
    measured_start(other, 9000, NOW)

    assert learned_startup_seconds(gemma) == (320.0, "median of 5 starts")


def test_expected_outage_is_drain_timeout_plus_learned_startup(gemma):
    measured_start(gemma, 700.4, NOW - timedelta(days=1))

    outage = expected_outage(gemma, OPENS)

    assert (outage.drain_seconds, outage.startup_seconds, outage.source) == (
        120, 701, "median of 1 start")
    assert outage.back_by == OPENS + timedelta(seconds=821)


def test_plan_in_a_window_starts_at_its_opening_and_says_when_it_is_back(gemma, admin):
    window = make_window(gemma.node, minutes=120)

    planned = plan_restart(gemma, user=admin, window=window, now=NOW, reason="new weights")

    assert planned.status == Restart.Status.SCHEDULED and planned.kind == Restart.Kind.PLANNED
    assert planned.scheduled_for == OPENS and planned.window == window
    assert (planned.expected_drain_seconds, planned.expected_startup_seconds) == (120, 600)
    assert planned.expected_back_by == OPENS + timedelta(minutes=12)
    assert planned.requested_by == admin and planned.reason == "new weights"
    entry = AuditEntry.objects.get(action="plan-restart")
    assert entry.allowed and entry.restart == planned and entry.user == admin
    assert entry.details["startup_source"] == DEFAULT_SOURCE


def test_a_user_holding_only_the_restart_permission_may_plan(gemma, operator):
    planned = plan_restart(gemma, user=operator, now=NOW, reason="")

    assert planned.scheduled_for == NOW and planned.window is None


def test_plan_that_would_overrun_its_window_is_refused_with_the_times(gemma, admin):
    measured_start(gemma, 1200, NOW - timedelta(days=3))
    window = make_window(gemma.node, minutes=15)

    with pytest.raises(PlanRefused) as refused:
        plan_restart(gemma, user=admin, window=window, now=NOW, reason="")

    # 03:00 + 2 min drain + 20 min learned startup, in the window's own zone (Asia/Seoul).
    assert refused.value.reason == "expected back by 03:22 KST but the window ends at 03:15 KST"
    assert [e.outcome for e in refusals()] == [refused.value.reason]
    assert not Restart.objects.filter(status=Restart.Status.SCHEDULED).exists()


def test_plan_without_the_permission_is_refused_and_audited(gemma, viewer):
    with pytest.raises(PermissionMissing, match="viewer lacks the permission"):
        plan_restart(gemma, user=viewer, now=NOW, reason="")

    (entry,) = refusals()
    assert (entry.user, entry.engine, entry.allowed) == (viewer, gemma, False)
    assert not Restart.objects.exists()


def test_plan_of_an_unmanaged_engine_is_refused_and_audited(node, admin):
    unmanaged = make_engine(node, "database-sidecar", managed=False)

    with pytest.raises(PlanRefused) as refused:
        plan_restart(unmanaged, user=admin, now=NOW, reason="")

    assert refused.value.reason == NOT_MANAGED
    assert [(e.engine, e.outcome) for e in refusals()] == [(unmanaged, NOT_MANAGED)]


def test_the_management_label_is_enough(node, admin):
    labelled = make_engine(node, "speech", managed=False, labels={"sparkops.manage": "true"})

    assert plan_restart(labelled, user=admin, now=NOW, reason="").status == "scheduled"


def test_plan_of_an_engine_whose_container_is_gone_is_refused(node, admin):
    gone = make_engine(node, "gemma", present=False)

    with pytest.raises(PlanRefused, match="not present on spark-a"):
        plan_restart(gone, user=admin, now=NOW, reason="")


def test_a_second_open_plan_for_the_same_engine_is_refused(gemma, admin):
    first = plan_restart(gemma, user=admin, now=NOW, reason="")

    with pytest.raises(PlanRefused, match=f"already has a scheduled restart \\(#{first.pk}\\)"):
        plan_restart(gemma, user=admin, window=make_window(gemma.node), now=NOW, reason="")
    assert len(refusals()) == 1


def test_a_start_outside_every_window_is_refused_and_inside_one_picks_it(gemma, admin):
    window = make_window(gemma.node, minutes=120)

    with pytest.raises(PlanRefused, match="is not inside a restart window of gemma"):
        plan_restart(gemma, user=admin, start=OPENS - timedelta(hours=1), now=NOW, reason="")
    planned = plan_restart(gemma, user=admin, start=OPENS + timedelta(minutes=30), now=NOW,
                           reason="")

    assert planned.window == window and planned.scheduled_for == OPENS + timedelta(minutes=30)


def test_a_start_in_the_past_is_refused(gemma, admin):
    with pytest.raises(PlanRefused, match="is in the past"):
        plan_restart(gemma, user=admin, start=NOW - timedelta(hours=1), now=NOW, reason="")


def test_a_window_for_another_engine_is_refused(node, gemma, admin):
    theirs = make_window(node, engine=make_engine(node, "nemotron"))

    with pytest.raises(PlanRefused, match="does not apply to gemma"):
        plan_restart(gemma, user=admin, window=theirs, now=NOW, reason="")


def test_when_the_open_window_has_too_little_left_the_plan_takes_the_next_opening(gemma, admin):
    window = make_window(gemma.node, minutes=120)
    late_in_window = OPENS + timedelta(minutes=110)

    planned = plan_restart(gemma, user=admin, window=window, now=late_in_window, reason="")

    assert planned.scheduled_for == OPENS + timedelta(days=7)


def test_a_plan_inside_the_open_window_starts_now(gemma, admin):
    window = make_window(gemma.node, minutes=120)

    planned = plan_restart(gemma, user=admin, window=window, now=OPENS + timedelta(minutes=5),
                           reason="")

    assert planned.scheduled_for == OPENS + timedelta(minutes=5)


def test_cancel_a_scheduled_restart_is_audited_and_only_once(gemma, admin):
    planned = plan_restart(gemma, user=admin, now=NOW, reason="")

    cancel_restart(planned, admin, now=NOW + timedelta(minutes=1))

    planned.refresh_from_db()
    assert planned.status == Restart.Status.CANCELLED
    assert planned.finished_at == NOW + timedelta(minutes=1)
    assert AuditEntry.objects.filter(action="cancel-restart", allowed=True).count() == 1
    with pytest.raises(PlanRefused, match="only a scheduled restart can be cancelled"):
        cancel_restart(planned, admin)
    assert len(refusals("cancel-restart")) == 1


def test_cancel_without_the_permission_is_refused_and_audited(gemma, admin, viewer):
    planned = plan_restart(gemma, user=admin, now=NOW, reason="")

    with pytest.raises(PermissionMissing):
        cancel_restart(planned, viewer)

    planned.refresh_from_db()
    assert planned.status == Restart.Status.SCHEDULED
    assert [e.user for e in refusals("cancel-restart")] == [viewer]


def test_queue_forecast_runs_two_plans_on_a_node_one_after_the_other(node, admin):
    gemma, nemotron = make_engine(node, "gemma"), make_engine(node, "nemotron")
    window = make_window(node, minutes=120)
    first = plan_restart(gemma, user=admin, window=window, now=NOW, reason="")
    second = plan_restart(nemotron, user=admin, window=window, now=NOW, reason="")

    queue = queue_forecast(node, NOW)

    assert [entry.restart for entry in queue] == [first, second]
    assert queue[0].expected_start == OPENS and queue[0].waits_for is None
    assert queue[1].expected_start == OPENS + timedelta(minutes=12)
    assert queue[1].waits_for == first
    assert queue[1].expected_back_by == OPENS + timedelta(minutes=24)
    assert second.expected_back_by == OPENS + timedelta(minutes=24)
    assert not queue[1].overruns_window


def test_a_plan_queued_behind_another_is_refused_when_the_wait_makes_it_overrun(node, admin):
    gemma, nemotron = make_engine(node, "gemma"), make_engine(node, "nemotron")
    window = make_window(node, minutes=20)
    plan_restart(gemma, user=admin, window=window, now=NOW, reason="")

    with pytest.raises(PlanRefused) as refused:
        plan_restart(nemotron, user=admin, window=window, now=NOW, reason="")

    assert refused.value.reason == ("expected back by 03:24 KST but the window ends at 03:20 KST "
                                    "(it waits for the restart of gemma until 03:12 KST)")


def test_a_running_restart_late_past_its_expectation_holds_the_queue_until_now(node, admin):
    gemma, nemotron = make_engine(node, "gemma"), make_engine(node, "nemotron")
    running = Restart.objects.create(
        node=node, engine=gemma, kind="planned", status="running", scheduled_for=NOW,
        started_at=NOW - timedelta(minutes=30), expected_drain_seconds=120,
        expected_startup_seconds=600,
    )
    waiting = plan_restart(nemotron, user=admin, now=NOW, reason="")

    queue = queue_forecast(node, NOW + timedelta(minutes=1))

    assert [entry.restart for entry in queue] == [running, waiting]
    assert queue[0].expected_back_by == NOW + timedelta(minutes=1)
    assert queue[1].expected_start == NOW + timedelta(minutes=1)


def test_a_new_plan_nudges_the_runbook_after_commit(gemma, admin, monkeypatch,
                                                    django_capture_on_commit_callbacks):
    calls = []
    tasks = types.ModuleType("dashboard.restarts.tasks")
    tasks.dispatch_due_restarts = types.SimpleNamespace(delay=lambda: calls.append("delay"))
    monkeypatch.setitem(sys.modules, "dashboard.restarts.tasks", tasks)

    with django_capture_on_commit_callbacks(execute=True):
        plan_restart(gemma, user=admin, now=NOW, reason="")

    assert calls == ["delay"]


def test_an_unreachable_broker_does_not_fail_the_plan(gemma, admin, monkeypatch,
                                                      django_capture_on_commit_callbacks):
    def broker_down() -> None:
        raise OperationalError("connection refused")

    tasks = types.ModuleType("dashboard.restarts.tasks")
    tasks.dispatch_due_restarts = types.SimpleNamespace(delay=broker_down)
    monkeypatch.setitem(sys.modules, "dashboard.restarts.tasks", tasks)

    with django_capture_on_commit_callbacks(execute=True):
        planned = plan_restart(gemma, user=admin, now=NOW, reason="")

    assert Restart.objects.get(pk=planned.pk).status == Restart.Status.SCHEDULED
