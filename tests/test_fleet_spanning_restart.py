"""A planned restart of an engine that spans two nodes, on a real fleet: one central SparkOps and
the agents of fleet-a and fleet-b (``tests.test_fleet_agents.Fleet``), an emulated vLLM over
both nodes (vLLM's own executor: the head on fleet-a, a headless rank on fleet-b).

Planned on the head, the restart is one restart with a part on fleet-b; fleet-a's agent runs the
head's runbook and fleet-b's the rank's, each on its own queue, and they meet at the barriers
of ``dashboard.restarts.groups``: the head stops first and starts first, the rank in between,
and the engine has one outage, the head's.
"""

from __future__ import annotations

import re

import pytest

from sparkops.testing.ports import free_port, wait_for_port
from sparkops.testing.postgres import fresh_database
from tests.containers import run_container
from tests.test_fleet_agents import CENTRE, Fleet
from tests.test_spanning_containers import _emulator

pytestmark = pytest.mark.slow

HEAD_NODE, RANK_NODE = "fleet-a", "fleet-b"

PLAN = """
from django.contrib.auth import get_user_model
from django.utils import timezone
from collectors.models import Engine
from dashboard.restarts.planning import plan_restart
admin = get_user_model().objects.get(username="admin")
head = Engine.objects.get(node__name=%(node)r, name=%(name)r)
print(plan_restart(head, user=admin, now=timezone.now()).pk)
"""


@pytest.fixture
def fleet(tmp_path, postgres_url, redis_url, docker_host):
    built = Fleet(tmp_path, fresh_database(postgres_url, "fleet"), redis_url, docker_host)
    built.manage("migrate", "--noinput", "--verbosity", "0")
    try:
        yield built
    finally:
        built.stop_all()


def _spanning_engine(fleet: Fleet) -> tuple[str, str]:
    """The head's and the rank's container names, each labelled for its own node."""
    master = free_port()
    names = {}
    for node, flags in ((HEAD_NODE, ("--node-rank", "0")),
                        (RANK_NODE, ("--node-rank", "1", "--headless"))):
        names[node] = f"{node}-gemma-tp2-{fleet.run}"
        run_container(names[node], _emulator(free_port(), master, *flags),
                      labels={"sparkops.engine": "vllm", "sparkops.fleet": fleet.run,
                              "sparkops.node": node, "sparkops.manage": "true"})
    return names[HEAD_NODE], names[RANK_NODE]


def _restarts(fleet: Fleet, head_id: int) -> list[tuple]:
    """The head's restart and its parts once all ended (empty while one is open)."""
    found = fleet.query(
        "select r.id, n.name, r.status, r.worker, r.outcome, r.part_of_id, r.after "
        "from dashboard_restart r join collectors_node n on n.id = r.node_id "
        "where r.id = %s or r.part_of_id = %s order by r.id", head_id, head_id)
    return found if found and all(row[2] not in ("scheduled", "running") for row in found) \
        else []


def _touched(fleet: Fleet, *restarts: int) -> list[tuple[str, str]]:
    """The containers' stops and starts these restarts made, in order, from the audit log."""
    return fleet.query(
        "select a.action, e.name from dashboard_auditentry a join collectors_engine e "
        "on e.id = a.engine_id where a.restart_id = any(%s) and a.action in "
        "('stop-engine', 'start-engine') order by a.at, a.id", list(restarts))


def _squeeze(fleet: Fleet, node: str, free_kib: int) -> None:
    """The node's /proc says only ``free_kib`` are free and available."""
    meminfo = fleet.tmp / "proc" / node / "meminfo"
    text = re.sub(r"^(MemFree|MemAvailable):\s+\d+ kB", lambda m: f"{m.group(1)}: {free_kib} kB",
                  meminfo.read_text(), flags=re.MULTILINE)
    meminfo.write_text(text)


def test_a_restart_of_an_engine_over_two_nodes_restarts_its_rank_in_order(fleet):
    head, rank = _spanning_engine(fleet)
    for name in (CENTRE, HEAD_NODE, RANK_NODE):
        fleet.start(name)
    wait_for_port(fleet.port, timeout=180)
    fleet.until(lambda: head in fleet.ready_engines(HEAD_NODE) and fleet.query(
        "select 1 from collectors_engine e join collectors_node n on n.id = e.node_id where "
        "n.name = %s and e.name = %s and e.span_key <> '' and e.startup ? 'kv_cache_gib'",
        RANK_NODE, rank), 120, "the head ready and the rank seen with its KV pool")

    said = fleet.manage("shell", "-c", PLAN % {"node": HEAD_NODE, "name": head})
    restart = int(said.split()[-1])
    rows = fleet.until(lambda: _restarts(fleet, restart), 240,
                       "the head's restart and its part ended")

    (head_id, head_node, head_status, head_worker, head_outcome, head_of, head_after), \
        (part_id, part_node, part_status, part_worker, part_outcome, part_of, part_after) = rows
    # One restart of the head with one part on the rank's node, each run by its own node.
    assert (head_node, head_of, part_node, part_of) == (HEAD_NODE, None, RANK_NODE, head_id)
    assert (head_status, part_status) == ("succeeded", "succeeded"), (head_outcome, part_outcome)
    assert head_worker.startswith(f"worker:{HEAD_NODE}@"), head_worker
    assert part_worker.startswith(f"worker:{RANK_NODE}@"), part_worker
    assert f"the restart of its head {head} on {HEAD_NODE} (#{head_id}) succeeded" \
        in part_outcome
    # Every meeting point was met, by the side that waits at it.
    assert [w["barrier"] for w in head_after["group"]["waits"] if w["met"]] == [
        "every rank passed its pre-check", "every rank stopped",
        "every rank passed its re-check", "every rank's container runs again"]
    assert [w["barrier"] for w in part_after["group"]["waits"] if w["met"]] == [
        "the head stopped", "the head started", "the head's restart ended"]

    # The order, from the audit log: the head stops first and starts first.
    assert _touched(fleet, head_id, part_id) == [("stop-engine", head), ("stop-engine", rank),
                                                 ("start-engine", head), ("start-engine", rank)]

    # One outage: the restarts page lists the engine's restart once, its part under it.
    page = fleet.signed_in_get("/restarts/")
    assert page.count(f'data-restart="{head_id}"') == 1
    assert f'data-part-of="{head_id}"' in page

    # A rank that would not fit on its node ends the whole restart before anything is touched:
    # its own pre-check refuses it, and the head, waiting for it, is aborted naming it.
    _squeeze(fleet, RANK_NODE, 100 * 1024)
    said = fleet.manage("shell", "-c", PLAN % {"node": HEAD_NODE, "name": head})
    again = int(said.split()[-1])
    (_, _, head_status, _, head_outcome, _, _), (part_id, _, part_status, _, part_outcome,
                                                 _, _) = fleet.until(
        lambda: _restarts(fleet, again), 240, "the second restart and its part ended")
    assert (head_status, part_status) == ("aborted", "aborted"), (head_outcome, part_outcome)
    assert part_outcome.startswith("Pre-check:") and "nothing was touched" in part_outcome
    assert head_outcome.startswith(f"The restart of the rank {rank} on {RANK_NODE} (#{part_id}) "
                                   "ended aborted: Pre-check"), head_outcome
    assert head_outcome.endswith("; nothing was touched."), head_outcome
    assert _touched(fleet, again, part_id) == []
