"""Alerts, their state changes, silences and admins' rule overrides.

State changes are rows: an :class:`Alert` moving between pending, firing and resolved always
writes an :class:`AlertEvent` in the same transaction (see ``dashboard.alerting.lifecycle``), so
the timeline of an alert can be read back exactly as it happened.

The tables keep the names they had under the ``dashboard`` app (``dashboard_alert``, ...), so an
upgrade moved no data.
"""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import models
from django.db.models import Q

from collectors.models import Engine, Node
from dashboard.alerting.figures import figure_rows, threshold_text, value_text

__all__ = ["Alert", "AlertEvent", "RuleSetting", "Silence"]


class AlertState(models.TextChoices):
    PENDING = "pending"
    FIRING = "firing"
    RESOLVED = "resolved"


# "Open" alerts are the ones the lifecycle still evaluates; at most one per scope.
OPEN_STATES = (AlertState.PENDING, AlertState.FIRING)


class ResolveReason(models.TextChoices):
    CLEARED = "cleared", "value back past the clear edge"
    NEVER_FIRED = "never fired", "cleared while pending, never fired"
    NO_LONGER_APPLIES = "no longer applies", "no longer applies (scope gone)"
    RULE_DISABLED = "rule disabled", "rule disabled"
    SETTLED = "settled", "the prediction met its outcome"


class Alert(models.Model):
    """One episode of one rule's condition being active for one scope (rule, node, engine).

    ``started_at`` is when the condition was first seen active; ``fired_at`` when the ``for``
    duration had passed. ``value``/``threshold``/``summary``/``details`` are the latest evaluated
    figures (refined on every evaluation while open, frozen once resolved). ``fired_cause`` is
    the cause the rule named when the alert fired: recorded once, never rewritten by later
    evaluations or by the resolve, because it is what receivers were told; ``summary`` ends with
    that cause ("…; cause: …"), and a different cause named since is ``cause_now``.
    ``notify_count`` counts notices issued for it (firing, repeat, updated, resolved): 0 means
    nobody was ever told, so its resolution is silent too.
    """

    rule = models.CharField(max_length=64)
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="alerts")
    # SET_NULL: the history of an engine's alerts outlives the engine row (scope keeps its id).
    engine = models.ForeignKey(Engine, null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="alerts")
    scope = models.CharField(max_length=200)
    state = models.CharField(max_length=16, choices=AlertState.choices,
                             default=AlertState.PENDING)
    severity = models.CharField(max_length=16)
    summary = models.CharField(max_length=500)
    details = models.JSONField(default=dict, blank=True)
    value = models.FloatField(null=True, blank=True)
    threshold = models.FloatField()
    clear = models.FloatField(null=True, blank=True)
    direction = models.CharField(max_length=8, blank=True)
    started_at = models.DateTimeField()
    fired_at = models.DateTimeField(null=True, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    last_evaluated_at = models.DateTimeField()
    # "active" (past the threshold), "holding" (between threshold and clear edge), "unknown"
    # (the rule could not compute a value; the state was kept as it was).
    last_evaluation = models.CharField(max_length=16, blank=True)
    last_notified_at = models.DateTimeField(null=True, blank=True)
    notify_count = models.PositiveIntegerField(default=0)
    resolve_reason = models.CharField(max_length=32, choices=ResolveReason.choices, blank=True)
    fired_cause = models.CharField(max_length=500, blank=True)

    class Meta:
        db_table = "dashboard_alert"
        constraints = [
            # The last line against two evaluators opening the same alert twice. A partial unique
            # index: supported by both SQLite and PostgreSQL.
            models.UniqueConstraint(fields=["scope"], condition=Q(state__in=OPEN_STATES),
                                    name="alert_one_open_per_scope"),
        ]
        indexes = [
            # "open alerts of node N" (every evaluation) and the alerts page's per-node filter.
            models.Index(fields=["node", "state"], name="alert_node_state"),
        ]
        ordering = ["-started_at", "-id"]

    def __str__(self) -> str:
        return f"{self.scope} ({self.state})"

    @property
    def is_open(self) -> bool:
        return self.state in OPEN_STATES

    @property
    def latest_cause(self) -> str:
        """The cause the rule named at its latest evaluation (``details["cause"]``), or ""."""
        return str((self.details or {}).get("cause") or "")

    @property
    def cause(self) -> str:
        """The alert's cause: the one named when it fired. While pending, and for an alert that
        fired without one (or before causes were recorded at firing), the latest one."""
        return self.fired_cause or self.latest_cause

    @property
    def cause_now(self) -> str:
        """A different cause named since it fired ("since then: …"), or "" when none."""
        latest = self.latest_cause
        return latest if self.fired_cause and latest != self.fired_cause else ""

    @property
    def figures(self) -> list[tuple[str, str]]:
        """The rule's figures in ``details`` as (label, text in units) rows, for people."""
        return figure_rows(self.details or {})

    @property
    def value_text(self) -> str:
        """The evaluated value in the rule's unit ("3.10 GiB", "2 restarts", "unknown")."""
        return value_text(self.rule, self.value)

    @property
    def threshold_text(self) -> str:
        """Where it fires and clears, in the rule's unit ("below 4.00 GiB; clears at 4.50 GiB")."""
        return threshold_text(self.rule, self.threshold, self.clear, self.direction)


class AlertEvent(models.Model):
    """One row per state change of an alert, and per notice issued for it.

    ``from_state`` is "" for the alert's creation. A row whose states are equal records a notice
    without a state change (a repeat, or the firing notice held back by a silence). ``notice`` is
    the notice kind issued with this change ("firing", "repeat", "resolved"), "" for none.
    """

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField()
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16)
    value = models.FloatField(null=True, blank=True)
    notice = models.CharField(max_length=16, blank=True)
    message = models.TextField(blank=True)

    class Meta:
        db_table = "dashboard_alertevent"
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.alert_id}: {self.from_state or '-'} → {self.to_state} at {self.at}"

    @property
    def value_text(self) -> str:
        """The value at this change in its rule's unit (reads ``alert``: one query unless it
        came through ``alert.events``)."""
        return value_text(self.alert.rule, self.value)


class SilenceQuerySet(models.QuerySet["Silence"]):
    def active(self, now: datetime) -> SilenceQuerySet:
        """Silences in force at ``now``: started, not yet ended."""
        return self.filter(starts_at__lte=now, ends_at__gt=now)

    def for_node(self, node: Node | int) -> SilenceQuerySet:
        """Silences that can match alerts of ``node`` (its own and those for any node)."""
        return self.filter(Q(node__isnull=True) | Q(node=node))


class Silence(models.Model):
    """Mutes notices (not state changes) of matching alerts between ``starts_at`` and ``ends_at``.

    Each of node, rule and engine narrows the match; empty means "any". Expired silences stay as
    history; expiring one early sets ``ends_at`` to now.
    """

    # CASCADE, not SET_NULL: a silence for a deleted engine must not widen to "any engine".
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.CASCADE,
                             related_name="silences")
    rule = models.CharField(max_length=64, blank=True)
    engine = models.ForeignKey(Engine, null=True, blank=True, on_delete=models.CASCADE,
                               related_name="silences")
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    reason = models.TextField()
    created_at = models.DateTimeField()
    # Set when someone ended it before its planned end (``ends_at`` is then that moment).
    expired_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    expired_early = models.BooleanField(default=False)

    objects = SilenceQuerySet.as_manager()

    class Meta:
        db_table = "dashboard_silence"
        indexes = [models.Index(fields=["ends_at"], name="silence_ends_at")]
        ordering = ["-ends_at", "-id"]
        permissions = [("change_silences", "Can create and expire silences")]

    def __str__(self) -> str:
        return f"silence #{self.pk} of {self.matcher_text}"

    def is_active(self, now: datetime) -> bool:
        return self.starts_at <= now < self.ends_at

    def matches(self, rule: str, node_id: int, engine_id: int | None) -> bool:
        """Whether this silence covers an alert of ``rule`` for that node and engine."""
        return ((self.node_id is None or self.node_id == node_id)
                and (not self.rule or self.rule == rule)
                and (self.engine_id is None or self.engine_id == engine_id))

    @property
    def matcher_text(self) -> str:
        """What it silences, for people: "rule X on node Y, engine Z" with "any" for blanks."""
        node = self.node.name if self.node_id else "any node"
        engine = self.engine.name if self.engine_id else "any engine"
        rule = self.rule or "any rule"
        return f"{rule} on {node}, {engine}"


class RuleSetting(models.Model):
    """An admin's overrides of one rule's defaults (see ``dashboard.alerting.settings``).

    NULL timings and missing threshold keys mean "use the default", so a changed default in code
    reaches every rule nobody tuned.
    """

    rule = models.CharField(max_length=64, unique=True)
    enabled = models.BooleanField(default=True)
    for_seconds = models.PositiveIntegerField(null=True, blank=True)
    repeat_seconds = models.PositiveIntegerField(null=True, blank=True)
    thresholds = models.JSONField(default=dict, blank=True)
    updated_at = models.DateTimeField(null=True, blank=True)
    updated_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")

    class Meta:
        db_table = "dashboard_rulesetting"
        permissions = [("change_rules", "Can change alert rule settings")]

    def __str__(self) -> str:
        return f"settings of {self.rule}"
