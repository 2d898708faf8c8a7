"""A squeeze seen coming, end to end, with real parts only.

Two emulated vLLM engines run in real containers inside a memory budget of the test's own
(``tests.containers.memory_budget``), as in ``tests/test_squeeze_scenario.py``: A serves with a
known prefill need; neighbour B is recreated. An emulated vLLM, like a real one, logs its release
at once, loads its weights for a while and only then allocates its KV pool, so the collectors
see each start while it loads and predict what it will hold (``collectors.starts``).

* B recreated with the pool it had: the prediction fits, no alert; the start records predicted
  against measured.
* B recreated with a pool 2 GiB larger: ``predicted-squeeze`` fires while B still loads, before
  its pool exists (the ledger shows none), naming B as the starting engine and A at risk; then
  B allocates the pool and the real ``prefill-squeeze`` fires, naming B's KV pool as its cause,
  for the same engine A. The prediction resolves ("settled") once B is ready, and its resolved
  notice, delivered to a real webhook receiver that checks its signature, says how close the
  prediction came.
"""

from __future__ import annotations

import json

import pytest

from collectors import docker_api
from collectors.models import EngineStart, LedgerChange
from dashboard.alerting.models import Alert, ResolveReason, RuleSetting
from dashboard.alerting.settings import RULES
from dashboard.notify.models import Channel
from sparkops.testing.ports import free_port
from sparkops.testing.webhooks import WebhookReceiver
from tests.containers import budget_squeeze_margin_gib, podman, run_container, unique_name
from tests.test_squeeze_scenario import BUDGET, GAP, NEED, VLLM, Node

pytestmark = [pytest.mark.slow, pytest.mark.django_db]
MIB = 1024**2
SMALL_POOL, BIG_POOL = "64M", "2112M"  # B grows by 2 GiB: A's need goes from 1 GiB inside to
# 1 GiB beyond the room
LOADING = ("starting", "loading", "profiling")


def _engine_command(port: int, model: str, kv: str, load_seconds: float) -> list[str]:
    # A low utilisation target: vLLM checks at start-up that the device's free memory is at
    # least that share of the total, pinned pool or not, and this machine's free memory is
    # whatever its other programs leave (other tests run beside this one).
    return [VLLM, "serve", model, "--port", str(port), "--kv-cache-memory-bytes", kv,
            "--gpu-memory-utilization", "0.05",
            "--max-num-batched-tokens", "8192", "--emulator-weights-bytes", "32M",
            "--emulator-load-seconds", str(load_seconds), "--emulator-profile-seconds", "0.2",
            "--emulator-graph-seconds", "0.2"]


def _start_b(name: str, port: int, kv: str, parent: str, load_seconds: float) -> None:
    run_container(name, _engine_command(port, "org/neighbour-8b", kv, load_seconds),
                  labels={"sparkops.engine": "vllm"}, cgroup_parent=parent)


def _share(node, name: str) -> dict:
    return next((s for s in (node.ledger or {}).get("engines", []) if s["name"] == name), {})


@pytest.fixture
def squeeze_rules_only(db):
    for rule in RULES:
        if rule not in ("prefill-squeeze", "predicted-squeeze"):
            RuleSetting.objects.create(rule=rule, enabled=False)


def test_a_neighbour_that_will_squeeze_is_announced_while_it_loads_and_one_that_fits_is_not(
        node, docker_host, settings, squeeze_rules_only, memory_budget):
    budget = memory_budget(BUDGET, programs=2)
    settings.SPARKOPS_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    api = docker_api.client(docker_host)
    name_a, name_b = unique_name("gemma"), unique_name("neighbour")
    port_a, port_b = free_port(), free_port()
    with WebhookReceiver() as receiver:
        hook = Channel.objects.create(name="chat", kind="webhook",
                                      config={"url": receiver.url()})
        receiver.secret = hook.secret
        run_container(name_a, _engine_command(port_a, "org/gemma-4-26b", "64M", 0.2),
                      labels={"sparkops.engine": "vllm",
                              "sparkops.prefill-bytes-per-token": str(NEED // 8192)},
                      cgroup_parent=budget.parent)
        _start_b(name_b, port_b, SMALL_POOL, budget.parent, 0.2)
        cluster = Node(node, api)

        def b():
            return node.engines.get(name=name_b)

        cluster.until(lambda: _share(node, name_a).get("kv_pool")
                      and _share(node, name_b).get("kv_pool")
                      and b().starts.filter(outcome="ready").exists())
        RuleSetting.objects.create(rule="prefill-squeeze", for_seconds=4, thresholds={
            "margin_gib": budget_squeeze_margin_gib(node.ledger, NEED, GAP),
            "hysteresis_gib": 0.5})

        # 1. B recreated with the pool it had: predicted while loading, fits, no alert.
        podman("rm", "--force", "--time", "0", name_b)
        _start_b(name_b, port_b, SMALL_POOL, budget.parent, 4)
        cluster.until(lambda: b().starts.filter(outcome="ready").count() == 2)
        fits = b().starts.filter(outcome="ready").order_by("-pk").first()
        assert fits.predicted_at is not None, fits.no_prediction
        assert fits.predicted["kv_pool"] == {"value": 64 * MIB, "confidence": "exact",
                                             "basis": fits.predicted["kv_pool"]["basis"]}
        # Its weights as its last start's log printed them (in GiB, two decimals: 0.03).
        assert fits.predicted["weights"]["value"] == pytest.approx(32 * MIB, abs=6 * MIB)
        assert fits.actual["kv_pool"]["value"] == 64 * MIB
        assert not Alert.objects.exists()

        # 2. B recreated with a pool that will squeeze A's prefill.
        podman("rm", "--force", "--time", "0", name_b)
        _start_b(name_b, port_b, BIG_POOL, budget.parent, 6)
        seen_when_fired = {}

        def predicted_fired() -> bool:
            alert = Alert.objects.filter(rule="predicted-squeeze").first()
            if alert is None or alert.fired_at is None:
                return False
            seen_when_fired.update(phase=b().phase, kv_pool=_share(node, name_b).get("kv_pool"))
            return True

        cluster.until(predicted_fired)
        cluster.until(lambda: Alert.objects.filter(rule="prefill-squeeze",
                                                   state="firing").exists())
        cluster.until(lambda: Alert.objects.get(rule="predicted-squeeze").state == "resolved")
        for _ in range(2):
            cluster.cycle()

    predicted = Alert.objects.get(rule="predicted-squeeze")
    real = Alert.objects.get(rule="prefill-squeeze")
    # Fired while B was still loading, before its pool existed.
    assert seen_when_fired["phase"] in LOADING and seen_when_fired["kv_pool"] is None
    pool_seen = LedgerChange.objects.filter(node=node, label=f"{name_b}'s KV pool",
                                            after_bytes=2112 * MIB).earliest("at")
    assert predicted.fired_at < pool_seen.at <= real.fired_at
    # Both name the same engine at risk and the same neighbour.
    assert predicted.engine.name == real.engine.name == name_a
    assert predicted.details["starting_engine"] == name_b
    # Its pool as the cause, or, when the squeeze began while B still allocated it, all B
    # held then: either way B.
    assert real.details["causes"][0]["label"] in (f"{name_b}'s KV pool",
                                                  f"{name_b}'s memory (KV pool not reported)")
    assert predicted.fired_cause.startswith(f"{name_b} is starting and will hold 2.09 GiB")
    assert predicted.details["predicted"]["kv_pool"]["value"] == 2112 * MIB
    # Settled once B was ready, saying how close the prediction came.
    squeeze = b().starts.order_by("-pk").first()
    assert squeeze.outcome == EngineStart.Outcome.READY
    assert predicted.resolve_reason == ResolveReason.SETTLED
    assert predicted.resolved_at >= squeeze.finished_at
    assert predicted.summary.startswith(f"{name_b} is ready: ")
    assert "KV pool predicted 2.06 GiB, actual 2.06 GiB (exact)" in predicted.summary
    kinds = [json.loads(r.body)["type"] for r in receiver.requests
             if json.loads(r.body)["alert"]["rule"] == "predicted-squeeze"]
    assert kinds == ["alert.firing", "alert.resolved"]
    resolved = next(json.loads(r.body) for r in receiver.requests
                    if json.loads(r.body)["type"] == "alert.resolved"
                    and json.loads(r.body)["alert"]["rule"] == "predicted-squeeze")
    assert "KV pool predicted 2.06 GiB, actual 2.06 GiB (exact)" in \
        resolved["alert"]["details"]["accuracy"]
    assert all(r.verified for r in receiver.requests)
    api.close()
