from django.apps import AppConfig


class AuditConfig(AppConfig):
    """The audit log and the guards below every domain that changes something.

    Its tables keep the names they had when they belonged to the ``dashboard`` app
    (``dashboard_auditentry``): migration ``audit.0001`` adopted them without touching the data.
    """

    name = "dashboard.audit"
    label = "audit"
    verbose_name = "Audit"
