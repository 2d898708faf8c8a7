"""Celery adapter for alert evaluation (central queue)."""

from __future__ import annotations

from celery import shared_task
from django.db import transaction
from django.utils import timezone

from collectors.models import Node
from dashboard.alerting.pipeline import run_alerts
from dashboard.notify.tasks import deliver_notifications


@shared_task(ignore_result=True)
def evaluate_alerts(node_name: str) -> int:
    """Evaluate the alert rules of one node; returns how many notices were queued.

    A notice is delivered at once, not at the outbox's next periodic sweep (up to an interval
    later): the sweep stays, for retries and for anything a crash left behind.
    """
    node = Node.objects.filter(name=node_name).first()
    if node is None:
        return 0
    notices = run_alerts(node, timezone.now())
    if notices:
        transaction.on_commit(deliver_notifications.delay)
    return len(notices)
