"""Planning restarts: the expected outage, the checks a plan must pass, and the node's queue.

Every restart on a GB10 is a planned outage: an engine takes about ten minutes to start, so a
plan says when the engine will be back ("back by 03:22") and is refused when that is later than
the end of its window. Two engines never start together on one node: the runbook carries plans out
one after the other, and :func:`queue_forecast` shows what that means for each plan's start.

A plan may carry a change of the engine's flags (:class:`dashboard.restarts.change.FlagChange`):
the fit planner (:mod:`collectors.fitplan`) then judges the new flags on the node's ledger with
the margin the caller passes, and the plan keeps the predicted after-ledger for the pages and
the runbook's pre-check (``Restart.change``).

Every decision here (allowed or refused) leaves an audit row (``dashboard.audit.records``).
Carrying a plan out is the runbook's job (``dashboard.restarts.tasks``); a new plan only nudges it.
In read-only mode (``SPARKOPS_READ_ONLY``) every plan is refused, saying so, before anything else
is looked at; cancelling stays allowed.
"""

from __future__ import annotations

import logging
import math
import statistics
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Coalesce
from django.utils import timezone
from kombu.exceptions import OperationalError

from collectors.docker_api import (
    COMPOSE_PROJECT_LABEL,
    READ_ONLY_TEXT,
    read_only,
    recreation_refused,
)
from collectors.fitplan import PlanError, PlanRequest
from collectors.fitplan import plan as plan_fit
from collectors.models import Engine, Node
from collectors.starts import history_for
from dashboard.audit.records import audit
from dashboard.restarts.change import (
    MODES,
    RECREATE,
    FlagChange,
    command_words,
    has_masked_secret,
    ledger_summary,
    refusal_at_planning,
    shown_command,
)
from dashboard.restarts.groups import rank_refusal, ranks_to_restart
from dashboard.restarts.models import DEFAULT_STARTUP_SECONDS, Restart, RestartWindow
from dashboard.restarts.windows import (
    WindowOccurrence,
    current_or_next,
    resolve_zone,
    window_containing,
)
from sparkops.timetext import ceil_minute, clock_text

__all__ = [
    "CANCEL_ACTION",
    "NOT_MANAGED",
    "PERMISSION",
    "PLAN_ACTION",
    "READ_ONLY",
    "Outage",
    "PermissionMissing",
    "PlanRefused",
    "QueuedRestart",
    "can_run_restarts",
    "cancel_restart",
    "ceil_minute",
    "check_change",
    "clock",
    "expected_outage",
    "learned_startup_seconds",
    "plan_restart",
    "queue_forecast",
]

log = logging.getLogger(__name__)

PERMISSION = "restarts.run_restarts"
PLAN_ACTION = "plan-restart"
CANCEL_ACTION = "cancel-restart"
NOT_MANAGED = ("not enabled for management: add the label sparkops.manage=true or enable it in "
               "SparkOps")
READ_ONLY = f"{READ_ONLY_TEXT}; turn SPARKOPS_READ_ONLY off to plan restarts"
DEFAULT_SOURCE = "default (no history yet)"
# The learned startup is the median of this many latest measured starts: enough to shrug off one
# slow start after a driver update, few enough to follow a change of model or flags.
LEARN_FROM_LATEST = 5
OPEN_STATUSES = (Restart.Status.SCHEDULED, Restart.Status.RUNNING)
# A start time picked in a form at 03:00 and submitted at 03:00:40 is "now", not "in the past".
PAST_SLACK = timedelta(minutes=1)


class PlanRefused(Exception):
    """A plan or a cancellation was refused; ``reason`` is shown to the admin and audited."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class PermissionMissing(PlanRefused):
    """The user lacks ``restarts.run_restarts`` (a page answers 403)."""


@dataclass(frozen=True)
class Outage:
    """What a restart starting at some instant is expected to cost.

    ``drain_seconds`` is the drain timeout (the worst case: requests still running are waited for
    up to it); ``startup_seconds`` the learned startup, ``source`` where that figure comes from.
    """

    drain_seconds: int
    startup_seconds: int
    source: str
    back_by: datetime

    @property
    def total_seconds(self) -> int:
        return self.drain_seconds + self.startup_seconds


@dataclass(frozen=True)
class QueuedRestart:
    """One open restart of a node as the serialised runbook will carry it out.

    ``expected_start`` is ``max(its own time, now, the previous one's expected back-by)``;
    ``waits_for`` is the restart ahead of it when that pushes its start later.
    ``window_end`` is the end of the window occurrence it was planned in (None without one).
    """

    restart: Restart
    expected_start: datetime
    expected_back_by: datetime
    waits_for: Restart | None
    window_end: datetime | None

    @property
    def overruns_window(self) -> bool:
        return self.window_end is not None and self.expected_back_by > self.window_end


def can_run_restarts(user: Any) -> bool:
    """May ``user`` plan, cancel and run restarts? (Superusers always may.)"""
    return bool(getattr(user, "is_authenticated", False) and user.has_perm(PERMISSION))


def learned_startup_seconds(engine: Engine) -> tuple[float, str]:
    """``(seconds, source)``: the median measured startup of ``engine``'s latest starts.

    Counted: succeeded planned restarts and unplanned ones that recorded a startup, the latest
    :data:`LEARN_FROM_LATEST`. Without any, :data:`DEFAULT_STARTUP_SECONDS` ("about ten
    minutes") with source "default (no history yet)". One query.
    """
    measured = list(
        Restart.objects.filter(engine=engine, startup_seconds__gt=0)
        .filter(Q(kind=Restart.Kind.PLANNED, status=Restart.Status.SUCCEEDED)
                | Q(kind=Restart.Kind.UNPLANNED))
        .annotate(measured_at=Coalesce("finished_at", "started_at", "requested_at"))
        .order_by("-measured_at", "-pk")
        .values_list("startup_seconds", flat=True)[:LEARN_FROM_LATEST]
    )
    if not measured:
        return float(DEFAULT_STARTUP_SECONDS), DEFAULT_SOURCE
    count = len(measured)
    return float(statistics.median(measured)), f"median of {count} start{'s' * (count != 1)}"


def expected_outage(engine: Engine, start: datetime) -> Outage:
    """The outage of restarting ``engine`` at ``start``: drain timeout + learned startup."""
    startup, source = learned_startup_seconds(engine)
    drain = math.ceil(settings.SPARKOPS_RESTART_DRAIN_TIMEOUT_SECONDS)
    startup_seconds = math.ceil(startup)
    back_by = start + timedelta(seconds=drain + startup_seconds)
    return Outage(drain_seconds=drain, startup_seconds=startup_seconds, source=source,
                  back_by=back_by)


def plan_restart(engine: Engine, *, user: Any, start: datetime | None = None,
                 window: RestartWindow | None = None, now: datetime,
                 reason: str = "", change: FlagChange | None = None) -> Restart:
    """Plan a restart of ``engine`` and return the ``scheduled`` :class:`Restart`.

    When: ``start`` and ``window`` both None means now. With ``window`` only, the current
    occurrence from now if the outage still fits in it, else the next occurrence. With ``start``
    (and optionally ``window``), that instant, which must lie inside an occurrence of the window
    (or of any window of the engine). The outage counts the node's queue: a plan waits for the
    restarts ahead of it.

    Raises :class:`PlanRefused` (or :class:`PermissionMissing`) with the reason: no permission,
    engine not manageable or not present, another open restart of the engine, a time outside any
    window, or an expected back-by later than the window's end. Every outcome is audited
    ("plan-restart"). On success the runbook is asked to look at due plans after the commit.
    In read-only mode every plan is refused (:data:`READ_ONLY`).

    With ``change`` the plan also carries the engine's next flags (:func:`check_change`): it is
    refused when the fit planner cannot read them, predicts the engine would not start or the
    host would run out of memory, or predicts a squeeze the admin did not accept; "recreate"
    is refused for a container that compose owns.
    """
    try:
        with transaction.atomic():
            restart = _plan(engine, user=user, start=start, window=window, now=now,
                            reason=reason, change=change)
    except PlanRefused as refused:
        # Outside the rolled-back transaction, so the refusal is kept.
        audit(PLAN_ACTION, allowed=False, user=user, node=engine.node, engine=engine,
              outcome=refused.reason, details={**_asked(start, window), **_asked_change(change)})
        raise
    transaction.on_commit(_dispatch_due_restarts)
    return restart


def cancel_restart(restart: Restart, user: Any, *, now: datetime | None = None) -> Restart:
    """Cancel a ``scheduled`` restart; refused (and audited) for anything else or without
    permission. The conditional update loses cleanly against a worker starting it meanwhile."""
    now = now or timezone.now()
    try:
        _require_permission(user)
        if restart.part_of_id is not None:
            raise PlanRefused(f"this restart is the part on {restart.node.name} of restart "
                              f"#{restart.part_of_id} of an engine that spans nodes; cancel "
                              "that one, and its parts are cancelled with it")
        with transaction.atomic():
            cancelled = Restart.objects.filter(pk=restart.pk, status=Restart.Status.SCHEDULED) \
                .update(status=Restart.Status.CANCELLED, finished_at=now,
                        outcome=f"cancelled by {_name(user)}")
            if cancelled:
                Restart.objects.filter(part_of=restart, status=Restart.Status.SCHEDULED).update(
                    status=Restart.Status.CANCELLED, finished_at=now,
                    outcome=f"cancelled by {_name(user)} with its head's restart "
                            f"#{restart.pk}")
        restart.refresh_from_db()
        if not cancelled:
            raise PlanRefused(f"only a scheduled restart can be cancelled; this one is "
                              f"{restart.status}")
    except PlanRefused as refused:
        audit(CANCEL_ACTION, allowed=False, user=user, node=restart.node, engine=restart.engine,
              restart=restart, outcome=refused.reason)
        raise
    audit(CANCEL_ACTION, allowed=True, user=user, node=restart.node, engine=restart.engine,
          restart=restart, outcome=restart.outcome)
    return restart


def queue_forecast(node: Node, now: datetime) -> list[QueuedRestart]:
    """The node's open restarts in the order the runbook will run them, with expected times.

    The running one first (back by its start + expected outage, or now if it is late), then
    scheduled ones by time: each starts at ``max(its time, now, previous expected back-by)``.
    """
    rows = list(Restart.objects.filter(node=node, status__in=OPEN_STATUSES)
                .select_related("engine", "window"))
    rows.sort(key=lambda r: (r.status != Restart.Status.RUNNING,
                             r.scheduled_for or r.requested_at, r.pk))
    queue: list[QueuedRestart] = []
    for restart in rows:
        queue.append(_queued(restart, queue[-1] if queue else None, now))
    return queue


def clock(at: datetime, zone: tzinfo | str, *, round_up: bool = False) -> str:
    """``at`` as "HH:MM KST" in ``zone``; ``round_up`` for promises ("back by"), never
    optimistic."""
    if isinstance(zone, str):
        zone = resolve_zone(zone)
    return clock_text(at, zone, round_up=round_up)


def check_change(engine: Engine, change: FlagChange) -> dict[str, Any]:
    """The ``Restart.change`` of a plan of ``engine`` with ``change``, once the fit planner
    allows it on the node's ledger (the start planned after the runbook's page-cache drop);
    raises :class:`PlanRefused` with the reason otherwise. Reads the node's engines (one
    query); the node's ledger comes with ``engine.node``."""
    if change.mode not in MODES:
        raise PlanRefused(f"unknown way to apply the new flags {change.mode!r}: choose "
                          f"{' or '.join(MODES)}")
    try:
        words = command_words(change.command)
    except PlanError as error:
        raise PlanRefused(f"the new flags cannot be planned: {error}") from None
    if change.mode == RECREATE:
        _refuse_recreation(engine, words)
    engines = list(Engine.objects.filter(node=engine.node, present=True))
    try:
        predicted = plan_fit(engine.node, engines, PlanRequest(
            engine.name, change.command, drop_page_cache=True,
            history=history_for(engine, engine.node)), change.margin_bytes)
    except PlanError as error:
        raise PlanRefused(f"the new flags cannot be planned: {error}") from None
    refusal = refusal_at_planning(predicted, accept_squeeze=change.accept_squeeze)
    if refusal:
        raise PlanRefused(refusal)
    return {"command": words, "mode": change.mode, "margin_bytes": change.margin_bytes,
            "accept_squeeze": change.accept_squeeze, "planned": ledger_summary(predicted)}


def _refuse_recreation(engine: Engine, words: list[str]) -> None:
    refused = recreation_refused()
    if refused:
        raise PlanRefused(refused)
    project = (engine.labels or {}).get(COMPOSE_PROJECT_LABEL)
    if project:
        raise PlanRefused(f"{engine.name} belongs to compose project {project} (label "
                          f"{COMPOSE_PROJECT_LABEL}): SparkOps does not recreate it behind "
                          "compose's back; change the compose file, recreate it through compose "
                          "and plan the restart with \"note\"")
    if has_masked_secret(words):
        raise PlanRefused("the new command holds a value SparkOps masked (copied from a page): "
                          "write the secret's real value, or plan with \"note\"")


def _plan(engine: Engine, *, user: Any, start: datetime | None, window: RestartWindow | None,
          now: datetime, reason: str, change: FlagChange | None) -> Restart:
    _require_permission(user)
    if read_only():
        raise PlanRefused(READ_ONLY)
    # Lock the engine and (through the join) its node: two plans on one node at once cannot both
    # pass the checks below (one open plan per engine; the queue each one waits behind).
    engine = (Engine.objects.select_for_update().select_related("node").filter(pk=engine.pk)
              .first())
    if engine is None:
        raise PlanRefused("the engine no longer exists")
    if not engine.manageable:
        raise PlanRefused(NOT_MANAGED)
    if not engine.present:
        raise PlanRefused(f"{engine.name} is not present on {engine.node.name}: its container is "
                          "gone")
    _refuse_second_open_plan(engine)
    ranks = _ranks_with(engine, change)
    stored_change = check_change(engine, change) if change is not None else {}
    queued = _fitting_slot(engine, start, window, now)
    slot = queued.slot
    restart = Restart.objects.create(
        node=engine.node, engine=engine, kind=Restart.Kind.PLANNED,
        status=Restart.Status.SCHEDULED, window=slot.window, requested_at=now,
        requested_by=user if getattr(user, "is_authenticated", False) else None, reason=reason,
        scheduled_for=slot.start, expected_drain_seconds=queued.outage.drain_seconds,
        expected_startup_seconds=queued.outage.startup_seconds,
        expected_back_by=queued.outage.back_by, change=stored_change,
    )
    parts = [Restart.objects.create(
        node=rank.node, engine=rank, kind=Restart.Kind.PLANNED, status=Restart.Status.SCHEDULED,
        requested_at=now, requested_by=restart.requested_by, reason=reason,
        scheduled_for=restart.scheduled_for, expected_drain_seconds=restart.expected_drain_seconds,
        expected_startup_seconds=restart.expected_startup_seconds,
        expected_back_by=restart.expected_back_by, part_of=restart) for rank in ranks]
    spanning = {"parts": [{"restart": p.pk, "engine": p.engine.name, "node": p.node.name}
                          for p in parts]} if parts else {}
    audit(PLAN_ACTION, allowed=True, user=user, node=engine.node, engine=engine, restart=restart,
          outcome=f"scheduled for {restart.scheduled_for.isoformat()}",
          details={**_asked(start, window), **queued.as_details(), **_asked_change(change),
                   **_planned_verdict(stored_change), **spanning})
    return restart


def _ranks_with(engine: Engine, change: FlagChange | None) -> list[Engine]:
    """The ranks that restart with ``engine`` (dashboard.restarts.groups): none for an engine
    on one node; refused for a rank whose head is present, for a head with a rank that cannot
    restart, and for a change of flags, which is not planned across nodes."""
    refused = rank_refusal(engine)
    if refused:
        raise PlanRefused(refused)
    ranks, why = ranks_to_restart(engine)
    if why:
        raise PlanRefused(f"{engine.name} spans nodes and {why}")
    if ranks and change is not None:
        raise PlanRefused(f"{engine.name} spans nodes: a change of its flags is not planned "
                          "here (every rank's command would change with it); recreate its "
                          "containers with the new flags and plan a restart without a change")
    return ranks


@dataclass(frozen=True)
class _Slot:
    """When a plan asks to start, and the window occurrence that allows it (None for "now")."""

    start: datetime
    occurrence: WindowOccurrence | None

    @property
    def window(self) -> RestartWindow | None:
        return self.occurrence.window if self.occurrence else None


@dataclass(frozen=True)
class _Queued:
    """A slot's outage once the restarts ahead of it on the node are counted."""

    slot: _Slot
    expected_start: datetime
    waits_for: Restart | None
    outage: Outage

    def problem(self) -> str | None:
        occurrence = self.slot.occurrence
        if occurrence is None or self.outage.back_by <= occurrence.end:
            return None
        zone = occurrence.window.time_zone if occurrence.window else UTC
        problem = (f"expected back by {clock(self.outage.back_by, zone, round_up=True)} but the "
                   f"window ends at {clock(occurrence.end, zone)}")
        if self.waits_for is not None:
            problem += (f" (it waits for the restart of {self.waits_for.engine.name} until "
                        f"{clock(self.expected_start, zone, round_up=True)})")
        return problem

    def as_details(self) -> dict[str, Any]:
        occurrence = self.slot.occurrence
        return {
            "expected_start": self.expected_start.isoformat(),
            "expected_back_by": self.outage.back_by.isoformat(),
            "drain_seconds": self.outage.drain_seconds,
            "startup_seconds": self.outage.startup_seconds,
            "startup_source": self.outage.source,
            "waits_for": self.waits_for.pk if self.waits_for else None,
            "window_end": occurrence.end.isoformat() if occurrence else None,
        }


def _fitting_slot(engine: Engine, start: datetime | None, window: RestartWindow | None,
                  now: datetime) -> _Queued:
    """The first candidate slot whose outage fits its window; else refuse with the last reason."""
    forecast = queue_forecast(engine.node, now)
    problem = ""
    for slot in _candidate_slots(engine, start, window, now):
        queued = _queue_behind(engine, slot, forecast)
        problem = queued.problem() or ""
        if not problem:
            return queued
    raise PlanRefused(problem)


def _candidate_slots(engine: Engine, start: datetime | None, window: RestartWindow | None,
                     now: datetime) -> list[_Slot]:
    if start is not None:
        if start < now - PAST_SLACK:
            raise PlanRefused(f"{_local(start)} is in the past")
        start = max(start, now)
    if window is None:
        return [_slot_in_any_window(engine, start)] if start is not None else [_Slot(now, None)]
    _refuse_foreign_window(engine, window)
    if start is not None:
        return [_slot_in_window(window, start)]
    return _openings_from(window, now)


def _slot_in_any_window(engine: Engine, start: datetime) -> _Slot:
    occurrence = window_containing(engine.node, engine, start)
    if occurrence is None:
        raise PlanRefused(f"{_local(start)} is not inside a restart window of {engine.name}: "
                          "plan it in a window, or now")
    return _Slot(start, occurrence)


def _slot_in_window(window: RestartWindow, start: datetime) -> _Slot:
    occurrence = current_or_next(window, start)
    if occurrence is None or not occurrence.contains(start):
        raise PlanRefused(f"{_local(start)} is not inside window {window.name}")
    return _Slot(start, occurrence)


def _openings_from(window: RestartWindow, now: datetime) -> list[_Slot]:
    """The rest of the occurrence open now (if any), then the next whole one."""
    current = current_or_next(window, now)
    if current is None:
        raise PlanRefused(f"window {window.name} has no occurrence from now on")
    if not current.contains(now):
        return [_Slot(current.start, current)]
    following = current_or_next(window, current.end)
    slots = [_Slot(now, current)]
    if following is not None:
        slots.append(_Slot(max(following.start, now), following))
    return slots


def _queue_behind(engine: Engine, slot: _Slot, forecast: list[QueuedRestart]) -> _Queued:
    # The forecast is sorted by time, so the restarts ahead of this slot are a prefix of it; the
    # last of them is the one it waits for.
    ahead = [entry for entry in forecast
             if entry.restart.status == Restart.Status.RUNNING
             or (entry.restart.scheduled_for or entry.expected_start) <= slot.start]
    previous = ahead[-1] if ahead else None
    expected_start = slot.start
    waits_for = None
    if previous is not None and previous.expected_back_by > slot.start:
        expected_start, waits_for = previous.expected_back_by, previous.restart
    return _Queued(slot=slot, expected_start=expected_start, waits_for=waits_for,
                   outage=expected_outage(engine, expected_start))


def _queued(restart: Restart, previous: QueuedRestart | None, now: datetime) -> QueuedRestart:
    outage = timedelta(seconds=restart.expected_drain_seconds + restart.expected_startup_seconds)
    if restart.status == Restart.Status.RUNNING:
        started = restart.started_at or now
        # Still running past its expectation: it is back no earlier than now.
        return QueuedRestart(restart=restart, expected_start=started,
                             expected_back_by=max(started + outage, now), waits_for=None,
                             window_end=_window_end(restart))
    own = restart.scheduled_for or restart.requested_at
    expected_start = max(own, now)
    waits_for = None
    if previous is not None and previous.expected_back_by > expected_start:
        expected_start, waits_for = previous.expected_back_by, previous.restart
    return QueuedRestart(restart=restart, expected_start=expected_start,
                         expected_back_by=expected_start + outage, waits_for=waits_for,
                         window_end=_window_end(restart))


def _window_end(restart: Restart) -> datetime | None:
    """End of the occurrence of the restart's window that holds its scheduled time, if any."""
    if restart.window is None or restart.scheduled_for is None:
        return None
    try:
        occurrence = current_or_next(restart.window, restart.scheduled_for)
    except ValueError:
        return None  # the window was edited into something unreadable; nothing to compare
    if occurrence is None or not occurrence.contains(restart.scheduled_for):
        return None
    return occurrence.end


def _refuse_second_open_plan(engine: Engine) -> None:
    existing = Restart.objects.filter(engine=engine, status__in=OPEN_STATUSES).first()
    if existing is not None:
        raise PlanRefused(f"{engine.name} already has a {existing.status} restart (#{existing.pk}"
                          "); cancel it or wait for it to finish")


def _refuse_foreign_window(engine: Engine, window: RestartWindow) -> None:
    if window.node_id != engine.node_id or window.engine_id not in (None, engine.pk):
        raise PlanRefused(f"window {window.name} does not apply to {engine.name}")
    if not window.enabled:
        raise PlanRefused(f"window {window.name} is disabled")


def _require_permission(user: Any) -> None:
    if not can_run_restarts(user):
        raise PermissionMissing(f"{_name(user)} lacks the permission {PERMISSION}")


def _asked(start: datetime | None, window: RestartWindow | None) -> dict[str, Any]:
    details: dict[str, Any] = {"window": window.pk if window else None}
    if start is not None:
        return {**details, "start": start.isoformat()}
    return {**details, "start": "now" if window is None else "next opening"}


def _asked_change(change: FlagChange | None) -> dict[str, Any]:
    """The change a plan asked for, as its audit row keeps it (secrets masked)."""
    if change is None:
        return {}
    try:
        command = shown_command(command_words(change.command))
    except PlanError:
        command = "(unreadable)"
    return {"change": {"command": command, "mode": change.mode,
                       "margin_bytes": change.margin_bytes,
                       "accept_squeeze": change.accept_squeeze}}


def _planned_verdict(stored: dict[str, Any]) -> dict[str, Any]:
    planned = stored.get("planned") or {}
    return {"predicted": planned["verdict"]} if planned else {}


def _local(at: datetime) -> str:
    return f"{timezone.localtime(at):%Y-%m-%d %H:%M} {timezone.get_current_timezone_name()}"


def _name(user: Any) -> str:
    if getattr(user, "is_authenticated", False):
        return user.get_username()
    return "an anonymous user"


def _dispatch_due_restarts() -> None:
    """Nudge the runbook to look at due plans now; never fails the request that planned.

    If the task cannot be imported or the broker is down, the periodic dispatch (beat) finds the
    plan anyway, a little later.
    """
    try:
        from dashboard.restarts.tasks import dispatch_due_restarts
    except ImportError:
        log.warning("restart dispatch task unavailable; the periodic dispatch will find the plan",
                    exc_info=True)
        return
    try:
        dispatch_due_restarts.delay()
    except OperationalError as error:
        log.warning("broker unreachable (%s); the periodic dispatch will find the plan", error)
