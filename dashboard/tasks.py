"""Celery finds the dashboard's tasks here (autodiscovery looks at ``<app>.tasks`` only)."""

from dashboard.alerting.tasks import evaluate_alerts  # noqa: F401
from dashboard.notify.tasks import deliver_notifications  # noqa: F401
