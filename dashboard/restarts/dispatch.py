"""Claiming, staleness and dispatch of planned restarts: the central half, database only.

Serialisation: a restart is *claimed* (``scheduled`` → ``running``) with one conditional UPDATE
that succeeds only while no other restart of the node runs; the partial unique index
``restart_one_running_per_node`` is the last line against a race. A claim that fails leaves the
restart ``scheduled`` for a later dispatch. So one engine of a node starts only after the
previous one is ready, which is after it logged its KV cache size.

Staleness: a due restart that could have started more than ``SPARKOPS_RESTART_START_GRACE_SECONDS``
ago (its time, or the end of the restart it waited for), or that would now overrun its window,
is cancelled with the reason instead of run: a request queued during an outage does not fire
hours later.

Crash safety: the run writes ``heartbeat_at`` at least every poll; :func:`interrupt_stale_restarts`
marks a running restart whose heartbeat went stale as ``interrupted``, with the container's real
state when it runs on the restart's node (through :mod:`collectors.docker_api`), else the state
the node's collector saw last.

While a restart is ``scheduled``, ``phase`` is "queued" once it was handed to the node's queue
(``heartbeat_at`` then says when) and "waiting" when a claim found the node busy.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import docker
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Exists, Max, OuterRef, Q, QuerySet
from django.db.models.functions import Coalesce

from collectors.docker_api import ContainerEngineError, container_status
from collectors.models import Engine, Event
from dashboard.audit.records import audit
from dashboard.restarts.fit import startup_deadline_seconds
from dashboard.restarts.models import Restart
from dashboard.restarts.windows import current_or_next
from sparkops.prepared import PreparedRead

__all__ = ["REDISPATCH_SECONDS", "RUN_ACTION", "cancel_restart", "claim_restart", "end_unstarted",
           "interrupt_stale_restarts", "restarts_to_dispatch", "stale_reason"]

RUN_ACTION = "run-restart"
# A restart handed to a node's queue is handed again after this long if nobody claimed it; the
# message itself expires then, so a message stuck in a queue never fires late.
REDISPATCH_SECONDS = 60.0


def claim_restart(restart: Restart, *, now: datetime, worker: str) -> bool:
    """``scheduled`` → ``running`` for this worker, only while no other restart of the node runs.

    One conditional UPDATE; on PostgreSQL two concurrent claims can both pass the NOT EXISTS
    (neither sees the other's uncommitted row), and then the unique index turns the second into
    an IntegrityError: not claimed either. Returns whether this call claimed it.
    """
    try:
        with transaction.atomic():
            return _conditional_claim(restart, now=now, worker=worker) == 1
    except IntegrityError:
        return False


def _conditional_claim(restart: Restart, *, now: datetime, worker: str) -> int:
    others = Restart.objects.filter(node_id=OuterRef("node_id"), status=Restart.Status.RUNNING)
    # Until the start sets the real deadline, hold alerts for the longest the run can take.
    provisional = now + timedelta(
        seconds=settings.SPARKOPS_RESTART_DRAIN_TIMEOUT_SECONDS
        + startup_deadline_seconds(restart.expected_startup_seconds) + 120)
    return (Restart.objects.filter(pk=restart.pk, status=Restart.Status.SCHEDULED)
            .filter(~Exists(others))
            .update(status=Restart.Status.RUNNING, started_at=now, heartbeat_at=now,
                    phase="claimed", worker=worker, deadline=provisional))


def stale_reason(restart: Restart, now: datetime) -> str:
    """Why a due ``scheduled`` restart must no longer run ("" when it still may).

    Waiting behind another restart of the node is not staleness: the grace counts from the
    later of its own time and the end of the last restart of the node that ran after it.
    """
    due = restart.scheduled_for or restart.requested_at
    if due > now or _node_busy(restart):
        return ""
    blocked_until = (Restart.objects.filter(node_id=restart.node_id, kind=Restart.Kind.PLANNED,
                                            finished_at__gt=due).exclude(pk=restart.pk)
                     .aggregate(latest=Max("finished_at"))["latest"])
    since = max(due, blocked_until or due)
    grace = timedelta(seconds=settings.SPARKOPS_RESTART_START_GRACE_SECONDS)
    if now - since > grace:
        return (f"due at {due:%Y-%m-%d %H:%M:%S} UTC but not started within "
                f"{grace.total_seconds():.0f} s (queued during an outage?); not started "
                f"{_duration(now - due)} late")
    window_end = _window_end(restart)
    back_by = now + timedelta(seconds=restart.expected_drain_seconds
                              + restart.expected_startup_seconds)
    if window_end is not None and back_by > window_end:
        return (f"its window ends at {window_end:%H:%M:%S} UTC; started now it would be back "
                f"only by {back_by:%H:%M:%S} UTC")
    return ""


def _due(now: datetime) -> QuerySet[Restart]:
    """The planned restarts scheduled for ``now`` or before (or asked for then, unscheduled)
    that wait to be handed over."""
    return Restart.objects.filter(kind=Restart.Kind.PLANNED, status=Restart.Status.SCHEDULED) \
        .filter(Q(scheduled_for__lte=now) | Q(scheduled_for__isnull=True, requested_at__lte=now))


_ANY_DUE = PreparedRead(lambda now: _due(now).values_list("pk", flat=True)[:1])


def restarts_to_dispatch(now: datetime) -> list[Restart]:
    """The restarts to hand to their nodes' queues now: per node, the oldest due one.

    Stale ones are cancelled on the way. A node with a running restart gets nothing (its next
    one waits). A restart handed over less than :data:`REDISPATCH_SECONDS` ago is not handed
    again; the handover is a conditional UPDATE, so two dispatchers never both send it.

    Cost: with none due, one query (prepared: the dispatcher runs every 15 s and mostly
    finds nothing); else two, and one UPDATE per restart handed.
    """
    if not _ANY_DUE(now):
        return []
    due = (_due(now).select_related("node", "engine", "window")
           .order_by(Coalesce("scheduled_for", "requested_at"), "pk"))
    busy = set(Restart.objects.filter(status=Restart.Status.RUNNING)
               .values_list("node_id", flat=True))
    chosen: dict[int, Restart] = {}
    for restart in due:
        if restart.node_id in busy or restart.node_id in chosen:
            continue
        reason = stale_reason(restart, now)
        if reason:
            cancel_restart(restart, reason, now, actor="dispatcher")
            continue
        chosen[restart.node_id] = restart
    handed_before = now - timedelta(seconds=REDISPATCH_SECONDS)
    return [
        restart for restart in chosen.values()
        if Restart.objects.filter(pk=restart.pk, status=Restart.Status.SCHEDULED)
        .filter(Q(heartbeat_at__isnull=True) | Q(heartbeat_at__lt=handed_before))
        .update(phase="queued", heartbeat_at=now)
    ]


def interrupt_stale_restarts(now: datetime, *, local_node: str,
                             api: docker.DockerClient | None, api_error: str = "",
                             node_name: str | None = None) -> list[Restart]:
    """Mark running restarts whose heartbeat is older than
    ``SPARKOPS_RESTART_HEARTBEAT_STALE_SECONDS`` as ``interrupted`` (their worker died).

    ``container_state`` is the container's real state, read through ``api`` for restarts of
    ``local_node``; for other nodes (or without ``api``) it is the state their collector saw
    last, marked with its source. Each is marked with a conditional UPDATE on the heartbeat it
    was read with, so a run that is alive after all is never overwritten. A critical
    ``restart-interrupted`` event is written for each. Returns the restarts marked.
    """
    stale_before = now - timedelta(seconds=settings.SPARKOPS_RESTART_HEARTBEAT_STALE_SECONDS)
    rows = (Restart.objects.filter(status=Restart.Status.RUNNING)
            .filter(Q(heartbeat_at__lt=stale_before)
                    | Q(heartbeat_at__isnull=True, started_at__lt=stale_before))
            .select_related("node", "engine"))
    if node_name is not None:
        rows = rows.filter(node__name=node_name)
    marked = []
    for restart in rows:
        live = api if restart.node.name == local_node else None
        state = _observed_state(restart.engine, live, api_error)
        outcome = _interrupted_outcome(restart, state)
        updated = Restart.objects.filter(
            pk=restart.pk, status=Restart.Status.RUNNING, heartbeat_at=restart.heartbeat_at,
        ).update(status=Restart.Status.INTERRUPTED, finished_at=now, container_state=state,
                 outcome=outcome)
        if not updated:
            continue
        Event.objects.create(node=restart.node, engine=restart.engine, at=now,
                             kind="restart-interrupted", severity=Event.Severity.CRITICAL,
                             message=f"{restart.engine.name}: {outcome}")
        restart.refresh_from_db()
        marked.append(restart)
    return marked


def _node_busy(restart: Restart) -> bool:
    return Restart.objects.filter(node_id=restart.node_id, status=Restart.Status.RUNNING) \
        .exclude(pk=restart.pk).exists()


def _window_end(restart: Restart) -> datetime | None:
    """End of the occurrence of the restart's window that holds its time, if any."""
    due = restart.scheduled_for or restart.requested_at
    if restart.window is None:
        return None
    try:
        occurrence = current_or_next(restart.window, due)
    except ValueError:
        return None  # edited into something unreadable: no bound to hold it to
    if occurrence is None or not occurrence.contains(due):
        return None
    return occurrence.end


def cancel_restart(restart: Restart, reason: str, now: datetime, *, actor: str) -> bool:
    """``scheduled`` → ``cancelled`` with ``reason`` (audited, with a warning event); whether
    this call cancelled it (False when it was no longer scheduled)."""
    return end_unstarted(restart, Restart.Status.CANCELLED, reason, now, actor=actor)


# How an unstarted restart's end is worded: (outcome prefix, audit word, event kind, event words).
_UNSTARTED_ENDS = {
    Restart.Status.CANCELLED: ("Not started", "cancelled", "restart-cancelled", "not started"),
    Restart.Status.REFUSED: ("Refused", "refused", "restart-refused", "refused"),
}


def end_unstarted(restart: Restart, status: str, reason: str, now: datetime, *,
                  actor: str) -> bool:
    """End a still ``scheduled`` restart as ``status`` (cancelled or refused) with ``reason``:
    the row, an audit entry and a warning event. Whether this call ended it (False when it was
    no longer scheduled: another worker got there first)."""
    prefix, word, kind, event_words = _UNSTARTED_ENDS[status]
    ended = Restart.objects.filter(pk=restart.pk, status=Restart.Status.SCHEDULED).update(
        status=status, finished_at=now, outcome=f"{prefix}: {reason}.")
    if ended:
        audit(RUN_ACTION, allowed=False, actor=actor, node=restart.node, engine=restart.engine,
              restart=restart, outcome=f"{word}: {reason}")
        Event.objects.create(node=restart.node, engine=restart.engine, at=now, kind=kind,
                             severity=Event.Severity.WARNING,
                             message=f"{restart.engine.name}: planned restart {event_words}: "
                                     f"{reason}.")
    return bool(ended)


def _observed_state(engine: Engine, api: docker.DockerClient | None,
                    api_error: str) -> dict[str, Any]:
    if api is not None:
        try:
            return {**container_status(api, engine.container_id).as_dict(), "source": "live"}
        except ContainerEngineError as error:
            api_error = str(error)
    engine.refresh_from_db()
    return {"state": engine.container_state, "running": engine.container_state == "running",
            "exists": engine.present, "exit_code": engine.exit_code,
            "started_at": engine.started_at.isoformat() if engine.started_at else None,
            "source": "last collection",
            "as_of": engine.last_seen.isoformat() if engine.last_seen else None,
            **({"error": api_error} if api_error else {})}


def _interrupted_outcome(restart: Restart, state: dict[str, Any]) -> str:
    beat = restart.heartbeat_at or restart.started_at
    when = f"{beat:%H:%M:%S} UTC" if beat else "an unknown time"
    if state.get("running"):
        container = "running"
    elif state.get("exists") is False:
        container = "gone"
    else:
        container = f"{state.get('state') or 'unknown'} (exit code {state.get('exit_code')})"
    source = "" if state.get("source") == "live" else " as last collected"
    return (f"Interrupted: {restart.worker or 'its worker'} stopped reporting during step "
            f"'{restart.phase or '?'}' (last heartbeat {when}). The container is "
            f"{container}{source}; check the engine before planning again.")


def _duration(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds >= 3600:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min"
    return f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"
