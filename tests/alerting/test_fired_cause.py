"""The cause an alert fired for stays its cause, and its figures are told in words and units.

A squeeze alert is driven through the lifecycle and the outbox (the same ``queue_notice`` the
pipeline uses) while the rule's named cause changes; the pages and every notification must keep
the firing cause and show the later one as a separate "since then" line. Restart alerts are
built from real Restart rows through the unplanned-restart rule.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils.html import escape

from dashboard.alerting.lifecycle import evaluate
from dashboard.alerting.models import Alert
from dashboard.alerting.pipeline import queue_notice
from dashboard.alerting.rules import unplanned_restart
from dashboard.alerting.settings import all_rule_settings
from dashboard.notify.models import Channel, Notification
from dashboard.restarts.models import Restart
from sparkops.units import GIB
from tests.alerting.helpers import T0, at, engine_rule, make_engine

FIRED_FOR = "nemotron KV pool went 0.25 → 0.75 GiB at 13:22:39 UTC"
LATER = "process python3 went 0.11 → 0.81 GiB at 13:22:59 UTC"


def squeeze(node, engine, value: float, cause: str, component: str):
    """A "prefill-squeeze" condition (bad below 2, clears at 2.5) naming ``cause``."""
    details = {"engine": engine.name, "headroom_bytes": int(3.5 * GIB), "margin_gib": 2.0,
               "prefill_need_bytes": 2 * GIB, "prefill_need_source": "estimate",
               "prefill_estimate_bytes": 2 * GIB, "prefill_observed_bytes": None,
               "causes": [{"component": component, "text": cause}], "cause": cause}
    return replace(engine_rule(node, engine, "prefill-squeeze", value), threshold=2.0,
                   clear=2.5, direction="below", severity="critical",
                   summary=f"{engine.name} may not fit its next prefill", details=details)


def _round(node, condition, now):
    return evaluate(node, [condition], now, evaluated_rules={condition.rule},
                    on_notice=lambda notice: queue_notice(notice, node, now))


@pytest.fixture
def channels(db):
    Channel.objects.create(name="mail", kind="email", config={"to": ["ops@example.com"]})
    Channel.objects.create(name="hook", kind="webhook",
                           config={"url": "https://hooks.example/sparkops"})


@pytest.fixture
def squeezed_and_resolved(node, channels):
    """A squeeze alert that fired for FIRED_FOR, then named LATER, then resolved."""
    engine = make_engine(node, "gemma")
    _round(node, squeeze(node, engine, 1.0, FIRED_FOR, "engine:nemotron"), at(0))
    _round(node, squeeze(node, engine, 1.0, FIRED_FOR, "engine:nemotron"), at(10))  # fires
    _round(node, squeeze(node, engine, 1.0, LATER, "process:python3"), at(20))  # updated
    repeat_after = all_rule_settings()["prefill-squeeze"].repeat_seconds
    _round(node, squeeze(node, engine, 1.0, LATER, "process:python3"), at(30 + repeat_after))
    _round(node, squeeze(node, engine, 3.0, LATER, "process:python3"), at(40 + repeat_after))
    return Alert.objects.get()


def test_the_firing_cause_survives_later_evaluations_and_the_resolve(squeezed_and_resolved):
    alert = squeezed_and_resolved

    assert alert.state == "resolved"
    assert (alert.fired_cause, alert.cause, alert.cause_now) == (FIRED_FOR, FIRED_FOR, LATER)


def test_every_notification_carries_the_firing_cause(squeezed_and_resolved):
    rows = list(Notification.objects.order_by("id"))

    kinds = [row.kind for row in rows if row.channel.kind == "webhook"]
    assert kinds == ["firing", "updated", "repeat", "resolved"]
    assert len(rows) == 8  # each notice to the email and the webhook channel
    for row in rows:
        assert row.payload["alert"]["cause"] == FIRED_FOR, row.kind
        assert f"Cause: {FIRED_FOR}" in row.text, row.kind
        assert f"<strong>Cause:</strong> {escape(FIRED_FOR)}" in row.html, row.kind
    firing = next(row for row in rows if row.kind == "firing")
    assert firing.payload["alert"]["cause_now"] is None and "Since then" not in firing.text
    resolved = next(row for row in rows if row.kind == "resolved")
    assert resolved.payload["alert"]["cause_now"] == LATER
    assert f"Since then: {LATER}" in resolved.text
    assert FIRED_FOR in firing.subject


def test_the_pages_show_the_firing_cause_and_the_later_one_apart(admin_client,
                                                                 squeezed_and_resolved):
    alert = squeezed_and_resolved

    listing = admin_client.get(reverse("dashboard:alerts")).content.decode()
    detail = admin_client.get(reverse("dashboard:alert", args=[alert.pk])).content.decode()

    assert alert.summary == f"gemma may not fit its next prefill; cause: {FIRED_FOR}"
    assert f"<td>{escape(alert.summary)}<br>" in listing
    assert f'<span class="cause cause-now">since then: {escape(LATER)}</span>' in listing
    assert LATER not in alert.summary
    assert f'<dd class="cause-fired">{escape(FIRED_FOR)}<br>' in detail
    assert f"since then: {escape(LATER)}" in detail


def test_a_pending_alert_tells_its_latest_cause_without_a_since_then_line(node):
    engine = make_engine(node, "gemma")
    evaluate(node, [squeeze(node, engine, 1.0, FIRED_FOR, "engine:nemotron")], at(0))
    evaluate(node, [squeeze(node, engine, 1.0, LATER, "process:python3")], at(5))

    alert = Alert.objects.get()
    assert (alert.state, alert.cause, alert.cause_now) == ("pending", LATER, "")


def test_figures_are_labelled_values_in_units_not_python_reprs(admin_client, node):
    engine = make_engine(node, "gemma")
    evaluate(node, [squeeze(node, engine, 1.0, FIRED_FOR, "engine:nemotron")], at(0))
    alert = Alert.objects.get()

    detail = admin_client.get(reverse("dashboard:alert", args=[alert.pk])).content.decode()
    figures = detail[detail.index("<h2>Figures</h2>"):detail.index("<h2>Timeline</h2>")]

    assert dict(alert.figures) == {
        "Engine": "gemma", "Headroom": "3.50 GiB", "Margin": "2.00 GiB",
        "Prefill need": "2.00 GiB", "Prefill need from": "estimate",
        "Prefill need, estimated": "2.00 GiB", "Prefill need, observed": "not observed yet",
        "Memory that grew": FIRED_FOR,
    }
    assert "<dt>Prefill need, observed</dt><dd>not observed yet</dd>" in figures
    assert "{" not in figures and "[" not in figures and "None" not in figures
    assert "<dt>Value</dt><dd>1.00 GiB</dd>" in detail
    assert "fires below 2.00 GiB; clears at 2.50 GiB" in detail


# --- restarts: said plainly, and consistent when a second one is folded in -------------------


def _unplanned(node, engine, minutes: float, message: str) -> Restart:
    moment = T0 + timedelta(minutes=minutes)
    return Restart.objects.create(node=node, engine=engine, kind="unplanned", status="detected",
                                  requested_at=moment, started_at=moment, reason=message)


def _restart_round(node, minutes: float):
    now = T0 + timedelta(minutes=minutes)
    thresholds = dict(all_rule_settings()["unplanned-restart"].thresholds)
    conditions = unplanned_restart.evaluate(node, {}, [], thresholds, now)
    return _round_all(node, conditions, now)


def _round_all(node, conditions, now):
    return evaluate(node, conditions, now, evaluated_rules={"unplanned-restart"},
                    on_notice=lambda notice: queue_notice(notice, node, now))


def test_a_second_unplanned_restart_is_told_plainly_with_summary_count_and_start_agreeing(
        admin_client, node, channels):
    engine = make_engine(node, "gemma")
    _unplanned(node, engine, 2, "Engine gemma stopped: container exited, exit code 137.")
    _restart_round(node, 2)
    _unplanned(node, engine, 20, "Engine gemma stopped: container exited, exit code 137 "
                                 "(killed by the OOM killer).")
    notices = _restart_round(node, 20)

    alert = Alert.objects.get()
    assert alert.summary == ("2 unplanned restarts of gemma since 2026-03-02 09:02:00 UTC: "
                             "exited (137) at 09:02:00, OOM-killed at 09:20:00")
    assert alert.started_at == T0 + timedelta(minutes=2)
    assert (alert.value, alert.notify_count, alert.value_text) == (2.0, 2, "2 restarts")
    assert [n.kind for n in notices] == ["updated"]
    assert notices[0].news[0].startswith("gemma: unplanned restart detected at 2026-03-02 "
                                         "09:20:00 UTC")
    updated = Notification.objects.filter(kind="updated", channel__kind="webhook").get()
    assert updated.payload["alert"]["summary"] == alert.summary
    assert dict(alert.figures)["Restarts"] == "exited (137) at 09:02:00 UTC; " \
                                              "OOM-killed at 09:20:00 UTC"

    detail = admin_client.get(reverse("dashboard:alert", args=[alert.pk])).content.decode()
    assert "<dt>Value</dt><dd>2 restarts</dd>" in detail
    assert "threshold 0.5" not in detail and "Value 1" not in detail
    assert "<dt>Notices</dt><dd>2," in detail


def test_a_restart_after_the_alert_resolved_opens_a_new_episode(node):
    engine = make_engine(node, "gemma")
    _unplanned(node, engine, 0, "Engine gemma stopped: container exited, exit code 1.")
    _restart_round(node, 0)
    _restart_round(node, 40)  # 40 min later: past the 30 min memory, resolves
    _unplanned(node, engine, 50, "Engine gemma restarted (started 2026-03-02 09:50:00 UTC); "
                                 "counters reset.")
    _restart_round(node, 50)

    first, second = Alert.objects.order_by("started_at")
    assert first.state == "resolved" and second.state == "firing"
    assert second.summary.startswith("gemma: unplanned restart detected at 2026-03-02 09:50:00")
    assert second.value_text == "1 restart"
