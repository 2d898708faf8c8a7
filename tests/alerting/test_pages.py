"""Alerting pages through Django's test client: who may see and change what."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from dashboard.alerting.lifecycle import evaluate
from dashboard.alerting.models import Alert, RuleSetting, Silence
from dashboard.alerting.silences import create_silence
from dashboard.audit.models import AuditEntry
from tests.access import grant
from tests.alerting.helpers import floor, make_engine, overcommit


@pytest.fixture
def staff_client(client, django_user_model):
    """Staff holding the permissions alerting changes need."""
    user = django_user_model.objects.create_user("operator", password="a-long-test-password",
                                                 is_staff=True)
    client.force_login(grant(user, "change_silences", "change_rules"))
    return client


@pytest.fixture
def bare_staff_client(django_user_model):
    """Staff without any permission: the account the probe used."""
    user = django_user_model.objects.create_user("bare", password="a-long-test-password",
                                                 is_staff=True)
    bare = Client()
    bare.force_login(user)
    return bare


@pytest.fixture
def viewer_client(django_user_model):
    user = django_user_model.objects.create_user("viewer", password="a-long-test-password")
    viewer = Client()
    viewer.force_login(user)
    return viewer


def future(hours: float = 2) -> str:
    return timezone.localtime(timezone.now() + timedelta(hours=hours)).strftime("%Y-%m-%dT%H:%M")


def alerts_in_every_state(node):
    now = timezone.now()
    evaluate(node, [overcommit(node, 2.0, summary="over by 2 GiB",
                               details={"cause": "gemma restarted with 24 GiB KV"})],
             now - timedelta(minutes=5))
    evaluate(node, [floor(node, 7.0, summary="floor breached")], now - timedelta(seconds=10))
    other = type(node).objects.create(name="spark-b")
    evaluate(other, [overcommit(other, 1.0, summary="spark-b over")], now - timedelta(hours=1))
    evaluate(other, [overcommit(other, -1.0, summary="spark-b over")], now)


@pytest.mark.parametrize("name", ["alerts", "silences", "rules", "silence-new"])
def test_anonymous_users_are_sent_to_login(client, db, name):
    response = client.get(reverse(f"dashboard:{name}"))

    assert response.status_code == 302
    assert response["Location"].startswith("/login/?next=")


def test_alerts_page_lists_firing_before_pending_before_resolved(viewer_client, node):
    alerts_in_every_state(node)

    page = viewer_client.get(reverse("dashboard:alerts")).content.decode()

    assert page.index("over by 2 GiB") < page.index("floor breached") < page.index("spark-b over")
    assert "gemma restarted with 24 GiB KV" in page


def test_alerts_page_filters_by_node(viewer_client, node):
    alerts_in_every_state(node)

    page = viewer_client.get(reverse("dashboard:alerts"), {"node": "spark-b"}).content.decode()

    assert "spark-b over" in page
    assert "floor breached" not in page


def test_alert_detail_shows_its_timeline(viewer_client, node):
    alerts_in_every_state(node)
    alert = Alert.objects.get(summary="over by 2 GiB; cause: gemma restarted with 24 GiB KV")

    response = viewer_client.get(reverse("dashboard:alert", args=[alert.pk]))

    page = response.content.decode()
    assert response.status_code == 200
    assert "opened → " in page and "pending → " in page
    assert "condition active: value 2" in page


def test_viewer_sees_pages_but_cannot_change_anything(viewer_client, node):
    silence = create_silence(reason="maintenance", ends_at=timezone.now() + timedelta(hours=1),
                             now=timezone.now(), node=node)

    for name in ("alerts", "silences", "rules"):
        assert viewer_client.get(reverse(f"dashboard:{name}")).status_code == 200
    created = viewer_client.post(reverse("dashboard:silence-new"),
                                 {"ends_at": future(), "reason": "nope"})
    expired = viewer_client.post(reverse("dashboard:silence-expire", args=[silence.pk]))
    edit_form = viewer_client.get(reverse("dashboard:rule-edit", args=["overcommit"]))
    edited = viewer_client.post(reverse("dashboard:rule-edit", args=["overcommit"]),
                                {"enabled": "", "for_seconds": "5"})

    assert [r.status_code for r in (created, expired, edit_form, edited)] == [403] * 4
    assert Silence.objects.count() == 1
    silence.refresh_from_db()
    assert not silence.expired_early
    assert not RuleSetting.objects.exists()
    assert "Creating or expiring silences needs the permission to create and expire silences " \
        "(alerting.change_silences)" in \
        viewer_client.get(reverse("dashboard:silences")).content.decode()


def test_staff_creates_a_scoped_silence(staff_client, node):
    gemma = make_engine(node, "gemma")

    response = staff_client.post(reverse("dashboard:silence-new"), {
        "node": node.pk, "rule": "prefill-stall", "engine": gemma.pk, "ends_at": future(3),
        "reason": "long-document test run",
    })

    assert response.status_code == 302
    silence = Silence.objects.get()
    assert (silence.node, silence.rule, silence.engine, silence.reason) == \
        (node, "prefill-stall", gemma, "long-document test run")
    assert silence.created_by.get_username() == "operator"
    assert silence.is_active(timezone.now())
    page = staff_client.get(reverse("dashboard:silences")).content.decode()
    assert "prefill-stall on spark-a, gemma" in page


@pytest.mark.parametrize(("fields", "error"), [
    ({"reason": ""}, "This field is required."),
    ({"ends_at": "2020-01-01T00:00"}, "The end must be in the future."),
])
def test_invalid_silence_is_refused_with_a_reason(staff_client, node, fields, error):
    data = {"ends_at": future(), "reason": "maintenance", **fields}

    response = staff_client.post(reverse("dashboard:silence-new"), data)

    assert response.status_code == 400
    assert error in response.content.decode()
    assert not Silence.objects.exists()


def test_silence_engine_must_be_on_the_chosen_node(staff_client, node):
    other = type(node).objects.create(name="spark-b")
    gemma = make_engine(other, "gemma")

    response = staff_client.post(reverse("dashboard:silence-new"), {
        "node": node.pk, "engine": gemma.pk, "ends_at": future(), "reason": "x"})

    assert response.status_code == 400
    assert "is not on node spark-a" in response.content.decode()


def test_staff_expires_a_silence_and_it_stays_as_history(staff_client, node):
    silence = create_silence(reason="maintenance", ends_at=timezone.now() + timedelta(hours=1),
                             now=timezone.now(), node=node)

    response = staff_client.post(reverse("dashboard:silence-expire", args=[silence.pk]))

    assert response.status_code == 302
    silence.refresh_from_db()
    assert silence.expired_early and silence.expired_by.get_username() == "operator"
    assert not silence.is_active(timezone.now())
    page = staff_client.get(reverse("dashboard:silences")).content.decode()
    assert "expired early by operator" in page


def test_expire_needs_post(staff_client, node):
    silence = create_silence(reason="maintenance", ends_at=timezone.now() + timedelta(hours=1),
                             now=timezone.now())

    assert staff_client.get(reverse("dashboard:silence-expire", args=[silence.pk])) \
        .status_code == 405


def test_changes_need_a_csrf_token(django_user_model, node):
    user = django_user_model.objects.create_user("operator", password="x", is_staff=True)
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(grant(user, "change_silences"))

    response = strict.post(reverse("dashboard:silence-new"),
                           {"ends_at": future(), "reason": "maintenance"})

    assert response.status_code == 403
    assert not Silence.objects.exists()


def test_rules_page_documents_defaults_and_marks_overrides(viewer_client, db):
    RuleSetting.objects.create(rule="queue-backlog", thresholds={"waiting_seconds": 20})

    page = viewer_client.get(reverse("dashboard:rules")).content.decode()

    assert "min(floor_gib, floor_percent of MemTotal)" in page
    assert "Prefill squeeze" in page and "4 h" in page
    assert '<span class="overridden">20 s</span>' in page
    assert "(default 15)" in page


def test_staff_edits_a_rule(staff_client, db):
    response = staff_client.post(reverse("dashboard:rule-edit", args=["headroom-floor"]), {
        "enabled": "on", "for_seconds": "45", "repeat_seconds": "",
        "threshold_floor_gib": "6", "threshold_floor_percent": "",
        "threshold_swap_growth_mib_per_min": "",
    })

    assert response.status_code == 302
    stored = RuleSetting.objects.get(rule="headroom-floor")
    assert (stored.enabled, stored.for_seconds, stored.repeat_seconds, stored.thresholds) == \
        (True, 45, None, {"floor_gib": 6.0})
    assert stored.updated_by.get_username() == "operator"


def test_staff_disables_a_rule(staff_client, db):
    staff_client.post(reverse("dashboard:rule-edit", args=["engine-down"]), {"for_seconds": ""})

    assert RuleSetting.objects.get(rule="engine-down").enabled is False


@pytest.mark.parametrize(("field", "value", "message"), [
    ("for_seconds", "-5", "For must be between 0 and 86400 seconds."),
    ("repeat_seconds", "10", "Repeat every must be between 60 and 604800 seconds."),
    ("threshold_margin_gib", "-1", "Margin must be at least 0 GiB."),
    ("threshold_margin_gib", "lots", "Enter a number."),
])
def test_invalid_rule_edit_shows_an_error_and_changes_nothing(staff_client, db, field, value,
                                                              message):
    RuleSetting.objects.create(rule="prefill-squeeze", for_seconds=20,
                               thresholds={"margin_gib": 3.0})
    data = {"enabled": "on", "for_seconds": "12", "repeat_seconds": "",
            "threshold_margin_gib": "2.5", field: value}

    response = staff_client.post(reverse("dashboard:rule-edit", args=["prefill-squeeze"]), data)

    page = response.content.decode()
    assert response.status_code == 400
    assert message in page and "Nothing was saved" in page
    stored = RuleSetting.objects.get(rule="prefill-squeeze")
    assert (stored.for_seconds, stored.thresholds) == (20, {"margin_gib": 3.0})


def test_unknown_rule_edit_is_404(staff_client, db):
    assert staff_client.get(reverse("dashboard:rule-edit", args=["no-such"])).status_code == 404


def test_superuser_fixture_can_change_things(admin_client, node):
    response = admin_client.post(reverse("dashboard:silence-new"),
                                 {"ends_at": future(), "reason": "maintenance",
                                  "confirm_broad": "on"})

    assert response.status_code == 302
    assert Silence.objects.get().matcher_text == "any rule on any node, any engine"


# --- permissions and audit ------------------------------------------------------------------

def test_staff_without_the_permissions_is_refused_and_each_refusal_is_audited(
        bare_staff_client, node):
    silence = create_silence(reason="maintenance", ends_at=timezone.now() + timedelta(hours=1),
                             now=timezone.now(), node=node)

    created = bare_staff_client.post(reverse("dashboard:silence-new"),
                                     {"ends_at": future(), "reason": "mute it all",
                                      "confirm_broad": "on"}, REMOTE_ADDR="192.0.2.7")
    expired = bare_staff_client.post(reverse("dashboard:silence-expire", args=[silence.pk]))
    edited = bare_staff_client.post(reverse("dashboard:rule-edit", args=["overcommit"]),
                                    {"for_seconds": "5"})

    assert [r.status_code for r in (created, expired, edited)] == [403] * 3
    assert "bare lacks the permission to create and expire silences " \
        "(alerting.change_silences)" in created.content.decode()
    assert "lacks the permission to change alert rule settings (alerting.change_rules)" in \
        edited.content.decode()
    assert Silence.objects.count() == 1 and not RuleSetting.objects.exists()
    silence.refresh_from_db()
    assert not silence.expired_early
    rows = {row.action: row for row in AuditEntry.objects.all()}
    assert set(rows) == {"create-silence", "expire-silence", "edit-rule"}
    assert all(not row.allowed and row.user.get_username() == "bare" for row in rows.values())
    assert rows["create-silence"].address == "192.0.2.7"
    assert rows["edit-rule"].details["rule"] == "overcommit"
    assert rows["expire-silence"].details["pk"] == silence.pk


def test_staff_without_the_permission_sees_no_change_controls(bare_staff_client, node):
    create_silence(reason="maintenance", ends_at=timezone.now() + timedelta(hours=1),
                   now=timezone.now(), node=node)

    silences_page = bare_staff_client.get(reverse("dashboard:silences")).content.decode()
    rules_page = bare_staff_client.get(reverse("dashboard:rules")).content.decode()

    assert "/expire/" not in silences_page and 'name="reason"' not in silences_page
    assert "/rules/overcommit/" not in rules_page
    assert bare_staff_client.get(reverse("dashboard:silence-new")).status_code == 403
    assert not AuditEntry.objects.exists()  # opening a form is no action


def test_silence_changes_are_audited_with_who_where_and_what(staff_client, node):
    response = staff_client.post(reverse("dashboard:silence-new"), {
        "node": node.pk, "rule": "prefill-stall", "ends_at": future(3), "reason": "test run",
    }, REMOTE_ADDR="198.51.100.4")
    silence = Silence.objects.get()
    staff_client.post(reverse("dashboard:silence-expire", args=[silence.pk]))

    assert response.status_code == 302
    created, expired = AuditEntry.objects.order_by("at", "pk")
    assert (created.action, created.allowed, created.user.get_username(), created.address,
            created.node) == ("create-silence", True, "operator", "198.51.100.4", node)
    assert created.details["silence"] == silence.pk and created.details["reason"] == "test run"
    assert "prefill-stall on spark-a, any engine" in created.outcome
    assert (expired.action, expired.allowed, expired.details["changed"]) == \
        ("expire-silence", True, True)


def test_rule_edit_is_audited_with_what_changed(staff_client, db):
    RuleSetting.objects.create(rule="headroom-floor", for_seconds=30)

    staff_client.post(reverse("dashboard:rule-edit", args=["headroom-floor"]), {
        "enabled": "", "for_seconds": "30", "repeat_seconds": "", "threshold_floor_gib": "6",
        "threshold_floor_percent": "", "threshold_swap_growth_mib_per_min": "",
    })

    (row,) = AuditEntry.objects.all()
    assert (row.action, row.allowed, row.user.get_username()) == ("edit-rule", True, "operator")
    assert row.details["changed"] == {
        "enabled": {"from": True, "to": False},
        "thresholds": {"from": {}, "to": {"floor_gib": 6.0}},
    }


# --- silence caps and broad silences -------------------------------------------------------

def test_a_silence_longer_than_the_cap_is_refused_with_a_reason(staff_client, node):
    response = staff_client.post(reverse("dashboard:silence-new"), {
        "node": node.pk, "rule": "prefill-stall", "ends_at": "9999-12-31T23:59",
        "reason": "forever", "confirm_broad": "on"})

    assert response.status_code == 400
    assert "A silence may last at most 7 days (SPARKOPS_SILENCE_MAX_DAYS)" in \
        response.content.decode()
    assert not Silence.objects.exists()


def test_the_cap_is_a_setting(staff_client, node, settings):
    settings.SPARKOPS_SILENCE_MAX_DAYS = 0.5

    refused = staff_client.post(reverse("dashboard:silence-new"), {
        "node": node.pk, "rule": "prefill-stall", "ends_at": future(13), "reason": "x"})
    accepted = staff_client.post(reverse("dashboard:silence-new"), {
        "node": node.pk, "rule": "prefill-stall", "ends_at": future(11), "reason": "x"})

    assert refused.status_code == 400 and "at most 12 h" in refused.content.decode()
    assert accepted.status_code == 302 and Silence.objects.count() == 1


def test_the_domain_refuses_an_overlong_silence_too(node):
    now = timezone.now()

    with pytest.raises(ValueError, match="at most 7 days"):
        create_silence(reason="x", ends_at=now + timedelta(days=8), now=now, node=node)


def test_a_silence_of_everything_shows_what_it_mutes_and_needs_confirming(staff_client, node):
    alerts_in_every_state(node)
    data = {"ends_at": future(2), "reason": "quiet please"}

    first = staff_client.post(reverse("dashboard:silence-new"), data)

    page = first.content.decode()
    assert first.status_code == 400 and not Silence.objects.exists()
    assert "it matches every rule on every node" in page
    assert 'id="broad-silence"' in page and "Yes, mute all of this" in page
    # The open alerts it would mute are listed; the resolved one on spark-b is not.
    assert "over by 2 GiB" in page and "floor breached" in page
    assert "spark-b over" not in page

    second = staff_client.post(reverse("dashboard:silence-new"), {**data, "confirm_broad": "on"})

    assert second.status_code == 302
    assert Silence.objects.get().matcher_text == "any rule on any node, any engine"
    assert AuditEntry.objects.get().details["broad"] == ["it matches every rule on every node"]


def test_a_scoped_silence_longer_than_a_day_needs_confirming(staff_client, node):
    data = {"node": node.pk, "rule": "prefill-stall", "ends_at": future(30), "reason": "x"}

    first = staff_client.post(reverse("dashboard:silence-new"), data)
    second = staff_client.post(reverse("dashboard:silence-new"), {**data, "confirm_broad": "on"})

    assert first.status_code == 400 and "it lasts longer than a day" in first.content.decode()
    assert "No alert it matches is open now" in first.content.decode()
    assert second.status_code == 302 and Silence.objects.count() == 1


def test_a_scoped_short_silence_needs_no_confirmation(staff_client, node):
    response = staff_client.post(reverse("dashboard:silence-new"), {
        "node": node.pk, "ends_at": future(4), "reason": "rebooting spark-a"})

    assert response.status_code == 302 and Silence.objects.count() == 1
