from django.apps import AppConfig


class RestartsConfig(AppConfig):
    """Restart windows, planned and unplanned restarts, and the runbook that carries them out.

    Its tables keep the names they had under the ``dashboard`` app (``dashboard_restart``, ...):
    migration ``restarts.0001`` adopted them without touching the data. Celery's autodiscovery
    imports ``dashboard.restarts.tasks`` in the worker, which connects its ``worker_ready``
    receiver there (and not in the web process, which needs no container client).
    """

    name = "dashboard.restarts"
    label = "restarts"
    verbose_name = "Restarts"
