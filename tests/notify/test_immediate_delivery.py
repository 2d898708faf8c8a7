"""An alert that fires is delivered by the evaluation that fired it, not a sweep later."""

from __future__ import annotations

import json

import pytest
from django.utils import timezone

from collectors.ledger import build_ledger, record_changes
from collectors.models import Engine
from dashboard.alerting.models import Alert
from dashboard.alerting.tasks import evaluate_alerts
from dashboard.notify.models import Notification
from sparkops.celery import app

GIB = 1024**3


@pytest.fixture
def eager_tasks():
    """Tasks sent with ``delay()`` run in this process, as a worker would run them."""
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = False


def _pinned_engine(node, name: str, kv_gib: float) -> Engine:
    return Engine.objects.create(
        node=node, name=name, container_id=name * 8, container_state="running", phase="ready",
        startup={"weights_gib": 15.0, "kv_cache_gib": kv_gib, "cuda_graph_gib": 0.5},
        config={"max_num_batched_tokens": 8192, "kv_cache_memory_bytes": 1})


@pytest.mark.django_db(transaction=True)
def test_a_firing_alert_reaches_the_webhook_within_its_evaluation(node, receiver, make_webhook,
                                                                   eager_tasks):
    make_webhook(receiver)
    engines = [_pinned_engine(node, "gemma", 60.0), _pinned_engine(node, "qwen", 60.0)]
    now = timezone.now()
    figures = {"mem_total": int(121.69 * GIB), "mem_available": 30 * GIB,
               "mem_available_min": 30 * GIB, "page_cache_reclaimable": 2 * GIB, "swap_used": 0}
    record_changes(node, build_ledger(node, now, figures, engines, []), now)

    assert evaluate_alerts(node.name) >= 1  # overcommit fires at once (its `for` is 0 s)

    alert = Alert.objects.get(rule="overcommit")
    assert alert.state == "firing"
    notice = Notification.objects.get(alert_id=alert.pk)
    # Not delivered: still "queued" means no delivery run took it (another held the lock);
    # "retrying" means the send failed, and says why.
    assert notice.delivered_at is not None, (notice.status, notice.attempts, notice.last_error)
    assert len(receiver.requests) == 1 and receiver.requests[0].verified
    assert json.loads(receiver.requests[0].body)["type"] == "alert.firing"


@pytest.mark.django_db(transaction=True)
def test_an_evaluation_without_news_sends_nothing(node, receiver, make_webhook, eager_tasks):
    make_webhook(receiver)

    assert evaluate_alerts(node.name) == 0
    assert receiver.requests == []
