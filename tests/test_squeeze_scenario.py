"""The neighbour squeeze, end to end, with real parts only.

Two emulated engines run in real containers and really hold memory. Engine A serves with a
known prefill need. Neighbour B is recreated with a bigger KV pool, so the headroom left for A's
next prefill falls below that need: one ``prefill-squeeze`` alert fires naming A at risk and
B's growth as the cause, and is delivered once to a real SMTP server and once to a real webhook
receiver that verifies its signature. B shrinks back: one resolved notification on each.

The engines run in a memory budget of the test's own (``tests.containers.memory_budget``), so
the headroom is the budget's room, which only they move: other programs allocating and freeing
memory on the machine meanwhile neither fire a second alert nor are named as the cause. The
margin is set from the budget's room once both engines run: A's need sits 1 GiB inside it
before B grows and 1 GiB beyond it after (B grows by 2 GiB).
"""

from __future__ import annotations

import json
import time

import pytest
from django.utils import timezone

from collectors import docker_api
from collectors.engines import collect_engines
from collectors.hostmemory import collect_host_memory, configured_budget, window_figures
from collectors.ledger import update_ledger
from collectors.procfs import Procfs
from dashboard.alerting.models import Alert, RuleSetting
from dashboard.alerting.pipeline import run_alerts
from dashboard.alerting.settings import RULES
from dashboard.notify.models import Channel
from dashboard.notify.outbox import deliver_due
from sparkops.testing.ports import free_port
from sparkops.testing.webhooks import WebhookReceiver
from tests.conftest import PROJECT
from tests.containers import budget_squeeze_margin_gib, podman, run_container, unique_name
from tests.notify.servers import ScriptedSMTPHandler, smtp_server

pytestmark = [pytest.mark.slow, pytest.mark.django_db]
GIB = 1024**3
MIB = 1024**2
VLLM = str(PROJECT / "collectors" / "emulator" / "bin" / "vllm")
NEED = 256 * MIB  # A's prefill need: 8192 batched tokens × 32 KiB per token
SMALL_POOL, BIG_POOL = "64M", "2112M"  # B grows by 2 GiB
GAP = 1.0 * GIB
# The budget: both engines at their largest (32 MiB of weights each, A's 64 MiB pool, B's
# 2,112 MiB), A's prefill buffer and the gap; their programs are counted by the fixture.
BUDGET = 2 * 32 * MIB + 64 * MIB + 2112 * MIB + NEED + int(GAP)


def _engine_command(port: int, model: str, kv: str) -> list[str]:
    return [VLLM, "serve", model, "--port", str(port), "--kv-cache-memory-bytes", kv,
            "--max-num-batched-tokens", "8192", "--emulator-weights-bytes", "32M",
            "--emulator-load-seconds", "0.2", "--emulator-profile-seconds", "0.2",
            "--emulator-graph-seconds", "0.2"]


def _start_b(name: str, port: int, kv: str, cgroup_parent: str) -> None:
    run_container(name, _engine_command(port, "org/neighbour-8b", kv),
                  labels={"sparkops.engine": "vllm"}, cgroup_parent=cgroup_parent)


class Node:
    """One collection cycle, as the beat runs it: engines, host memory (and the memory budget)
    + ledger, alerts, mail."""

    def __init__(self, node, api):
        self.node, self.api = node, api

    def cycle(self) -> None:
        collect_engines(self.node, self.api, timezone.now())
        _, window = collect_host_memory(self.node, Procfs(), duration=0.5, period=0.1,
                                        budget=configured_budget())
        update_ledger(self.node, window_figures(window), timezone.now())
        run_alerts(self.node, timezone.now())
        deliver_due(timezone.now())

    def until(self, condition, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"not reached within {timeout} s; ledger: "
                                     f"{json.dumps(self.node.ledger)[:800]}")
            self.cycle()
            self.node.refresh_from_db()


def _pools(node) -> dict[str, int | None]:
    return {share["name"]: share["kv_pool"] for share in (node.ledger or {}).get("engines", [])}


@pytest.fixture
def only_prefill_squeeze(db):
    for rule in RULES:
        if rule != "prefill-squeeze":
            RuleSetting.objects.create(rule=rule, enabled=False)


def test_neighbour_growth_squeezes_prefill_alerts_once_and_resolves(
        node, docker_host, settings, only_prefill_squeeze, memory_budget):
    budget = memory_budget(BUDGET, programs=2)
    settings.SPARKOPS_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    api = docker_api.client(docker_host)
    handler = ScriptedSMTPHandler()
    name_a, name_b = unique_name("gemma"), unique_name("neighbour")
    port_a, port_b = free_port(), free_port()
    with smtp_server(handler) as smtp_port, WebhookReceiver() as receiver:
        # pytest-django swaps in the in-memory mail backend; this test wants the real SMTP one.
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", smtp_port
        Channel.objects.create(name="ops mail", kind="email", config={"to": ["ops@example.com"]})
        hook = Channel.objects.create(name="chat", kind="webhook",
                                      config={"url": receiver.url()})
        receiver.secret = hook.secret
        run_container(name_a, _engine_command(port_a, "org/gemma-4-26b", "64M"),
                      labels={"sparkops.engine": "vllm",
                              "sparkops.prefill-bytes-per-token": str(NEED // 8192)},
                      cgroup_parent=budget.parent)
        _start_b(name_b, port_b, SMALL_POOL, budget.parent)
        cluster = Node(node, api)
        cluster.until(lambda: _pools(node).get(name_a) and _pools(node).get(name_b))

        margin_gib = budget_squeeze_margin_gib(node.ledger, NEED, GAP)
        # Pending for a few seconds before firing (10 s by default): by then the ledger knows
        # the neighbour's new pool, so the first notification already names the right cause.
        RuleSetting.objects.create(rule="prefill-squeeze", for_seconds=4, thresholds={
            "margin_gib": margin_gib, "hysteresis_gib": 0.5})
        for _ in range(3):
            cluster.cycle()
        assert not Alert.objects.exists()

        podman("rm", "--force", "--time", "0", name_b)  # "restart" B with a bigger pool
        _start_b(name_b, port_b, BIG_POOL, budget.parent)
        cluster.until(lambda: Alert.objects.filter(state="firing").exists())
        for _ in range(3):
            cluster.cycle()

        alert = Alert.objects.get()
        assert alert.rule == "prefill-squeeze" and alert.engine.name == name_a
        cause = alert.details["causes"][0]
        assert cause["label"] == f"{name_b}'s KV pool"
        assert cause["before_bytes"] == 64 * MIB and cause["after_bytes"] == 2112 * MIB
        assert f"{name_b}'s KV pool went 0.06 → 2.06 GiB" in alert.summary
        assert alert.details["prefill_need_bytes"] == NEED
        assert len(handler.messages) == 1 and len(receiver.requests) == 1
        mail, post = handler.messages[0], receiver.requests[0]
        assert "prefill-squeeze" in mail["Subject"] and name_a in mail["Subject"]
        assert name_b in mail.get_body(("plain",)).get_content()
        assert post.verified, post.verify_error
        body = json.loads(post.body)
        assert body["type"] == "alert.firing" and body["alert"]["engine"] == name_a
        assert body["alert"]["details"]["causes"][0]["growth_bytes"] == (2112 - 64) * MIB

        podman("rm", "--force", "--time", "0", name_b)  # B back to its old size
        _start_b(name_b, port_b, SMALL_POOL, budget.parent)
        cluster.until(lambda: Alert.objects.filter(state="resolved").exists())
        for _ in range(2):
            cluster.cycle()

    assert len(handler.messages) == 2 and len(receiver.requests) == 2
    resolved = json.loads(receiver.requests[1].body)
    assert resolved["type"] == "alert.resolved" and receiver.requests[1].verified
    assert receiver.requests[0].headers["webhook-id"] != receiver.requests[1].headers["webhook-id"]
    assert "RESOLVED" in handler.messages[1]["Subject"]
    api.close()
