"""The planned-restart runbook: carry out one restart of one engine safely, and record it.

On a GB10 an engine takes about ten minutes to start, page cache left in place makes it refuse to
start, dropping the cache while it runs leaves it short, and two engines starting at once break
each other's memory profiling (BRIEF). So a restart is a fixed sequence of steps, each written as
a :class:`~dashboard.restarts.models.RestartStep` with its times, result and numbers:

1. ``precheck``: will the engine's weights + KV pool (+ CUDA graphs) + prefill need fit in the
   room it would have after stopping it and dropping the page cache? If not: ``aborted``, with
   the numbers, and the container is not touched.
2. ``drain``: wait until its running and waiting requests are 0, up to
   ``SPARKOPS_RESTART_DRAIN_TIMEOUT_SECONDS`` (then go on, noting it).
3. ``stop``: stop the container (audited).
4. ``drop_caches``: drop the page cache (:mod:`dashboard.restarts.pagecache`); a refusal (the
   cooldown) or a failure is noted, not fatal: the re-check decides.
5. ``recheck``: once no neighbour is mid-startup (one still unsized after the minimum startup
   deadline ends the run), MemFree (what CUDA sees on GB10) against the need. If it does not
   fit: ``aborted`` and the container is **left stopped**. Starting it
   would fail (or, with ``--kv-cache-memory-bytes``, over-commit the host, which on GB10 wedges
   it); an engine that stays down is what the restart-failed alert is for, and
   ``container_state`` says it is stopped.
6. ``start``: start the container (audited); the startup deadline is set from here.
7. ``follow``: poll the container, its log since this start and ``/health`` until ready; each
   startup phase is recorded. ``failed`` when the container exits, the log reports a startup
   error, or the deadline passes. A failed start leaves the container as it is (a slow load may
   still finish; the admin decides), and ``container_state`` says how it is.
8. ``record``: status, outcome, measured startup (start → ready), memory and KV capacity
   before and after, container state.

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
state. A run that finds its row no longer ``running`` (someone marked it) stops at once.

While a restart is ``scheduled``, ``phase`` is "queued" once it was handed to the node's queue
(``heartbeat_at`` then says when) and "waiting" when a claim found the node busy.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import docker
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Exists, Max, OuterRef, Q
from django.db.models.functions import Coalesce

from collectors.docker_api import (
    ContainerEngineError,
    ContainerStatus,
    container_logs_since,
    container_status,
    start_container,
    stop_container,
)
from collectors.httpfetch import FetchError, fetch
from collectors.ledger import EngineShare, engine_share
from collectors.meminfo import MemInfo, parse_meminfo
from collectors.models import Engine, Event
from collectors.nodes import local_procfs
from collectors.procfs import Procfs, ProcfsError
from collectors.sampling import Clock
from collectors.vllm.logs import StartupLog, parse_startup_log
from collectors.vllm.scrape import ScrapeError, scrape
from dashboard.restarts.audit import audit
from dashboard.restarts.models import Restart, RestartStep
from dashboard.restarts.pagecache import DROP_TIMEOUT_SECONDS, PageCacheError, drop_page_cache
from dashboard.restarts.windows import current_or_next

__all__ = [
    "PRECHECK_MARGIN_FRACTION",
    "REDISPATCH_SECONDS",
    "STEPS",
    "Fit",
    "claim_restart",
    "engine_holds",
    "engine_need",
    "interrupt_stale_restarts",
    "precheck_fit",
    "recheck_fit",
    "restarts_to_dispatch",
    "run_restart",
    "stale_reason",
    "startup_deadline_seconds",
]

log = logging.getLogger(__name__)

STEPS = ("precheck", "drain", "stop", "drop_caches", "recheck", "start", "follow", "record")
RUN_ACTION = "run-restart"
STOP_ACTION = "stop-engine"
START_ACTION = "start-engine"
GIB = 1024**3
MIB = 1024**2
# Room kept free on top of the need: 1 % of MemTotal (≈ 1.2 GiB on a GB10), for what no report
# covers (the CUDA context, allocator slack, a neighbour's small growth meanwhile).
PRECHECK_MARGIN_FRACTION = 0.01
POLL_SECONDS = 1.0
HEALTH_DEADLINE_SECONDS = 2.0
# After the log reports a startup error, how long the container may take to exit.
EXIT_AFTER_ERROR_SECONDS = 10.0
SCRAPE_DEADLINE_SECONDS = 4.0
# A restart handed to a node's queue is handed again after this long if nobody claimed it; the
# message itself expires then, so a message stuck in a queue never fires late.
REDISPATCH_SECONDS = 60.0
# The ledger's interval minimum counts only while it is this recent.
LEDGER_FRESH = timedelta(minutes=2)
# A neighbour before this phase has not yet logged its KV cache size: starting now would break
# its memory profiling (and ours).
_NOT_YET_SIZED = {"loading", "profiling"}


class RestartLost(Exception):
    """The restart row is no longer ``running`` (marked interrupted meanwhile): stop at once."""


class _Finish(Exception):
    """End the run early with ``status`` and ``outcome``."""

    def __init__(self, status: str, outcome: str) -> None:
        super().__init__(outcome)
        self.status = status
        self.outcome = outcome


# --- the arithmetic of the two memory checks -----------------------------------------------------


@dataclass(frozen=True)
class Fit:
    """Does ``need`` fit in ``room`` less ``margin``? Bytes; None means unknown, never 0.

    ``parts`` holds the figures the sum came from (for the step's data), ``missing`` what was
    needed but unknown. ``fits`` is None when the answer is unknown.
    """

    need: int | None
    room: int | None
    margin: int
    parts: dict[str, int | None] = field(default_factory=dict)
    missing: tuple[str, ...] = ()

    @property
    def fits(self) -> bool | None:
        if self.need is None or self.room is None:
            return None
        return self.need + self.margin <= self.room

    def describe(self, room_words: str) -> str:
        """E.g. "needs 31.2 GiB (+ 1.2 GiB margin), 24.0 GiB would be free"."""
        if self.fits is None:
            return f"{' and '.join(self.missing) or 'a figure'} unknown"
        return (f"needs {size(self.need)} (+ {size(self.margin)} margin), "
                f"{size(self.room)} {room_words}")

    def as_dict(self) -> dict[str, Any]:
        return {"need_bytes": self.need, "room_bytes": self.room, "margin_bytes": self.margin,
                "fits": self.fits, "parts": dict(self.parts), "missing": list(self.missing)}


def engine_need(share: EngineShare) -> tuple[int | None, dict[str, int | None], tuple[str, ...]]:
    """``(need, parts, missing)``: weights + KV pool, plus CUDA graphs and the transient prefill
    need when known. Weights and KV pool are required: without them there is no need to compare
    (an engine that never reported them cannot be pre-checked)."""
    parts = {"weights": share.weights, "kv_pool": share.kv_pool,
             "cuda_graphs": share.cuda_graphs, "prefill": share.prefill_need}
    missing = tuple(f"its {name.replace('_', ' ')}" for name in ("weights", "kv_pool")
                    if parts[name] is None)
    if missing:
        return None, parts, missing
    return sum(value for value in parts.values() if value is not None), parts, ()


def engine_holds(share: EngineShare, *, running: bool) -> int | None:
    """What stopping the engine gives back: 0 when it is not running; else the larger of what it
    reports reserving (weights + KV pool + graphs, as known) and what it is seen holding (NVML
    per-process or cgroup). Each view misses something: on GB10 the cgroup does not see GPU
    allocations, and the reports leave out the CUDA context and activations."""
    if not running:
        return 0
    reported = None
    if share.weights is not None and share.kv_pool is not None:
        reported = share.weights + share.kv_pool + (share.cuda_graphs or 0)
    known = [value for value in (reported, share.actual) if value is not None]
    return max(known) if known else None


def precheck_fit(share: EngineShare, *, mem_available: int | None, running: bool,
                 margin: int) -> Fit:
    """Before touching anything: the need against MemAvailable + what the engine holds.

    MemAvailable already counts the reclaimable page cache the drop will hand back (as free
    pages), so it is not added a second time; after the stop and the drop, MemFree is about
    this sum.
    """
    need, parts, missing = engine_need(share)
    holds = engine_holds(share, running=running)
    room = None if mem_available is None or holds is None else mem_available + holds
    absent = list(missing)
    if mem_available is None:
        absent.append("MemAvailable")
    if holds is None:
        absent.append("what it holds now")
    return Fit(need=need, room=room, margin=margin,
               parts={**parts, "mem_available": mem_available, "engine_holds": holds},
               missing=tuple(absent))


def recheck_fit(need: int, *, mem_free: int | None, margin: int) -> Fit:
    """After the stop and the drop: the need against MemFree, what CUDA sees on GB10."""
    return Fit(need=need, room=mem_free, margin=margin, parts={"mem_free": mem_free},
               missing=() if mem_free is not None else ("MemFree",))


def startup_deadline_seconds(expected_startup_seconds: float) -> float:
    """How long a start may take: expected × factor, never less than the minimum (15 min)."""
    return max(expected_startup_seconds * settings.SPARKOPS_RESTART_DEADLINE_FACTOR,
               settings.SPARKOPS_RESTART_MIN_DEADLINE_SECONDS)


def size(value: int | None) -> str:
    """Bytes for people: GiB with one decimal, MiB below 1 GiB (the emulator's scale)."""
    if value is None:
        return "unknown"
    return f"{value / GIB:.1f} GiB" if abs(value) >= GIB else f"{value / MIB:.0f} MiB"


# --- claiming, staleness and dispatch ------------------------------------------------------------


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


def restarts_to_dispatch(now: datetime) -> list[Restart]:
    """The restarts to hand to their nodes' queues now: per node, the oldest due one.

    Stale ones are cancelled on the way. A node with a running restart gets nothing (its next
    one waits). A restart handed over less than :data:`REDISPATCH_SECONDS` ago is not handed
    again; the handover is a conditional UPDATE, so two dispatchers never both send it.
    """
    due = (Restart.objects.filter(kind=Restart.Kind.PLANNED, status=Restart.Status.SCHEDULED)
           .filter(Q(scheduled_for__lte=now)
                   | Q(scheduled_for__isnull=True, requested_at__lte=now))
           .select_related("node", "engine", "window")
           .order_by(Coalesce("scheduled_for", "requested_at"), "pk"))
    busy = set(Restart.objects.filter(status=Restart.Status.RUNNING)
               .values_list("node_id", flat=True))
    chosen: dict[int, Restart] = {}
    for restart in due:
        if restart.node_id in busy or restart.node_id in chosen:
            continue
        reason = stale_reason(restart, now)
        if reason:
            _cancel(restart, reason, now, actor="dispatcher")
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


def _cancel(restart: Restart, reason: str, now: datetime, *, actor: str) -> bool:
    cancelled = Restart.objects.filter(pk=restart.pk, status=Restart.Status.SCHEDULED).update(
        status=Restart.Status.CANCELLED, finished_at=now, outcome=f"Not started: {reason}.")
    if cancelled:
        audit(RUN_ACTION, allowed=False, actor=actor, node=restart.node, engine=restart.engine,
              restart=restart, outcome=f"cancelled: {reason}")
        Event.objects.create(node=restart.node, engine=restart.engine, at=now,
                             kind="restart-cancelled", severity=Event.Severity.WARNING,
                             message=f"{restart.engine.name}: planned restart not started: "
                                     f"{reason}.")
    return bool(cancelled)


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


# --- the run -------------------------------------------------------------------------------------


def run_restart(restart_id: int, *, api: docker.DockerClient | None, api_error: str = "",
                clock: Clock | None = None, procfs: Procfs | None = None,
                worker: str | None = None, poll_seconds: float = POLL_SECONDS,
                margin_bytes: int | None = None) -> Restart:
    """Carry out the scheduled restart ``restart_id`` on this node and return its row.

    Does nothing (returns the row as it is) when the restart is not ``scheduled`` (a message
    delivered twice) or not yet due. Cancels it when stale (:func:`stale_reason`), refuses it
    when the engine is not manageable, leaves it ``scheduled`` ("waiting") when another restart
    of the node runs. Otherwise claims it and runs every step; blocks for the whole restart
    (drain timeout + startup, ~10 minutes on a GB10). ``api`` None (with ``api_error``) means the
    container engine is unreachable: the restart is aborted without touching anything.

    ``clock`` drives every wait (tests inject one); ``worker`` names the actor in the audit log
    ("worker:<hostname>" by default); ``margin_bytes`` overrides the 1 %-of-MemTotal margin.
    """
    clock = clock or Clock()
    actor = f"worker:{worker or socket.gethostname()}"
    restart = Restart.objects.select_related("engine", "node", "window").get(pk=restart_id)
    now = clock.wall()
    if restart.kind != Restart.Kind.PLANNED or restart.status != Restart.Status.SCHEDULED:
        log.info("restart %s is %s; nothing to do", restart.pk, restart.status)
        return restart
    if (restart.scheduled_for or restart.requested_at) > now:
        log.info("restart %s is not due until %s", restart.pk, restart.scheduled_for)
        return restart
    reason = stale_reason(restart, now)
    if reason:
        _cancel(restart, reason, now, actor=actor)
    elif not restart.engine.manageable:
        _refuse(restart, now, actor)
    elif not claim_restart(restart, now=now, worker=actor):
        # Another restart of the node runs: stay scheduled and be dispatched again once it ends.
        Restart.objects.filter(pk=restart.pk, status=Restart.Status.SCHEDULED) \
            .update(phase="waiting", heartbeat_at=None)
    else:
        restart.refresh_from_db()
        audit(RUN_ACTION, allowed=True, actor=actor, node=restart.node, engine=restart.engine,
              restart=restart, outcome="claimed; runbook started")
        _Run(restart, api=api, api_error=api_error, clock=clock,
             procfs=procfs or local_procfs(), actor=actor, poll_seconds=poll_seconds,
             margin_bytes=margin_bytes).execute()
    restart.refresh_from_db()
    return restart


def _refuse(restart: Restart, now: datetime, actor: str) -> None:
    reason = (f"{restart.engine.name} is not enabled for management (label sparkops.manage=true "
              "or the admin setting); nothing was touched")
    refused = Restart.objects.filter(pk=restart.pk, status=Restart.Status.SCHEDULED).update(
        status=Restart.Status.REFUSED, finished_at=now, outcome=f"Refused: {reason}.")
    if refused:
        audit(RUN_ACTION, allowed=False, actor=actor, node=restart.node, engine=restart.engine,
              restart=restart, outcome=f"refused: {reason}")
        Event.objects.create(node=restart.node, engine=restart.engine, at=now,
                             kind="restart-refused", severity=Event.Severity.WARNING,
                             message=f"{restart.engine.name}: planned restart refused: {reason}.")


@dataclass
class _StepNote:
    """What a step found; saved on its row when the step ends (or earlier, for live progress)."""

    row: RestartStep
    ok: bool | None = None
    message: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def done(self, message: str, *, ok: bool = True, **data: Any) -> None:
        self.ok, self.message = ok, message
        self.data.update(data)

    def save(self, finished_at: datetime | None = None) -> None:
        self.row.message, self.row.data = self.message, self.data
        self.row.ok, self.row.finished_at = self.ok, finished_at
        self.row.save(update_fields=["message", "data", "ok", "finished_at"])


@dataclass(frozen=True)
class _Started:
    wall: datetime
    mono: float
    container_started_at: datetime
    deadline_mono: float
    deadline_seconds: float


class _Run:
    """One claimed restart being carried out; every method is one step or a helper of one."""

    def __init__(self, restart: Restart, *, api: docker.DockerClient | None, api_error: str,
                 clock: Clock, procfs: Procfs, actor: str, poll_seconds: float,
                 margin_bytes: int | None) -> None:
        self.restart = restart
        self.engine = restart.engine
        self.node = restart.node
        self.api = api
        self.api_error = api_error
        self.clock = clock
        self.procfs = procfs
        self.actor = actor
        self.poll = poll_seconds
        self.margin_override = margin_bytes
        self.startup_seconds: float | None = None
        self.new_log: StartupLog | None = None
        self._failed_seen: float | None = None

    # -- the sequence --------------------------------------------------------------------------

    def execute(self) -> None:
        try:
            need, running = self.precheck()
            self.drain(running)
            self.stop(running)
            self.drop_caches()
            self.recheck(need)
            started = self.start()
            self.follow(started)
        except _Finish as end:
            self.finish(end.status, end.outcome)
        except RestartLost as lost:
            log.warning("restart %s: %s; stopping here", self.restart.pk, lost)
        except Exception as error:  # never leave a restart "running" behind a bug
            log.exception("restart %s failed unexpectedly", self.restart.pk)
            self.finish(Restart.Status.FAILED,
                        f"Unexpected error in step '{self.restart.phase}': "
                        f"{type(error).__name__}: {error}")
        else:
            self.finish(Restart.Status.SUCCEEDED, self._success_outcome())

    def precheck(self) -> tuple[int, bool]:
        with self.step("precheck") as note:
            if self.api is None:
                raise _Finish(Restart.Status.ABORTED, "Container engine unreachable "
                              f"({self.api_error or 'no client'}); nothing was touched.")
            try:
                status = container_status(self.docker, self.engine.container_id)
            except ContainerEngineError as error:
                raise _Finish(Restart.Status.ABORTED, f"Container engine error: {error}; "
                              "nothing was touched.") from None
            if not status.exists:
                raise _Finish(Restart.Status.ABORTED, f"The container of {self.engine.name} no "
                              "longer exists; nothing was touched.")
            info = self.meminfo()
            mem_available, source = self._mem_available(info)
            self.engine.refresh_from_db()
            fit = precheck_fit(engine_share(self.engine), mem_available=mem_available,
                               running=status.running, margin=self.margin(info))
            self._save(before=self._snapshot(info, self._known_capacity()))
            note.data.update(fit.as_dict(), mem_available_source=source,
                             container=status.as_dict())
            if fit.fits is None:
                raise _Finish(Restart.Status.ABORTED,
                              f"Pre-check not possible for {self.engine.name}: "
                              f"{fit.describe('')}; nothing was touched.")
            if not fit.fits:
                raise _Finish(Restart.Status.ABORTED,
                              f"Pre-check: {self.engine.name} "
                              f"{fit.describe('would be free')}; nothing was touched.")
            note.done(f"fits: {fit.describe('would be free')}")
            return fit.need or 0, status.running

    def drain(self, running: bool) -> None:
        with self.step("drain") as note:
            url = self.engine.metrics_url
            if not running or not url:
                why = "not running" if not running else "no /metrics address known"
                note.done(f"{why}: nothing to drain", drained=not running)
                return
            timeout = settings.SPARKOPS_RESTART_DRAIN_TIMEOUT_SECONDS
            begun = self.clock.mono()
            while True:
                busy, error = self._requests_in_flight(url)
                waited = self.clock.mono() - begun
                if busy == 0:
                    note.done(f"no requests in flight after {waited:.1f} s", drained=True,
                              waited_seconds=round(waited, 1))
                    return
                if waited >= timeout:
                    left = f"{busy} requests still in flight" if busy else error
                    note.done(f"drain timeout ({timeout:.0f} s): {left}; going on",
                              drained=False, requests_in_flight=busy,
                              waited_seconds=round(waited, 1))
                    return
                self.heartbeat()
                self.clock.sleep(min(self.poll, max(timeout - waited, 0.0)))

    def stop(self, running: bool) -> None:
        with self.step("stop") as note:
            self.require_manageable(STOP_ACTION)
            if not running:
                note.done("the container was not running")
                return
            begun = self.clock.mono()
            try:
                stop_container(self.docker, self.engine.container_id)
                status = container_status(self.docker, self.engine.container_id)
            except ContainerEngineError as error:
                self._audit(STOP_ACTION, True, f"failed: {error}")
                raise _Finish(Restart.Status.FAILED, f"Could not stop {self.engine.name}: "
                              f"{error}.") from None
            took = self.clock.mono() - begun
            self._audit(STOP_ACTION, True, f"stopped in {took:.1f} s (exit code "
                                           f"{status.exit_code})")
            if status.running:
                raise _Finish(Restart.Status.FAILED,
                              f"{self.engine.name} is still running after the stop.")
            note.done(f"stopped in {took:.1f} s", exit_code=status.exit_code,
                      stop_seconds=round(took, 2))

    def drop_caches(self) -> None:
        with self.step("drop_caches") as note:
            try:
                # No heartbeat while the helper runs: it must end well before the run would
                # be taken for dead.
                result = drop_page_cache(
                    engine=self.engine, restart=self.restart, actor=self.actor, api=self.docker,
                    now=self.clock.wall(), timeout_seconds=min(
                        DROP_TIMEOUT_SECONDS,
                        settings.SPARKOPS_RESTART_HEARTBEAT_STALE_SECONDS / 2))
            except PageCacheError as error:
                # Not fatal: the re-check measures whether the engine fits anyway.
                note.done(f"not dropped: {error}; going on to the re-check", ok=False)
                return
            note.done(f"Cached {size(result.cached_before)} → {size(result.cached_after)}",
                      cached_before_bytes=result.cached_before,
                      cached_after_bytes=result.cached_after)

    def recheck(self, need: int) -> None:
        with self.step("recheck") as note:
            waited = self.wait_for_neighbours()
            info = self.meminfo()
            mem_free = info.get("MemFree") if info else None
            fit = recheck_fit(need, mem_free=mem_free, margin=self.margin(info))
            note.data.update(fit.as_dict(), neighbours_waited_seconds=round(waited, 1))
            if not fit.fits:
                raise _Finish(Restart.Status.ABORTED,
                              f"Re-check after the stop and the drop: {self.engine.name} "
                              f"{fit.describe('is free (MemFree)')}. Left stopped: it would "
                              "not start, or over-commit the node.")
            note.done(f"fits: {fit.describe('is free (MemFree)')}")

    def start(self) -> _Started:
        with self.step("start") as note:
            self.require_manageable(START_ACTION)
            wall, mono = self.clock.wall(), self.clock.mono()
            try:
                start_container(self.docker, self.engine.container_id)
                status = container_status(self.docker, self.engine.container_id)
            except ContainerEngineError as error:
                self._audit(START_ACTION, True, f"failed: {error}")
                raise _Finish(Restart.Status.FAILED, f"Could not start {self.engine.name}: "
                              f"{error}.") from None
            self._audit(START_ACTION, True, f"started ({status.state})")
            seconds = startup_deadline_seconds(self.restart.expected_startup_seconds)
            deadline = wall + timedelta(seconds=seconds)
            self._save(deadline=deadline)
            note.done(f"started; expected ready in {self.restart.expected_startup_seconds} s, "
                      f"deadline {deadline:%H:%M:%S} UTC", started_at=wall.isoformat(),
                      deadline=deadline.isoformat(), deadline_seconds=seconds)
            return _Started(wall=wall, mono=mono,
                            container_started_at=status.started_at or wall,
                            deadline_mono=mono + seconds, deadline_seconds=seconds)

    def follow(self, started: _Started) -> None:
        with self.step("follow") as note:
            phases: list[dict[str, Any]] = []
            note.data["phases"] = phases
            while True:
                elapsed = self.clock.mono() - started.mono
                status = self.status_or_none()
                startup = self._startup_log(started)
                if startup is not None:
                    self.new_log = startup
                    if startup.phase != "unknown":  # nothing logged yet is not a phase
                        self._note_phase(note, phases, startup.phase, elapsed)
                failure = self._startup_failure(status, startup, elapsed, started)
                if failure:
                    note.done(failure, ok=False)
                    raise _Finish(Restart.Status.FAILED, failure)
                if status is not None and status.running and self._ready(startup):
                    self.startup_seconds = round(elapsed, 2)
                    self._note_phase(note, phases, "ready", elapsed)
                    note.done(f"ready after {elapsed:.1f} s", startup_seconds=self.startup_seconds)
                    return
                self.heartbeat()
                self.clock.sleep(self.poll)

    def finish(self, status: str, outcome: str) -> None:
        """The record step: the final row, written only while this run still owns it."""
        with self.step("record") as note:
            state = self._state_now()
            info = self.meminfo()
            capacity = self._capacity(self.new_log.as_dict() if self.new_log else {}, {})
            after = self._snapshot(info, capacity)
            now = self.clock.wall()
            Restart.objects.filter(pk=self.restart.pk, status=Restart.Status.RUNNING).update(
                status=status, outcome=outcome, finished_at=now, container_state=state,
                after=after, startup_seconds=self.startup_seconds)
            note.done(f"{status}: {outcome}", ok=status == Restart.Status.SUCCEEDED,
                      status=status, container=state)
        severity = {Restart.Status.SUCCEEDED: Event.Severity.INFO,
                    Restart.Status.ABORTED: Event.Severity.WARNING}.get(status,
                                                                        Event.Severity.CRITICAL)
        if status == Restart.Status.ABORTED and not state.get("running"):
            severity = Event.Severity.CRITICAL  # aborted with the engine left down
        Event.objects.create(node=self.node, engine=self.engine, at=now,
                             kind=f"restart-{status}", severity=severity,
                             message=f"{self.engine.name}: planned restart {status}: {outcome}")

    # -- step plumbing -------------------------------------------------------------------------

    @contextmanager
    def step(self, name: str) -> Iterator[_StepNote]:
        """Record one step: its row is created now and completed when the block ends."""
        if name != "record":
            self.heartbeat(phase=name)
        else:
            self._save(phase=name)
        note = _StepNote(RestartStep.objects.create(restart=self.restart, step=name,
                                                    started_at=self.clock.wall()))
        try:
            yield note
        except _Finish as end:
            if note.ok is None:
                note.done(end.outcome, ok=False)
            raise
        except RestartLost:
            note.done("the restart was marked as no longer running", ok=False)
            raise
        except Exception as error:
            note.done(f"{type(error).__name__}: {error}", ok=False)
            raise
        finally:
            if note.ok is None:
                note.ok = True
            note.save(finished_at=self.clock.wall())

    def heartbeat(self, phase: str | None = None) -> None:
        """Say we are alive (and in which step); raise RestartLost if the row is not ours."""
        fields: dict[str, Any] = {"heartbeat_at": self.clock.wall()}
        if phase:
            fields["phase"] = phase
            self.restart.phase = phase
        if not Restart.objects.filter(pk=self.restart.pk, status=Restart.Status.RUNNING) \
                .update(**fields):
            raise RestartLost("the restart is no longer running (marked by recovery?)")

    def require_manageable(self, action: str) -> None:
        """The last gate before a container is touched: refused and audited otherwise."""
        self.engine.refresh_from_db(fields=["managed", "labels"])
        if not self.engine.manageable:
            self._audit(action, False, "refused: not enabled for management")
            raise _Finish(Restart.Status.ABORTED, f"{self.engine.name} is no longer enabled "
                          "for management; not touched.")

    def _audit(self, action: str, allowed: bool, outcome: str) -> None:
        audit(action, allowed=allowed, actor=self.actor, node=self.node, engine=self.engine,
              restart=self.restart, outcome=outcome,
              details={"container_id": self.engine.container_id})

    def _save(self, **fields: Any) -> None:
        for name, value in fields.items():
            setattr(self.restart, name, value)
        Restart.objects.filter(pk=self.restart.pk).update(**fields)

    # -- what the node and the engine say ------------------------------------------------------

    @property
    def docker(self) -> docker.DockerClient:
        """The container engine; the pre-check ends the run before any step needs it absent."""
        assert self.api is not None
        return self.api

    def status_or_none(self) -> ContainerStatus | None:
        """The container's state now; None when the engine could not say (retried at the next
        poll while following a start, until the deadline)."""
        try:
            return container_status(self.docker, self.engine.container_id)
        except ContainerEngineError as error:
            log.warning("restart %s: %s", self.restart.pk, error)
            return None

    def meminfo(self) -> MemInfo | None:
        try:
            return parse_meminfo(self.procfs.meminfo())
        except ProcfsError as error:
            log.warning("restart %s: %s", self.restart.pk, error)
            return None

    def margin(self, info: MemInfo | None) -> int:
        if self.margin_override is not None:
            return self.margin_override
        total = (info.get("MemTotal") if info else None) or self.node.mem_total_bytes or 0
        return int(total * PRECHECK_MARGIN_FRACTION)

    def _mem_available(self, info: MemInfo | None) -> tuple[int | None, str]:
        """The lower of MemAvailable now and the ledger's interval minimum (when recent): the
        ledger catches a neighbour's transient prefill dip that one reading would miss."""
        now_value = info.mem_available if info else None
        self.node.refresh_from_db(fields=["ledger"])
        ledger = self.node.ledger or {}
        ledger_value = ledger.get("headroom")
        fresh = False
        if ledger_value is not None and ledger.get("at"):
            fresh = self.clock.wall() - datetime.fromisoformat(ledger["at"]) <= LEDGER_FRESH
        candidates = {"MemAvailable now": now_value,
                      "ledger interval minimum": ledger_value if fresh else None}
        known = {name: value for name, value in candidates.items() if value is not None}
        if not known:
            return None, "unknown"
        source = min(known, key=lambda name: known[name])
        return known[source], source

    def _requests_in_flight(self, url: str) -> tuple[int | None, str]:
        try:
            snapshot = scrape(f"{url}/metrics", deadline=SCRAPE_DEADLINE_SECONDS)
        except ScrapeError as error:
            return None, f"/metrics: {error}"
        parts = [snapshot.requests_running, snapshot.requests_waiting]
        if all(part is None for part in parts):
            return None, "/metrics reports no request gauges"
        return sum(part or 0 for part in parts), ""

    def wait_for_neighbours(self) -> float:
        """Wait until no other engine of the node is starting without having logged its KV
        cache size (BRIEF: serialise starts). Bounded by the minimum startup deadline; an
        engine still not sized by then ends the run (left stopped)."""
        begun = self.clock.mono()
        limit = settings.SPARKOPS_RESTART_MIN_DEADLINE_SECONDS
        while True:
            starting = self._neighbours_starting()
            waited = self.clock.mono() - begun
            if not starting:
                return waited
            if waited >= limit:
                raise _Finish(Restart.Status.ABORTED,
                              f"{', '.join(starting)} still starting after {waited:.0f} s; "
                              f"{self.engine.name} left stopped so as not to start alongside.")
            self.heartbeat()
            self.clock.sleep(self.poll)

    def _neighbours_starting(self) -> list[str]:
        neighbours = Engine.objects.filter(node=self.node, present=True).exclude(pk=self.engine.pk)
        return [n.name for n in neighbours if self._neighbour_starting(n)]

    def _neighbour_starting(self, neighbour: Engine) -> bool:
        """Running, not serving yet, and its log since its start has no KV cache size yet.

        A neighbour that answers ``/health`` is past that point, whatever its log still holds
        (a long-running engine's startup lines can be far behind the log tail). Nothing logged
        yet counts as starting only for a container started recently.
        """
        try:
            status = container_status(self.docker, neighbour.container_id)
            if not status.running or status.started_at is None:
                return False
            if neighbour.metrics_url and _healthy(neighbour.metrics_url):
                return False
            text = container_logs_since(self.docker, neighbour.container_id, status.started_at)
        except ContainerEngineError:
            return False  # unknown: the collector reports it; not a reason to hold this start
        phase = parse_startup_log(text).phase
        if phase == "unknown":
            age = (self.clock.wall() - status.started_at).total_seconds()
            return age < settings.SPARKOPS_RESTART_MIN_DEADLINE_SECONDS
        return phase in _NOT_YET_SIZED

    def _startup_log(self, started: _Started) -> StartupLog | None:
        try:
            return parse_startup_log(container_logs_since(
                self.docker, self.engine.container_id, started.container_started_at))
        except ContainerEngineError as error:
            log.warning("restart %s: %s", self.restart.pk, error)
            return None

    def _startup_failure(self, status: ContainerStatus | None, startup: StartupLog | None,
                         elapsed: float, started: _Started) -> str:
        """Why the start has failed ("" while it may still succeed)."""
        errors = "; ".join(e.message.rstrip(".") for e in startup.errors) if startup else ""
        if status is not None and not status.exists:
            return f"The container of {self.engine.name} disappeared during startup."
        if status is not None and not status.running:
            oom = ", OOM-killed" if status.oom_killed else ""
            return (f"The container exited during startup (exit code {status.exit_code}{oom}): "
                    f"{errors or 'no startup error in its log'}.")
        if startup is not None and startup.phase == "failed":
            # vLLM exits right after logging the error: wait briefly to report its exit code.
            self._failed_seen = self._failed_seen or self.clock.mono()
            if self.clock.mono() - self._failed_seen >= EXIT_AFTER_ERROR_SECONDS:
                return f"Startup failed, the container still runs: {errors}."
        if self.clock.mono() >= started.deadline_mono:
            phase = startup.phase if startup else "unknown"
            return (f"Not ready {elapsed:.0f} s after the start (deadline "
                    f"{started.deadline_seconds:.0f} s); last phase: {phase}. The container was "
                    "left as it is.")
        return ""

    def _ready(self, startup: StartupLog | None) -> bool:
        """Ready when ``/health`` answers 200; without a known address, when the log says so."""
        url = self.engine.metrics_url
        if not url:
            return startup is not None and startup.phase == "ready"
        return _healthy(url)

    def _note_phase(self, note: _StepNote, phases: list[dict[str, Any]], phase: str,
                    elapsed: float) -> None:
        if phases and phases[-1]["phase"] == phase:
            return
        phases.append({"phase": phase, "at": self.clock.wall().isoformat(),
                       "elapsed_seconds": round(elapsed, 1)})
        note.message = f"{phase} after {elapsed:.0f} s"
        note.save()  # live progress for the page

    def _state_now(self) -> dict[str, Any]:
        if self.api is None:
            return {"state": "unknown", "running": None, "error": self.api_error}
        try:
            return container_status(self.api, self.engine.container_id).as_dict()
        except ContainerEngineError as error:
            return {"state": "unknown", "running": None, "error": str(error)}

    def _known_capacity(self) -> dict[str, Any]:
        snapshot = (self.engine.metrics or {}).get("snapshot") or {}
        return self._capacity(self.engine.startup or {}, snapshot)

    @staticmethod
    def _capacity(startup: dict[str, Any], snapshot: dict[str, Any]) -> dict[str, Any]:
        """KV capacity from the startup log, else from ``cache_config_info``; None if neither."""
        kv_bytes = snapshot.get("kv_cache_memory_bytes")
        return {
            "kv_cache_gib": _first(startup.get("kv_cache_gib"),
                                   kv_bytes / GIB if kv_bytes is not None else None),
            "kv_cache_tokens": _first(startup.get("kv_cache_tokens"),
                                      snapshot.get("kv_cache_size_tokens")),
            "max_concurrency": _first(startup.get("max_concurrency"),
                                      snapshot.get("kv_cache_max_concurrency")),
        }

    def _snapshot(self, info: MemInfo | None, capacity: dict[str, Any]) -> dict[str, Any]:
        return {"at": self.clock.wall().isoformat(),
                "mem_available_bytes": info.mem_available if info else None,
                "mem_free_bytes": info.get("MemFree") if info else None,
                **capacity}

    def _success_outcome(self) -> str:
        capacity = self._capacity(self.new_log.as_dict() if self.new_log else {}, {})
        kv = capacity["kv_cache_gib"]
        tokens = capacity["kv_cache_tokens"]
        pool = f"; KV pool {kv:.2f} GiB" if kv is not None else ""
        pool += f", {tokens:,} tokens" if tokens is not None else ""
        return (f"Ready {self.startup_seconds:.1f} s after the start (expected "
                f"{self.restart.expected_startup_seconds} s){pool}.")


def _healthy(base_url: str) -> bool:
    """Does the engine's ``/health`` answer 200 now (within a short deadline)?"""
    try:
        fetch(f"{base_url}/health", deadline=HEALTH_DEADLINE_SECONDS, max_bytes=64 * 1024)
    except FetchError:
        return False
    return True


def _first(*values: Any) -> Any:
    return next((value for value in values if value is not None), None)
