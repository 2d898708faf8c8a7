"""Notification channels and the outbox of notifications to deliver through them.

Every notification is a row (``Notification``) written in the same transaction as the state
change it reports; workers claim due rows with a conditional UPDATE and record the outcome on the
row and on its channel (see ``dashboard.notify.outbox``). A channel never loses a row: a row ends
delivered or failed with a reason, and a worker that dies mid-send leaves a claim that expires.

The tables keep the names they had under the ``dashboard`` app (``dashboard_channel``,
``dashboard_notification``), so an upgrade moved no data.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import models
from django.db.models import Q
from django.utils import timezone

from collectors.models import Node
from dashboard.notify.signing import new_secret

__all__ = ["Channel", "Notification", "new_message_id"]


def new_message_id() -> str:
    """A notification's idempotency key: ``msg_`` + 32 hex digits (webhook-id, Message-ID)."""
    return f"msg_{uuid.uuid4().hex}"


class Channel(models.Model):
    """Somewhere notifications go: a list of email addresses, or one signed webhook.

    ``config`` by kind — email: ``{"to": ["ops@example.com", ...]}``; webhook:
    ``{"url": "https://...", "secret": "whsec_<base64>"}`` (the secret is generated when the
    channel is first saved). ``node`` limits the channel to alerts about that node; None means
    every node. ``disabled_reason`` is set when a permanent failure (webhook HTTP 410) switched
    the channel off; re-enabling clears it.

    Delivery limits, kept by the outbox: ``sending_until`` is the lease of the one send in
    flight to this channel (None when idle), so a slow receiver holds at most one worker.
    ``failures_in_a_row`` counts temporary failures since the last success, and
    ``paused_until`` is the circuit breaker: until then the channel's queued notifications
    wait instead of each being tried in turn against a receiver that does not answer.
    """

    class Kind(models.TextChoices):
        EMAIL = "email", "Email"
        WEBHOOK = "webhook", "Webhook"

    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    enabled = models.BooleanField(default=True)
    config = models.JSONField(default=dict, blank=True)
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.CASCADE,
                             related_name="notification_channels")
    created_at = models.DateTimeField(default=timezone.now)
    last_success_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    last_error_at = models.DateTimeField(null=True, blank=True)
    disabled_reason = models.TextField(blank=True)
    sending_until = models.DateTimeField(null=True, blank=True, editable=False)
    failures_in_a_row = models.PositiveIntegerField(default=0, editable=False)
    paused_until = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        db_table = "dashboard_channel"
        ordering = ["name", "pk"]
        permissions = [("change_channels", "Can create, edit, enable and disable channels")]

    def __str__(self) -> str:
        return f"{self.name} ({self.get_kind_display().lower()})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.kind == self.Kind.WEBHOOK and not self.config.get("secret"):
            self.config = {**self.config, "secret": new_secret()}
        super().save(*args, **kwargs)

    @property
    def recipients(self) -> list[str]:
        return list(self.config.get("to") or [])

    @property
    def url(self) -> str:
        return str(self.config.get("url") or "")

    @property
    def secret(self) -> str:
        return str(self.config.get("secret") or "")

    @property
    def target(self) -> str:
        """Where this channel sends, for lists: addresses, or the webhook's origin only.

        A webhook URL's path and query often hold a token (chat services work that way), so
        only the scheme and host are shown outside the edit form.
        """
        if self.kind == self.Kind.EMAIL:
            return ", ".join(self.recipients)
        scheme, _, rest = self.url.partition("://")
        host = rest.split("/", 1)[0].split("?", 1)[0].rsplit("@", 1)[-1]
        return f"{scheme}://{host}/…" if host else ""


class Notification(models.Model):
    """One message to one channel: the outbox row, and the record of its delivery.

    ``message_id`` is the idempotency key, identical on every attempt (``webhook-id`` header,
    email ``Message-ID``). A row is *due* when it is neither delivered nor failed, its
    ``next_attempt_at`` has come, and nobody holds a live claim on it. ``attempts`` counts the
    sends whose outcome was recorded; ``claimed_at``/``claimed_by`` name the worker sending it
    now (cleared when a retry is scheduled, kept as a record once delivered or failed).
    ``alert_id`` refers to the alerting package's alert by id only, so this package does not
    depend on it.
    """

    class Kind(models.TextChoices):
        FIRING = "firing", "Firing"
        RESOLVED = "resolved", "Resolved"
        REPEAT = "repeat", "Repeat"
        UPDATED = "updated", "New incident"
        TEST = "test", "Test"

    message_id = models.CharField(max_length=40, unique=True, default=new_message_id,
                                  editable=False)
    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="notifications")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    alert_id = models.BigIntegerField(null=True, blank=True)
    payload = models.JSONField(default=dict)
    subject = models.CharField(max_length=255)
    text = models.TextField()
    html = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    attempts = models.PositiveIntegerField(default=0)
    claimed_at = models.DateTimeField(null=True, blank=True)
    claimed_by = models.CharField(max_length=200, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)

    class Meta:
        db_table = "dashboard_notification"
        ordering = ["-created_at", "-pk"]
        indexes = [
            # The claim query: open rows ordered by next_attempt_at. Partial, so it only holds
            # the (few) open rows, not the whole delivery history.
            models.Index(fields=["next_attempt_at"], name="notify_open_due_idx",
                         condition=Q(delivered_at__isnull=True, failed_at__isnull=True)),
            # The channels page: each channel's latest notifications.
            models.Index(fields=["channel", "-created_at"], name="notify_channel_recent_idx"),
            # The alert page: what was sent for an alert.
            models.Index(fields=["alert_id"], name="notify_alert_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.message_id} {self.kind} → {self.channel_id}"

    @property
    def status(self) -> str:
        """One word for people: delivered, failed, sending, retrying or pending."""
        if self.delivered_at is not None:
            return "delivered"
        if self.failed_at is not None:
            return "failed"
        if self.claimed_at is not None:
            return "sending"
        return "retrying" if self.attempts else "pending"
