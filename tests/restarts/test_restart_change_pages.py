"""The pages of restart plans with new flags, through Django's test client: the plan form's
command, the fit planner's "Plan this restart with these flags", and the restart's page."""

from __future__ import annotations

import shlex

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from collectors import fitplan as planner
from collectors.models import Engine, Node
from dashboard.audit.models import AuditEntry
from dashboard.restarts.change import NOTE, RECREATE, FlagChange, ledger_summary
from dashboard.restarts.models import Restart, RestartStep
from dashboard.restarts.planning import PLAN_ACTION, plan_restart
from tests.test_planner import GEMMA_COMMAND, MARGIN, NEMOTRON_COMMAND, plan_for, seed_node

pytestmark = pytest.mark.django_db

GEMMA = "gemma-4-26b"
NEMOTRON = "nemotron-120b"
GEMMA_16G = GEMMA_COMMAND.replace("20G", "16G")


@pytest.fixture
def seeded() -> Node:
    node = seed_node()
    Engine.objects.filter(node=node).update(managed=True)
    return node


@pytest.fixture
def operator(django_user_model):
    user = django_user_model.objects.create_user("operator")
    user.user_permissions.add(Permission.objects.get(codename="run_restarts"))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def viewer(django_user_model):
    client = Client()
    client.force_login(django_user_model.objects.create_user("viewer"))
    return client


def engine(name: str) -> Engine:
    return Engine.objects.get(name=name)


def plan_post(client: Client, node: Node, name: str, command: str, **fields: str):
    return client.post(reverse("dashboard:restart-plan", args=[node.name]), {
        "engine": engine(name).pk, "when": "now", "reason": "new flags", "command": command,
        "mode": NOTE, **fields})


def test_the_plan_form_carries_a_new_command_and_the_restart_page_shows_its_diff(seeded,
                                                                                 operator):
    form = operator.get(reverse("dashboard:restart-plan", args=[seeded.name])).content.decode()
    assert "New launch command (optional)" in form and 'name="accept_squeeze"' in form

    response = plan_post(operator, seeded, GEMMA, GEMMA_16G)

    assert response.status_code == 302
    restart = Restart.objects.get(engine__name=GEMMA)
    assert restart.change["margin_bytes"] == MARGIN  # the prefill-squeeze alert's default
    page = operator.get(response["Location"]).content.decode()
    assert 'id="restart-change" data-mode="note"' in page
    assert f"<code id=\"change-command\">{GEMMA_16G}</code>" in page
    # The diff names the one flag that changes, against the engine's command now.
    assert '<tr data-flag="--kv-cache-memory-bytes"><td><code>--kv-cache-memory-bytes</code>' \
        '</td><td><code>20G</code></td><td><code>16G</code></td></tr>' in page
    assert page.count("<tr data-flag=") == 1
    assert 'id="change-planned-verdict" data-verdict="fits"' in page
    assert f'<tr data-engine="{GEMMA}" data-verdict="fits" class="planned">' in page
    assert "What the pre-check found" not in page  # it has not run


def test_a_refused_change_is_shown_in_words_and_accepting_the_squeeze_plans_it(seeded,
                                                                               operator):
    squeezing = NEMOTRON_COMMAND.format(kv="24G", util="0.8")

    refused = plan_post(operator, seeded, NEMOTRON, squeezing)
    accepted = plan_post(operator, seeded, NEMOTRON, squeezing, accept_squeeze="on")

    assert refused.status_code == 409
    assert f"Refused: the new flags squeeze {GEMMA}&#x27;s prefill" in refused.content.decode()
    assert accepted.status_code == 302
    assert Restart.objects.get(engine__name=NEMOTRON).change["accept_squeeze"] is True


def test_recreating_a_compose_container_is_refused_on_the_page(seeded, operator):
    Engine.objects.filter(name=GEMMA).update(
        labels={"com.docker.compose.project": "inference", "sparkops.engine": "vllm"})

    response = plan_post(operator, seeded, GEMMA, GEMMA_16G, mode=RECREATE)

    assert response.status_code == 409
    assert "belongs to compose project inference" in response.content.decode()
    assert not Restart.objects.exists()


def test_the_planner_offers_to_plan_the_restart_with_its_flags(seeded, operator):
    url = reverse("dashboard:planner", args=[seeded.name])

    page = operator.get(url, {"engine": GEMMA, "command": GEMMA_16G}).content.decode()

    assert "Plan this restart with these flags" in page
    assert f'action="{reverse("dashboard:restart-plan", args=[seeded.name])}"' in page
    assert f'<input type="hidden" name="engine" value="{engine(GEMMA).pk}">' in page
    assert f'<textarea name="command" id="planner-restart-command" hidden readonly>{GEMMA_16G}' \
        "</textarea>" in page
    # What the planner page posts is a plan with exactly these flags.
    response = operator.post(reverse("dashboard:restart-plan", args=[seeded.name]), {
        "engine": engine(GEMMA).pk, "command": GEMMA_16G, "mode": RECREATE, "when": "now",
        "reason": "smaller pool"})
    assert response.status_code == 302
    restart = Restart.objects.get(engine__name=GEMMA)
    assert restart.change["command"] == shlex.split(GEMMA_16G)
    assert restart.change["mode"] == RECREATE


def test_viewers_see_why_they_cannot_plan_and_their_post_is_refused(seeded, viewer):
    page = viewer.get(reverse("dashboard:planner", args=[seeded.name]),
                      {"engine": GEMMA, "command": GEMMA_16G}).content.decode()

    assert "Planning a restart needs the permission restarts.run_restarts." in page
    assert 'id="planner-restart-form"' not in page
    response = plan_post(viewer, seeded, GEMMA, GEMMA_16G)
    assert response.status_code == 403
    assert AuditEntry.objects.filter(action=PLAN_ACTION, allowed=False).exists()
    assert not Restart.objects.exists()


def test_an_unmanaged_engine_is_not_offered(seeded, operator):
    Engine.objects.filter(name=GEMMA).update(managed=False)

    page = operator.get(reverse("dashboard:planner", args=[seeded.name]),
                        {"engine": GEMMA, "command": GEMMA_16G}).content.decode()

    assert "is not enabled for management" in page
    assert 'id="planner-restart-form"' not in page


def test_after_a_run_the_page_shows_what_the_pre_check_found_and_the_flags_after(
        seeded, operator, django_user_model):
    admin = django_user_model.objects.create_superuser("root", "", None)
    restart = plan_restart(engine(GEMMA), user=admin, now=timezone.now(), reason="smaller",
                           change=FlagChange(GEMMA_16G, NOTE, MARGIN))
    found = ledger_summary(plan_for(seeded, NEMOTRON, NEMOTRON_COMMAND.format(kv="24G",
                                                                              util="0.8")))
    now = timezone.now()
    RestartStep.objects.create(restart=restart, step="precheck", started_at=now,
                               finished_at=now, ok=False, data={"change": {"plan": found}},
                               message="Pre-check of the new flags: the new flags would now "
                                       "squeeze gemma-4-26b's prefill")
    RestartStep.objects.create(restart=restart, step="record", started_at=now, finished_at=now,
                               ok=False, data={"flags": {
                                   "runs_intended": False, "command": GEMMA_COMMAND.split(),
                                   "text": "It still runs other flags than the intended ones: "
                                           "--kv-cache-memory-bytes 20G (intended 16G)."}})
    Restart.objects.filter(pk=restart.pk).update(status=Restart.Status.REFUSED)

    page = operator.get(reverse("dashboard:restart", args=[restart.pk])).content.decode()

    assert "What the pre-check found" in page
    assert f'id="change-prechecked-verdict" data-verdict="{planner.SQUEEZES}"' in page
    # Unknown figures read "unknown" and point to their reason, never a number.
    assert '<span class="unknown" title="' in page and "Mamba" in page
    assert 'id="change-flags-after" data-runs-intended="no"' in page
    assert "--kv-cache-memory-bytes 20G (intended 16G)" in page
