"""Celery finds the dashboard's tasks here (autodiscovery looks at ``<app>.tasks`` only)."""

from dashboard.alerting.tasks import evaluate_alerts  # noqa: F401
from dashboard.notify.tasks import deliver_notifications  # noqa: F401
from dashboard.restarts.tasks import (  # noqa: F401
    dispatch_due_restarts,
    recover_interrupted_restarts,
    run_restart_task,
)
