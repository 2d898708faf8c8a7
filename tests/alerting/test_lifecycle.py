"""The alert lifecycle: pending → firing → resolved, hysteresis, repeats, silences, races."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from dashboard.alerting import lifecycle
from dashboard.alerting.lifecycle import alert_as_dict, evaluate
from dashboard.alerting.models import Alert, AlertEvent, RuleSetting, Silence
from dashboard.alerting.settings import UnknownRule
from tests.alerting.helpers import T0, at, engine_rule, floor, make_engine, overcommit

FOUR_HOURS = 4 * 3600


def kinds(notices) -> list[str]:
    return [notice.kind for notice in notices]


def transitions(alert: Alert) -> list[tuple[str, str]]:
    return list(alert.events.values_list("from_state", "to_state"))


def test_pending_alert_fires_after_for_seconds(node):
    assert evaluate(node, [floor(node, 7.0)], at(0)) == []
    alert = Alert.objects.get()
    assert (alert.state, alert.started_at, alert.fired_at) == ("pending", at(0), None)

    assert evaluate(node, [floor(node, 6.5)], at(29)) == []
    assert Alert.objects.get().state == "pending"

    notices = evaluate(node, [floor(node, 6.0)], at(30))

    assert kinds(notices) == ["firing"]
    alert.refresh_from_db()
    assert (alert.state, alert.fired_at, alert.notify_count) == ("firing", at(30), 1)
    assert notices[0].alert.pk == alert.pk
    assert notices[0].idempotency_key == f"sparkops-alert-{alert.pk}-1"
    assert transitions(alert) == [("", "pending"), ("pending", "firing")]


def test_for_seconds_allows_half_a_second_of_evaluation_jitter(node):
    """Evaluations follow collections, which start a little late or early: 10 s at a 5 s
    interval is three evaluations, whether the third comes at 9.6 s or 10.2 s."""
    RuleSetting.objects.create(rule="headroom-floor", for_seconds=10)
    evaluate(node, [floor(node, 7.0)], at(0))
    evaluate(node, [floor(node, 7.0)], at(5.1))

    assert evaluate(node, [floor(node, 7.0)], at(9.4)) == []  # more than jitter: not yet
    assert kinds(evaluate(node, [floor(node, 7.0)], at(9.6))) == ["firing"]


def test_rule_with_for_zero_fires_at_once(node):
    notices = evaluate(node, [overcommit(node, 3.0)], at(0))

    assert kinds(notices) == ["firing"]
    alert = Alert.objects.get()
    assert (alert.state, alert.started_at, alert.fired_at) == ("firing", at(0), at(0))
    assert transitions(alert) == [("", "pending"), ("pending", "firing")]


def test_value_within_the_threshold_band_does_not_open_an_alert(node):
    # 9 GiB is above the 8 GiB threshold but below the 10 GiB clear edge: not bad yet.
    assert evaluate(node, [floor(node, 9.0)], at(0)) == []
    assert not Alert.objects.exists()


def test_flapping_value_gives_one_firing_notice_and_no_storm(node):
    notices = []
    for step in range(50):
        # Oscillates around the 8 GiB threshold, always below the 10 GiB clear edge.
        value = 7.9 if step % 2 == 0 else 8.1 + (step % 7) * 0.25
        notices += evaluate(node, [floor(node, value)], at(step * 5))

    assert kinds(notices) == ["firing"]
    alert = Alert.objects.get()
    assert alert.state == "firing"
    assert alert.events.count() == 2


def test_back_past_clear_resolves_with_one_resolved_notice(node):
    evaluate(node, [overcommit(node, 2.0)], at(0))

    notices = evaluate(node, [overcommit(node, -1.0)], at(60))
    again = evaluate(node, [overcommit(node, -1.0)], at(65))

    assert kinds(notices) == ["resolved"]
    assert again == []
    alert = Alert.objects.get()
    assert (alert.state, alert.resolved_at, alert.resolve_reason) == \
        ("resolved", at(60), "cleared")
    assert alert.notify_count == 2
    assert transitions(alert)[-1] == ("firing", "resolved")


def test_value_between_threshold_and_clear_keeps_firing_alert_open(node):
    evaluate(node, [floor(node, 7.0)], at(0))
    evaluate(node, [floor(node, 7.0)], at(30))

    assert evaluate(node, [floor(node, 9.9)], at(40)) == []

    alert = Alert.objects.get()
    assert (alert.state, alert.last_evaluation) == ("firing", "holding")
    assert kinds(evaluate(node, [floor(node, 10.0)], at(50))) == ["resolved"]


def test_pending_alert_that_clears_never_notifies(node):
    evaluate(node, [floor(node, 7.0)], at(0))

    notices = evaluate(node, [floor(node, 12.0)], at(10))

    assert notices == []
    alert = Alert.objects.get()
    assert (alert.state, alert.resolve_reason, alert.notify_count) == \
        ("resolved", "never fired", 0)
    assert transitions(alert) == [("", "pending"), ("pending", "resolved")]


def test_a_new_episode_after_resolution_is_a_new_alert(node):
    evaluate(node, [overcommit(node, 2.0)], at(0))
    evaluate(node, [overcommit(node, -1.0)], at(10))

    notices = evaluate(node, [overcommit(node, 2.0)], at(20))

    assert kinds(notices) == ["firing"]
    assert list(Alert.objects.order_by("id").values_list("state", flat=True)) == \
        ["resolved", "firing"]


def test_repeat_notice_honours_the_interval(node):
    evaluate(node, [overcommit(node, 2.0)], at(0))

    before = evaluate(node, [overcommit(node, 2.0)], at(FOUR_HOURS - 1))
    due = evaluate(node, [overcommit(node, 2.0)], at(FOUR_HOURS))
    after = evaluate(node, [overcommit(node, 2.0)], at(FOUR_HOURS + 60))

    assert (before, kinds(due), after) == ([], ["repeat"], [])
    assert due[0].sequence == 2
    alert = Alert.objects.get()
    assert (alert.notify_count, alert.last_notified_at) == (2, at(FOUR_HOURS))


def test_repeat_interval_override_from_rule_settings(node):
    RuleSetting.objects.create(rule="overcommit", repeat_seconds=600)
    evaluate(node, [overcommit(node, 2.0)], at(0))

    assert evaluate(node, [overcommit(node, 2.0)], at(599)) == []
    assert kinds(evaluate(node, [overcommit(node, 2.0)], at(600))) == ["repeat"]


def silence(node=None, rule="", engine=None, start=0, end=3600) -> Silence:
    return Silence.objects.create(node=node, rule=rule, engine=engine, starts_at=at(start),
                                  ends_at=at(end), reason="maintenance", created_at=at(start))


def test_silence_holds_back_firing_and_repeat_then_firing_goes_out_once(node):
    silence(node, end=FOUR_HOURS + 3600)

    fired = evaluate(node, [overcommit(node, 2.0)], at(0))
    repeat_due = evaluate(node, [overcommit(node, 2.0)], at(FOUR_HOURS + 10))

    alert = Alert.objects.get()
    assert (fired, repeat_due) == ([], [])
    assert (alert.state, alert.notify_count) == ("firing", 0)
    assert "silenced" in alert.events.get(to_state="firing").message

    after_silence = evaluate(node, [overcommit(node, 2.0)], at(FOUR_HOURS + 3600))
    next_round = evaluate(node, [overcommit(node, 2.0)], at(FOUR_HOURS + 3605))

    assert kinds(after_silence) == ["firing"]
    assert next_round == []
    assert transitions(alert)[-1] == ("firing", "firing")


def test_silence_mutes_repeats_of_an_alert_notified_before_it(node):
    evaluate(node, [overcommit(node, 2.0)], at(0))
    silence(node, start=60, end=FOUR_HOURS + 600)

    assert evaluate(node, [overcommit(node, 2.0)], at(FOUR_HOURS)) == []
    assert kinds(evaluate(node, [overcommit(node, 2.0)], at(FOUR_HOURS + 600))) == ["repeat"]


def test_resolution_of_a_notified_alert_is_sent_even_while_silenced(node):
    evaluate(node, [overcommit(node, 2.0)], at(0))
    silence(node, start=60)

    assert kinds(evaluate(node, [overcommit(node, -1.0)], at(120))) == ["resolved"]


def test_resolution_of_an_alert_that_fired_only_while_silenced_is_silent(node):
    silence(node)
    evaluate(node, [overcommit(node, 2.0)], at(0))

    assert evaluate(node, [overcommit(node, -1.0)], at(60)) == []
    assert Alert.objects.get().state == "resolved"


def test_silence_scoped_by_rule_and_engine_mutes_only_matching_alerts(node):
    gemma, nemotron = make_engine(node, "gemma"), make_engine(node, "nemotron")
    silence(node, rule="prefill-stall", engine=gemma)
    rounds = [
        engine_rule(node, gemma, "prefill-stall", 5.0),
        engine_rule(node, nemotron, "prefill-stall", 5.0),
        engine_rule(node, gemma, "overcommit", 5.0),
    ]

    notices = evaluate(node, rounds, at(0))

    muted = Alert.objects.get(rule="prefill-stall", engine=gemma)
    assert muted.state == "firing" and muted.notify_count == 0
    assert sorted((n.alert.rule, n.alert.engine.name) for n in notices) == \
        [("overcommit", "gemma"), ("prefill-stall", "nemotron")]


def test_silence_of_another_node_or_a_past_window_mutes_nothing(node):
    other = type(node).objects.create(name="spark-b")
    silence(other)
    silence(None, start=-7200, end=-3600)

    assert kinds(evaluate(node, [overcommit(node, 2.0)], at(0))) == ["firing"]


def test_silence_for_any_node_mutes_this_node(node):
    silence(None, rule="overcommit")

    assert evaluate(node, [overcommit(node, 2.0)], at(0)) == []


def test_unknown_value_keeps_state(node):
    evaluate(node, [floor(node, 7.0)], at(0))

    # Past the 30 s "for", but unknown: neither fires nor resolves.
    assert evaluate(node, [floor(node, None)], at(40)) == []
    pending = Alert.objects.get()
    assert (pending.state, pending.value, pending.last_evaluation) == ("pending", 7.0, "unknown")
    assert pending.last_evaluated_at == at(40)

    assert kinds(evaluate(node, [floor(node, 7.0)], at(45))) == ["firing"]
    assert evaluate(node, [floor(node, None)], at(FOUR_HOURS + 100)) == []
    assert Alert.objects.get().state == "firing"


def test_unknown_value_opens_nothing(node):
    assert evaluate(node, [floor(node, None)], at(0)) == []
    assert not Alert.objects.exists()


def test_details_and_summary_follow_the_latest_evaluation(node):
    evaluate(node, [floor(node, 7.0)], at(0))

    evaluate(node, [floor(node, 6.0, summary="refined", details={"cause": "page cache"})], at(5))

    alert = Alert.objects.get()
    assert (alert.summary, alert.cause, alert.value) == \
        ("refined; cause: page cache", "page cache", 6.0)


def _alert_writes(node, conditions, moment) -> list[str]:
    """The UPDATE statements of the alert table one evaluation makes."""
    with CaptureQueriesContext(connection) as queries:
        evaluate(node, conditions, moment)
    return [query["sql"] for query in queries
            if query["sql"].startswith('UPDATE "dashboard_alert"')]


def _set_columns(update: str) -> set[str]:
    assignments = update.split(" SET ", 1)[1].split(" WHERE ", 1)[0]
    return {part.split("=")[0].strip().strip('"') for part in assignments.split(", ")
            if "=" in part and part.split("=")[0].strip().startswith('"')}


def test_a_round_that_changes_nothing_but_the_evaluation_writes_only_its_time(node):
    evaluate(node, [floor(node, 7.0)], at(0))
    evaluate(node, [floor(node, 7.0)], at(30))  # fires
    assert Alert.objects.get().state == "firing"

    writes = _alert_writes(node, [floor(node, 7.0)], at(35))

    assert len(writes) == 1
    assert _set_columns(writes[0]) == {"last_evaluated_at"}
    assert Alert.objects.get().last_evaluated_at == at(35)


def test_a_refined_figure_of_a_steady_alert_is_written_with_its_time(node):
    evaluate(node, [floor(node, 7.0)], at(0))

    writes = _alert_writes(node, [floor(node, 6.5)], at(5))  # still pending, lower

    assert len(writes) == 1
    assert _set_columns(writes[0]) == {"last_evaluated_at", "value", "summary", "details"}
    alert = Alert.objects.get()
    assert (alert.state, alert.value, alert.details["mem_available_gib"]) == \
        ("pending", 6.5, 6.5)


def test_vanished_scope_resolves_as_no_longer_applies(node):
    gemma = make_engine(node, "gemma")
    evaluate(node, [engine_rule(node, gemma, "engine-down", 5.0)], at(0))
    evaluate(node, [engine_rule(node, gemma, "engine-down", 5.0)], at(60))

    notices = evaluate(node, [], at(90), evaluated_rules={"engine-down"})

    assert kinds(notices) == ["resolved"]
    alert = Alert.objects.get()
    assert (alert.state, alert.resolve_reason) == ("resolved", "no longer applies")


def test_open_alert_of_a_rule_that_did_not_run_stays_open(node):
    evaluate(node, [overcommit(node, 2.0)], at(0))

    assert evaluate(node, [], at(10), evaluated_rules={"headroom-floor"}) == []
    assert evaluate(node, [floor(node, 12.0)], at(20)) == []
    assert Alert.objects.get().state == "firing"


def test_vanished_pending_alert_resolves_silently(node):
    gemma = make_engine(node, "gemma")
    evaluate(node, [engine_rule(node, gemma, "engine-down", 5.0)], at(0))

    assert evaluate(node, [], at(10), evaluated_rules={"engine-down"}) == []
    assert Alert.objects.get().state == "resolved"


def test_disabled_rule_resolves_its_alerts_and_ignores_its_conditions(node):
    evaluate(node, [overcommit(node, 2.0)], at(0))
    RuleSetting.objects.create(rule="overcommit", enabled=False)

    notices = evaluate(node, [overcommit(node, 2.0)], at(10))
    later = evaluate(node, [overcommit(node, 3.0)], at(20))

    assert (kinds(notices), later) == (["resolved"], [])
    alert = Alert.objects.get()
    assert (alert.state, alert.resolve_reason) == ("resolved", "rule disabled")


def test_direct_duplicate_open_alert_is_refused_by_the_database(node):
    evaluate(node, [overcommit(node, 2.0)], at(0))
    first = Alert.objects.get()

    with pytest.raises(IntegrityError), transaction.atomic():
        Alert.objects.create(rule=first.rule, node=node, scope=first.scope, state="pending",
                             severity="warning", summary="copy", threshold=0.0,
                             started_at=at(1), last_evaluated_at=at(1))

    # A resolved alert of the same scope is history, not a duplicate.
    Alert.objects.create(rule=first.rule, node=node, scope=first.scope, state="resolved",
                         severity="warning", summary="old", threshold=0.0,
                         started_at=at(-100), last_evaluated_at=at(-50))


def test_evaluator_that_loses_the_race_uses_the_winners_alert(node, monkeypatch):
    # The other evaluator opened the alert after this one looked for it and found none.
    evaluate(node, [floor(node, 7.0)], at(0))
    real_lock_open = lifecycle._lock_open
    looks = []

    def stale_first_look(scope):
        looks.append(scope)
        return None if len(looks) == 1 else real_lock_open(scope)

    monkeypatch.setattr(lifecycle, "_lock_open", stale_first_look)

    notices = evaluate(node, [floor(node, 6.0)], at(30))

    assert len(looks) == 2
    assert kinds(notices) == ["firing"]
    alert = Alert.objects.get()
    assert (alert.state, alert.value) == ("firing", 6.0)


def test_every_state_change_wrote_an_event(node):
    gemma = make_engine(node, "gemma")
    silence(node, rule="engine-down", start=100, end=200)
    script = [
        (0, [floor(node, 7.0), engine_rule(node, gemma, "engine-down", 5.0)]),
        (30, [floor(node, 7.0), engine_rule(node, gemma, "engine-down", 5.0)]),
        (120, [floor(node, 12.0), engine_rule(node, gemma, "engine-down", 5.0)]),
        (200, [engine_rule(node, gemma, "engine-down", 5.0)]),
        (300, []),
    ]
    for seconds, conditions in script:
        evaluate(node, conditions, at(seconds),
                 evaluated_rules={"headroom-floor", "engine-down"})

    states = {alert.rule: transitions(alert) for alert in Alert.objects.all()}
    assert states == {
        "headroom-floor": [("", "pending"), ("pending", "firing"), ("firing", "resolved")],
        "engine-down": [("", "pending"), ("pending", "firing"), ("firing", "firing"),
                        ("firing", "resolved")],
    }
    assert AlertEvent.objects.filter(notice="firing").count() == 2


def test_notice_sink_runs_in_the_alerts_transaction(node):
    def broken_outbox(notice):
        raise RuntimeError("outbox unavailable")

    evaluate(node, [floor(node, 7.0)], at(0))
    with pytest.raises(RuntimeError):
        evaluate(node, [floor(node, 7.0)], at(30), on_notice=broken_outbox)

    # Nothing was recorded as sent, so the next round issues the firing notice again.
    alert = Alert.objects.get()
    assert (alert.state, alert.notify_count, alert.events.count()) == ("pending", 0, 1)
    written = []
    notices = evaluate(node, [floor(node, 7.0)], at(35), on_notice=written.append)
    assert kinds(notices) == kinds(written) == ["firing"]


def test_conditions_are_checked_before_anything_changes(node):
    other = type(node).objects.create(name="spark-b")

    with pytest.raises(ValueError):
        evaluate(node, [overcommit(node, 2.0), overcommit(other, 2.0)], at(0))
    with pytest.raises(ValueError):
        evaluate(node, [overcommit(node, 2.0), overcommit(node, 3.0)], at(0))
    with pytest.raises(UnknownRule):
        evaluate(node, [overcommit(node, 2.0), overcommit(node, 2.0, rule="typo")], at(0))
    assert not Alert.objects.exists()


def test_alert_as_dict_is_json_ready(node):
    gemma = make_engine(node, "gemma")
    evaluate(node, [engine_rule(node, gemma, "prefill-stall", 5.0)], at(0))

    data = alert_as_dict(Alert.objects.get())

    assert json.loads(json.dumps(data)) == data
    assert {k: data[k] for k in ("rule", "state", "node", "engine", "value", "threshold",
                                 "notify_count", "fired_at", "resolved_at")} == {
        "rule": "prefill-stall", "state": "firing", "node": "spark-a", "engine": "gemma",
        "value": 5.0, "threshold": 1.0, "notify_count": 1,
        "fired_at": (T0 + timedelta(0)).isoformat(), "resolved_at": None,
    }
    assert {"id", "severity", "summary", "details", "started_at"} <= data.keys()
    assert data["url"] == f"/alerts/{data['id']}/"


# --- new incidents folded into a firing alert -------------------------------------------------


def restarted(node, engine, restart_id: int):
    """An "unplanned-restart" condition naming restart ``restart_id`` of ``engine``."""
    return replace(engine_rule(node, engine, "unplanned-restart", 1.0), threshold=0.5,
                   clear=0.5, severity="critical",
                   summary=f"{engine.name}: unplanned restart {restart_id}",
                   details={"restart_id": restart_id})


def squeezed(node, engine, *components: str):
    """A "prefill-squeeze" condition (firing: 1 below 2) whose causes are ``components``."""
    causes = [{"component": c, "text": f"{c} went 8 → 24 GiB"} for c in components]
    return replace(engine_rule(node, engine, "prefill-squeeze", 1.0), threshold=2.0, clear=2.5,
                   direction="below", severity="critical", details={"causes": causes})


def test_a_new_restart_folded_into_a_firing_alert_is_announced_once(node):
    engine = make_engine(node, "vllm-a")
    first = evaluate(node, [restarted(node, engine, 1)], at(0))
    same = evaluate(node, [restarted(node, engine, 1)], at(5))
    again = evaluate(node, [restarted(node, engine, 2)], at(10))
    after = evaluate(node, [restarted(node, engine, 2)], at(15))

    assert (kinds(first), kinds(same), kinds(again), kinds(after)) == \
        (["firing"], [], ["updated"], [])
    (notice,) = again
    assert notice.news == ("vllm-a: unplanned restart 2",)
    assert notice.idempotency_key != first[0].idempotency_key
    alert = Alert.objects.get()
    assert (alert.state, alert.notify_count) == ("firing", 2)
    assert AlertEvent.objects.filter(notice="updated").get().message == \
        "new incident: vllm-a: unplanned restart 2"


def test_a_new_neighbour_named_as_cause_is_announced_a_known_one_is_not(node):
    engine = make_engine(node, "vllm-a")
    evaluate(node, [squeezed(node, engine, "engine:vllm-b")], at(0))
    evaluate(node, [squeezed(node, engine, "engine:vllm-b")], at(300))  # for 300 s: fires

    grew = evaluate(node, [squeezed(node, engine, "engine:vllm-b", "engine:vllm-c")], at(305))
    reordered = evaluate(node, [squeezed(node, engine, "engine:vllm-c", "engine:vllm-b")],
                         at(310))

    assert kinds(grew) == ["updated"] and grew[0].news == ("engine:vllm-c went 8 → 24 GiB",)
    assert kinds(reordered) == []


def test_a_new_incident_while_silenced_or_before_the_firing_notice_sends_nothing_new(node):
    engine = make_engine(node, "vllm-a")
    silence(node, rule="unplanned-restart", end=60)
    muted = [kinds(evaluate(node, [restarted(node, engine, n)], at(n))) for n in (1, 2)]
    unmuted = evaluate(node, [restarted(node, engine, 3)], at(61))

    assert muted == [[], []]
    # The held-back firing notice goes out and already tells the latest restart.
    assert kinds(unmuted) == ["firing"]
    assert Alert.objects.get().summary == "vllm-a: unplanned restart 3"
