"""The guarded start with an emulated engine in a real container, inside a memory budget of the
test's own (``tests.restarts.budget_engines``): while the restarted engine loads its weights, a
process of the test inside the same budget reads a large file, whose page cache fills the
budget's free room (its limit less its usage) as weights read from disk fill MemFree on a GB10.
The runbook sees the free room below the floor (what the engine still has to allocate plus the
margin), drops the page cache and compacts memory, and the restart's record and page show it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from django.urls import reverse

from collectors import docker_api
from dashboard.audit.models import AuditEntry
from dashboard.restarts.models import Restart
from dashboard.restarts.runbook import STEPS, run_restart
from tests.cycles import CollectionCycle
from tests.restarts.budget_engines import ready_in_budget, start_budget_engine
from tests.restarts.runbook_helpers import hook_clock, plan_now

pytestmark = [pytest.mark.slow, pytest.mark.django_db,
              pytest.mark.skipif(os.geteuid() != 0, reason="memory budgets and the real "
                                 "page-cache drop need root")]
MIB = 1024**2
POLL = 0.2
MARGIN = 16 * MIB
WEIGHTS, KV = 64 * MIB, 64 * MIB
# Room in the budget besides the engine and its program; the file read while it loads is
# larger, so that its page cache takes all of the budget's free room.
ROOM = 256 * MIB
FILLER = 512 * MIB


@pytest.fixture
def api(docker_host):
    client = docker_api.client(docker_host)
    yield client
    client.close()


@pytest.fixture
def filler(tmp_path) -> Path:
    """A file on disk to read into the page cache; written (and synced) now, outside the
    budget, then dropped from the cache by the restart's drop_caches step."""
    path = tmp_path / "weights-like.bin"
    block = os.urandom(MIB)
    with path.open("wb") as handle:
        for _ in range(FILLER // MIB):
            handle.write(block)
        handle.flush()
        os.fsync(handle.fileno())
    yield path
    path.unlink(missing_ok=True)


def _read_in_budget(path: Path, budget_path: Path) -> None:
    """Read ``path`` from a process inside the memory budget, so its page cache is charged
    there; first told out of the cache, so that it is read from disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    subprocess.run(["sh", "-c", f'echo $$ > "{budget_path}/cgroup.procs" && exec cat "{path}"'],
                   stdout=subprocess.DEVNULL, check=True, timeout=120)


def test_memfree_below_the_floor_while_the_engine_loads_drops_the_cache_again(
        node, api, memory_budget, filler, settings, admin_client):
    settings.SPARKOPS_RESTART_DRAIN_TIMEOUT_SECONDS = 3
    settings.SPARKOPS_RESTART_MIN_DEADLINE_SECONDS = 60
    settings.SPARKOPS_DROP_CACHES_COOLDOWN_SECONDS = 300
    budget = memory_budget(WEIGHTS + KV + ROOM, programs=1)
    # Each start loads its weights for 8 s: the budget is filled while the restarted one does.
    real = start_budget_engine(budget, weights=WEIGHTS, kv=KV, load_seconds=8)
    cycle = CollectionCycle(node, api)
    engine = ready_in_budget(cycle, node, real.name)
    restart = plan_now(engine)
    filled: list[str] = []

    def fill_while_loading() -> None:
        if filled or Restart.objects.get(pk=restart.pk).phase != "follow":
            return
        filled.append(Restart.objects.get(pk=restart.pk).phase)
        _read_in_budget(filler, budget.path)

    restart = run_restart(restart.pk, api=api, poll_seconds=POLL, margin_bytes=MARGIN,
                          clock=hook_clock(fill_while_loading))

    assert restart.status == Restart.Status.SUCCEEDED, restart.outcome
    assert [s.step for s in restart.steps.order_by("started_at", "pk")] == list(STEPS)
    guard = restart.steps.get(step="follow").data["guarded_start"]
    assert filled and guard["rooms"] == ["budget", "host"]
    first = guard["interventions"][0]
    assert first["room"] == "budget" and first["dropped"] and first["compacted"]
    assert first["free_before_bytes"] < first["floor_bytes"] < first["free_after_bytes"]
    assert len(guard["interventions"]) == 1  # the cooldown holds any other back
    assert guard["ended"].startswith("watched until the engine reported phase ")
    entry = AuditEntry.objects.get(restart=restart, action="drop-caches",
                                   details__guarded_start=True)
    assert entry.allowed and entry.details["ok"] and entry.outcome.startswith(
        "guarded start: the memory budget's free room ")
    page = admin_client.get(reverse("dashboard:restart", args=[restart.pk])).content.decode()
    assert 'id="restart-guarded-start" data-interventions="1"' in page
    assert first["done"] in page
    assert docker_api.container_status(api, real.container_id).running
