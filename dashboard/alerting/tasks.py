"""Celery adapters for alert evaluation (central queue): after every collection (the receiver
queues it), and the central watch of nodes out of contact (beat, every heartbeat interval)."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from collectors.reads import node_named
from dashboard.alerting.pipeline import nodes_out_of_contact, run_alerts
from dashboard.notify.tasks import deliver_notifications
from sparkops.celery import CENTRAL_QUEUE, EVALUATE_ALERTS, WATCH_NODES


@shared_task(name=EVALUATE_ALERTS, ignore_result=True)
def evaluate_alerts(node_name: str) -> int:
    """Evaluate the alert rules of one node; returns how many notices were queued.

    A notice is delivered at once, not at the outbox's next periodic sweep (up to an interval
    later): the sweep stays, for retries and for anything a crash left behind.
    """
    node = node_named(node_name)
    if node is None:
        return 0
    notices = run_alerts(node, timezone.now())
    if notices:
        transaction.on_commit(deliver_notifications.delay)
    return len(notices)


@shared_task(name=WATCH_NODES, ignore_result=True)
def watch_nodes() -> int:
    """Evaluate every node out of contact (``pipeline.nodes_out_of_contact``), every heartbeat
    interval; returns how many notices were queued.

    Evaluations otherwise follow a node's collections, and a node whose worker died collects
    nothing: without this its node-unreachable alert would never fire. A node is so reported
    at most the unreachable bound, plus one interval of this task, plus the evaluations' time,
    after its last beat.
    """
    now = timezone.now()
    queued = sum(len(run_alerts(node, now)) for node in nodes_out_of_contact(now))
    if queued:
        transaction.on_commit(deliver_notifications.delay)
    return queued


def queue_evaluation(sender: Any = None, *, node_name: str, **_: Any) -> None:
    """Receiver of ``collectors.signals.collection_finished``: evaluate that node's alerts
    centrally, after every collection, whether it succeeded or not.

    The message expires after two collection intervals: an evaluation that waited that long
    is superseded by the next collection's.
    """
    evaluate_alerts.apply_async(args=(node_name,), queue=CENTRAL_QUEUE,
                                expires=settings.SPARKOPS_COLLECT_INTERVAL * 2)
