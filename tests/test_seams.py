"""The hand-offs between apps: pinned Celery task names, and collection → alert evaluation
through ``collectors.signals.collection_finished``."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from celery.signals import worker_ready

from collectors import tasks as collector_tasks
from collectors.signals import collection_finished
from dashboard.alerting import tasks as alerting_tasks
from sparkops import celery as sparkops_celery
from sparkops.celery import TASK_NAMES, app, beat_schedule

# The names deployed installations have queued messages under: they must never change.
DEPLOYED_NAMES = {
    "collectors.tasks.collect_host_memory",
    "collectors.tasks.collect_engines",
    "collectors.tasks.collect_kernel_log",
    "collectors.tasks.rollup_samples",
    "collectors.tasks.prune_samples",
    "dashboard.alerting.tasks.evaluate_alerts",
    "dashboard.alerting.tasks.watch_nodes",
    "dashboard.notify.tasks.deliver_notifications",
    "dashboard.restarts.tasks.dispatch_due_restarts",
    "dashboard.restarts.tasks.recover_interrupted_restarts",
    "dashboard.restarts.tasks.run_restart_task",
}


def test_every_task_keeps_the_name_queued_messages_carry():
    assert set(TASK_NAMES) == DEPLOYED_NAMES
    # What a worker loads: each app's tasks module, found by Celery's autodiscovery.
    discovered = {package for fixup in app._fixups for package in fixup.autodiscover_tasks()}
    assert {"collectors", "dashboard.alerting", "dashboard.notify",
            "dashboard.restarts"} <= discovered
    app.loader.import_default_modules()
    assert set(app.tasks) >= DEPLOYED_NAMES
    from dashboard.restarts.tasks import _recover_when_a_worker_starts

    assert _recover_when_a_worker_starts in worker_ready._live_receivers(None)


def test_beat_names_only_pinned_tasks():
    schedule = beat_schedule(["spark-a"], 5.0)
    assert {entry["task"] for entry in schedule.values()} <= DEPLOYED_NAMES
    assert schedule["deliver-notifications"]["options"]["queue"] == sparkops_celery.NOTIFY_QUEUE


def test_a_finished_collection_queues_the_nodes_evaluation_centrally(monkeypatch, settings):
    settings.SPARKOPS_COLLECT_INTERVAL = 7.0
    queued = []
    monkeypatch.setattr(alerting_tasks.evaluate_alerts, "apply_async",
                        lambda **kwargs: queued.append(kwargs))

    collection_finished.send(sender=None, node_name="spark-a", collection_id=3, ok=True)

    assert queued == [{"args": ("spark-a",), "queue": "sparkops", "expires": 14.0}]


@pytest.mark.django_db
def test_the_collection_task_announces_each_collection_and_survives_a_failing_listener(
        monkeypatch, settings, caplog, tmp_path):
    settings.SPARKOPS_NODE_NAME = "spark-a"
    settings.DATA_DIR = tmp_path  # the flight recorder writes there, not into the checkout
    stored = SimpleNamespace(id=42, ok=False, error="meminfo unreadable",
                             at=datetime(2026, 11, 1, tzinfo=UTC))
    monkeypatch.setattr(collector_tasks, "collect_into", lambda *a, **k: (stored, None))
    monkeypatch.setattr(alerting_tasks.evaluate_alerts, "apply_async", lambda **kwargs: None)
    heard = []

    def listener(sender, **kwargs):
        heard.append(kwargs)

    def broken(sender, **kwargs):
        raise RuntimeError("listener broke")

    collection_finished.connect(listener)
    collection_finished.connect(broken)
    try:
        assert collector_tasks.collect_host_memory("spark-a") == 42
    finally:
        collection_finished.disconnect(listener)
        collection_finished.disconnect(broken)

    assert heard == [{"signal": collection_finished, "node_name": "spark-a",
                      "collection_id": 42, "ok": False}]
    assert "listener broke" in caplog.text
