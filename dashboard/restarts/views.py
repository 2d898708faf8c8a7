"""Restart pages: windows, plans, the live runbook and the ledger; thin adapters over
``dashboard.restarts.windows`` and ``dashboard.restarts.planning``.

Everyone logged in can read them. Changing anything is a POST with CSRF: a plan or a
cancellation needs ``restarts.run_restarts``, a window ``restarts.change_windows``. A plan may
carry the engine's new launch command (the plan form, or the fit planner page's "Plan this
restart with these flags", which posts here); it is checked with the prefill margin in force,
which the pages register (:func:`dashboard.restarts.change.use_prefill_margin`). Anyone else
gets 403, and the refusal is audited. The forms themselves (GET) need the permission too,
without an audit row: looking is no action. Audit rows carry the request's client address.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from functools import wraps
from typing import Any, NoReturn
from zoneinfo import ZoneInfo

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from collectors.models import Engine, Node
from dashboard.audit.access import CHANGE_WINDOWS, guarded
from dashboard.audit.models import AuditEntry
from dashboard.audit.records import audit, audit_request, from_request
from dashboard.restarts.change import (
    MODES,
    FlagChange,
    current_prefill_margin,
    flag_differences,
    planned_ledger,
    shown_command,
)
from dashboard.restarts.forms import PlanForm, RestartWindowForm, plannable_engines
from dashboard.restarts.models import Restart, RestartStep, RestartWindow
from dashboard.restarts.planning import (
    PERMISSION,
    PLAN_ACTION,
    PermissionMissing,
    PlanRefused,
    QueuedRestart,
    can_run_restarts,
    cancel_restart,
    expected_outage,
    plan_restart,
    queue_forecast,
)
from dashboard.restarts.windows import current_or_next, resolve_zone
from sparkops.timetext import ceil_minute, clock_text, moment_text, span_text
from sparkops.units import fixed_gib_text, gib

# How many finished restarts the ledger and the chart show; older ones stay in the database.
HISTORY_LIMIT = 100
CHART_LIMIT = 500
CREATE_WINDOW_ACTION = "create-window"
EDIT_WINDOW_ACTION = "edit-window"
OPEN_STATUSES = (Restart.Status.SCHEDULED, Restart.Status.RUNNING)
# Step names the runbook records (dashboard.restarts.runbook.STEPS) that the progress reads.
DRAIN_STEP = "drain"
START_STEP = "start"

View = Callable[..., HttpResponse]


def change_permission_required(view: View) -> View:
    """Login first (redirect); without ``restarts.run_restarts`` a GET is 403. POSTs are checked
    (and a refusal audited) by the view itself, which knows what was asked."""

    @login_required
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if request.method != "POST" and not can_run_restarts(request.user):
            raise PermissionDenied(f"{request.user.get_username()} lacks the permission to "
                                   f"plan and run engine restarts ({PERMISSION})")
        return view(request, *args, **kwargs)

    return wrapper


# --- restarts ------------------------------------------------------------------------------------

@login_required
def restarts(request: HttpRequest) -> HttpResponse:
    """Running restarts (live), each node's queue of plans, and the ledger with its chart."""
    now = timezone.now()
    nodes = Node.objects.all()
    chosen = nodes.filter(name=request.GET.get("node", "")).first()
    listed = Restart.objects.select_related("node", "engine", "window", "requested_by")
    if chosen is not None:
        listed = listed.filter(node=chosen)
    open_nodes = [chosen] if chosen else list(
        nodes.filter(restarts__status__in=OPEN_STATUSES).distinct())
    queues = [(node, [_queue_row(entry) for entry in queue_forecast(node, now)])
              for node in open_nodes]
    # A restart of an engine that spans nodes is one outage: its head's row, with its parts on
    # the ranks' nodes under it (dashboard.restarts.groups).
    finished = (listed.exclude(status__in=OPEN_STATUSES).filter(part_of__isnull=True)
                .prefetch_related("parts__node", "parts__engine")
                .order_by("-requested_at", "-pk"))
    return render(request, "restarts/restarts.html", {
        "nodes": nodes,
        "chosen": chosen,
        "plan_nodes": [chosen] if chosen else list(nodes),
        "running": [_progress_row(r, now) for r in listed.filter(status=Restart.Status.RUNNING)],
        "queues": [(node, rows) for node, rows in queues if rows],
        "ledger": [_ledger_row(r) for r in finished[:HISTORY_LIMIT]],
        "history_limit": HISTORY_LIMIT,
        "chart": startup_history(listed.filter(part_of__isnull=True), CHART_LIMIT),
        "can_change": can_run_restarts(request.user),
    })


@login_required
def restart_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """One restart: the plan, the live runbook (steps, phase, elapsed, remaining) and its audit."""
    found = get_object_or_404(Restart.objects.select_related(
        "node", "engine", "window", "requested_by", "part_of__node", "part_of__engine"), pk=pk)
    now = timezone.now()
    queued = next((e for e in queue_forecast(found.node, now) if e.restart.pk == found.pk), None)
    return render(request, "restarts/restart.html", {
        "restart": found,
        "progress": restart_progress(found, now),
        "queued": _queue_row(queued) if queued else None,
        "ledger": _ledger_row(found),
        "audit": found.audit.select_related("user").order_by("at", "pk"),
        "change": change_summary(found),
        "json_url": reverse("dashboard:restart-json", args=[found.pk]),
        "can_cancel": found.status == Restart.Status.SCHEDULED and found.part_of_id is None
        and can_run_restarts(request.user),
    })


@login_required
def restart_json(request: HttpRequest, pk: int) -> JsonResponse:
    """The live runbook of one restart, polled by its page while it runs."""
    found = get_object_or_404(Restart.objects.select_related("node", "engine"), pk=pk)
    return JsonResponse(restart_progress(found, timezone.now()))


@change_permission_required
def restart_plan(request: HttpRequest, node: str) -> HttpResponse:
    """GET: the plan form for one node with each engine's expected outage; POST: plan it."""
    watched = get_object_or_404(Node, name=node)
    now = timezone.now()
    if request.method != "POST":
        return _plan_page(request, PlanForm(node=watched, now=now), now)
    if not can_run_restarts(request.user):
        _deny(request, PLAN_ACTION, node=watched, engine=_posted_engine(request, watched))
    form = PlanForm(request.POST, node=watched, now=now)
    if not form.is_valid():
        return _plan_page(request, form, now, status=400)
    data = form.cleaned_data
    try:
        change = _flag_change(request, data)
        with from_request(request):
            planned = plan_restart(data["engine"], user=request.user, start=data["start_at"],
                                   window=data["window"], now=now, reason=data["reason"],
                                   change=change)
    except PlanRefused as refused:
        form.add_error(None, f"Refused: {refused.reason}.")
        return _plan_page(request, form, now, status=409)
    viewer = timezone.get_current_timezone()
    messages.success(request, f"Restart of {planned.engine.name} planned for "
                              f"{moment_text(planned.scheduled_for, viewer)}; expected back by "
                              f"{clock_text(planned.expected_back_by, viewer, round_up=True)}.")
    return redirect("dashboard:restart", pk=planned.pk)


@require_POST
@login_required
def restart_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    found = get_object_or_404(Restart.objects.select_related("node", "engine"), pk=pk)
    try:
        with from_request(request):
            cancel_restart(found, request.user, now=timezone.now())
    except PermissionMissing as refused:
        raise PermissionDenied(refused.reason) from None
    except PlanRefused as refused:
        messages.error(request, f"Not cancelled: {refused.reason}.")
    else:
        messages.success(request, f"Restart #{found.pk} of {found.engine.name} cancelled.")
    return redirect("dashboard:restart", pk=found.pk)


def _flag_change(request: HttpRequest, data: dict[str, Any]) -> FlagChange | None:
    """The change of flags a plan form asked for, with the prefill margin in force; refused
    (and audited) when no margin is known."""
    asked = data["change"]
    if asked is None:
        return None
    margin = current_prefill_margin()
    if margin is None:
        reason = ("the prefill margin the new flags are checked with is not known (the pages "
                  "did not register the prefill-squeeze alert's)")
        audit_request(request, PLAN_ACTION, allowed=False, node=data["engine"].node,
                      engine=data["engine"], outcome=reason)
        raise PlanRefused(reason)
    return FlagChange(command=asked["command"], mode=asked["mode"], margin_bytes=margin,
                      accept_squeeze=asked["accept_squeeze"])


def change_summary(restart: Restart) -> dict[str, Any] | None:
    """What the restart page shows of a plan's change of flags (None without one): the intended
    command (secrets masked) and how its flags differ from the engine's command now, the mode,
    the margin, the after-ledger as planned, and after a run what the pre-check found and which
    flags the engine then ran."""
    change = restart.change or {}
    if not change:
        return None
    intended = change.get("command") or []
    differences, unreadable = flag_differences(restart.engine.command or [], intended)
    steps = {step.step: step for step in restart.steps.all()}
    precheck = steps.get("precheck")
    found = (precheck.data or {}).get("change") if precheck is not None else None
    record = steps.get("record")
    return {
        "mode": change.get("mode", ""),
        "mode_text": MODES.get(change.get("mode", ""), change.get("mode", "")),
        "command": shown_command(intended),
        "differences": differences,
        "unreadable": unreadable,
        "margin": fixed_gib_text(change["margin_bytes"]) if "margin_bytes" in change else "",
        "accept_squeeze": bool(change.get("accept_squeeze")),
        "planned": planned_ledger(change.get("planned")),
        "prechecked": planned_ledger(found.get("plan")) if found else None,
        "precheck_error": (found or {}).get("error", ""),
        "precheck_message": precheck.message if precheck is not None else "",
        "flags_after": (record.data or {}).get("flags") if record is not None else None,
    }


def restart_progress(restart: Restart, now: datetime) -> dict[str, Any]:
    """The JSON of ``restart-json``: status, phase, times, expected remaining, and the steps.

    ``expected_remaining_seconds`` (None unless running) follows the runbook's steps: see
    :func:`expected_remaining_seconds`. Times are ISO 8601 in UTC.
    """
    steps = list(restart.steps.all())
    expected = restart.expected_drain_seconds + restart.expected_startup_seconds
    elapsed = remaining = None
    if restart.started_at is not None:
        elapsed = ((restart.finished_at or now) - restart.started_at).total_seconds()
    if restart.status == Restart.Status.RUNNING:
        remaining = expected_remaining_seconds(restart, steps, now)
    return {
        "id": restart.pk,
        "node": restart.node.name,
        "engine": restart.engine.name,
        "kind": restart.kind,
        "status": restart.status,
        "phase": restart.phase,
        "scheduled_for": _iso(restart.scheduled_for),
        "started_at": _iso(restart.started_at),
        "finished_at": _iso(restart.finished_at),
        "elapsed_seconds": elapsed,
        "expected_seconds": expected,
        "expected_remaining_seconds": remaining,
        "expected_back_by": _iso(restart.expected_back_by),
        "deadline": _iso(restart.deadline),
        "heartbeat_at": _iso(restart.heartbeat_at),
        "outcome": restart.outcome,
        "startup_seconds": restart.startup_seconds,
        "steps": [{"step": step.step, "started_at": _iso(step.started_at),
                   "finished_at": _iso(step.finished_at), "ok": step.ok,
                   "message": step.message} for step in steps],
        "now": _iso(now),
    }


def expected_remaining_seconds(restart: Restart, steps: list[RestartStep],
                               now: datetime) -> float:
    """Seconds until a running restart is expected back, never negative.

    Once the container is started (the runbook's "start" step), the learned startup counts from
    that step; before, the drain timeout counts from the drain step (or the run's start) and the
    whole startup is still ahead. Stop, page-cache drop and re-check take seconds: not counted.
    """
    by_name = {step.step: step for step in steps}
    startup = timedelta(seconds=restart.expected_startup_seconds)
    if START_STEP in by_name:
        return max(0.0, (by_name[START_STEP].started_at + startup - now).total_seconds())
    drain = by_name.get(DRAIN_STEP)
    if drain is not None and drain.finished_at is not None:
        return startup.total_seconds()
    drain_from = drain.started_at if drain is not None else restart.started_at or now
    drain_left = drain_from + timedelta(seconds=restart.expected_drain_seconds) - now
    return max(0.0, drain_left.total_seconds()) + startup.total_seconds()


def startup_history(restarts: Any, limit: int) -> dict[str, Any]:
    """Measured startup times per engine over time, as plotly traces (minutes)."""
    measured = (restarts.filter(startup_seconds__isnull=False)
                .order_by("-requested_at", "-pk")[:limit])
    traces: dict[str, dict[str, list[Any]]] = {}
    for row in sorted(measured, key=lambda r: r.finished_at or r.started_at or r.requested_at):
        trace = traces.setdefault(f"{row.node.name}/{row.engine.name}",
                                  {"x": [], "y": [], "kind": [], "id": []})
        trace["x"].append(_iso(row.finished_at or row.started_at or row.requested_at))
        trace["y"].append(round(row.startup_seconds / 60, 2))
        trace["kind"].append(row.kind)
        trace["id"].append(row.pk)
    return {"traces": [{"name": name, **trace} for name, trace in traces.items()]}


# --- windows -------------------------------------------------------------------------------------

@login_required
def windows(request: HttpRequest) -> HttpResponse:
    """Every window with its next (or current) opening, in the viewer's zone and its own."""
    now = timezone.now()
    listed = RestartWindow.objects.select_related("node", "engine", "created_by")
    return render(request, "restarts/windows.html", {
        "rows": [_window_row(window, now) for window in listed],
        "can_change": CHANGE_WINDOWS.held_by(request.user),
    })


@guarded(CHANGE_WINDOWS, CREATE_WINDOW_ACTION)
def window_new(request: HttpRequest) -> HttpResponse:
    return _window_form(request, None)


@guarded(CHANGE_WINDOWS, EDIT_WINDOW_ACTION)
def window_edit(request: HttpRequest, pk: int) -> HttpResponse:
    return _window_form(request, get_object_or_404(RestartWindow, pk=pk))


def _window_form(request: HttpRequest, window: RestartWindow | None) -> HttpResponse:
    now = timezone.now()
    action = EDIT_WINDOW_ACTION if window else CREATE_WINDOW_ACTION
    if request.method != "POST":
        initial = {"node": request.GET["node"]} if window is None and "node" in request.GET else {}
        form = RestartWindowForm(instance=window, now=now, initial=initial)
        return _window_page(request, form, window)
    # Read before the form binds: validating a ModelForm writes into its instance.
    before = _window_summary(window) if window else None
    form = RestartWindowForm(request.POST, instance=window, now=now)
    if not form.is_valid():
        return _window_page(request, form, window, status=400)
    saved = form.save_window(request.user)
    after = _window_summary(saved)
    details: dict[str, Any] = {"window": saved.pk, **after}
    if before is not None:
        details["changed"] = {key: {"from": before[key], "to": value}
                              for key, value in after.items() if before[key] != value}
    audit(action, allowed=True, user=request.user, node=saved.node, engine=saved.engine,
          outcome=f"window {saved.name}: {saved.recurrence} for {saved.duration_minutes} min",
          details=details)
    messages.success(request, f"Window {saved.name} saved.")
    return redirect("dashboard:windows")


# --- helpers -------------------------------------------------------------------------------------

def _deny(request: HttpRequest, action: str, *, node: Node | None = None,
          engine: Engine | None = None, details: dict[str, Any] | None = None) -> NoReturn:
    """Audit a change refused for lack of permission, then answer 403."""
    reason = (f"{request.user.get_username()} lacks the permission to plan and run engine "
              f"restarts ({PERMISSION})")
    audit_request(request, action, allowed=False, node=node, engine=engine, outcome=reason,
                  details=details)
    raise PermissionDenied(reason)


def _window_summary(window: RestartWindow) -> dict[str, Any]:
    """A window's settings as an audit row records them."""
    return {"name": window.name, "node": window.node.name,
            "engine": window.engine.name if window.engine_id else None,
            "recurrence": window.recurrence, "time_zone": window.time_zone,
            "duration_minutes": window.duration_minutes, "enabled": window.enabled}


def _posted_engine(request: HttpRequest, node: Node) -> Engine | None:
    """The engine a refused POST named, for the audit row (None if it named none of node's)."""
    engine_id = request.POST.get("engine", "")
    return Engine.objects.filter(node=node, pk=engine_id).first() if engine_id.isdigit() else None


def _plan_page(request: HttpRequest, form: PlanForm, now: datetime,
               status: int = 200) -> HttpResponse:
    outages = []
    for engine in form.engines:
        outage = expected_outage(engine, now)
        outages.append({"engine": engine, "outage": outage,
                        "minutes": round(outage.total_seconds / 60, 1),
                        "back_by": ceil_minute(outage.back_by)})
    return render(request, "restarts/plan_form.html", {
        "form": form,
        "node": form.node,
        "outages": outages,
        "queue": [_queue_row(entry) for entry in queue_forecast(form.node, now)],
        "unmanaged": [e for e in Engine.objects.filter(node=form.node, present=True)
                      if e not in form.engines],
        "engines_exist": bool(plannable_engines(form.node)),
    }, status=status)


def _window_page(request: HttpRequest, form: RestartWindowForm, window: RestartWindow | None,
                 status: int = 200) -> HttpResponse:
    return render(request, "restarts/window_form.html", {
        "form": form, "window": window, "zones": RestartWindowForm.zone_names(),
    }, status=status)


def _window_row(window: RestartWindow, now: datetime) -> dict[str, Any]:
    row: dict[str, Any] = {"window": window, "error": "", "next": None, "open_now": False}
    try:
        found = current_or_next(window, now)
        zone = resolve_zone(window.time_zone)
    except ValueError as error:
        return {**row, "error": str(error)}
    if found is None:
        return row
    return {**row, "next": found, "open_now": found.contains(now),
            "local": span_text(found.start, found.end, zone),
            "viewer": span_text(found.start, found.end, timezone.get_current_timezone())}


def _queue_row(entry: QueuedRestart) -> dict[str, Any]:
    """A plan of the queue for the pages: its moments as datetimes, which the templates write in
    the viewer's zone (``when``) and, where it reads differently, in the window's (``also_in``).
    Promises (a forecast start, "back by") are rounded up to the minute."""
    restart = entry.restart
    promised_start = restart.status != Restart.Status.RUNNING
    planned_back_by = restart.expected_back_by
    return {
        "entry": entry,
        "restart": restart,
        "zone": _restart_zone(restart).key,
        "planned_for": restart.scheduled_for,
        "back_by": ceil_minute(planned_back_by) if planned_back_by else None,
        # A forecast start is rounded up like every promise here ("starts 03:11" after one "back
        # by 03:11"); a start that already happened is not.
        "expected_start": ceil_minute(entry.expected_start) if promised_start
        else entry.expected_start,
        "expected_back_by": ceil_minute(entry.expected_back_by),
        "window_end": entry.window_end,
        "startup_source": _startup_source(restart),
        "drain_minutes": round(restart.expected_drain_seconds / 60, 1),
        "startup_minutes": round(restart.expected_startup_seconds / 60, 1),
    }


def _progress_row(restart: Restart, now: datetime) -> dict[str, Any]:
    return {"restart": restart, "progress": restart_progress(restart, now),
            "json_url": reverse("dashboard:restart-json", args=[restart.pk])}


def _ledger_row(restart: Restart) -> dict[str, Any]:
    return {"restart": restart, "before": capacity_summary(restart.before),
            "after": capacity_summary(restart.after),
            "parts": sorted(restart.parts.all(), key=lambda part: (part.node.name, part.pk))}


def capacity_summary(snapshot: dict[str, Any] | None) -> str:
    """One line of what a runbook snapshot says about KV capacity and memory, "unknown" if
    nothing. Reads ``kv_cache_tokens``, ``kv_cache_gib`` (or ``kv_cache_bytes``),
    ``max_concurrency`` and ``mem_available_bytes`` when present."""
    snapshot = snapshot or {}
    parts = []
    tokens = snapshot.get("kv_cache_tokens")
    if isinstance(tokens, int | float):
        parts.append(f"{tokens / 1e6:.2f} M KV tokens")
    pool_gib = snapshot.get("kv_cache_gib")
    if pool_gib is None and isinstance(snapshot.get("kv_cache_bytes"), int | float):
        pool_gib = gib(snapshot["kv_cache_bytes"])
    if isinstance(pool_gib, int | float):
        parts.append(f"{pool_gib:.1f} GiB KV pool")
    concurrency = snapshot.get("max_concurrency")
    if isinstance(concurrency, int | float):
        parts.append(f"{concurrency:g}× max concurrency")
    available = snapshot.get("mem_available_bytes")
    if isinstance(available, int | float):
        parts.append(f"MemAvailable {fixed_gib_text(available, 1)}")
    return " · ".join(parts) or "unknown"


def _startup_source(restart: Restart) -> str:
    """Where the plan's startup figure came from, as recorded when it was planned."""
    planned = (AuditEntry.objects.filter(restart=restart, action=PLAN_ACTION, allowed=True)
               .values_list("details", flat=True).first())
    return (planned or {}).get("startup_source", "")


def _restart_zone(restart: Restart) -> ZoneInfo:
    """Times of a plan read best in its window's zone; without a window, in the site's."""
    if restart.window is not None:
        try:
            return resolve_zone(restart.window.time_zone)
        except ValueError:
            pass  # an unreadable zone must not break the page; the site's zone still reads
    return timezone.get_current_timezone()


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None
