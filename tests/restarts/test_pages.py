"""Restart pages through Django's test client: who may see and change what, and what they show."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from collectors.models import Node
from dashboard.audit.models import AuditEntry
from dashboard.restarts.models import Restart, RestartStep, RestartWindow
from dashboard.restarts.planning import plan_restart
from dashboard.restarts.views import restart_progress
from tests.restarts.plan_factories import make_engine, make_window, measured_start

# A Sunday far enough ahead that "the next opening" does not depend on when the tests run.
FAR_SUNDAY = datetime(2036, 11, 2, 3, 0)


@pytest.fixture
def operator_client(django_user_model):
    user = django_user_model.objects.create_user("operator")
    user.user_permissions.add(*Permission.objects.filter(
        codename__in=["run_restarts", "change_windows"]))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def viewer_client(django_user_model):
    client = Client()
    client.force_login(django_user_model.objects.create_user("viewer"))
    return client


@pytest.fixture
def gemma(node):
    return make_engine(node, "gemma")


@pytest.fixture
def scheduled(gemma, django_user_model):
    admin = django_user_model.objects.create_superuser("root", "", None)
    return plan_restart(gemma, user=admin, now=timezone.now(), reason="new weights")


def refused(action: str) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(action=action, allowed=False))


def test_anonymous_users_are_sent_to_login(client, node, scheduled):
    window = make_window(node)
    for url in [reverse("dashboard:restarts"), reverse("dashboard:windows"),
                reverse("dashboard:window-new"), reverse("dashboard:window-edit", args=[window.pk]),
                reverse("dashboard:restart", args=[scheduled.pk]),
                reverse("dashboard:restart-json", args=[scheduled.pk]),
                reverse("dashboard:restart-plan", args=[node.name])]:
        response = client.get(url)

        assert response.status_code == 302, url
        assert response["Location"].startswith("/login/?next="), url
    cancel = client.post(reverse("dashboard:restart-cancel", args=[scheduled.pk]))
    assert cancel.status_code == 302
    assert Restart.objects.get(pk=scheduled.pk).status == Restart.Status.SCHEDULED


def test_viewers_read_the_pages_but_get_no_forms(viewer_client, node, scheduled):
    restarts = viewer_client.get(reverse("dashboard:restarts"))
    plan_form = viewer_client.get(reverse("dashboard:restart-plan", args=[node.name]))

    assert restarts.status_code == 200
    assert "needs the permission" in restarts.content.decode()
    assert "Cancel" not in restarts.content.decode()
    assert plan_form.status_code == 403
    assert not AuditEntry.objects.filter(allowed=False).exists()  # looking is no action


def test_a_viewer_posting_a_plan_gets_403_and_an_audit_row(viewer_client, node, gemma):
    response = viewer_client.post(reverse("dashboard:restart-plan", args=[node.name]),
                                  {"engine": gemma.pk, "when": "now", "reason": "try"})

    assert response.status_code == 403
    (entry,) = refused("plan-restart")
    assert (entry.actor, entry.node, entry.engine) == ("viewer", node, gemma)
    assert "lacks the permission to plan and run engine restarts (restarts.run_restarts)" in \
        entry.outcome
    assert not Restart.objects.exists()


def test_a_viewer_posting_a_window_or_a_cancellation_gets_403_and_audit_rows(
        viewer_client, node, scheduled):
    window = make_window(node)

    created = viewer_client.post(reverse("dashboard:window-new"), {"name": "x"})
    edited = viewer_client.post(reverse("dashboard:window-edit", args=[window.pk]), {"name": "x"})
    cancelled = viewer_client.post(reverse("dashboard:restart-cancel", args=[scheduled.pk]))

    assert (created.status_code, edited.status_code, cancelled.status_code) == (403, 403, 403)
    assert len(refused("create-window")) == len(refused("edit-window")) == 1
    assert [e.restart for e in refused("cancel-restart")] == [scheduled]
    assert RestartWindow.objects.get(pk=window.pk).name == "sunday night"
    assert Restart.objects.get(pk=scheduled.pk).status == Restart.Status.SCHEDULED


def test_plans_need_the_csrf_token(django_user_model, node, gemma):
    user = django_user_model.objects.create_superuser("strict", "", None)
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)

    response = client.post(reverse("dashboard:restart-plan", args=[node.name]),
                           {"engine": gemma.pk, "when": "now", "reason": "no token"})

    assert response.status_code == 403
    assert not Restart.objects.exists()


def test_the_plan_form_offers_only_manageable_present_engines(operator_client, node, gemma):
    make_engine(node, "database", managed=False)
    make_engine(node, "old-gemma", present=False)
    make_engine(node, "speech", managed=False, labels={"sparkops.manage": "true"})

    response = operator_client.get(reverse("dashboard:restart-plan", args=[node.name]))

    offered = [label for _, label in response.context["form"].fields["engine"].widget.choices]
    assert offered == ["spark-a / gemma", "spark-a / speech"]
    page = response.content.decode()
    assert "Not offered (not enabled for management): database" in page
    assert "default (no history yet)" in page


def test_a_crafted_plan_for_an_unmanaged_engine_is_refused_and_audited(operator_client, node):
    database = make_engine(node, "database", managed=False)

    response = operator_client.post(reverse("dashboard:restart-plan", args=[node.name]),
                                    {"engine": database.pk, "when": "now", "reason": "x"})

    assert response.status_code == 409
    assert "not enabled for management" in response.content.decode()
    assert [(e.engine, e.actor) for e in refused("plan-restart")] == [(database, "operator")]
    assert not Restart.objects.exists()


def test_an_operator_plans_a_restart_in_a_window_through_the_form(operator_client, node, gemma):
    window = make_window(node, local_start=FAR_SUNDAY, minutes=120)

    response = operator_client.post(
        reverse("dashboard:restart-plan", args=[node.name]),
        {"engine": gemma.pk, "when": f"window:{window.pk}", "reason": "new chat template"},
        follow=True,
    )

    planned = Restart.objects.get()
    assert response.redirect_chain[-1][0] == reverse("dashboard:restart", args=[planned.pk])
    assert planned.window == window and planned.reason == "new chat template"
    assert planned.scheduled_for == datetime(2036, 11, 1, 18, 0, tzinfo=UTC)
    page = response.content.decode()
    # No zone cookie: the site's zone (UTC here), labelled.
    assert "planned for 2036-11-01 18:00:00 UTC; expected back by 18:12 UTC" in page
    assert AuditEntry.objects.get(action="plan-restart").actor == "operator"


def test_a_refused_plan_shows_the_reason_on_the_form(operator_client, node, gemma):
    window = make_window(node, minutes=10)

    response = operator_client.post(
        reverse("dashboard:restart-plan", args=[node.name]),
        {"engine": gemma.pk, "when": f"window:{window.pk}", "reason": "too short a window"},
    )

    assert response.status_code == 409
    assert "Refused: expected back by" in response.content.decode()
    assert "but the window ends at" in refused("plan-restart")[0].outcome
    assert not Restart.objects.exists()


def test_a_start_time_without_a_window_is_a_form_error(operator_client, node, gemma):
    response = operator_client.post(
        reverse("dashboard:restart-plan", args=[node.name]),
        {"engine": gemma.pk, "when": "now", "start_at": "2036-11-02T03:00", "reason": "x"},
    )

    assert response.status_code == 400
    assert "A start time needs a window" in response.content.decode()


def test_restart_json_reports_the_live_runbook(viewer_client, node, gemma):
    now = timezone.now()
    running = Restart.objects.create(
        node=node, engine=gemma, kind="planned", status="running", phase="drain",
        scheduled_for=now - timedelta(seconds=100), started_at=now - timedelta(seconds=100),
        expected_drain_seconds=120, expected_startup_seconds=600,
        deadline=now + timedelta(minutes=15),
    )
    RestartStep.objects.create(restart=running, step="precheck", ok=True, message="fits",
                               started_at=now - timedelta(seconds=100),
                               finished_at=now - timedelta(seconds=99))
    RestartStep.objects.create(restart=running, step="drain",
                               started_at=now - timedelta(seconds=99))

    data = viewer_client.get(reverse("dashboard:restart-json", args=[running.pk])).json()

    assert {"status", "phase", "started_at", "elapsed_seconds", "expected_remaining_seconds",
            "deadline", "steps"} <= data.keys()
    assert (data["status"], data["phase"]) == ("running", "drain")
    assert 100 <= data["elapsed_seconds"] < 160
    # Draining since 99 s ago: the rest of the 120 s drain timeout, then the whole startup.
    assert data["expected_remaining_seconds"] == pytest.approx(
        120 - (data["elapsed_seconds"] - 1) + 600)
    assert [(s["step"], s["ok"]) for s in data["steps"]] == [("precheck", True), ("drain", None)]
    assert data["steps"][0]["message"] == "fits"


def test_progress_counts_the_startup_from_the_start_step_and_stops_at_zero(node, gemma):
    started = datetime(2026, 11, 7, 18, 0, tzinfo=UTC)
    running = Restart.objects.create(node=node, engine=gemma, kind="planned", status="running",
                                     started_at=started, expected_drain_seconds=120,
                                     expected_startup_seconds=600)

    before_drain = restart_progress(running, started + timedelta(seconds=30))
    RestartStep.objects.create(restart=running, step="drain", ok=True, started_at=started,
                               finished_at=started + timedelta(seconds=5))
    drained = restart_progress(running, started + timedelta(seconds=30))
    RestartStep.objects.create(restart=running, step="start", ok=True,
                               started_at=started + timedelta(seconds=40))
    starting = restart_progress(running, started + timedelta(minutes=5))
    late = restart_progress(running, started + timedelta(minutes=20))

    assert before_drain["expected_remaining_seconds"] == 90 + 600
    assert drained["expected_remaining_seconds"] == 600  # drained early: only the startup left
    assert (starting["elapsed_seconds"], starting["expected_remaining_seconds"]) == (300, 340)
    assert (late["elapsed_seconds"], late["expected_remaining_seconds"]) == (1200, 0)


def test_the_restart_page_polls_its_json_and_lists_steps_and_audit(viewer_client, scheduled):
    RestartStep.objects.create(restart=scheduled, step="pre-check", ok=False,
                               message="needs 31.0 GiB, 12.5 GiB free", started_at=timezone.now())

    page = viewer_client.get(reverse("dashboard:restart", args=[scheduled.pk])).content.decode()

    assert f'data-restart-url="{reverse("dashboard:restart-json", args=[scheduled.pk])}"' in page
    assert "js/restart.js" in page
    assert "needs 31.0 GiB, 12.5 GiB free" in page
    assert "plan-restart" in page and "default (no history yet)" in page


def test_the_restart_page_says_how_an_unplanned_startup_was_found(viewer_client, gemma):
    told = Restart.objects.create(
        node=gemma.node, engine=gemma, kind="unplanned", status="detected",
        requested_at=timezone.now(), startup_seconds=3.5,
        after={"startup": {"source": "log", "text": "gemma was ready when SparkOps saw it "
                                                    "again; its log tells a startup of 4 s"}})
    unknown = Restart.objects.create(
        node=gemma.node, engine=gemma, kind="unplanned", status="detected",
        requested_at=timezone.now(),
        after={"startup": {"source": None, "text": "how long it took is unknown"}})

    told_page = viewer_client.get(reverse("dashboard:restart", args=[told.pk])).content.decode()
    unknown_page = viewer_client.get(reverse("dashboard:restart", args=[unknown.pk])) \
        .content.decode()

    assert "4 s" in told_page and "its log tells a startup of 4 s" in told_page
    assert '<span class="unknown">unknown</span>' in unknown_page
    assert "how long it took is unknown" in unknown_page


def test_restarts_page_shows_queue_ledger_and_startup_chart(admin_client, node):
    gemma, nemotron = make_engine(node, "gemma"), make_engine(node, "nemotron")
    measured_start(gemma, 540, timezone.now() - timedelta(days=2))
    Restart.objects.filter(engine=gemma).update(before={"kv_cache_tokens": 1_230_000},
                                                after={"kv_cache_tokens": 2_220_000})
    window = make_window(node, local_start=FAR_SUNDAY, minutes=120)
    user = admin_client.get(reverse("dashboard:restarts")).wsgi_request.user
    now = timezone.now()
    plan_restart(gemma, user=user, window=window, now=now, reason="first")
    plan_restart(nemotron, user=user, window=window, now=now, reason="second")

    response = admin_client.get(reverse("dashboard:restarts"))

    page = response.content.decode()
    assert "waits for #" in page and "(gemma)" in page
    assert "median of 1 start" in page
    assert "1.23 M KV tokens" in page and "2.22 M KV tokens" in page
    assert 'id="startup-data"' in page
    (trace,) = response.context["chart"]["traces"]
    assert (trace["name"], trace["y"], trace["kind"]) == ("spark-a/gemma", [9.0], ["planned"])
    assert "vendor/plotly.min.js" in page


def test_windows_page_shows_the_next_opening_in_both_zones(viewer_client, node, settings):
    settings.TIME_ZONE = "UTC"
    make_window(node, name="sunday night", local_start=FAR_SUNDAY, minutes=120)

    page = viewer_client.get(reverse("dashboard:windows")).content.decode()

    assert "2036-11-02 03:00–05:00 KST" in page and "Asia/Seoul" in page  # the window's own
    assert "2036-11-01 18:00–20:00 UTC" in page  # the viewer's (no cookie: the site's)
    assert "every engine" in page


def test_a_plan_reads_in_the_viewer_s_zone_and_in_its_window_s(operator_client, node, gemma):
    """Seen from Berlin, a Seoul window's plan is written in CET, labelled, with the window's
    own reading beside it; the flash message and the queue say the same instant."""
    window = make_window(node, local_start=FAR_SUNDAY, minutes=120)
    operator_client.cookies["sparkops_tz"] = "Europe/Berlin"

    response = operator_client.post(
        reverse("dashboard:restart-plan", args=[node.name]),
        {"engine": gemma.pk, "when": f"window:{window.pk}", "reason": "new chat template"},
        follow=True,
    )

    page = response.content.decode()
    assert "planned for 2036-11-01 19:00:00 CET; expected back by 19:12 CET" in page
    assert ">2036-11-01 19:00:00 CET</time>" in page  # Planned for, through the one filter
    assert "(window's zone: 2036-11-02 03:00 KST, Asia/Seoul)" in page
    plan_page = operator_client.get(reverse("dashboard:restart-plan", args=[node.name]))
    queue = plan_page.content.decode()
    assert ">2036-11-01 19:00:00 CET</time>" in queue and "03:00 KST, Asia/Seoul" in queue
    assert "Sun 2036" not in queue and "Asia/Seoul;" not in queue


def test_an_operator_creates_a_window_through_the_form(operator_client, node):
    response = operator_client.post(reverse("dashboard:window-new"), {
        "name": "sunday night", "node": node.pk, "engine": "", "enabled": "on",
        "local_start": "2036-11-02T03:00", "time_zone": "Asia/Seoul",
        "rrule": "FREQ=WEEKLY;BYDAY=SU", "duration_minutes": "120",
    })

    assert response.status_code == 302
    window = RestartWindow.objects.get()
    assert window.recurrence == ("DTSTART;TZID=Asia/Seoul:20361102T030000\n"
                                 "RRULE:FREQ=WEEKLY;BYDAY=SU")
    assert (window.time_zone, window.duration_minutes, window.enabled) == ("Asia/Seoul", 120, True)
    assert AuditEntry.objects.get(action="create-window").allowed


@pytest.mark.parametrize(("field", "value", "message"), [
    ("rrule", "FREQ=WEKLY", "FREQ=WEKLY: FREQ is one of YEARLY"),
    ("rrule", "FREQ=HOURLY;BYDAY", "BYDAY is not NAME=VALUE"),
    ("time_zone", "Seoul", "Unknown time zone"),
    ("duration_minutes", "0", "greater than or equal to 1"),
    ("rrule", "FREQ=WEEKLY;COUNT=1;BYDAY=SU", "no occurrence from now on"),
])
def test_a_bad_window_is_refused_with_the_reason(operator_client, node, field, value, message):
    data = {"name": "w", "node": node.pk, "local_start": "2026-01-04T03:00",
            "time_zone": "Asia/Seoul", "rrule": "FREQ=WEEKLY;BYDAY=SU", "duration_minutes": "60"}

    response = operator_client.post(reverse("dashboard:window-new"), {**data, field: value})

    assert response.status_code == 400
    assert message in response.content.decode()
    assert not RestartWindow.objects.exists()


def _window_post(node, **extra: str) -> dict[str, str]:
    return {"name": "saturday night", "node": node.pk, "engine": "", "enabled": "on",
            "local_start": "2036-11-02T04:00", "time_zone": "Asia/Seoul",
            "rrule": "FREQ=WEEKLY;BYDAY=SU", "duration_minutes": "60", **extra}


def test_a_window_overlapping_another_asks_for_confirmation_first(operator_client, node):
    # Sundays 03:00-05:00 Seoul; the new one, Sundays 04:00-05:00 Seoul, overlaps every week.
    make_window(node, name="sunday night", local_start=FAR_SUNDAY, minutes=120)

    first = operator_client.post(reverse("dashboard:window-new"), _window_post(node))

    assert first.status_code == 400
    page = first.content.decode()
    assert 'id="window-overlap"' in page and "tick the box to save it anyway" in page
    assert ("2036-11-02 04:00–05:00 KST Asia/Seoul overlaps window sunday night, "
            "2036-11-02 03:00–05:00 KST Asia/Seoul") in page
    assert RestartWindow.objects.count() == 1

    confirmed = operator_client.post(reverse("dashboard:window-new"),
                                     _window_post(node, confirm_overlap="on"))

    assert confirmed.status_code == 302
    assert RestartWindow.objects.filter(name="saturday night").exists()


def test_windows_that_do_not_overlap_need_no_confirmation(operator_client, node):
    make_window(node, name="sunday night", local_start=FAR_SUNDAY, minutes=60)
    other_engine = make_window(node, name="gemma only", local_start=FAR_SUNDAY, minutes=120)
    other_engine.engine = make_engine(node, "gemma")
    other_engine.save()
    nemotron = make_engine(node, "nemotron")

    # 04:00-05:00 meets the node window's 03:00-04:00 end; the gemma-only window is another
    # engine's, and a disabled window is no window.
    after = operator_client.post(reverse("dashboard:window-new"),
                                 _window_post(node, engine=str(nemotron.pk)))
    disabled = operator_client.post(reverse("dashboard:window-new"),
                                    _window_post(node, name="off", enabled="",
                                                 local_start="2036-11-02T03:30"))

    assert (after.status_code, disabled.status_code) == (302, 302)


def test_editing_a_window_does_not_overlap_with_itself(operator_client, node):
    window = make_window(node, name="sunday night", local_start=FAR_SUNDAY, minutes=120)

    response = operator_client.post(reverse("dashboard:window-edit", args=[window.pk]),
                                    _window_post(node, name="sunday night",
                                                 local_start="2036-11-02T03:00",
                                                 duration_minutes="90"))

    assert response.status_code == 302
    window.refresh_from_db()
    assert window.duration_minutes == 90


def test_the_edit_form_shows_the_stored_rule_in_its_parts(operator_client, node):
    window = make_window(node)

    form = operator_client.get(reverse("dashboard:window-edit", args=[window.pk])).context["form"]

    assert (form["rrule"].value(), form["time_zone"].value()) == ("FREQ=WEEKLY;BYDAY=SU",
                                                                  "Asia/Seoul")
    assert form["local_start"].value() == datetime(2026, 11, 1, 3, 0)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_restart_page_follows_the_runbook_live_in_a_browser(live_server, page,
                                                                 django_user_model):
    node = Node.objects.create(name="spark-a")
    gemma = make_engine(node, "gemma")
    measured_start(gemma, 480, timezone.now() - timedelta(days=1))
    now = timezone.now()
    running = Restart.objects.create(
        node=node, engine=gemma, kind="planned", status="running", phase="drain",
        scheduled_for=now, started_at=now, expected_drain_seconds=120,
        expected_startup_seconds=600,
    )
    django_user_model.objects.create_superuser("admin", "", "a-long-test-password")
    page.goto(f"{live_server.url}/login/")
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", "a-long-test-password")
    page.click("button[type=submit]")
    page.goto(f"{live_server.url}{reverse('dashboard:restart', args=[running.pk])}")
    assert page.locator('[data-field="phase"]').inner_text() == "drain"

    RestartStep.objects.create(restart=running, step="stop", ok=True, message="stopped in 3 s",
                               started_at=timezone.now(), finished_at=timezone.now())
    Restart.objects.filter(pk=running.pk).update(phase="start")
    page.wait_for_function("document.querySelector('[data-field=\"phase\"]').textContent === "
                           "'start'", timeout=10_000)
    assert "stopped in 3 s" in page.locator("[data-steps]").inner_text()

    Restart.objects.filter(pk=running.pk).update(status="succeeded", phase="",
                                                 outcome="ready after 7 min",
                                                 finished_at=timezone.now(), startup_seconds=420)
    page.wait_for_function("document.body.textContent.includes('ready after 7 min')",
                           timeout=10_000)  # the page reloaded itself once the run ended

    page.goto(f"{live_server.url}{reverse('dashboard:restarts')}")
    page.wait_for_function("document.getElementById('startup-chart').data?.length === 1")
    assert page.evaluate("document.getElementById('startup-chart').data[0].y") == [8.0, 7.0]


# --- windows have their own permission ------------------------------------------------------

WINDOW_FORM = {"name": "sunday night", "node": "", "engine": "", "enabled": "on",
               "local_start": "2026-11-01T03:00", "time_zone": "Asia/Seoul",
               "rrule": "FREQ=WEEKLY;BYDAY=SU", "duration_minutes": "120"}


def test_the_restart_permission_alone_does_not_change_windows(django_user_model, node):
    user = django_user_model.objects.create_user("restarter")
    user.user_permissions.add(Permission.objects.get(codename="run_restarts"))
    client = Client()
    client.force_login(user)

    form = client.get(reverse("dashboard:window-new"))
    created = client.post(reverse("dashboard:window-new"), {**WINDOW_FORM, "node": node.pk},
                          REMOTE_ADDR="203.0.113.9")

    assert form.status_code == created.status_code == 403
    assert "restarter lacks the permission to create and edit restart windows " \
        "(restarts.change_windows)" in created.content.decode()
    (entry,) = refused("create-window")
    assert (entry.actor, entry.address) == ("restarter", "203.0.113.9")
    assert not RestartWindow.objects.exists()
    assert "/restarts/windows/new/" not in client.get(reverse("dashboard:windows")) \
        .content.decode()


def test_window_changes_are_audited_with_the_address_and_what_changed(operator_client, node):
    operator_client.post(reverse("dashboard:window-new"), {**WINDOW_FORM, "node": node.pk},
                         REMOTE_ADDR="198.51.100.20")
    window = RestartWindow.objects.get()
    operator_client.post(reverse("dashboard:window-edit", args=[window.pk]),
                         {**WINDOW_FORM, "node": node.pk, "duration_minutes": "90"},
                         REMOTE_ADDR="198.51.100.21")

    created, edited = AuditEntry.objects.filter(allowed=True).order_by("at", "pk")
    assert (created.action, created.address, created.details["duration_minutes"]) == \
        ("create-window", "198.51.100.20", 120)
    assert (edited.action, edited.address) == ("edit-window", "198.51.100.21")
    assert edited.details["changed"] == {"duration_minutes": {"from": 120, "to": 90}}


def test_plans_record_the_client_address(operator_client, node, gemma):
    operator_client.post(reverse("dashboard:restart-plan", args=[node.name]),
                         {"engine": gemma.pk, "when": "now", "reason": "new weights"},
                         REMOTE_ADDR="192.0.2.33")

    assert AuditEntry.objects.get(action="plan-restart", allowed=True).address == "192.0.2.33"
