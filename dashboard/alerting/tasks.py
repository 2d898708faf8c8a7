"""Celery adapter for alert evaluation (central queue)."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from collectors.models import Node
from dashboard.alerting.pipeline import run_alerts


@shared_task(ignore_result=True)
def evaluate_alerts(node_name: str) -> int:
    """Evaluate the alert rules of one node; returns how many notices were queued."""
    node = Node.objects.filter(name=node_name).first()
    if node is None:
        return 0
    return len(run_alerts(node, timezone.now()))
