"""The runbook against real engines: the emulator in Podman containers, reached through the
Docker-compatible API, the node's real /proc/meminfo, and a real page-cache drop (as root)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import timedelta
from itertools import pairwise
from pathlib import Path

import pytest
from django.utils import timezone

from collectors import docker_api
from collectors.models import Event
from collectors.vllm.logs import parse_startup_log
from dashboard.audit.models import AuditEntry
from dashboard.restarts.dispatch import restarts_to_dispatch
from dashboard.restarts.models import Restart
from dashboard.restarts.pagecache import DropRefused, drop_page_cache
from dashboard.restarts.planning import learned_startup_seconds
from dashboard.restarts.runbook import STEPS, run_restart
from tests.conftest import FIXTURES, PROJECT, subprocess_env
from tests.containers import podman
from tests.restarts.runbook_helpers import (
    MemFreeGoneAfterFirstRead,
    RealEngine,
    collect_until_ready,
    fill_page_cache,
    hook_clock,
    plan_now,
    refresh_ledger,
    started_at,
)
from tests.restarts.runbook_helpers import start_engine as start_real_engine

# alone: the runbook judges the host's own MemAvailable (whether a stopped engine's memory
# came back, whether the next start fits), which engines of tests beside it would move.
pytestmark = [pytest.mark.slow, pytest.mark.django_db, pytest.mark.alone]
MIB = 1024**2
POLL = 0.2


@pytest.fixture
def api(docker_host):
    client = docker_api.client(docker_host)
    yield client
    client.close()


@pytest.fixture
def start_engine(tmp_path):
    """Start engines for one test and remove them after it: engines left running would be
    this node's neighbours in the next test (and one still loading would hold its start)."""
    started: list[RealEngine] = []

    def start(name: str, **options: object) -> RealEngine:
        started.append(start_real_engine(tmp_path / name, **options))
        return started[-1]

    yield start
    for real in started:
        podman("rm", "--force", "--time", "0", real.name)


@pytest.fixture(autouse=True)
def _quick_restarts(settings):
    settings.SPARKOPS_RESTART_DRAIN_TIMEOUT_SECONDS = 3
    settings.SPARKOPS_RESTART_MIN_DEADLINE_SECONDS = 30
    settings.SPARKOPS_DROP_CACHES_COOLDOWN_SECONDS = 300


def _steps(restart: Restart) -> list[tuple[str, bool | None]]:
    return list(restart.steps.order_by("started_at", "pk").values_list("step", "ok"))


def _actions(restart: Restart) -> list[tuple[str, bool]]:
    return list(AuditEntry.objects.filter(restart=restart).order_by("at", "pk")
                .values_list("action", "allowed"))


@pytest.mark.skipif(os.geteuid() != 0, reason="the real page-cache drop needs root")
def test_a_planned_restart_runs_every_step_and_drops_the_page_cache(node, api, start_engine,
                                                                   tmp_path):
    real = start_engine("engine", labels={"sparkops.prefill-bytes-per-token": "1024"})
    engine = collect_until_ready(node, api, real.name)[real.name]
    refresh_ledger(node)
    first_start = started_at(api, real.container_id)
    fill_page_cache(tmp_path / "cache-filler", 256 * MIB)
    restart = plan_now(engine)

    restart = run_restart(restart.pk, api=api, poll_seconds=POLL)

    assert restart.status == Restart.Status.SUCCEEDED, restart.outcome
    assert _steps(restart) == [(step, True) for step in STEPS]
    steps = {s.step: s for s in restart.steps.all()}
    times = [(s.started_at, s.finished_at) for s in restart.steps.order_by("started_at", "pk")]
    assert all(start <= end for start, end in times)
    assert all(end <= next_start for (_, end), (next_start, _) in pairwise(times))
    # Cached really fell: the 256 MiB just read, and whatever else was clean.
    drop = steps["drop_caches"].data
    assert drop["cached_before_bytes"] - drop["cached_after_bytes"] > 200 * MIB
    assert steps["precheck"].data["fits"] is True
    assert steps["precheck"].data["parts"]["prefill"] == 2048 * 1024
    assert steps["recheck"].data["parts"]["mem_free"] > steps["recheck"].data["need_bytes"]
    # The startup phases as the new log told them, in order, then ready.
    phases = [p["phase"] for p in steps["follow"].data["phases"]]
    assert phases[-1] == "ready" and phases.index("profiling") < phases.index("kv_allocated")
    assert 1.0 < restart.startup_seconds < 20
    assert learned_startup_seconds(engine) == (restart.startup_seconds, "median of 1 start")
    assert restart.before["kv_cache_tokens"] == restart.after["kv_cache_tokens"] > 0
    assert restart.after["kv_cache_gib"] == pytest.approx(64 / 1024, abs=0.005)  # "0.06 GiB"
    assert restart.after["mem_free_bytes"] and restart.before["mem_available_bytes"]
    assert restart.container_state["running"] is True
    assert started_at(api, real.container_id) != first_start
    assert _actions(restart) == [("run-restart", True), ("stop-engine", True),
                                 ("drop-caches", True), ("start-engine", True)]
    assert AuditEntry.objects.get(action="stop-engine").actor.startswith("worker:")
    assert Event.objects.get(kind="restart-succeeded").severity == "info"


def test_a_restart_that_would_not_fit_is_aborted_before_touching_anything(node, api,
                                                                          start_engine):
    # 2048 batched tokens × 100 MB of activations: a 205 GB prefill buffer fits nowhere.
    real = start_engine("engine",
                        labels={"sparkops.prefill-bytes-per-token": "100000000"})
    engine = collect_until_ready(node, api, real.name)[real.name]
    refresh_ledger(node)
    before = started_at(api, real.container_id)

    restart = run_restart(plan_now(engine).pk, api=api, poll_seconds=POLL)

    assert restart.status == Restart.Status.ABORTED
    assert re.fullmatch(rf"Pre-check: {real.name} needs 190\.8 GiB \(\+ \d+ MiB margin\), "
                        r"\d+\.\d GiB would be free; nothing was touched\.", restart.outcome)
    assert _steps(restart) == [("precheck", False), ("record", False)]
    assert started_at(api, real.container_id) == before
    assert docker_api.container_status(api, real.container_id).running
    assert restart.container_state["running"] is True
    assert _actions(restart) == [("run-restart", True)]


def test_an_engine_that_no_longer_fits_after_the_drop_is_left_stopped(node, api, start_engine):
    real = start_engine("engine")
    engine = collect_until_ready(node, api, real.name)[real.name]
    refresh_ledger(node)

    restart = run_restart(plan_now(engine).pk, api=api, poll_seconds=POLL,
                          procfs=MemFreeGoneAfterFirstRead())

    assert restart.status == Restart.Status.ABORTED
    assert re.fullmatch(r"Re-check after the stop and the drop: \S+ needs \d+ MiB \(\+ \d+ MiB "
                        r"margin\), 10 MiB is free \(MemFree\)\. Left stopped: it would not "
                        r"start, or over-commit the node\.", restart.outcome)
    assert [step for step, _ in _steps(restart)] == [*STEPS[:5], "record"]
    assert restart.container_state["running"] is False
    assert not docker_api.container_status(api, real.container_id).running
    assert ("start-engine", True) not in _actions(restart)
    assert Event.objects.get(kind="restart-aborted").severity == "critical"


def test_an_engine_that_never_becomes_ready_fails_at_the_deadline(node, api, start_engine,
                                                                  settings):
    settings.SPARKOPS_RESTART_MIN_DEADLINE_SECONDS = 4
    real = start_engine("engine")
    engine = collect_until_ready(node, api, real.name)[real.name]
    refresh_ledger(node)
    real.next_start("--emulator-load-seconds", "3600")  # hangs loading its weights

    restart = run_restart(plan_now(engine, expected_startup_seconds=2).pk, api=api,
                          poll_seconds=POLL)

    assert restart.status == Restart.Status.FAILED
    assert restart.outcome.startswith("Not ready 4 s after the start (deadline 4 s); last phase: "
                                      "loading.")
    follow = restart.steps.get(step="follow")
    assert follow.ok is False and [p["phase"] for p in follow.data["phases"]] == ["loading"]
    assert restart.deadline is not None and restart.startup_seconds is None
    assert restart.container_state["running"] is True  # left as it is: the admin decides
    assert Event.objects.get(kind="restart-failed").severity == "critical"


def test_a_container_that_fails_to_start_fails_with_the_logs_error(node, api, start_engine):
    real = start_engine("engine")
    engine = collect_until_ready(node, api, real.name)[real.name]
    refresh_ledger(node)
    real.next_start("--emulator-fail", "free-memory")

    restart = run_restart(plan_now(engine).pk, api=api, poll_seconds=POLL)

    assert restart.status == Restart.Status.FAILED
    assert "exit code 1" in restart.outcome
    assert "Free memory on device" in restart.outcome and "is less than desired" in restart.outcome
    assert restart.container_state["running"] is False
    assert restart.container_state["exit_code"] == 1
    assert _steps(restart)[-2:] == [("follow", False), ("record", False)]


def test_two_restarts_of_one_node_run_one_after_the_other(node, api, start_engine):
    one, two = start_engine("one"), start_engine("two")
    engines = collect_until_ready(node, api, one.name, two.name)
    refresh_ledger(node)
    first, second = plan_now(engines[one.name]), plan_now(engines[two.name])
    seen_during_first: list[tuple[str, str, list[int]]] = []

    def try_the_second() -> None:
        # While the first restart follows its engine's start, the second cannot be claimed
        # and is not dispatched.
        if seen_during_first or Restart.objects.get(pk=first.pk).phase != "follow":
            return
        tried = run_restart(second.pk, api=api, poll_seconds=POLL)
        dispatched = [r.pk for r in restarts_to_dispatch(timezone.now())]
        seen_during_first.append((tried.status, tried.phase, dispatched))

    first = run_restart(first.pk, api=api, poll_seconds=POLL,
                        clock=hook_clock(try_the_second))
    assert seen_during_first == [(Restart.Status.SCHEDULED, "waiting", [])]

    second = run_restart(second.pk, api=api, poll_seconds=POLL)

    assert first.status == second.status == Restart.Status.SUCCEEDED, second.outcome
    assert second.started_at >= first.finished_at
    # The page cache was dropped for the first moments ago: the cooldown refuses the second
    # drop, which is noted, and the re-check still lets the engine start.
    drop = second.steps.get(step="drop_caches")
    assert drop.ok is False and "cooldown" in drop.message
    assert AuditEntry.objects.filter(action="drop-caches", allowed=False,
                                     restart=second).count() == 1


def test_an_engine_starts_only_after_a_starting_neighbour_logged_its_kv_cache(node, api,
                                                                              start_engine):
    real = start_engine("engine")
    engine = collect_until_ready(node, api, real.name)[real.name]
    neighbour = start_engine("neighbour", load_seconds=4)
    collect_until_ready(node, api, real.name)  # the neighbour is present, still loading
    refresh_ledger(node)

    restart = run_restart(plan_now(engine).pk, api=api, poll_seconds=POLL)

    assert restart.status == Restart.Status.SUCCEEDED, restart.outcome
    assert _steps(restart) == [(step, True) for step in STEPS]
    assert restart.steps.get(step="recheck").data["neighbours_waited_seconds"] >= 2
    # What the neighbour had logged when this engine was started: its KV cache, at least.
    start = restart.steps.get(step="start").started_at
    logged = parse_startup_log(podman("logs", "--until", start.isoformat(), neighbour.name))
    assert logged.phase in ("kv_allocated", "ready") and logged.kv_cache_tokens


def test_an_unmanaged_engine_is_refused_and_untouched(node, api, start_engine):
    real = start_engine("engine", manage=False)
    engine = collect_until_ready(node, api, real.name)[real.name]
    before = started_at(api, real.container_id)

    restart = run_restart(plan_now(engine).pk, api=api, poll_seconds=POLL)

    assert restart.status == Restart.Status.REFUSED
    assert restart.steps.count() == 0
    assert _actions(restart) == [("run-restart", False)]
    assert started_at(api, real.container_id) == before


def test_a_stale_restart_is_cancelled_not_run(node, api, start_engine, settings):
    settings.SPARKOPS_RESTART_START_GRACE_SECONDS = 60
    real = start_engine("engine")
    engine = collect_until_ready(node, api, real.name)[real.name]
    before = started_at(api, real.container_id)
    restart = plan_now(engine)
    Restart.objects.filter(pk=restart.pk).update(
        scheduled_for=timezone.now() - timedelta(hours=6))

    restart = run_restart(restart.pk, api=api, poll_seconds=POLL)

    assert restart.status == Restart.Status.CANCELLED
    assert "queued during an outage" in restart.outcome and "6 h 0 min late" in restart.outcome
    assert started_at(api, real.container_id) == before


@pytest.mark.skipif(os.geteuid() != 0, reason="the real page-cache drop needs root")
def test_drop_caches_is_refused_while_the_engine_runs_and_within_the_cooldown(node, api,
                                                                              start_engine):
    real = start_engine("engine")
    engine = collect_until_ready(node, api, real.name)[real.name]

    with pytest.raises(DropRefused, match="is running"):
        drop_page_cache(engine=engine, restart=None, actor="worker:test", api=api)
    podman("stop", "--time", "5", real.name)
    dropped = drop_page_cache(engine=engine, restart=None, actor="worker:test", api=api)
    with pytest.raises(DropRefused, match="cooldown is 300 s"):
        drop_page_cache(engine=engine, restart=None, actor="worker:test", api=api)

    assert dropped.cached_before is not None and dropped.cached_after is not None
    assert list(AuditEntry.objects.filter(action="drop-caches").order_by("at", "pk")
                .values_list("allowed", flat=True)) == [False, True, False]


# --- a real Celery worker killed mid-restart ------------------------------------------------------

WORLD = """
import time
from django.utils import timezone
from collectors import docker_api
from collectors.engines import collect_engines
from collectors.hostmemory import collect_host_memory, window_figures
from collectors.ledger import update_ledger
from collectors.nodes import local_node, local_procfs
from dashboard.restarts.models import Restart
from dashboard.restarts.tasks import dispatch_due_restarts

node, api = local_node(), docker_api.client()
for _ in range(100):
    found = {e.name: e for e in collect_engines(node, api, timezone.now())}
    if found.get(%(name)r) and found[%(name)r].phase == "ready":
        break
    time.sleep(0.3)
collection, window = collect_host_memory(node, local_procfs(), duration=0.3, period=0.1)
update_ledger(node, window_figures(window), collection.at)
now = timezone.now()
restart = Restart.objects.create(node=node, engine=found[%(name)r], kind="planned",
                                 status="scheduled", requested_at=now, scheduled_for=now,
                                 expected_startup_seconds=3)
print("handed", dispatch_due_restarts(), "restart", restart.pk)
"""


def _manage(env: dict[str, str], *args: str) -> str:
    result = subprocess.run([sys.executable, "manage.py", *args], cwd=PROJECT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _worker(env: dict[str, str], log: Path) -> subprocess.Popen:
    # The restart tasks are named explicitly: the worker must not depend on how the dashboard's
    # task modules are wired up for autodiscovery.
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "sparkops", "worker", "--queues",
         "node.kill-node", "--pool", "prefork", "--concurrency", "1", "--without-mingle",
         "--without-gossip", "--loglevel", "INFO", "--include", "dashboard.restarts.tasks"],
        cwd=PROJECT, env=env, stdout=log.open("a"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _row(data: Path, restart_id: int) -> dict[str, object]:
    with sqlite3.connect(data / "sparkops.sqlite3") as db:
        db.row_factory = sqlite3.Row
        row = db.execute("select * from dashboard_restart where id = ?", (restart_id,)).fetchone()
        return dict(row)


def _wait_for(condition, timeout: float, what: str, log: Path, state=None) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            seen = f"; state: {state()}" if state else ""
            raise AssertionError(f"{what} did not happen within {timeout} s{seen}; worker log:\n"
                                 f"{log.read_text()[-3000:]}")
        time.sleep(0.2)


def test_a_worker_killed_mid_restart_leaves_it_interrupted_with_the_real_state(
        start_engine, docker_host, tmp_path):
    data = tmp_path / "data"
    # The restart's fit checks read this node's memory: a GB10's (a fixture), so that whatever
    # page cache the machine running the tests holds cannot decide the run.
    procfs = tmp_path / "proc"
    (procfs / "pressure").mkdir(parents=True)
    shutil.copy(FIXTURES / "procfs" / "meminfo-gb10", procfs / "meminfo")
    shutil.copy(FIXTURES / "procfs" / "pressure-memory", procfs / "pressure" / "memory")
    env = subprocess_env(SPARKOPS_DATA_DIR=str(data), SPARKOPS_NODE_NAME="kill-node",
                         SPARKOPS_DOCKER_HOST=docker_host, SPARKOPS_PROCFS=str(procfs),
                         SPARKOPS_RESTART_DRAIN_TIMEOUT_SECONDS="0",
                         SPARKOPS_RESTART_HEARTBEAT_STALE_SECONDS="5",
                         SPARKOPS_RESTART_MIN_DEADLINE_SECONDS="300")
    log = tmp_path / "worker.log"
    real = start_engine("engine")
    real.next_start("--emulator-load-seconds", "120")  # a long start: time to kill the worker
    _manage(env, "migrate", "--noinput")
    first = _worker(env, log)
    try:
        handed = _manage(env, "shell", "-c", WORLD % {"name": real.name}).split()
        assert handed[-4:-2] == ["handed", "1"], handed
        restart_id = int(handed[-1])
        _wait_for(lambda: _row(data, restart_id)["phase"] == "follow", 90, "the follow step",
                  log, lambda: _row(data, restart_id))
        os.killpg(first.pid, signal.SIGKILL)  # as the OOM killer, or a power cut, would
        first.wait(timeout=10)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert _row(data, restart_id)["status"] == "running"  # nobody is left to say otherwise

    time.sleep(5.5)  # the dead worker's heartbeat goes stale
    second = _worker(env, log)  # a worker starting looks for restarts its node left behind
    try:
        _wait_for(lambda: _row(data, restart_id)["status"] == "interrupted", 30,
                  "marking the restart interrupted", log)
    finally:
        os.killpg(second.pid, signal.SIGTERM)
        second.wait(timeout=20)

    row = _row(data, restart_id)
    state = json.loads(row["container_state"])
    assert state["running"] is True and state["source"] == "live"  # still loading its weights
    assert "during step 'follow'" in row["outcome"] and "The container is running" in row["outcome"]
    with sqlite3.connect(data / "sparkops.sqlite3") as db:
        events = db.execute("select kind, severity from collectors_event where kind like "
                            "'restart-%'").fetchall()
        unfinished = db.execute("select step from dashboard_restartstep where restart_id = ? "
                                "and finished_at is null", (restart_id,)).fetchall()
    assert events == [("restart-interrupted", "critical")]
    assert unfinished == [("follow",)]
