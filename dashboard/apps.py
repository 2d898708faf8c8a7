from django.apps import AppConfig


class DashboardConfig(AppConfig):
    """The pages and their chart JSON; no models of its own.

    Its migrations (0001-0004) created the domain apps' tables, which keep their ``dashboard_``
    names; 0005 handed the models to ``alerting``, ``notify``, ``restarts`` and ``audit``.
    """

    name = "dashboard"
    verbose_name = "Dashboard"
