"""One engine over two nodes, in real containers: the head on node "spark-a", a headless rank on
node "spark-b", each an emulated vLLM (collectors/emulator) in a Podman container.

Both containers run on this machine's one container engine, so each node's collection lists
only its own containers, through the label selector a host shared by several SparkOps nodes
uses (``SPARKOPS_ENGINE_LABEL_SELECTOR``). The two rows appear as one engine with two ranks;
once the head stops, the rank keeps running and holding its memory, and the orphan-rank rule
names node b and the amount.
"""

from __future__ import annotations

import time
import uuid

import pytest
from django.template.loader import render_to_string
from django.utils import timezone

from collectors import docker_api
from collectors.engines import collect_engines
from collectors.ledger import update_ledger
from collectors.models import Engine, EngineStart, Event, Node
from dashboard.alerting.rules import orphan_rank
from dashboard.engines import engine_span
from sparkops.testing.ports import free_port
from sparkops.units import MIB, size_text
from tests.conftest import PROJECT
from tests.containers import podman, run_container

pytestmark = [pytest.mark.slow, pytest.mark.django_db]

VLLM = str(PROJECT / "collectors" / "emulator" / "bin" / "vllm")
NODE_LABEL = "sparkops.test.node"
WEIGHTS, KV = 32 * MIB, 48 * MIB
# The rank holds its weights and KV pool; what its own program holds comes on top.
FLOOR_GIB = 0.01


def _emulator(port: int, master_port: int, *rank_flags: str) -> list[str]:
    # vLLM 0.33.0, docs/serving/parallelism_scaling.md:145-159, each node's share pinned.
    return [VLLM, "serve", "nvidia/Gemma-4-26B-A4B-NVFP4", "--port", str(port),
            "--served-model-name", "gemma", "--tensor-parallel-size", "2", "--nnodes", "2",
            "--master-addr", "127.0.0.1", "--master-port", str(master_port),
            "--kv-cache-memory-bytes", str(KV), "--emulator-weights-bytes", str(WEIGHTS),
            "--emulator-load-seconds", "0.3", "--emulator-profile-seconds", "0.3",
            "--emulator-graph-seconds", "0.3", "--emulator-stats-interval", "1", *rank_flags]


@pytest.fixture
def api(docker_host):
    client = docker_api.client(docker_host)
    yield client
    client.close()


def _collect(node: Node, api, monkeypatch, selector: str) -> dict[str, Engine]:
    """One engine collection of ``node``, which sees only the containers labelled ``selector``."""
    monkeypatch.setenv("SPARKOPS_ENGINE_LABEL_SELECTOR", selector)
    engines = collect_engines(node, api, timezone.now())
    update_ledger(node, {}, timezone.now())
    return {e.name: e for e in engines}


def _until(collect, condition, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        found = collect()
        if condition(found):
            return found
        if time.monotonic() > deadline:
            seen = {n: (e.phase, e.container_state, e.last_scrape_error)
                    for n, e in found.items()}
            raise AssertionError(f"condition not met within {timeout} s: {seen}")
        time.sleep(0.5)


def test_head_and_headless_rank_are_one_engine_and_the_orphan_is_named(api, monkeypatch):
    node_a, node_b = Node.objects.create(name="spark-a"), Node.objects.create(name="spark-b")
    run_id = uuid.uuid4().hex[:8]
    select_a, select_b = f"{NODE_LABEL}=a-{run_id}", f"{NODE_LABEL}=b-{run_id}"
    head_name, rank_name = f"gemma-tp2-{run_id}", f"gemma-tp2-rank1-{run_id}"
    master_port = free_port()
    run_container(head_name, _emulator(free_port(), master_port, "--node-rank", "0"),
                  labels={"sparkops.engine": "vllm", NODE_LABEL: f"a-{run_id}"})
    run_container(rank_name, _emulator(free_port(), master_port, "--node-rank", "1",
                                       "--headless"),
                  labels={"sparkops.engine": "vllm", NODE_LABEL: f"b-{run_id}"})

    on_a = _until(lambda: _collect(node_a, api, monkeypatch, select_a),
                  lambda found: head_name in found and found[head_name].phase == "ready"
                  and found[head_name].last_scrape_ok_at is not None)
    on_b = _until(lambda: _collect(node_b, api, monkeypatch, select_b),
                  lambda found: rank_name in found
                  and found[rank_name].phase == "kv_allocated"
                  and (found[rank_name].memory_usage_bytes or 0) > WEIGHTS + KV)

    # Each node saw only its own container.
    assert set(on_a) == {head_name} and set(on_b) == {rank_name}
    head, rank = on_a[head_name], on_b[rank_name]
    assert head.span_key == rank.span_key == f"vllm-mp|127.0.0.1:{master_port}|" \
                                             "nvidia/Gemma-4-26B-A4B-NVFP4"
    assert (head.span["role"], rank.span["role"]) == ("head", "rank")
    assert (rank.span["rank"], rank.span["ranks"], rank.span["serves_api"]) == (1, 2, False)
    # The headless rank is not read over HTTP: no address, no failed read, not down.
    assert rank.metrics_url == "" and rank.last_scrape_error == ""
    assert not Event.objects.filter(engine=rank, kind="scrape-failed").exists()
    assert rank.startup["kv_cache_gib"] == pytest.approx(KV / 1024**3, abs=0.01)
    # Its release from its launch line (a headless rank logs no server version), and its
    # start is ready once its head serves: a headless rank never logs "ready" itself.
    assert rank.startup["version"] == head.startup["version"] and rank.startup["version"]
    assert EngineStart.objects.get(engine=rank).outcome == "ready"
    # Each part's memory is in its own node's ledger.
    node_a.refresh_from_db()
    node_b.refresh_from_db()
    assert [s["name"] for s in node_a.ledger["engines"]] == [head_name]
    [rank_share] = node_b.ledger["engines"]
    assert rank_share["name"] == rank_name and rank_share["kv_pool"] == KV

    # The engine page shows one engine with its two parts, each linked to its own node's row.
    span = engine_span(head)
    assert [(p["node"], p["role"], p["place"], p["state"]) for p in span["parts"]] == [
        ("spark-a", "head", "rank 0", "running"), ("spark-b", "rank", "rank 1", "running")]
    html = render_to_string("dashboard/_engine_span.html", {"span": span})
    assert f"/nodes/spark-b/engines/{rank_name}/" in html
    assert "no (headless)" in html

    assert not any(c.crosses_threshold() for node in (node_a, node_b)
                   for c in _evaluate(node))

    podman("stop", "--time", "5", head_name)
    _until(lambda: _collect(node_a, api, monkeypatch, select_a),
           lambda found: found[head_name].container_state == "exited")
    on_b = _collect(node_b, api, monkeypatch, select_b)

    rank = on_b[rank_name]
    assert rank.container_state == "running"  # the orphan keeps running, and its memory
    [condition] = _evaluate(node_b)
    held = condition.details["held_bytes"]
    assert held >= WEIGHTS + KV
    assert condition.crosses_threshold()
    assert condition.summary.startswith(
        f"rank 1 of {head_name} on spark-b still holds {size_text(held)}; its head on spark-a "
        "stopped (container exited)")
    assert [p["state"] for p in engine_span(rank)["parts"]] == ["exited", "running"]


def _evaluate(node: Node):
    node.refresh_from_db()
    engines = list(Engine.objects.filter(node=node, present=True))
    return orphan_rank.evaluate(node, node.ledger or {}, engines, {"floor_gib": FLOOR_GIB},
                                timezone.now())
