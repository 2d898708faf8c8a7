"""The planned-restart runbook: carry out one restart of one engine safely, on its node, and
record it.

On a GB10 an engine takes about ten minutes to start, page cache left in place makes it refuse to
start (CUDA counts only MemFree as available), dropping the cache while it runs leaves it short,
and two engines starting at once break each other's memory profiling (vLLM sizes its KV pool from
the memory it sees free while it profiles). So a restart is a fixed sequence of steps, each
written as a :class:`~dashboard.restarts.models.RestartStep` with its times, result and numbers:

1. ``precheck``: will the engine's weights + KV pool (+ CUDA graphs) + prefill need fit in the
   room it would have after stopping it and dropping the page cache? If not: ``aborted``, with
   the numbers, and the container is not touched.
2. ``drain``: wait until its running and waiting requests are 0, up to
   ``SPARKOPS_RESTART_DRAIN_TIMEOUT_SECONDS`` (then go on, noting it).
3. ``stop``: stop the container (audited). Just before, the room the stop should grow is read
   (MemAvailable, or the memory budget's room when the engine runs in one) with what the engine
   held (:func:`dashboard.restarts.fit.returned_by_stop`): the step's ``memory_return``.
4. ``drop_caches``: drop the page cache (:mod:`dashboard.restarts.pagecache`); a refusal (the
   cooldown) or a failure is noted, not fatal: the re-check decides.
5. ``recheck``: first, did the memory come back? The room is read until it is what it was
   before the stop plus what the engine held, less the tolerance
   (:func:`dashboard.restarts.fit.return_tolerance`), for up to
   ``SPARKOPS_MEMORY_RETURN_GRACE_SECONDS`` after the stop. If it is not: "memory not
   returned", a ``memory-not-returned`` event, and ``aborted`` with the container **left
   stopped**, naming what is missing: starting into memory that is gone is how a GB10 wedges.
   (A neighbour starting meanwhile moves the room by its own allocations: the answer is then
   unknown, noted, and the run goes on.) Then, once no neighbour is mid-startup (one still
   unsized after the minimum startup deadline ends the run), MemFree (what CUDA sees on GB10)
   against the need. If it does not fit: ``aborted`` and the container is **left stopped**.
   Starting it would fail (or, with ``--kv-cache-memory-bytes``, over-commit the host, which on
   GB10 wedges it); an engine that stays down is what the restart-failed alert is for, and
   ``container_state`` says it is stopped.
6. ``start``: start the container (audited); the startup deadline is set from here.
7. ``follow``: poll the container, its log since this start and its health endpoint until
   ready; each startup phase is recorded. ``failed`` when the container exits, the log reports
   a startup error, or the deadline passes. A failed start leaves the container as it is (a
   slow load may still finish; the admin decides), and ``container_state`` says how it is.
   Until the engine reports its KV pool (phase ``kv_allocated`` or later) each poll is also the
   **guarded start**: MemFree (and the memory budget's free room, where the engine runs in one)
   against a floor (``SPARKOPS_GUARDED_START_FLOOR_GIB``, or what the engine still has to
   allocate plus the margin: :func:`dashboard.restarts.fit.guard_floor`); below it the page
   cache is dropped again and memory compacted
   (:func:`dashboard.restarts.pagecache.drop_while_starting`), at most
   :data:`GUARD_MAX_INTERVENTIONS` times per start and never within the drop cooldown (this
   run's own ``drop_caches`` step aside: that one emptied the cache before the load that
   refills it), each audited and kept in the step's ``guarded_start`` data (time, MemFree
   before and after, what was done). Read-only mode refuses it, audited, and the watch ends.
8. ``record``: status, outcome, measured startup (start → ready), memory and KV capacity
   before and after, container state.

A plan that changes the engine's flags (``Restart.change``, :mod:`dashboard.restarts.change`)
adds to three steps. The ``precheck`` re-runs the fit planner (:mod:`collectors.fitplan`) on the
node's ledger of now with the margin the plan was checked with, records the after-ledger in the
step's data, and ends the run ``refused`` (nothing touched) when the verdict got worse than what
was accepted at planning: the engine would refuse to start, the host would run out of memory,
or a squeeze the admin did not accept. For "recreate" it also checks that the container can be
recreated, and the need the two memory checks compare is that of the new flags. The ``start``
step of "recreate" recreates the container with the new command
(:func:`collectors.docker_api.recreate_with_command`: the old container is kept, renamed and
stopped); ``follow`` removes the old one once the new one serves, and puts it back under its
name (stopped, with its old flags) when the new one exits while starting. The ``record`` step
notes the flags the engine runs after the run, and whether they are the intended ones (for
"note", whether the admin's recreation took).

Every engine kind is restarted the same way; what differs is asked of the kind's reader
(:mod:`collectors.kinds.registry`): where it answers once it serves (``health_path``: vLLM's and
llama.cpp's ``/health``, Ollama's ``/api/version``), how its startup log reads
(``new_log_parser()``: the phases of this start, and of a neighbour's, which decide whether a
neighbour is still sizing its memory), and how its requests in flight are read for the drain
(``read()``; a kind that never reports them, Ollama, is given the whole drain timeout).

The run happens on the engine's node (``run_restart_task`` on the node's queue): it reaches the
container only through :mod:`collectors.docker_api`, host memory only through
:mod:`collectors.procfs` and :mod:`collectors.meminfo`, the engine over HTTP through
:mod:`sparkops.httpfetch` and its kind's reader, and the page cache through
:mod:`dashboard.restarts.pagecache`. The arithmetic of the two memory checks is in
:mod:`dashboard.restarts.fit`; claiming, staleness and recovery in
:mod:`dashboard.restarts.dispatch`. A run that finds its row no longer ``running`` (recovery
marked it) stops at once.
"""

from __future__ import annotations

import logging
import shlex
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import docker
from django.conf import settings

from collectors.docker_api import (
    READ_ONLY_TEXT,
    ContainerEngineError,
    ContainerStatus,
    Recreated,
    check_recreatable,
    container_command,
    container_logs_since,
    container_status,
    discard_replaced,
    read_only,
    recreate_with_command,
    restore_replaced,
    start_container,
    stop_container,
)
from collectors.fitplan import PlanError, PlanRequest
from collectors.fitplan import plan as plan_fit
from collectors.hostmemory import configured_budget
from collectors.kinds.base import KindReader
from collectors.kinds.registry import reader_for
from collectors.ledger import engine_share
from collectors.meminfo import MemInfo, parse_meminfo
from collectors.models import Engine, Event
from collectors.nodes import local_procfs
from collectors.procfs import Procfs, ProcfsError, read_memory_budget
from collectors.redaction import mask_command
from collectors.sampling import Clock, stale_after
from collectors.starts import history_for
from collectors.vllm.scrape import ScrapeError
from dashboard.audit.records import audit
from dashboard.restarts.change import (
    RECREATE,
    ledger_summary,
    planned_row,
    refusal_at_precheck,
    runs_intended,
)
from dashboard.restarts.dispatch import (
    RUN_ACTION,
    cancel_restart,
    claim_restart,
    end_unstarted,
    stale_reason,
)
from dashboard.restarts.fit import (
    BUDGET,
    HOST,
    NOT_RETURNED,
    PRECHECK_MARGIN_FRACTION,
    ROOM_WORDS,
    Fit,
    MemoryReturn,
    engines_held,
    guard_floor,
    planned_need,
    precheck_fit,
    recheck_fit,
    return_tolerance,
    returned_by_stop,
    startup_deadline_seconds,
    with_need,
)
from dashboard.restarts.groups import (
    HEAD_ENDED,
    HEAD_STARTED,
    HEAD_STOPPED,
    PARTS,
    PARTS_PRECHECKED,
    PARTS_RECHECKED,
    PARTS_RUNNING,
    PARTS_STOPPED,
    Barrier,
    Group,
    GroupEnded,
    wait_until,
)
from dashboard.restarts.models import Restart, RestartStep
from dashboard.restarts.pagecache import (
    DROP_TIMEOUT_SECONDS,
    DropRefused,
    PageCacheError,
    cooldown_refusal,
    drop_page_cache,
    drop_while_starting,
    last_drop_before_guard,
)
from sparkops.httpfetch import FetchError, fetch
from sparkops.units import GIB, size_text

__all__ = ["STEPS", "RestartLost", "run_restart"]

log = logging.getLogger(__name__)

STEPS = ("precheck", "drain", "stop", "drop_caches", "recheck", "start", "follow", "record")
STOP_ACTION = "stop-engine"
START_ACTION = "start-engine"
RECREATE_ACTION = "recreate-engine"
RESTORE_ACTION = "restore-engine"
DISCARD_ACTION = "remove-replaced-engine"
POLL_SECONDS = 1.0
HEALTH_DEADLINE_SECONDS = 2.0
# After the log reports a startup error, how long the container may take to exit.
EXIT_AFTER_ERROR_SECONDS = 10.0
SCRAPE_DEADLINE_SECONDS = 4.0
# A neighbour before this phase has not yet logged its KV cache size: starting now would break
# its memory profiling (and ours).
_NOT_YET_SIZED = {"loading", "profiling"}
# The guarded start watches while the engine's log says no more than this (it has not reported
# its KV pool yet), and drops the page cache at most this often per start.
_GUARDED_PHASES = {"unknown", "loading", "profiling"}
GUARD_MAX_INTERVENTIONS = 3
# A rank of an engine that spans nodes reports no readiness of its own (a headless rank serves
# no API): its container that stays up this long after its start runs again; one that exits
# sooner failed its start. The engine is ready when its head is.
RANK_SETTLE_SECONDS = 3.0
MEMORY_NOT_RETURNED = "memory-not-returned"
# What "free" is in each room the guarded start watches.
FREE_WORDS = {HOST: "MemFree", BUDGET: "the memory budget's free room"}


class RestartLost(Exception):
    """The restart row is no longer ``running`` (marked interrupted meanwhile): stop at once."""


class _Finish(Exception):
    """End the run early with ``status`` and ``outcome``."""

    def __init__(self, status: str, outcome: str) -> None:
        super().__init__(outcome)
        self.status = status
        self.outcome = outcome


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
    ("worker:<hostname>" by default; the node's task passes ``<node>@<hostname>``, which says
    in a fleet whose agent ran it); ``margin_bytes`` overrides the 1 %-of-MemTotal margin.
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
        cancel_restart(restart, reason, now, actor=actor)
    elif read_only():
        # Planned before read-only mode was switched on: ended before anything is touched,
        # rather than failing at its stop step.
        end_unstarted(restart, Restart.Status.REFUSED, f"{READ_ONLY_TEXT}; nothing was touched",
                      now, actor=actor)
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
    end_unstarted(restart, Restart.Status.REFUSED, reason, now, actor=actor)


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


@dataclass
class _Guard:
    """The guarded start of one run: what MemFree is compared with, and what was done.

    ``start`` holds the available room of each watched room (:data:`HOST`, and :data:`BUDGET`
    where the engine runs in the memory budget) when the container was started: what the engine
    has allocated since is read against it (:func:`dashboard.restarts.fit.guard_floor`).
    """

    need: int
    margin: int
    fixed: int | None
    start: dict[str, int | None]
    interventions: list[dict[str, Any]] = field(default_factory=list)
    held_back: str = ""
    checks: int = 0
    watching: bool = True
    ended: str = ""

    def floor_words(self) -> str:
        if self.fixed is not None:
            return f"{size_text(self.fixed)} (SPARKOPS_GUARDED_START_FLOOR_GIB)"
        return f"what the engine still has to allocate + the margin of {size_text(self.margin)}"

    def as_dict(self) -> dict[str, Any]:
        return {"floor": self.floor_words(), "fixed_floor_bytes": self.fixed,
                "need_bytes": self.need, "margin_bytes": self.margin,
                "rooms": sorted(self.start), "available_at_start": dict(self.start),
                "checks": self.checks, "max_interventions": GUARD_MAX_INTERVENTIONS,
                "interventions": list(self.interventions), "held_back": self.held_back,
                "watching": self.watching, "ended": self.ended}


class _Run:
    """One claimed restart being carried out; every method is one step or a helper of one."""

    def __init__(self, restart: Restart, *, api: docker.DockerClient | None, api_error: str,
                 clock: Clock, procfs: Procfs, actor: str, poll_seconds: float,
                 margin_bytes: int | None) -> None:
        self.restart = restart
        self.engine = restart.engine
        self.reader = reader_for(self.engine.kind)
        self.node = restart.node
        self.api = api
        self.api_error = api_error
        self.clock = clock
        self.procfs = procfs
        self.actor = actor
        self.poll = poll_seconds
        self.margin_override = margin_bytes
        self.change: dict[str, Any] = restart.change or {}
        # The container replaced by a recreation, while it is kept (None: nothing replaced).
        self.recreated: Recreated | None = None
        self.startup_seconds: float | None = None
        # This start's log as the kind's parser read it (vLLM's StartupLog or a KindStartup).
        self.new_log: Any = None
        self._failed_seen: float | None = None
        # What the stop should hand back (None: nothing to expect, ``return_note`` says why),
        # when it ended, and who was starting then; the re-check's verdict (kept in ``after``).
        self.return_account: MemoryReturn | None = None
        self.return_note: dict[str, Any] = {}
        self.stopped_mono: float | None = None
        self.stopped_wall: datetime | None = None
        self.neighbours_at_stop: list[str] = []
        self.memory_return: dict[str, Any] | None = None
        self.guard: _Guard | None = None
        self.need = 0
        # The restart group of an engine that spans nodes (None: an engine on one node), and
        # what this run waited for in it (kept in ``after``).
        self.group = Group.of(restart)
        self.group_waits: list[dict[str, Any]] = []
        self.started_container = False

    # -- the sequence --------------------------------------------------------------------------

    def execute(self) -> None:
        try:
            need, running = self.precheck()
            self.meet(PARTS_PRECHECKED)
            self.meet(HEAD_STOPPED)
            self.drain(running)
            self.stop(running)
            self.meet(PARTS_STOPPED)
            self.drop_caches()
            self.recheck(need)
            self.meet(PARTS_RECHECKED)
            self.meet(HEAD_STARTED)
            started = self.start()
            self.follow(started)
            self.meet(PARTS_RUNNING)
            self.meet(HEAD_ENDED)
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
            if self.change:
                fit = self.check_change(note, fit)
                note.data.update(fit.as_dict())
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

    def check_change(self, note: _StepNote, fit: Fit) -> Fit:
        """The pre-check of a change of flags: the fit planner on the node's ledger of now with
        the plan's margin (its after-ledger kept in the step's data); refused when the verdict
        got worse than what was accepted at planning. For "recreate", whether the container can
        be recreated, and ``fit`` with the need of the new flags."""
        change = self.change
        recreate = change.get("mode") == RECREATE
        if recreate:
            try:
                check_recreatable(self.docker, self.engine.container_id, change["command"])
            except ContainerEngineError as error:
                note.data["change"] = {"error": str(error)}
                raise _Finish(Restart.Status.REFUSED, f"Pre-check: {error}; nothing was "
                              "touched.") from None
        self.node.refresh_from_db(fields=["ledger"])
        engines = list(Engine.objects.filter(node=self.node, present=True))
        try:
            predicted = plan_fit(self.node, engines,
                                 PlanRequest(self.engine.name, shlex.join(change["command"]),
                                             drop_page_cache=True,
                                             history=history_for(self.engine, self.node)),
                                 change["margin_bytes"])
        except PlanError as error:
            note.data["change"] = {"error": str(error)}
            raise _Finish(Restart.Status.ABORTED, "Pre-check of the new flags not possible: "
                          f"{error}; nothing was touched.") from None
        note.data["change"] = {"plan": ledger_summary(predicted)}
        refusal = refusal_at_precheck(predicted,
                                      accepted_squeeze=bool(change.get("accept_squeeze")))
        if refusal:
            raise _Finish(Restart.Status.REFUSED, f"Pre-check of the new flags: {refusal}; "
                          "nothing was touched.")
        if not recreate:
            return fit  # the container restarts with the command it has
        row = planned_row(predicted)
        return with_need(fit, planned_need(row.weights[1].value, row.kv_pool[1].value,
                                           row.cuda_graphs[1].value, row.prefill_need[1].value))

    def drain(self, running: bool) -> None:
        with self.step("drain") as note:
            url = self.engine.metrics_url
            if not running or not url:
                why = "not running" if not running else \
                    f"no {self.reader.endpoints} address known"
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
                    told = f"drain timeout ({timeout:.0f} s): {left}; going on"
                    if busy is None and self.reader.never_reported.get("requests"):
                        told = (f"waited the whole drain timeout ({timeout:.0f} s) for requests "
                                f"in flight to finish: {error}; going on")
                    note.done(told,
                              # Unknown (None) when the engine could not say.
                              drained=None if busy is None else False,
                              requests_in_flight=busy, waited_seconds=round(waited, 1))
                    return
                self.heartbeat()
                self.clock.sleep(min(self.poll, max(timeout - waited, 0.0)))

    def stop(self, running: bool) -> None:
        with self.step("stop") as note:
            self.require_manageable(STOP_ACTION)
            if not running:
                note.done("the container was not running")
                return
            self.expect_memory_back(note)
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
            self.stopped_mono, self.stopped_wall = self.clock.mono(), self.clock.wall()
            note.data["memory_return"]["stopped_at"] = self.stopped_wall.isoformat()
            note.done(f"stopped in {took:.1f} s", exit_code=status.exit_code,
                      stop_seconds=round(took, 2))

    def expect_memory_back(self, note: _StepNote) -> None:
        """Just before the stop: the room it should grow, now, and what the engine holds (the
        step's ``memory_return``); and which neighbours are starting (their allocations would
        move the room too)."""
        self.engine.refresh_from_db()
        held, parts = returned_by_stop(engine_share(self.engine),
                                       gpu_seen=self.engine.gpu_memory_bytes)
        source, room, total, why = self._return_room()
        self.neighbours_at_stop = self._neighbours_starting()
        note_data: dict[str, Any] = {"source": source, "held_parts": parts, "total_bytes": total}
        if held is None:
            note_data.update(verdict="unknown", why=(
                f"what {self.engine.name} holds is not known: it reports neither its weights "
                "and KV pool nor loaded models, and NVML sees nothing of its processes"))
        elif room is None:
            note_data.update(verdict="unknown", why=f"{ROOM_WORDS[source]} unknown: {why}")
        else:
            self.return_account = MemoryReturn(source, room, held,
                                               return_tolerance(held, total))
            note_data.update(self.return_account.as_dict())
        self.return_note = note_data
        note.data["memory_return"] = note_data

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
            note.done(f"Cached {size_text(result.cached_before)} → "
                      f"{size_text(result.cached_after)}",
                      cached_before_bytes=result.cached_before,
                      cached_after_bytes=result.cached_after)

    def recheck(self, need: int) -> None:
        self.need = need
        with self.step("recheck") as note:
            self.check_memory_back(note)
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

    def check_memory_back(self, note: _StepNote) -> None:
        """Did the stop hand back what the engine held? The room is read until it is back
        within the tolerance, for up to the grace period after the stop; if not, the run ends
        ``aborted`` (left stopped), naming what is missing, with a ``memory-not-returned``
        event. Unknown (noted, the run goes on) without an account, or when a neighbour was
        starting: its allocations move the room as much."""
        account = self.return_account
        if account is None or self.stopped_mono is None:
            data = self.return_note or {"verdict": "unknown", "why": "the container was not "
                                        "running: nothing to hand back"}
            note.data["memory_return"] = {**data, "words": f"Not judged: {data['why']}."}
            return
        grace = settings.SPARKOPS_MEMORY_RETURN_GRACE_SECONDS
        while True:
            account = account.reading(self._room_now(account.source))
            waited = self.clock.mono() - self.stopped_mono
            starting = self.neighbours_at_stop or self._neighbours_starting()
            if starting or account.returned or waited >= grace:
                break
            self.heartbeat()
            self.clock.sleep(min(self.poll, max(grace - waited, 0.0)))
        words = ROOM_WORDS[account.source]
        data = {**self.return_note, **account.as_dict(), "accounts": [account.as_dict()],
                "text": "", "grace_seconds": grace,
                "waited_seconds": round(waited, 1),
                "stopped_at": self.stopped_wall.isoformat() if self.stopped_wall else None,
                "engines_held": engines_held(
                    Engine.objects.filter(node=self.node, present=True)
                    .exclude(pk=self.engine.pk)) | {str(self.engine.pk): 0}}
        seen = (f"{words} {size_text(account.best)}, expected {size_text(account.expected)} "
                f"± {size_text(account.tolerance)}")
        held = size_text(account.held)
        if starting:
            why = f"{', '.join(starting)} started meanwhile: its allocations move {words} too"
            data.update(verdict="unknown", why=why, words=f"Not judged: {why}.")
        elif account.returned is None:
            why = f"{words} could not be read after the stop"
            data.update(verdict="unknown", why=why, words=f"Not judged: {why}.")
        elif account.returned:
            data.update(verdict="returned", why="", words=(
                f"What {self.engine.name} held ({held}) came back within {waited:.0f} s "
                f"({seen})."))
        else:
            data.update(verdict=NOT_RETURNED, why="", words=(
                f"{size_text(account.missing)} of what {self.engine.name} held ({held}) was "
                f"still missing {waited:.0f} s after it stopped ({seen})."))
        note.data["memory_return"] = data
        self.memory_return = data
        if data["verdict"] != NOT_RETURNED:
            return
        missing = size_text(account.missing)
        data["text"] = (f"{self.engine.name}: memory not returned: {missing} of what it held "
                        f"({held}) is still missing {waited:.0f} s after it stopped ({seen}).")
        Event.objects.create(node=self.node, engine=self.engine, at=self.clock.wall(),
                             kind=MEMORY_NOT_RETURNED, severity=Event.Severity.WARNING,
                             message=data["text"])
        raise _Finish(Restart.Status.ABORTED,
                      f"Memory not returned: {missing} of what {self.engine.name} held is "
                      f"still missing {waited:.0f} s after it stopped ({seen}); not starting "
                      "into it (a reboot frees it). Left stopped.")

    def start(self) -> _Started:
        with self.step("start") as note:
            recreate = self.change.get("mode") == RECREATE
            action = RECREATE_ACTION if recreate else START_ACTION
            self.require_manageable(action)
            wall, mono = self.clock.wall(), self.clock.mono()
            try:
                if recreate:
                    self.recreate(note)
                else:
                    start_container(self.docker, self.engine.container_id)
                status = container_status(self.docker, self.engine.container_id)
            except ContainerEngineError as error:
                self._audit(action, True, f"failed: {error}")
                verb = "recreate" if recreate else "start"
                raise _Finish(Restart.Status.FAILED, f"Could not {verb} {self.engine.name}: "
                              f"{error}.") from None
            self.started_container = True
            if recreate:
                self._audit(action, True, f"recreated with the new command as "
                            f"{self.engine.container_id[:12]} ({status.state}); the old "
                            f"container is kept, stopped, as {self.recreated.replaced_name}")
            else:
                self._audit(action, True, f"started ({status.state})")
            seconds = startup_deadline_seconds(self.restart.expected_startup_seconds)
            deadline = wall + timedelta(seconds=seconds)
            self._save(deadline=deadline)
            self.guard = self._new_guard()
            note.done(f"started; expected ready in {self.restart.expected_startup_seconds} s, "
                      f"deadline {deadline:%H:%M:%S} UTC", started_at=wall.isoformat(),
                      deadline=deadline.isoformat(), deadline_seconds=seconds)
            return _Started(wall=wall, mono=mono,
                            container_started_at=status.started_at or wall,
                            deadline_mono=mono + seconds, deadline_seconds=seconds)

    def recreate(self, note: _StepNote) -> None:
        """Replace the stopped container by one with the new command; the engine's row follows
        the new container from here (the collectors would find it by its name anyway)."""
        recreated = recreate_with_command(self.docker, self.engine.container_id,
                                          self.change["command"])
        self.recreated = recreated
        self._follow_container(recreated.container_id)
        note.data["recreated"] = recreated.as_dict()

    def _follow_container(self, container_id: str) -> None:
        Engine.objects.filter(pk=self.engine.pk).update(container_id=container_id)
        self.engine.container_id = container_id

    def after_failed_recreation(self, status: ContainerStatus | None) -> str:
        """After a failed start of a recreated container: put the old one back when the new one
        no longer runs; what became of the old one, in words ("" without a recreation)."""
        recreated = self.recreated
        if recreated is None:
            return ""
        if status is None or status.running:
            return f" The old container is kept, stopped, as {recreated.replaced_name}."
        try:
            restore_replaced(self.docker, recreated)
        except ContainerEngineError as error:
            self._audit(RESTORE_ACTION, True, f"failed: {error}")
            return f" Putting the old container back failed: {error}."
        self.recreated = None
        self._follow_container(recreated.replaced_id)
        self._audit(RESTORE_ACTION, True, "removed the new container; the old one is back under "
                                          "its name, stopped")
        return (" The new container was removed and the old one is back under its name, "
                "stopped, with its old flags.")

    def discard_replaced(self, note: _StepNote) -> None:
        """Once the recreated engine serves: remove the old container (noted, never fatal)."""
        recreated = self.recreated
        if recreated is None:
            return
        try:
            discard_replaced(self.docker, recreated)
        except ContainerEngineError as error:
            self._audit(DISCARD_ACTION, True, f"failed: {error}")
            note.data["replaced"] = {"removed": False, "name": recreated.replaced_name,
                                     "error": str(error)}
            return
        self.recreated = None
        self._audit(DISCARD_ACTION, True, f"removed the old container {recreated.replaced_name}")
        note.data["replaced"] = {"removed": True, "name": recreated.replaced_name}

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
                self.guard_start(note, startup)
                failure = self._startup_failure(status, startup, elapsed, started) \
                    or self._group_failure()
                if failure:
                    failure += self.after_failed_recreation(status)
                    note.done(failure, ok=False)
                    raise _Finish(Restart.Status.FAILED, failure)
                if status is not None and status.running and self._ready(startup, elapsed):
                    self.startup_seconds = round(elapsed, 2)
                    self._note_phase(note, phases, "ready", elapsed)
                    note.done(f"ready after {elapsed:.1f} s", startup_seconds=self.startup_seconds)
                    self.discard_replaced(note)
                    return
                self.heartbeat()
                self.clock.sleep(self.poll)

    # -- the guarded start ------------------------------------------------------------------------

    def _new_guard(self) -> _Guard:
        """The guarded start of this run, from the rooms as the container starts."""
        fixed_gib = settings.SPARKOPS_GUARDED_START_FLOOR_GIB
        info = self.meminfo()
        return _Guard(need=self.need, margin=self.margin(info),
                      fixed=int(fixed_gib * GIB) if fixed_gib > 0 else None,
                      start={source: available
                             for source, (_, available) in self._guard_readings(info).items()})

    def _guard_readings(self, info: MemInfo | None = None
                        ) -> dict[str, tuple[int | None, int | None]]:
        """``(free, available)`` now in each room the guarded start watches: MemFree and
        MemAvailable; and, where the engine runs in the memory budget, its limit less its usage
        (page cache included) and its room (limit less its working set)."""
        info = info or self.meminfo()
        readings = {HOST: (info.get("MemFree") if info else None,
                           info.mem_available if info else None)}
        budget = self._budget_if_inside()
        if budget is not None:
            reading = read_memory_budget(budget)
            free = None if reading.limit is None or reading.usage is None \
                else max(reading.limit - reading.usage, 0)
            readings[BUDGET] = (free, reading.room)
        return readings

    def guard_start(self, note: _StepNote, startup: Any) -> None:
        """One check of the guarded start while the engine has not reported its KV pool: free
        memory below the floor in any watched room has the page cache dropped and memory
        compacted, within the limits; what was found and done goes to the step's data."""
        guard = self.guard
        if guard is None or not guard.watching:
            return
        phase = startup.phase if startup is not None else "unknown"
        if phase not in _GUARDED_PHASES:
            guard.watching = False
            guard.ended = f"watched until the engine reported phase {phase}"
            note.data["guarded_start"] = guard.as_dict()
            return
        guard.checks += 1
        note.data["guarded_start"] = guard.as_dict()
        short = self._below_floor(guard)
        if short is None:
            return
        source, free, floor, still = short
        why = (f"{FREE_WORDS[source]} {size_text(free)} below the floor of {size_text(floor)} "
               f"({size_text(still)} still to allocate) at phase {phase}")
        if len(guard.interventions) >= GUARD_MAX_INTERVENTIONS:
            guard.held_back = (f"{why}; not dropped: the {GUARD_MAX_INTERVENTIONS} "
                               "interventions of a start are used")
        else:
            refusal = cooldown_refusal(last_drop_before_guard(self.node.pk, self.restart),
                                       self.clock.wall())
            if refusal:
                guard.held_back = f"{why}; not dropped: {refusal}"
            else:
                self._intervene(guard, source, free, floor, why)
        note.data["guarded_start"] = guard.as_dict()
        note.save()

    def _below_floor(self, guard: _Guard) -> tuple[str, int, int, int] | None:
        """``(room, free, floor, still to allocate)`` of the room furthest below its floor;
        None when every room is above it (or unreadable)."""
        short = []
        for source, (free, available) in self._guard_readings().items():
            if free is None:
                continue
            floor, still = guard_floor(guard.need, available_at_start=guard.start.get(source),
                                       available_now=available, margin=guard.margin,
                                       fixed=guard.fixed)
            if free < floor:
                short.append((source, free, floor, still))
        return min(short, key=lambda item: item[1] - item[2]) if short else None

    def _intervene(self, guard: _Guard, source: str, free: int, floor: int, why: str) -> None:
        at = self.clock.wall()
        entry: dict[str, Any] = {"at": at.isoformat(), "room": source,
                                 "room_words": FREE_WORDS[source], "free_before_bytes": free,
                                 "free_before_text": size_text(free), "floor_bytes": floor,
                                 "floor_text": size_text(floor)}
        try:
            # No heartbeat while the helper runs, as in the drop_caches step.
            done = drop_while_starting(
                engine=self.engine, restart=self.restart, actor=self.actor, why=why,
                proc_root=self.procfs.root, timeout_seconds=min(
                    DROP_TIMEOUT_SECONDS, settings.SPARKOPS_RESTART_HEARTBEAT_STALE_SECONDS / 2))
        except DropRefused as error:
            guard.watching = False
            guard.ended = f"stopped watching: {error}"
            guard.interventions.append({**entry, "free_after_bytes": None,
                                        "free_after_text": "—", "dropped": False,
                                        "compacted": False, "done": f"refused: {error}",
                                        "text": f"{why}: refused: {error}"})
            return
        after = self._guard_readings().get(source, (None, None))[0]
        guard.interventions.append({
            **entry, "free_after_bytes": after, "free_after_text": size_text(after),
            "dropped": done.result is not None,
            "compacted": done.compacted, "done": done.words(),
            "text": f"{why}: {done.words()}; {FREE_WORDS[source]} {size_text(after)} after"})

    def finish(self, status: str, outcome: str) -> None:
        """The record step: the final row, written only while this run still owns it."""
        with self.step("record") as note:
            state = self._state_now()
            info = self.meminfo()
            capacity = self._capacity(self.new_log.as_dict() if self.new_log else {}, {})
            after = self._snapshot(info, capacity)
            if self.memory_return is not None:
                after["memory_return"] = self.memory_return
            if self.group is not None:
                after["group"] = note.data["group"] = self._group_record()
            flags = self._flags_after() if self.change else None
            if flags is not None:
                note.data["flags"] = flags
                if status in (Restart.Status.SUCCEEDED, Restart.Status.FAILED):
                    outcome = f"{outcome} {flags['text']}"
            now = self.clock.wall()
            # A rank's start is not a startup of the engine: its readiness is its head's.
            measured = self.startup_seconds if self.group is None or self.group.is_head else None
            Restart.objects.filter(pk=self.restart.pk, status=Restart.Status.RUNNING).update(
                status=status, outcome=outcome, finished_at=now, container_state=state,
                after=after, startup_seconds=measured)
            note.done(f"{status}: {outcome}", ok=status == Restart.Status.SUCCEEDED,
                      status=status, container=state)
        severity = {Restart.Status.SUCCEEDED: Event.Severity.INFO,
                    Restart.Status.ABORTED: Event.Severity.WARNING,
                    # Refused by the pre-check: nothing was touched.
                    Restart.Status.REFUSED: Event.Severity.WARNING}.get(status,
                                                                        Event.Severity.CRITICAL)
        if status == Restart.Status.ABORTED and not state.get("running"):
            severity = Event.Severity.CRITICAL  # aborted with the engine left down
        Event.objects.create(node=self.node, engine=self.engine, at=now,
                             kind=f"restart-{status}", severity=severity,
                             message=f"{self.engine.name}: planned restart {status}: {outcome}")

    def _flags_after(self) -> dict[str, Any]:
        """The flags the engine's container runs now, and whether they are the intended ones
        (``runs_intended`` None when that cannot be told; the words say why)."""
        if self.api is None:
            return {"runs_intended": None, "command": None,
                    "text": "Its flags after the run are unknown: the container engine was "
                            "unreachable."}
        try:
            words = container_command(self.api, self.engine.container_id)
        except ContainerEngineError as error:
            return {"runs_intended": None, "command": None,
                    "text": f"Its flags after the run are unknown: {error}."}
        intended, text = runs_intended(words, self.change["command"])
        return {"runs_intended": intended, "command": mask_command(words),
                "text": f"{text[:1].upper()}{text[1:]}."}

    # -- an engine that spans nodes ---------------------------------------------------------------

    def meet(self, barrier: Barrier) -> None:
        """Wait for the other members of this run's group at ``barrier`` (the head at the
        parts' barriers, a part at its head's); nothing for an engine on one node. Ends the
        run ``aborted`` (``failed`` once its container was started again) when another member
        ended badly or did not come within the limit."""
        group = self.group
        if group is None or (barrier.on == PARTS) != group.is_head:
            return
        since = self.clock.wall()
        try:
            waited = wait_until(group, barrier, limit=self._group_limit(barrier),
                                mono=self.clock.mono, pause=self._pause, poll=self.poll)
        except (GroupEnded, TimeoutError) as ended:
            self.group_waits.append({"barrier": barrier.name, "since": since.isoformat(),
                                     "met": False, "why": str(ended)})
            status = Restart.Status.FAILED if self.started_container else Restart.Status.ABORTED
            raise _Finish(status, f"{str(ended)[:1].upper()}{str(ended)[1:]}; "
                          f"{self._left_words()}.") from None
        self.group_waits.append({"barrier": barrier.name, "since": since.isoformat(),
                                 "met": True, "waited_seconds": round(waited, 1)})

    def _group_limit(self, barrier: Barrier) -> float:
        """How long a barrier may take: the group wait, plus what the awaited step may take
        of the head (its re-check's waits before it starts, its startup deadline before it
        ends)."""
        limit = settings.SPARKOPS_RESTART_GROUP_WAIT_SECONDS
        if barrier is HEAD_STARTED:
            limit += (settings.SPARKOPS_MEMORY_RETURN_GRACE_SECONDS
                      + settings.SPARKOPS_RESTART_MIN_DEADLINE_SECONDS)
        elif barrier is HEAD_ENDED:
            limit += startup_deadline_seconds(self.restart.expected_startup_seconds)
        return limit

    def _group_failure(self) -> str:
        """While the head follows its start: why the engine cannot serve because a rank's
        restart ended badly ("" while none did, and for a part)."""
        if self.group is None or not self.group.is_head:
            return ""
        try:
            self.group.raise_if_ended()
        except GroupEnded as ended:
            return f"{str(ended)[:1].upper()}{str(ended)[1:]}; the engine cannot serve without it."
        return ""

    def _pause(self, seconds: float) -> None:
        self.heartbeat()
        self.clock.sleep(seconds)

    def _left_words(self) -> str:
        """The state this run leaves its container in, for an outcome."""
        if self.started_container:
            return f"{self.engine.name} was started again and is left as it is"
        if self.stopped_wall is not None:
            return f"{self.engine.name} is left stopped"
        return "nothing was touched"

    def _group_record(self) -> dict[str, Any]:
        group = self.group
        assert group is not None
        return {"role": "head" if group.is_head else "rank", "head": group.head_id,
                "parts": list(group.part_ids), "waits": list(self.group_waits)}

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
        """The lower of MemAvailable now and the ledger's interval minimum (while the ledger is
        no older than :func:`collectors.sampling.stale_after` the collection interval): the
        ledger catches a neighbour's transient prefill dip that one reading would miss."""
        now_value = info.mem_available if info else None
        self.node.refresh_from_db(fields=["ledger"])
        ledger = self.node.ledger or {}
        ledger_value = ledger.get("headroom")
        fresh = False
        if ledger_value is not None and ledger.get("at"):
            age = self.clock.wall() - datetime.fromisoformat(ledger["at"])
            fresh = age.total_seconds() <= stale_after(settings.SPARKOPS_COLLECT_INTERVAL)
        # The ledger's headroom is the interval's minimum, and the memory budget's room where
        # that is smaller (collectors.ledger); say which.
        ledger_name = ("ledger interval minimum (memory budget's room)"
                       if ledger.get("headroom_source") == "budget" else "ledger interval minimum")
        candidates = {"MemAvailable now": now_value,
                      ledger_name: ledger_value if fresh else None}
        known = {name: value for name, value in candidates.items() if value is not None}
        if not known:
            return None, "unknown"
        source = min(known, key=lambda name: known[name])
        return known[source], source

    def _budget_if_inside(self) -> Path | None:
        """The memory budget's cgroup when the node has one and its ledger says this engine runs
        inside it; None otherwise."""
        budget = configured_budget()
        if budget is None:
            return None
        shares = (self.node.ledger or {}).get("engines") or []
        inside = any(share.get("engine_id") == self.engine.pk and share.get("in_budget")
                     for share in shares)
        return budget if inside else None

    def _return_room(self) -> tuple[str, int | None, int | None, str]:
        """``(room, size now, total, why unknown)`` of what the stop should grow: the memory
        budget's room (its total the limit) when the engine runs in one, else MemAvailable (its
        total MemTotal)."""
        budget = self._budget_if_inside()
        if budget is not None:
            reading = read_memory_budget(budget)
            return BUDGET, reading.room, reading.limit, reading.room_note
        info = self.meminfo()
        if info is None:
            return HOST, None, None, "/proc/meminfo could not be read"
        total = info.get("MemTotal") or self.node.mem_total_bytes
        return HOST, info.mem_available, total, "no MemAvailable in /proc/meminfo"

    def _room_now(self, source: str) -> int | None:
        if source == BUDGET:
            budget = configured_budget()
            return read_memory_budget(budget).room if budget is not None else None
        info = self.meminfo()
        return info.mem_available if info else None

    def _requests_in_flight(self, url: str) -> tuple[int | None, str]:
        """Running + waiting requests, read through the engine's kind; ``(None, why)`` when it
        cannot say (a kind that never reports them is not read at all)."""
        never = self.reader.never_reported.get("requests")
        if never:
            return None, never
        try:
            reading = self.reader.read(url, deadline=SCRAPE_DEADLINE_SECONDS)
        except ScrapeError as error:
            return None, f"{self.reader.endpoints}: {error}"
        snapshot = reading.snapshot
        parts = [snapshot.requests_running, snapshot.requests_waiting]
        if all(part is None for part in parts):
            return None, reading.unknown.get("requests") or \
                f"{self.reader.endpoints} reports no request gauges"
        return sum(part or 0 for part in parts), ""

    def wait_for_neighbours(self) -> float:
        """Wait until no other engine of the node is starting without having logged its KV
        cache size (two engines profiling at once each see the other's memory as taken).
        Bounded by the minimum startup deadline; an engine still not sized by then ends the
        run (left stopped)."""
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
        """Running, not serving yet, and its log since its start has no KV cache size yet,
        each judged by the neighbour's own kind (its health endpoint, its log's phases).

        A neighbour that answers its health endpoint is past that point, whatever its log still
        holds (a long-running engine's startup lines can be far behind the log tail). Nothing
        logged yet counts as starting only for a container started recently.
        """
        reader = reader_for(neighbour.kind)
        try:
            status = container_status(self.docker, neighbour.container_id)
            if not status.running or status.started_at is None:
                return False
            if neighbour.metrics_url and _healthy(neighbour.metrics_url, reader.health_path):
                return False
            text = container_logs_since(self.docker, neighbour.container_id, status.started_at)
        except ContainerEngineError:
            return False  # unknown: the collector reports it; not a reason to hold this start
        phase = _parse_log(reader, text).phase
        if phase == "unknown":
            age = (self.clock.wall() - status.started_at).total_seconds()
            return age < settings.SPARKOPS_RESTART_MIN_DEADLINE_SECONDS
        return phase in _NOT_YET_SIZED

    def _startup_log(self, started: _Started) -> Any:
        """This start's log, read by the kind's parser; None when the logs could not be read."""
        try:
            return _parse_log(self.reader, container_logs_since(
                self.docker, self.engine.container_id, started.container_started_at))
        except ContainerEngineError as error:
            log.warning("restart %s: %s", self.restart.pk, error)
            return None

    def _startup_failure(self, status: ContainerStatus | None, startup: Any,
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
            # Engines exit right after logging the error: wait briefly to report the exit code.
            self._failed_seen = self._failed_seen or self.clock.mono()
            if self.clock.mono() - self._failed_seen >= EXIT_AFTER_ERROR_SECONDS:
                return f"Startup failed, the container still runs: {errors}."
        if self.clock.mono() >= started.deadline_mono:
            phase = startup.phase if startup else "unknown"
            return (f"Not ready {elapsed:.0f} s after the start (deadline "
                    f"{started.deadline_seconds:.0f} s); last phase: {phase}. The container was "
                    "left as it is.")
        return ""

    def _ready(self, startup: Any, elapsed: float = 0.0) -> bool:
        """Ready when the kind's health endpoint answers 200 (vLLM's and llama.cpp's
        ``/health``, Ollama's ``/api/version``); without a known address, when the log says
        so. A rank of an engine that spans nodes: once its container stayed up
        :data:`RANK_SETTLE_SECONDS` (its engine serves when its head does)."""
        if self.group is not None and not self.group.is_head:
            return elapsed >= RANK_SETTLE_SECONDS
        url = self.engine.metrics_url
        if not url:
            return startup is not None and startup.phase == "ready"
        return _healthy(url, self.reader.health_path)

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
        if self.group is not None and not self.group.is_head:
            head = Restart.objects.get(pk=self.group.head_id)
            return (f"Its container runs again {self.startup_seconds:.1f} s after the start; "
                    f"the engine is ready: the restart of its head {head.engine.name} on "
                    f"{head.node.name} (#{head.pk}) succeeded.")
        capacity = self._capacity(self.new_log.as_dict() if self.new_log else {}, {})
        kv = capacity["kv_cache_gib"]
        tokens = capacity["kv_cache_tokens"]
        pool = f"; KV pool {kv:.2f} GiB" if kv is not None else ""
        pool += f", {tokens:,} tokens" if tokens is not None else ""
        return (f"Ready {self.startup_seconds:.1f} s after the start (expected "
                f"{self.restart.expected_startup_seconds} s){pool}.")


def _healthy(base_url: str, path: str) -> bool:
    """Does the engine's health endpoint ``path`` answer 200 now (within a short deadline)?"""
    try:
        fetch(f"{base_url}{path}", deadline=HEALTH_DEADLINE_SECONDS, max_bytes=64 * 1024)
    except FetchError:
        return False
    return True


def _parse_log(reader: KindReader, text: str) -> Any:
    """``text`` (a container's log since a start) read by ``reader``'s startup parser: the
    last startup in it, in that kind's result type (``phase``, ``errors``, KV figures)."""
    parser = reader.new_log_parser()
    parser.feed(text)
    return parser.result()


def _first(*values: Any) -> Any:
    return next((value for value in values if value is not None), None)
