"""A node whose worker stopped beating: one node-unreachable alert, its other alerts held as they
were (no engine-down per engine, nothing resolved on the old figures), resolved when the beats
return, and the central watch that evaluates silent nodes at all."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from collectors.models import Engine, Node
from dashboard.alerting import tasks as alerting_tasks
from dashboard.alerting.evaluation import RETURNING, UNREACHABLE, contact_hold, evaluate_rules
from dashboard.alerting.models import Alert, AlertState
from dashboard.alerting.pipeline import nodes_out_of_contact, run_alerts
from dashboard.alerting.rules import RULES, node_unreachable
from dashboard.alerting.settings import RuleSetting
from dashboard.notify.models import Channel, Notification
from sparkops import settings as project_settings
from sparkops.celery import CENTRAL_QUEUE, WATCH_NODES, beat_schedule
from sparkops.celery import app as celery_app
from sparkops.units import GIB
from tests.alerting.helpers import T0, at

pytestmark = pytest.mark.django_db

HEALTHY = {"mem_total": int(121.69 * GIB), "mem_available": 40 * GIB, "swap_used": 0,
           "engines": []}
SHORT = {**HEALTHY, "mem_available": 4 * GIB}  # below the 7.9 GiB headroom floor


@pytest.fixture(autouse=True)
def _beats(settings):
    # The defaults, written out: a beat every 10 s, unreachable after three missed ones.
    settings.SPARKOPS_HEARTBEAT_SECONDS = 10.0
    settings.SPARKOPS_UNREACHABLE_AFTER_BEATS = 3.0


def _beat(node: Node, seconds: float, *, collected: float | None = None,
          skew: float = 0.0) -> None:
    """The node's last beat at ``at(seconds)`` (the centre's clock), and its last collection
    at ``at(collected)`` on the node's clock, which runs ``skew`` seconds ahead."""
    node.heartbeat_at = at(seconds)
    node.agent_started_at = node.agent_started_at or at(seconds)
    node.clock_skew_seconds = skew
    if collected is not None:
        node.last_collection_at = at(collected) + timedelta(seconds=skew)
    node.save()


def _stopped_engine(node: Node, name: str) -> Engine:
    return Engine.objects.create(node=node, name=name, container_id=f"{name}-id",
                                 container_state="exited", exit_code=137, phase="ready")


def _open(node: Node, rule: str) -> list[Alert]:
    return list(Alert.objects.filter(node=node, rule=rule).exclude(state=AlertState.RESOLVED))


# --- the rule -------------------------------------------------------------------------------


def test_registered_right_after_engine_down_and_fires_at_once_for_the_node():
    names = list(RULES)
    assert names[names.index("engine-down") + 1] == "node-unreachable"
    rule = RULES["node-unreachable"]
    assert rule.for_seconds == 0 and rule.value_unit == "s"
    assert "40 s" in rule.description and "held" in rule.description


def test_a_silent_node_is_unreachable_past_the_bound_and_the_summary_says_so(node):
    _beat(node, 0)

    fresh = node_unreachable.evaluate(node, {}, [], {}, at(12))[0]
    at_bound = node_unreachable.evaluate(node, {}, [], {}, at(30))[0]
    silent = node_unreachable.evaluate(node, {}, [], {}, at(185))[0]

    assert (fresh.value, fresh.crosses_threshold(), fresh.back_past_clear()) == (12, False, True)
    assert at_bound.crosses_threshold() is False  # the bound itself is still reachable
    assert silent.engine_id is None and silent.severity == "critical"
    assert silent.crosses_threshold() and silent.threshold == 30.0
    assert silent.summary.startswith("spark-a is unreachable: last contact 3 min 5 s ago, at "
                                     "2026-03-02 09:00:00 UTC (the bound is 30 s)")
    assert silent.details["last_contact_at"] == T0.isoformat()
    assert silent.details["contact_age_seconds"] == 185.0


def test_a_node_that_never_beat_is_unknown_never_unreachable(node):
    condition = node_unreachable.evaluate(node, {}, [], {}, at(10_000))[0]

    assert condition.value is None and condition.crosses_threshold() is None
    assert "never sent a heartbeat" in condition.summary
    run_alerts(node, at(10_000))
    assert not Alert.objects.filter(rule="node-unreachable").exists()


# --- the hold -------------------------------------------------------------------------------


def test_an_unreachable_node_gets_one_alert_and_its_other_alerts_are_held(node):
    Channel.objects.create(name="ops mail", kind="email", config={"to": ["ops@example.com"]})
    node.ledger = SHORT
    _beat(node, 31, collected=31)
    run_alerts(node, at(0))
    run_alerts(node, at(31))  # headroom-floor holds 30 s: firing
    [floor] = _open(node, "headroom-floor")
    assert floor.state == AlertState.FIRING
    # Then the node goes silent with its engines stopped, as a wedged host leaves them, and
    # its last ledger happens to look fine.
    gemma, nemotron = _stopped_engine(node, "gemma"), _stopped_engine(node, "nemotron")
    node.ledger = HEALTHY
    node.save()

    for seconds in (62, 120, 400):  # far past engine-down's 60 s
        run_alerts(node, at(seconds))

    [unreachable] = _open(node, "node-unreachable")
    assert unreachable.state == AlertState.FIRING and unreachable.engine_id is None
    assert unreachable.fired_at == at(62)
    assert "last contact 6 min 9 s ago" in unreachable.summary
    assert not Alert.objects.filter(rule="engine-down").exists()
    assert {gemma.pk, nemotron.pk}.isdisjoint(Alert.objects.values_list("engine_id", flat=True))
    floor.refresh_from_db()
    assert floor.state == AlertState.FIRING and floor.resolved_at is None
    assert floor.last_evaluated_at == at(31)  # not evaluated since
    told = Notification.objects.order_by("pk")
    assert [(n.kind, n.alert_id) for n in told] == [("firing", floor.pk),
                                                     ("firing", unreachable.pk)]


def test_the_hold_keeps_even_when_the_alert_is_disabled(node):
    RuleSetting.objects.create(rule="node-unreachable", enabled=False)
    _stopped_engine(node, "gemma")
    _beat(node, 0, collected=0)

    held = evaluate_rules(node, at(200))

    assert held.held == UNREACHABLE and held.conditions == [] and held.evaluated == set()


def test_beats_return_resolve_it_and_the_first_collection_ends_the_hold(node):
    _stopped_engine(node, "gemma")
    node.ledger = HEALTHY
    _beat(node, 0, collected=0)
    run_alerts(node, at(45))
    [alert] = _open(node, "node-unreachable")

    # Beats are back before any collection: resolved, the other rules still held.
    _beat(node, 98)
    assert contact_hold(node, at(100)) == RETURNING
    run_alerts(node, at(100))
    alert.refresh_from_db()
    assert alert.state == AlertState.RESOLVED and alert.resolved_at == at(100)
    assert alert.resolve_reason == "cleared"
    assert not Alert.objects.filter(rule="engine-down").exists()

    # The first collection since: every rule judges the node again.
    _beat(node, 108, collected=105)
    assert contact_hold(node, at(110)) == ""
    run_alerts(node, at(110))
    [down] = _open(node, "engine-down")
    assert down.state == AlertState.PENDING and down.started_at == at(110)


def test_a_collection_is_put_on_the_centres_clock_before_it_ends_the_hold(node):
    _beat(node, 0, collected=0)
    run_alerts(node, at(45))
    # The node's clock runs 60 s ahead: its collection stamped 75 s (its clock) was at 15 s
    # on the centre's, before the alert opened at 45 s.
    _beat(node, 98, collected=15, skew=60.0)
    assert node.last_collection_at == at(75)

    assert contact_hold(node, at(100)) == RETURNING


# --- the central watch ----------------------------------------------------------------------


def test_the_watch_takes_silent_nodes_and_nodes_with_an_open_alert(node):
    now = timezone.now()
    silent = Node.objects.create(name="spark-b", heartbeat_at=now - timedelta(seconds=31))
    Node.objects.create(name="spark-c", heartbeat_at=now - timedelta(seconds=29))
    Node.objects.create(name="spark-d")  # never beat
    back = Node.objects.create(name="spark-e", heartbeat_at=now - timedelta(seconds=2))
    Alert.objects.create(rule="node-unreachable", node=back, scope=f"node-unreachable:{back.pk}:-",
                         state=AlertState.FIRING, severity="critical", summary="unreachable",
                         threshold=30.0, started_at=now - timedelta(minutes=5),
                         last_evaluated_at=now - timedelta(seconds=10))

    assert [n.name for n in nodes_out_of_contact(now)] == [silent.name, back.name]


def test_the_watch_task_fires_for_a_dead_agent_and_resolves_when_it_is_back(
        node, django_capture_on_commit_callbacks):
    Channel.objects.create(name="ops mail", kind="email", config={"to": ["ops@example.com"]})
    _stopped_engine(node, "gemma")
    Node.objects.filter(pk=node.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=45),
                                           agent_started_at=timezone.now())

    with django_capture_on_commit_callbacks() as delivered:
        assert alerting_tasks.watch_nodes() == 1  # the firing notice

    [alert] = _open(node, "node-unreachable")
    assert alert.state == AlertState.FIRING and len(delivered) == 1
    assert not Alert.objects.filter(rule="engine-down").exists()
    Node.objects.filter(pk=node.pk).update(heartbeat_at=timezone.now())
    assert alerting_tasks.watch_nodes() == 1  # the resolved notice
    alert.refresh_from_db()
    assert alert.state == AlertState.RESOLVED
    assert alerting_tasks.watch_nodes() == 0  # nothing out of contact any more


def test_the_watch_runs_centrally_every_heartbeat_interval():
    entry = beat_schedule(["spark-a"], 5.0, 2.5)["watch-nodes"]

    assert entry["task"] == WATCH_NODES == alerting_tasks.watch_nodes.name
    assert entry["schedule"] == 2.5
    assert entry["options"] == {"queue": CENTRAL_QUEUE, "expires": 2.5}
    # What the app's beat is given: the setting.
    installed = celery_app.conf.beat_schedule["watch-nodes"]
    assert installed["schedule"] == project_settings.SPARKOPS_HEARTBEAT_SECONDS
