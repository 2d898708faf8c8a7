"""Read-only mode (``SPARKOPS_READ_ONLY``): SparkOps monitors and never touches.

Refused at the seam, before the container engine is asked or the privileged helper is run (stop,
start, drop caches); planning says so in words; the restart and engine pages say so before
anyone tries. Off, the same calls go through: each refusal is checked against its control.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from collectors import docker_api, pagecache
from collectors.docker_api import ReadOnlyRefused
from dashboard.audit.models import AuditEntry
from dashboard.restarts.models import Restart
from dashboard.restarts.pagecache import drop_page_cache
from dashboard.restarts.planning import PlanRefused, plan_restart
from dashboard.restarts.runbook import run_restart
from tests.restarts.plan_factories import make_engine
from tests.restarts.runbook_helpers import (
    collect_until_ready,
    plan_now,
    refresh_ledger,
    start_engine,
    started_at,
)

CONTAINER = "c0ffee" * 10 + "abcd"


class _RecordingApi:
    """A container engine's low-level API that records what it was asked and answers like an
    engine whose container is stopped."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def stop(self, container_id: str, timeout: int) -> None:
        self.calls.append(("stop", container_id))

    def start(self, container_id: str) -> None:
        self.calls.append(("start", container_id))

    def inspect_container(self, container_id: str) -> dict:
        self.calls.append(("inspect", container_id))
        return {"State": {"Status": "exited", "ExitCode": 0}}


class _Engine:
    def __init__(self) -> None:
        self.api = _RecordingApi()


@pytest.fixture
def read_only(settings):
    settings.SPARKOPS_READ_ONLY = True


@pytest.fixture
def drop_helper(tmp_path, settings) -> Path:
    """A stand-in drop-caches helper that leaves a mark when it runs; its mark's path."""
    mark = tmp_path / "helper-ran"
    helper = tmp_path / "drop-caches"
    helper.write_text(f"#!/bin/sh\ntouch {mark}\necho 'Cached before: 2048 kB'\n"
                      "echo 'Cached after: 1024 kB'\n")
    helper.chmod(0o755)
    settings.SPARKOPS_DROP_CACHES_COMMAND = [str(helper)]
    return mark


def test_the_setting_is_off_unless_turned_on(settings):
    assert settings.SPARKOPS_READ_ONLY is False
    assert docker_api.read_only() is False
    settings.SPARKOPS_READ_ONLY = True
    assert docker_api.read_only() is True


@pytest.mark.parametrize("verb", ["stop", "start"])
def test_read_only_refuses_stop_and_start_before_asking_the_engine(read_only, verb):
    engine = _Engine()
    call = docker_api.stop_container if verb == "stop" else docker_api.start_container

    with pytest.raises(ReadOnlyRefused) as refused:
        call(engine, CONTAINER)

    assert engine.api.calls == []
    assert str(refused.value) == (f"cannot {verb} c0ffeec0ffee: SparkOps is read-only "
                                  "(SPARKOPS_READ_ONLY is on): it monitors and never stops or "
                                  "starts a container or drops the page cache")
    # A refusal is a container-engine error: every caller that handles one handles it.
    assert isinstance(refused.value, docker_api.ContainerEngineError)


def test_without_read_only_stop_and_start_reach_the_engine():
    engine = _Engine()
    docker_api.stop_container(engine, CONTAINER)
    docker_api.start_container(engine, CONTAINER)
    assert engine.api.calls == [("stop", CONTAINER), ("start", CONTAINER)]


def test_read_only_never_runs_the_drop_caches_helper(read_only, drop_helper):
    with pytest.raises(pagecache.ReadOnlyRefused) as refused:
        pagecache.run_drop_helper(pagecache.drop_command(), 5.0)

    assert not drop_helper.exists()
    assert "SPARKOPS_READ_ONLY" in str(refused.value)
    assert str(refused.value).startswith("the page cache was not dropped: SparkOps is read-only")


@pytest.mark.django_db
def test_a_drop_asked_for_in_read_only_mode_is_audited_and_not_run(read_only, drop_helper, node):
    engine = make_engine(node, "gemma")

    with pytest.raises(pagecache.ReadOnlyRefused):
        drop_page_cache(engine=engine, restart=None, actor="worker:test", api=_Engine(),
                        now=timezone.now())

    assert not drop_helper.exists()
    entry = AuditEntry.objects.get(action="drop-caches")
    assert "SparkOps is read-only (SPARKOPS_READ_ONLY is on)" in entry.outcome
    assert entry.details["ok"] is False


@pytest.mark.slow
@pytest.mark.django_db
def test_without_read_only_the_drop_helper_runs(drop_helper, node):
    engine = make_engine(node, "gemma")

    result = drop_page_cache(engine=engine, restart=None, actor="worker:test", api=_Engine(),
                             now=timezone.now())

    assert drop_helper.exists()
    assert result.freed == 1024 * 1024


@pytest.mark.django_db
def test_planning_in_read_only_mode_is_refused_in_words_and_audited(read_only, node,
                                                                    django_user_model):
    engine = make_engine(node, "gemma")
    admin = django_user_model.objects.create_superuser("root", "", None)

    with pytest.raises(PlanRefused) as refused:
        plan_restart(engine, user=admin, now=timezone.now(), reason="new weights")

    assert refused.value.reason == (
        "SparkOps is read-only (SPARKOPS_READ_ONLY is on): it monitors and never stops or "
        "starts a container or drops the page cache; turn SPARKOPS_READ_ONLY off to plan "
        "restarts")
    assert not Restart.objects.exists()
    entry = AuditEntry.objects.get(action="plan-restart")
    assert entry.allowed is False and entry.outcome == refused.value.reason


@pytest.mark.django_db
def test_the_same_plan_goes_through_without_read_only(node, django_user_model):
    engine = make_engine(node, "gemma")
    admin = django_user_model.objects.create_superuser("root", "", None)

    planned = plan_restart(engine, user=admin, now=timezone.now(), reason="new weights")

    assert planned.status == Restart.Status.SCHEDULED


@pytest.fixture
def operator(django_user_model) -> Client:
    user = django_user_model.objects.create_user("operator")
    user.user_permissions.add(*Permission.objects.filter(codename="run_restarts"))
    client = Client()
    client.force_login(user)
    return client


BANNER = ("Read-only:</strong> SparkOps is read-only (SPARKOPS_READ_ONLY is on): it monitors "
          "and never stops or starts a container or drops the page cache.")
ENGINE_LINE = ("SparkOps is read-only (<code>SPARKOPS_READ_ONLY</code>): it will not stop or "
               "start this container, though it is enabled for management.")


@pytest.mark.django_db
def test_the_pages_say_read_only_and_the_plan_form_refuses(read_only, operator, node):
    engine = make_engine(node, "gemma", labels={"sparkops.manage": "true"})

    restarts = operator.get(reverse("dashboard:restarts")).content.decode()
    plan_form = operator.get(reverse("dashboard:restart-plan", args=[node.name]))
    engine_page = operator.get(reverse("dashboard:engine", args=[node.name, engine.name]))
    posted = operator.post(reverse("dashboard:restart-plan", args=[node.name]),
                           {"engine": engine.pk, "when": "now", "reason": "new weights"})

    assert BANNER in restarts
    assert BANNER in plan_form.content.decode()
    # Still shown as manageable by its label, and still offered: the plan is what is refused.
    assert ENGINE_LINE in engine_page.content.decode()
    assert f'<option value="{engine.pk}"' in plan_form.content.decode()
    assert posted.status_code == 409
    assert ("Refused: SparkOps is read-only (SPARKOPS_READ_ONLY is on): it monitors and never "
            "stops or starts a container or drops the page cache; turn SPARKOPS_READ_ONLY off "
            "to plan restarts.") in posted.content.decode()
    assert not Restart.objects.exists()


@pytest.mark.django_db
def test_the_pages_say_nothing_of_it_without_read_only(operator, node):
    engine = make_engine(node, "gemma", labels={"sparkops.manage": "true"})

    pages = [operator.get(reverse("dashboard:restarts")),
             operator.get(reverse("dashboard:restart-plan", args=[node.name])),
             operator.get(reverse("dashboard:engine", args=[node.name, engine.name]))]

    assert all("read-only" not in page.content.decode().lower() for page in pages)
    assert "SparkOps may stop and start this container." in pages[2].content.decode()


# --- a real engine: a restart due while read-only leaves it as it was --------------------------


@pytest.mark.slow
@pytest.mark.django_db
def test_a_restart_due_in_read_only_mode_leaves_the_container_running(read_only, node,
                                                                      docker_host, tmp_path,
                                                                      drop_helper, settings):
    settings.SPARKOPS_RESTART_DRAIN_TIMEOUT_SECONDS = 2
    api = docker_api.client(docker_host)
    try:
        real = start_engine(tmp_path / "engine")
        engine = collect_until_ready(node, api, real.name)[real.name]
        refresh_ledger(node)
        before = started_at(api, real.container_id)
        # Planned before read-only was turned on (planning now refuses), then due.
        restart = plan_now(engine)

        restart = run_restart(restart.pk, api=api, poll_seconds=0.2)

        # Ended before its first step: refused, nothing touched, the engine never asked.
        assert restart.status == Restart.Status.REFUSED
        assert "SparkOps is read-only (SPARKOPS_READ_ONLY is on)" in restart.outcome
        assert "nothing was touched" in restart.outcome
        assert not restart.steps.exists()
        assert started_at(api, real.container_id) == before
        assert not drop_helper.exists()
    finally:
        api.close()
