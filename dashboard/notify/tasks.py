"""Celery task for the ``notify`` queue: deliver what the outbox holds.

Scheduled every 15 s by beat (``sparkops.celery.CENTRAL_SCHEDULE``) and also ``delay()``-ed on
commit after notifications are written, for low latency. The task is routed to its own queue
(``sparkops.celery.NOTIFY_QUEUE``), so a fleet can give delivery a worker of its own; on a
worker shared with collection it holds at most one pool slot: one delivery run at a time per
data directory (a file lock, so it holds for thread and process pools alike); a run that finds
another one going returns at once, and the running one, or the next beat tick, sends what was
queued meanwhile. Running it on several hosts at once is safe: rows and channels are claimed
one by one (see ``outbox``).
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from pathlib import Path

from celery import shared_task
from django.conf import settings

from dashboard.notify.outbox import DeliveryReport, deliver_due, worker_name
from sparkops.celery import DELIVER_NOTIFICATIONS
from sparkops.filelock import only_run

log = logging.getLogger(__name__)

BATCH = 100
# Bounds for one run, so a long backlog cannot hold a worker's slot for long: at most this many
# batches, and this many seconds in all, enforced per send (no send outlasts the budget).
MAX_BATCHES = 20
TIME_BUDGET = 60.0
LOCK_NAME = "notify-delivery.lock"


@shared_task(name=DELIVER_NOTIFICATIONS, ignore_result=True)
def deliver_notifications() -> dict[str, int]:
    """Deliver due notifications in batches until none is left or a bound is reached.

    Returns counts; ``busy`` is 1 when another run held the lock and this one did nothing.
    """
    with only_run(Path(settings.DATA_DIR) / LOCK_NAME) as alone:
        if not alone:
            return {"delivered": 0, "retrying": 0, "failed": 0, "lost_claims": 0, "busy": 1}
        total = _deliver_batches()
    summary = {"delivered": len(total.delivered), "retrying": len(total.retrying),
               "failed": len(total.failed), "lost_claims": total.lost_claims}
    if total.retrying or total.failed:
        log.warning("notifications: %s (deferred %d)", summary, total.deferred)
    elif total.delivered:
        log.info("notifications: %s", summary)
    return summary


def _deliver_batches() -> DeliveryReport:
    started = time.monotonic()
    total = DeliveryReport()
    worker = f"celery:{worker_name()}"
    lease = timedelta(seconds=settings.SPARKOPS_NOTIFY_LEASE_SECONDS)
    for _ in range(MAX_BATCHES):
        budget = TIME_BUDGET - (time.monotonic() - started)
        report = deliver_due(worker=worker, limit=BATCH, lease=lease, budget=budget)
        total.merge(report)
        # Stop when the backlog is read to its end, the budget is spent, or a batch moved
        # nothing (its rows all wait for busy or paused channels).
        if report.found < BATCH or report.out_of_budget or report.attempted == 0:
            break
    return total
