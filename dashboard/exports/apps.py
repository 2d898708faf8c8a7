from django.apps import AppConfig


class ExportsConfig(AppConfig):
    """Prometheus ``/metrics`` and the read-only JSON API ``/api/v1/``; no models of its own."""

    name = "dashboard.exports"
    label = "exports"
    verbose_name = "Exports"
