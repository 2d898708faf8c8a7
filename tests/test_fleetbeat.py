"""The central beat's scheduler: the configured nodes plus every agent-backed node that beats,
re-read every few seconds, and the stack's beat thread running it."""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
from celery.utils.imports import symbol_by_name
from django.utils import timezone

from collectors import fleetbeat, heartbeat
from collectors.fleetbeat import FleetScheduler, agent_nodes_to_collect, fleet_schedule
from collectors.models import Node
from sparkops import stackworker
from sparkops.celery import (
    COLLECT_HOST_MEMORY,
    FLEET_SCHEDULER,
    NODE_TASKS,
    app,
    beat_schedule,
    node_schedule,
)

# Long periods: nothing of the schedule falls due while a test looks at it (a due entry would
# be published to the test settings' broker).
HOUR = 3600.0


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def configured(monkeypatch, settings) -> dict:
    """The central host's own schedule: its node "central" and the housekeeping."""
    settings.SPARKOPS_BEAT_NODES = ["central"]
    settings.SPARKOPS_COLLECT_INTERVAL = HOUR
    schedule = {name: {**entry, "schedule": HOUR}
                for name, entry in beat_schedule(["central"], HOUR).items()}
    monkeypatch.setitem(app.conf, "beat_schedule", schedule)
    return schedule


def _agent(name: str, *, beat_age: timedelta | None) -> Node:
    node = Node.objects.create(name=name, agent_started_at=timezone.now())
    if beat_age is not None:
        Node.objects.filter(pk=node.pk).update(heartbeat_at=timezone.now() - beat_age)
    return node


def _nodes(scheduler: FleetScheduler) -> set[str]:
    return {entry.args[0] for entry in scheduler.schedule.values() if entry.args}


@pytest.mark.django_db
def test_the_agents_collected_are_those_registered_and_not_silent(settings):
    settings.SPARKOPS_HEARTBEAT_SECONDS = 10
    settings.SPARKOPS_UNREACHABLE_AFTER_BEATS = 3
    _agent("spark-fresh", beat_age=None)
    heartbeat.beat("spark-fresh")  # on the database's clock, as the node's worker does
    _agent("spark-starting", beat_age=None)  # registered, first beat not yet in
    _agent("spark-silent", beat_age=timedelta(minutes=5))
    Node.objects.create(name="spark-old-way")  # collected by configuration or not at all

    assert agent_nodes_to_collect() == ["spark-fresh", "spark-starting"]


def test_the_fleet_schedule_is_the_configured_one_plus_each_agents_collections():
    configured = beat_schedule(["central"], 5.0)
    schedule = fleet_schedule(configured, ["spark-b"], 5.0)

    assert set(schedule) == set(configured) | {f"{name}:spark-b" for name, _ in NODE_TASKS}
    entry = schedule["collect-host-memory:spark-b"]
    assert entry["task"] == COLLECT_HOST_MEMORY and entry["args"] == ("spark-b",)
    assert entry["options"] == {"queue": "node.spark-b", "expires": 5.0}
    assert fleet_schedule(configured, ["central"], 5.0) == configured
    assert node_schedule(["spark-b"], 5.0) == {
        name: entry for name, entry in schedule.items() if name.endswith(":spark-b")}


@pytest.mark.django_db
def test_the_scheduler_follows_agents_as_they_come_and_go(configured, settings, tmp_path,
                                                          caplog):
    clock = Clock()
    _agent("spark-b", beat_age=timedelta(0))
    # The beat's own node registers too; SPARKOPS_BEAT_NODES alone says whether it is collected.
    settings.SPARKOPS_NODE_NAME = "centre-that-collects-no-host"
    _agent("centre-that-collects-no-host", beat_age=timedelta(0))
    with caplog.at_level(logging.INFO, logger=fleetbeat.__name__):
        scheduler = FleetScheduler(app=app, schedule_filename=str(tmp_path / "schedule"),
                                   clock=clock)
    try:
        assert _nodes(scheduler) == {"central", "spark-b"}
        assert set(configured) <= set(scheduler.schedule)
        entry = scheduler.schedule["collect-engines:spark-b"]
        assert entry.options["queue"] == "node.spark-b"
        assert "beat schedules the collections of spark-b" in caplog.text

        # A second agent registers and a first one falls silent: nothing changes until the
        # next refresh is due, then both show.
        _agent("spark-c", beat_age=timedelta(0))
        Node.objects.filter(name="spark-b").update(
            heartbeat_at=timezone.now() - timedelta(hours=1))
        clock.now += fleetbeat.REFRESH_SECONDS / 2
        delay = scheduler.tick()
        assert _nodes(scheduler) == {"central", "spark-b"}
        assert 0 < delay <= fleetbeat.REFRESH_SECONDS / 2

        clock.now += fleetbeat.REFRESH_SECONDS
        scheduler.tick()
        assert _nodes(scheduler) == {"central", "spark-c"}
        assert not [name for name in scheduler.schedule if name.endswith(":spark-b")]
        assert "beat pauses the collections of spark-b" in caplog.text

        # A node that is gone is gone from the schedule; the configured node never goes.
        Node.objects.all().delete()
        clock.now += fleetbeat.REFRESH_SECONDS
        scheduler.tick()
        assert _nodes(scheduler) == {"central"}
        assert set(scheduler.schedule) >= set(configured)
    finally:
        scheduler.close()


@pytest.mark.django_db(transaction=True)
def test_a_refresh_that_finds_the_same_agents_leaves_the_schedule_and_the_connection(
        configured, tmp_path, monkeypatch):
    from django.db import connection

    clock = Clock()
    _agent("spark-b", beat_age=timedelta(0))
    scheduler = FleetScheduler(app=app, schedule_filename=str(tmp_path / "schedule"),
                               clock=clock)
    try:
        entries = dict(scheduler.schedule)
        merges = []
        monkeypatch.setattr(scheduler, "merge_inplace",
                            lambda schedule: merges.append(schedule))
        raw = connection.connection
        assert raw is not None  # the first refresh's, kept

        clock.now += fleetbeat.REFRESH_SECONDS
        scheduler.tick()
        assert scheduler.refresh()
        # Nothing changed: no entry made anew (each would lose nothing, but costs Celery's
        # time-zone work), and the same connection asked.
        assert merges == []
        assert all(scheduler.schedule[name] is entry for name, entry in entries.items())
        assert connection.connection is raw

        _agent("spark-c", beat_age=timedelta(0))
        assert scheduler.refresh()
        assert len(merges) == 1 and "collect-engines:spark-c" in merges[0]
    finally:
        scheduler.close()
        connection.close()  # the beat's kept connection: not for the tests after this one


def test_without_the_database_the_scheduler_keeps_its_schedule_and_says_so_once(
        configured, tmp_path, caplog):
    # No django_db mark: every query is refused, as a database that does not answer would.
    clock = Clock()
    with caplog.at_level(logging.WARNING, logger=fleetbeat.__name__):
        scheduler = FleetScheduler(app=app, schedule_filename=str(tmp_path / "schedule"),
                                   clock=clock)
        try:
            assert not scheduler.refresh()
            assert _nodes(scheduler) == {"central"}
            assert set(configured) <= set(scheduler.schedule)
        finally:
            scheduler.close()

    warnings = [r for r in caplog.records if "cannot read which nodes have agents" in r.message]
    assert len(warnings) == 1


def test_the_stacks_beat_thread_runs_the_fleet_scheduler_unless_told_otherwise(tmp_path):
    assert symbol_by_name(FLEET_SCHEDULER) is FleetScheduler
    assert stackworker.scheduler_for(SimpleNamespace(scheduler=None)) == FLEET_SCHEDULER
    assert stackworker.scheduler_for(
        SimpleNamespace(scheduler="celery.beat:PersistentScheduler")) == FLEET_SCHEDULER
    assert stackworker.scheduler_for(SimpleNamespace(scheduler="site:Other")) == "site:Other"

    parent = SimpleNamespace(app=app, schedule_filename=str(tmp_path / "schedule"),
                             scheduler=app.conf.beat_scheduler, steps=[])
    step = stackworker.BeatThread(parent, beat_thread=True)
    step.create(parent)
    assert step.service.scheduler_cls == FLEET_SCHEDULER


@pytest.mark.django_db
def test_the_scheduler_sleeps_until_an_entry_is_due_instead_of_spinning(
        configured, monkeypatch, tmp_path):
    # One entry due every 0.1 s, ticked for about a second as Celery's beat service ticks
    # (sleeping whatever delay a tick returns, here at most the entry's 0.1 s). Celery's own
    # delay ends 10 ms early and then asks for no sleep at all until the entry is due: a
    # hundred ticks or so per send. Waking when the entry is due takes a tick or two per send.
    every = 0.1
    monkeypatch.setitem(app.conf, "beat_schedule", {
        "often": {"task": COLLECT_HOST_MEMORY, "schedule": every, "args": ("central",)}})
    scheduler = FleetScheduler(app=app, schedule_filename=str(tmp_path / "schedule"))
    sends = []
    monkeypatch.setattr(scheduler, "apply_entry",
                        lambda entry, producer=None: sends.append(entry.name))
    try:
        ticks, end = 0, time.monotonic() + 1.0
        while time.monotonic() < end:
            delay = scheduler.tick()
            ticks += 1
            if delay and delay > 0:
                time.sleep(delay)
    finally:
        scheduler.close()

    assert sends.count("often") >= 3
    assert ticks <= 4 * len(sends) + 10, (ticks, len(sends))
