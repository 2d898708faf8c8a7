"""Celery task for the central queue: deliver what the outbox holds.

Schedule it periodically (every 10 s or so, ``expires`` about that interval) and, for low
latency, also ``delay()`` it on commit after writing notifications. Running it on several
workers at once is safe: rows are claimed one by one (see ``outbox``).
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from celery import shared_task
from django.conf import settings

from dashboard.notify.outbox import DeliveryReport, deliver_due, worker_name

log = logging.getLogger(__name__)

BATCH = 100
# Bounds for one run, so a long backlog cannot hold a worker past the next beat tick for long:
# at most this many batches, and no new batch after this many seconds.
MAX_BATCHES = 20
TIME_BUDGET = 60.0


@shared_task(ignore_result=True)
def deliver_notifications() -> dict[str, int]:
    """Deliver due notifications in batches until none is left or a bound is reached."""
    started = time.monotonic()
    total = DeliveryReport()
    worker = f"celery:{worker_name()}"
    lease = timedelta(seconds=settings.SPARKOPS_NOTIFY_LEASE_SECONDS)
    for _ in range(MAX_BATCHES):
        report = deliver_due(worker=worker, limit=BATCH, lease=lease)
        total.merge(report)
        if report.found < BATCH or time.monotonic() - started > TIME_BUDGET:
            break
    summary = {"delivered": len(total.delivered), "retrying": len(total.retrying),
               "failed": len(total.failed), "lost_claims": total.lost_claims}
    if total.retrying or total.failed:
        log.warning("notifications: %s", summary)
    elif total.delivered:
        log.info("notifications: %s", summary)
    return summary
