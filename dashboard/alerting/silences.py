"""Silences: creating, expiring and finding the ones that mute an alert.

A silence mutes notices of matching alerts for a time window; the alerts themselves still change
state (see ``dashboard.alerting.lifecycle``). Silences are never deleted: an expired one is the
record of who muted what, when and why.
"""

from __future__ import annotations

from datetime import datetime

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet
from django.db.models.functions import Least

from collectors.models import Engine, Node
from dashboard.alerting.models import Alert, Silence, SilenceQuerySet


def create_silence(*, reason: str, ends_at: datetime, now: datetime, node: Node | None = None,
                   rule: str = "", engine: Engine | None = None,
                   created_by: AbstractBaseUser | None = None) -> Silence:
    """Start a silence now. Raises ValueError for an empty reason or an end not after ``now``.

    An engine implies its node, so a silence for an engine is stored with that node too.
    """
    if not reason.strip():
        raise ValueError("a silence needs a reason")
    if ends_at <= now:
        raise ValueError("a silence must end in the future")
    if engine is not None:
        if node is not None and engine.node_id != node.pk:
            raise ValueError(f"engine {engine.name} is not on node {node.name}")
        node = engine.node
    return Silence.objects.create(node=node, rule=rule, engine=engine, starts_at=now,
                                  ends_at=ends_at, created_by=created_by, reason=reason.strip(),
                                  created_at=now)


def expire_silence(silence: Silence, now: datetime,
                   by: AbstractBaseUser | None = None) -> bool:
    """End ``silence`` at ``now``. False if it had already ended (nothing changes then).

    A conditional UPDATE, so two admins expiring it at once record one expiry. A silence that
    had not started yet ends up as an empty window at ``now``.
    """
    changed = Silence.objects.filter(pk=silence.pk, ends_at__gt=now).update(
        ends_at=now, starts_at=Least("starts_at", now), expired_early=True, expired_by=by,
    )
    if changed:
        silence.refresh_from_db()
    return bool(changed)


def active_silences(now: datetime) -> SilenceQuerySet:
    return Silence.objects.active(now).select_related("node", "engine", "created_by")


def expired_silences(now: datetime) -> QuerySet[Silence]:
    return Silence.objects.filter(ends_at__lte=now) \
        .select_related("node", "engine", "created_by", "expired_by")


def upcoming_silences(now: datetime) -> QuerySet[Silence]:
    return Silence.objects.filter(starts_at__gt=now, ends_at__gt=now) \
        .select_related("node", "engine", "created_by")


def silences_muting(alert: Alert, now: datetime) -> list[Silence]:
    """The silences in force at ``now`` that mute ``alert`` (same matching as the lifecycle)."""
    candidates = active_silences(now).for_node(alert.node_id)
    return [s for s in candidates if s.matches(alert.rule, alert.node_id, alert.engine_id)]
