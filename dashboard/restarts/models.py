"""Restart windows, the restart ledger (planned and unplanned) and runbook steps.

State changes are rows: every runbook step is a :class:`RestartStep` (and every action an admin
takes, or is refused, an ``audit.AuditEntry``). The tables keep the names they had under the
``dashboard`` app (``dashboard_restart``, ...), so an upgrade moved no data.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from collectors.models import Engine, Node

__all__ = ["Restart", "RestartStep", "RestartWindow"]

DEFAULT_STARTUP_SECONDS = 600  # "about ten minutes" until an engine has its own history


class RestartWindow(models.Model):
    """A recurring maintenance window, as an iCalendar recurrence (RFC 5545).

    ``recurrence`` holds ``DTSTART;TZID=<zone>:<local start>`` and an ``RRULE:`` line, e.g.
    ``DTSTART;TZID=Asia/Seoul:20261101T030000`` + ``RRULE:FREQ=WEEKLY;BYDAY=SU``; each
    occurrence lasts ``duration_minutes``. A window applies to a node, or to one engine of it.
    """

    name = models.CharField(max_length=120)
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="restart_windows")
    engine = models.ForeignKey(Engine, null=True, blank=True, on_delete=models.CASCADE,
                               related_name="restart_windows")
    recurrence = models.TextField()
    time_zone = models.CharField(max_length=64)
    duration_minutes = models.PositiveIntegerField()
    enabled = models.BooleanField(default=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "dashboard_restartwindow"
        ordering = ["node", "name"]
        permissions = [("change_windows", "Can create and edit restart windows")]

    def __str__(self) -> str:
        return self.name


class Restart(models.Model):
    """One restart of one engine: planned by an admin, or detected (unplanned).

    Planned: scheduled → running → succeeded | failed | aborted | interrupted (or refused /
    cancelled before it ran). Unplanned: recorded as ``detected`` when SparkOps sees a container
    restarted behind its back.
    """

    class Kind(models.TextChoices):
        PLANNED = "planned"
        UNPLANNED = "unplanned"

    class Status(models.TextChoices):
        SCHEDULED = "scheduled"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        ABORTED = "aborted"
        INTERRUPTED = "interrupted"
        REFUSED = "refused"
        CANCELLED = "cancelled"
        DETECTED = "detected"

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="restarts")
    engine = models.ForeignKey(Engine, on_delete=models.CASCADE, related_name="restarts")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    status = models.CharField(max_length=16, choices=Status.choices)
    window = models.ForeignKey(RestartWindow, null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="restarts")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                     on_delete=models.SET_NULL, related_name="+")
    requested_at = models.DateTimeField(default=timezone.now)
    reason = models.TextField(blank=True)
    # The plan: when it starts, and the outage it expects.
    scheduled_for = models.DateTimeField(null=True, blank=True)
    expected_drain_seconds = models.PositiveIntegerField(default=0)
    expected_startup_seconds = models.PositiveIntegerField(default=DEFAULT_STARTUP_SECONDS)
    expected_back_by = models.DateTimeField(null=True, blank=True)
    # The run.
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    deadline = models.DateTimeField(null=True, blank=True)  # "ready by", else failed
    phase = models.CharField(max_length=32, blank=True)  # the runbook step now running
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    worker = models.CharField(max_length=255, blank=True)
    outcome = models.TextField(blank=True)
    startup_seconds = models.FloatField(null=True, blank=True)  # measured: start → ready
    before = models.JSONField(default=dict, blank=True)  # memory and KV capacity
    after = models.JSONField(default=dict, blank=True)
    # What the container engine said when an unplanned restart was seen.
    container_state = models.JSONField(default=dict, blank=True)
    # The change of flags the plan carries (dashboard.restarts.change); empty: none. Keys:
    # "command" (the intended command line, a list of words), "mode" ("recreate": SparkOps
    # recreates the container with it; "note": the admin does), "margin_bytes" (the prefill
    # margin it was checked with), "accept_squeeze" (the admin accepted a predicted squeeze),
    # "planned" (the fit planner's after-ledger as planned: change.ledger_summary).
    change = models.JSONField(default=dict, blank=True)
    # A restart of an engine that spans nodes is one restart of its head with one part per
    # rank on the rank's node (dashboard.restarts.groups): each part points at the head's row.
    # The head's row is the engine's one outage; a part never stands alone.
    part_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.CASCADE,
                                related_name="parts")

    class Meta:
        db_table = "dashboard_restart"
        ordering = ["-requested_at"]
        permissions = [("run_restarts", "Can plan and run engine restarts")]
        constraints = [
            # Two engines never start at the same time on a node.
            models.UniqueConstraint(fields=["node"], condition=Q(status="running"),
                                    name="restart_one_running_per_node"),
            # One open plan per engine (planning checks it first, under a lock).
            models.UniqueConstraint(fields=["engine"],
                                    condition=Q(status__in=["scheduled", "running"]),
                                    name="restart_one_open_per_engine"),
        ]
        indexes = [models.Index(fields=["node", "status"], name="restart_node_status"),
                   models.Index(fields=["engine", "status"], name="restart_engine_status")]

    def __str__(self) -> str:
        return f"{self.kind} restart of {self.engine} ({self.status})"


class RestartStep(models.Model):
    """One step of a runbook run, with its times and what it found."""

    restart = models.ForeignKey(Restart, on_delete=models.CASCADE, related_name="steps")
    step = models.CharField(max_length=32)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    ok = models.BooleanField(null=True)
    message = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        db_table = "dashboard_restartstep"
        ordering = ["started_at", "pk"]
