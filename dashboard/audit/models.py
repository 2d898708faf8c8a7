"""The audit log: one row for every dangerous or configuration action, allowed or not.

The table keeps the name it had under the ``dashboard`` app (``dashboard_auditentry``), so an
upgrade moved no data.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from collectors.models import Engine, Node

__all__ = ["AuditEntry"]


class AuditEntry(models.Model):
    """Every dangerous or configuration action, also when refused or failed: who, from where,
    what, on what, and the result.

    ``allowed`` False means refused (no permission, or a guard said no); an allowed action that
    went wrong has an ``outcome`` starting with "failed". ``details`` never holds a secret.
    """

    at = models.DateTimeField(default=timezone.now)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                             on_delete=models.SET_NULL, related_name="+")
    actor = models.CharField(max_length=120, blank=True)  # "worker:<host>" for the runbook
    # The client address of the request that asked (None for the worker and older rows).
    address = models.GenericIPAddressField(null=True, blank=True)
    action = models.CharField(max_length=64)
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.SET_NULL,
                             related_name="+")
    engine = models.ForeignKey(Engine, null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="+")
    # By name: the audit log sits below the restarts app and never imports it.
    restart = models.ForeignKey("restarts.Restart", null=True, blank=True,
                                on_delete=models.SET_NULL, related_name="audit")
    allowed = models.BooleanField()
    outcome = models.TextField(blank=True)
    details = models.JSONField(default=dict, blank=True)

    class Meta:
        db_table = "dashboard_auditentry"
        ordering = ["-at"]
        indexes = [models.Index(fields=["action", "at"], name="audit_action_at"),
                   # The audit page lists newest first, unfiltered by default.
                   models.Index(fields=["at"], name="audit_at")]
        permissions = [("view_audit", "Can read the audit log"),
                       ("unlock_logins", "Can see login lockouts and lift them")]
