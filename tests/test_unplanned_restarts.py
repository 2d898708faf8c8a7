"""Restarts behind SparkOps' back: recorded as unplanned, with an alert."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone as dj_timezone

from collectors import docker_api
from collectors.engines import collect_engines
from collectors.models import Engine, Event
from dashboard.alerting.models import Alert
from dashboard.alerting.pipeline import run_alerts
from dashboard.restarts.models import Restart
from dashboard.restarts.unplanned import record_unplanned_restarts
from sparkops.testing.ports import free_port
from tests.conftest import PROJECT
from tests.containers import podman, run_container, unique_name

T0 = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
VLLM = str(PROJECT / "collectors" / "emulator" / "bin" / "vllm")


def _engine(node, **fields):
    values = dict(node=node, name="gemma", container_id="c" * 64, container_state="running",
                  phase="ready", started_at=T0 - timedelta(days=1))
    values.update(fields)
    return Engine.objects.create(**values)


def _event(engine, kind, at, message="m"):
    return Event.objects.create(node=engine.node, engine=engine, kind=kind, at=at,
                                message=message)


def test_an_exit_and_the_restart_after_it_are_one_unplanned_restart(node):
    engine = _engine(node, container_state="exited", exit_code=137)
    _event(engine, "engine-exited", T0, "container exited, exit code 137")
    record_unplanned_restarts(node, T0 + timedelta(seconds=5))
    engine.container_state, engine.started_at, engine.phase = "running", T0 + timedelta(30), \
        "loading"
    engine.save()
    _event(engine, "engine-restarted", T0 + timedelta(seconds=30), "restarted")

    record_unplanned_restarts(node, T0 + timedelta(seconds=35))
    record_unplanned_restarts(node, T0 + timedelta(seconds=40))  # nothing new

    restart = Restart.objects.get()
    assert (restart.kind, restart.status) == ("unplanned", "detected")
    assert "exit code 137" in restart.reason and "Then: restarted" in restart.reason
    assert len(restart.container_state["event_ids"]) == 2


def test_startup_time_of_an_unplanned_restart_is_measured(node):
    engine = _engine(node, started_at=T0, phase="ready")
    _event(engine, "engine-restarted", T0 + timedelta(seconds=2))
    _event(engine, "phase-change", T0 + timedelta(seconds=590), "gemma: profiling → ready")

    record_unplanned_restarts(node, T0 + timedelta(seconds=600))

    assert Restart.objects.get().startup_seconds == 590


def test_an_engine_ready_when_first_seen_again_takes_its_startup_from_its_log(node):
    """Back within one collection interval (or while SparkOps was down): no "→ ready" phase
    change was seen, and the startup its own log tells is the restart's."""
    engine = _engine(node, started_at=T0, phase="ready", logs_read_at=T0 + timedelta(seconds=5),
                     startup={"phase": "ready", "startup_seconds": 3.5})
    _event(engine, "engine-restarted", T0 + timedelta(seconds=2))

    record_unplanned_restarts(node, T0 + timedelta(seconds=6))

    restart = Restart.objects.get()
    assert restart.startup_seconds == 3.5
    assert restart.finished_at == T0 + timedelta(seconds=3.5)
    assert restart.after["startup"]["source"] == "log"


def test_a_startup_neither_seen_nor_logged_is_unknown_and_not_looked_for_again(node):
    # Its log, read since the start, says ready and tells no startup (no timestamps).
    engine = _engine(node, started_at=T0, phase="ready", logs_read_at=T0 + timedelta(seconds=5),
                     startup={"phase": "ready", "startup_seconds": None})
    _event(engine, "engine-restarted", T0 + timedelta(seconds=2))
    record_unplanned_restarts(node, T0 + timedelta(seconds=6))

    restart = Restart.objects.get()
    assert restart.startup_seconds is None and restart.finished_at is None
    assert restart.after["startup"]["source"] is None
    assert "unknown" in restart.after["startup"]["text"]
    # Hours later, past the look-back: a pass reads nothing of it any more.
    later = T0 + timedelta(hours=3)
    with CaptureQueriesContext(connection) as queries:
        record_unplanned_restarts(node, later)
    assert not [q for q in queries if "collectors_event" in q["sql"]
                and "phase-change" in q["sql"]]
    assert Restart.objects.get().after == restart.after


def test_a_log_of_an_earlier_start_neither_times_this_one_nor_closes_it(node):
    engine = _engine(node, started_at=T0, phase="ready", logs_read_at=T0 - timedelta(hours=2),
                     startup={"phase": "ready", "startup_seconds": 600.0})
    _event(engine, "engine-restarted", T0 + timedelta(seconds=2))

    record_unplanned_restarts(node, T0 + timedelta(seconds=6))

    restart = Restart.objects.get()
    assert restart.startup_seconds is None
    assert "startup" not in restart.after  # still open: the next read of its log may tell


def test_a_planned_restart_explains_its_own_stop_and_start(node):
    engine = _engine(node)
    Restart.objects.create(node=node, engine=engine, kind="planned", status="running",
                           started_at=T0, scheduled_for=T0)
    _event(engine, "engine-exited", T0 + timedelta(seconds=20))
    _event(engine, "engine-restarted", T0 + timedelta(seconds=40))

    assert record_unplanned_restarts(node, T0 + timedelta(seconds=50)) == []
    assert not Restart.objects.filter(kind="unplanned").exists()


@pytest.mark.slow
@pytest.mark.django_db
def test_a_container_restarted_behind_our_back_is_unplanned_with_an_alert(node, docker_host):
    api = docker_api.client(docker_host)
    name = unique_name("behind")
    run_container(name, [VLLM, "serve", "org/m", "--port", str(free_port()),
                         "--emulator-load-seconds", "0.2", "--emulator-profile-seconds", "0.2",
                         "--emulator-graph-seconds", "0.2"],
                  labels={"sparkops.engine": "vllm"})
    collect_engines(node, api, dj_timezone.now())

    podman("restart", "--time", "1", name)
    collect_engines(node, api, dj_timezone.now())
    run_alerts(node, dj_timezone.now())

    restart = Restart.objects.get(engine__name=name)
    assert restart.kind == "unplanned" and "restarted" in restart.reason
    alert = Alert.objects.get(rule="unplanned-restart")
    assert alert.state == "firing" and alert.engine.name == name
    api.close()
