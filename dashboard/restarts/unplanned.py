"""Restarts behind SparkOps' back: read from the engine events the collectors record.

The collectors only state facts (``engine-restarted``, ``engine-exited``, ``engine-gone``); here
they become ``unplanned`` rows of the restart ledger, unless a planned restart of that engine
explains them. An exit followed by a restart a little later is one unplanned restart, not two.
Once the engine is ready again, the measured startup time is filled in, so unplanned restarts
teach the learned startup time too.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from collectors.models import Event, Node
from dashboard.restarts.models import Restart

WATCHED_EVENTS = ("engine-restarted", "engine-exited", "engine-gone")
# How far back events are examined on each pass (the pass runs after every collection).
LOOKBACK = timedelta(hours=1)
# An exit and the restart that follows within this long are one outage.
MERGE_WITHIN = timedelta(minutes=15)
# Slack around a planned restart's run within which its own stop/start events are expected.
PLANNED_SLACK = timedelta(seconds=60)


def record_unplanned_restarts(node: Node, now: datetime) -> list[Restart]:
    """Turn new restart-like events of ``node`` into unplanned restarts; return those written."""
    recorded = Restart.objects.filter(
        node=node, kind=Restart.Kind.UNPLANNED, requested_at__gte=now - LOOKBACK - MERGE_WITHIN
    ).values_list("container_state", flat=True)
    seen_ids = {event_id for state in recorded for event_id in (state or {}).get("event_ids", [])}
    events = Event.objects.filter(node=node, kind__in=WATCHED_EVENTS, engine__isnull=False,
                                  at__gte=now - LOOKBACK).exclude(pk__in=seen_ids) \
        .select_related("engine").order_by("at")
    written = []
    for event in events:
        if _explained_by_plan(event):
            continue
        written.append(_record(event))
    _fill_startup_times(node)
    return written


def _explained_by_plan(event: Event) -> bool:
    return Restart.objects.filter(
        engine=event.engine, kind=Restart.Kind.PLANNED, started_at__isnull=False,
        started_at__lte=event.at + PLANNED_SLACK,
    ).exclude(finished_at__lt=event.at - PLANNED_SLACK).exists()


def _record(event: Event) -> Restart:
    engine = event.engine
    state = {"state": engine.container_state, "exit_code": engine.exit_code,
             "started_at": engine.started_at.isoformat() if engine.started_at else None,
             "running": engine.container_state == "running", "event_ids": [event.pk]}
    open_one = Restart.objects.filter(
        engine=engine, kind=Restart.Kind.UNPLANNED, startup_seconds__isnull=True,
        requested_at__gte=event.at - MERGE_WITHIN,
    ).order_by("-requested_at").first()
    if open_one is not None:
        previous_ids = (open_one.container_state or {}).get("event_ids", [])
        open_one.container_state = {**state, "event_ids": [*previous_ids, event.pk]}
        open_one.reason = f"{open_one.reason} Then: {event.message}".strip()
        open_one.save(update_fields=["container_state", "reason"])
        return open_one
    return Restart.objects.create(
        node=event.node, engine=engine, kind=Restart.Kind.UNPLANNED,
        status=Restart.Status.DETECTED, requested_at=event.at, started_at=event.at,
        reason=event.message, container_state=state,
    )


def _fill_startup_times(node: Node) -> None:
    """Startup of an unplanned restart: container start → the engine's next "ready"."""
    pending = Restart.objects.filter(node=node, kind=Restart.Kind.UNPLANNED,
                                     startup_seconds__isnull=True).select_related("engine")
    for restart in pending:
        engine = restart.engine
        if engine.phase != "ready" or engine.started_at is None \
                or engine.started_at < restart.requested_at - MERGE_WITHIN:
            continue
        ready = Event.objects.filter(engine=engine, kind="phase-change",
                                     message__endswith="→ ready",
                                     at__gte=engine.started_at).order_by("at").first()
        if ready is None:
            continue
        restart.startup_seconds = (ready.at - engine.started_at).total_seconds()
        restart.finished_at = ready.at
        restart.save(update_fields=["startup_seconds", "finished_at"])
