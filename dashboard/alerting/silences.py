"""Silences: creating, expiring and finding the ones that mute an alert.

A silence mutes notices of matching alerts for a time window; the alerts themselves still change
state (see ``dashboard.alerting.lifecycle``). Silences are never deleted: an expired one is the
record of who muted what, when and why.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet
from django.db.models.functions import Least

from collectors.models import Engine, Node
from dashboard.alerting.models import OPEN_STATES, Alert, Silence, SilenceQuerySet

# A silence longer than this, or one matching every rule on every node, is "broad": the page
# shows what it would mute and asks for an explicit confirmation before creating it.
BROAD_LENGTH = timedelta(days=1)


def longest_silence() -> timedelta:
    """The cap on a silence's length: ``SPARKOPS_SILENCE_MAX_DAYS`` (default 7 days)."""
    return timedelta(days=settings.SPARKOPS_SILENCE_MAX_DAYS)


def length_problem(starts_at: datetime, ends_at: datetime) -> str | None:
    """Why a silence from ``starts_at`` to ``ends_at`` is refused (not after its start, or longer
    than the cap), else None."""
    if ends_at <= starts_at:
        return "a silence must end in the future"
    cap = longest_silence()
    if ends_at - starts_at > cap:
        return (f"a silence may last at most {_days(cap)} (SPARKOPS_SILENCE_MAX_DAYS); "
                f"this one would last {_days(ends_at - starts_at)}")
    return None


def broad_reasons(*, node: Node | None, rule: str, engine: Engine | None,
                  length: timedelta) -> list[str]:
    """Why a silence needs confirming before it is created; empty if it does not."""
    reasons = []
    if node is None and engine is None and not rule:
        reasons.append("it matches every rule on every node")
    if length > BROAD_LENGTH:
        reasons.append(f"it lasts longer than a day ({_days(length)})")
    return reasons


def alerts_it_would_mute(*, node: Node | None, rule: str, engine: Engine | None) -> list[Alert]:
    """The open alerts a silence with these matchers would mute now. Cost: one query."""
    probe = Silence(node=node if engine is None else engine.node, rule=rule, engine=engine)
    candidates = Alert.objects.filter(state__in=OPEN_STATES).select_related("node", "engine")
    if probe.node_id is not None:
        candidates = candidates.filter(node_id=probe.node_id)
    return [alert for alert in candidates.order_by("node__name", "rule", "pk")
            if probe.matches(alert.rule, alert.node_id, alert.engine_id)]


def create_silence(*, reason: str, ends_at: datetime, now: datetime, node: Node | None = None,
                   rule: str = "", engine: Engine | None = None,
                   created_by: AbstractBaseUser | None = None) -> Silence:
    """Start a silence now. Raises ValueError for an empty reason, an end not after ``now`` or
    a length over :func:`longest_silence`.

    An engine implies its node, so a silence for an engine is stored with that node too.
    """
    if not reason.strip():
        raise ValueError("a silence needs a reason")
    problem = length_problem(now, ends_at)
    if problem:
        raise ValueError(problem)
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


def _days(length: timedelta) -> str:
    """A length in words: "7 days", "1.5 days", "3 h"."""
    days = length.total_seconds() / 86400
    if days < 1:
        return f"{length.total_seconds() / 3600:.3g} h"
    shown = f"{days:.0f}" if days >= 10 else f"{days:.3g}"
    return f"{shown} day{'' if shown == '1' else 's'}"
