"""A model that an Ollama server loads on demand squeezes the vLLM engine next to it, with real
parts only: both emulated engines in real containers really hold their memory. Ollama reports
no KV pool, only each loaded model's whole size (``/api/ps``); that size is a ledger component,
so the ``prefill-squeeze`` alert for the vLLM engine names the Ollama model as its cause. The
Ollama server stops, its model's memory comes back, and the alert resolves.

Both run in a memory budget of the test's own (``tests.containers.memory_budget``), so the
headroom is the budget's room, which only they move: other programs allocating and freeing
memory on the machine meanwhile neither open an alert of their own nor are named as the cause.
The margin is set from the budget's room once both run: the vLLM engine's need sits 1 GiB inside
it before the model loads and 1 GiB beyond it after (the model takes 2 GiB).
"""

from __future__ import annotations

import json
import urllib.request

import pytest

from collectors import docker_api
from collectors.models import LedgerChange
from dashboard.alerting.models import Alert, RuleSetting
from dashboard.alerting.settings import RULES
from sparkops.testing.ports import free_port
from tests.conftest import PROJECT
from tests.containers import budget_squeeze_margin_gib, podman, run_container, unique_name
from tests.cycles import CollectionCycle, ledger_shares

pytestmark = [pytest.mark.slow, pytest.mark.django_db]
GIB = 1024**3
MIB = 1024**2
BIN = PROJECT / "collectors" / "emulator" / "bin"
NEED = 256 * MIB  # the vLLM engine's prefill need: 8192 batched tokens × 32 KiB per token
GAP = 1.0 * GIB
MODEL = "qwen3:30b"
# The model Ollama loads: 2 GiB of weights, 4,096 tokens of KV at 4 KiB, 512 tokens of compute.
MODEL_SIZE = 2 * GIB + 4096 * 4096 + 512 * 1024
# The budget: the vLLM engine (32 MiB of weights, a 64 MiB pool), the loaded model, the vLLM
# engine's prefill buffer and the gap; their programs are counted by the fixture.
BUDGET = 32 * MIB + 64 * MIB + MODEL_SIZE + NEED + int(GAP)


@pytest.fixture
def api(docker_host):
    client = docker_api.client(docker_host)
    yield client
    client.close()


def _start_vllm(name: str, cgroup_parent: str) -> None:
    run_container(name, [str(BIN / "vllm"), "serve", "org/gemma-like", "--port", str(free_port()),
                         "--kv-cache-memory-bytes", "64M", "--max-num-batched-tokens", "8192",
                         "--emulator-weights-bytes", "32M", "--emulator-load-seconds", "0.2",
                         "--emulator-profile-seconds", "0.2", "--emulator-graph-seconds", "0.2"],
                  labels={"sparkops.engine": "vllm",
                          "sparkops.prefill-bytes-per-token": str(NEED // 8192)},
                  cgroup_parent=cgroup_parent)


def _start_ollama(name: str, port: int, cgroup_parent: str) -> None:
    # No preload: the model is loaded when a client first asks for it, and kept loaded.
    run_container(name, [str(BIN / "ollama"), "serve", "--emulator-model", MODEL,
                         "--emulator-weights-bytes", "2G", "--emulator-kv-bytes-per-token", "4K",
                         "--emulator-load-seconds", "0.5"],
                  env={"OLLAMA_HOST": f"127.0.0.1:{port}", "OLLAMA_CONTEXT_LENGTH": "4096",
                       "OLLAMA_KEEP_ALIVE": "-1"},
                  cgroup_parent=cgroup_parent)


def _generate(port: int, model: str) -> None:
    body = json.dumps({"model": model, "prompt": "Summarise this memo.", "max_tokens": 4})
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/generate",
                                     data=body.encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        assert json.loads(response.read())["done"] is True


def test_a_model_ollama_loads_is_named_as_the_cause_of_a_vllm_prefill_squeeze(
        node, api, memory_budget):
    for rule in RULES:
        if rule != "prefill-squeeze":
            RuleSetting.objects.create(rule=rule, enabled=False)
    budget = memory_budget(BUDGET, programs=2)
    victim, chat, port = unique_name("gemma"), unique_name("chat"), free_port()
    _start_vllm(victim, budget.parent)
    _start_ollama(chat, port, budget.parent)
    cycle = CollectionCycle(node, api)
    cycle.until(lambda: ledger_shares(node).get(victim, {}).get("prefill_need")
                and ledger_shares(node).get(chat, {}).get("loaded_models") == 0)
    assert ledger_shares(node)[chat]["kv_pool"] is None  # Ollama reports none

    margin_gib = budget_squeeze_margin_gib(node.ledger, NEED, GAP)
    RuleSetting.objects.create(rule="prefill-squeeze", for_seconds=4, thresholds={
        "margin_gib": margin_gib, "hysteresis_gib": 0.5})
    for _ in range(3):
        cycle()
    assert not Alert.objects.exists()

    _generate(port, MODEL)  # a client asks for the model: Ollama loads it, 2 GiB
    cycle.until(lambda: Alert.objects.filter(state="firing").exists())
    alert = Alert.objects.get()
    assert alert.rule == "prefill-squeeze" and alert.engine.name == victim
    cause = alert.details["causes"][0]
    assert cause["label"] == f"{chat}'s loaded models ({MODEL})"
    assert (cause["before_bytes"], cause["after_bytes"]) == (0, MODEL_SIZE)
    assert alert.fired_cause.startswith(f"{chat}'s loaded models ({MODEL}) went 0.00 → 2.02 GiB")
    assert MODEL in alert.summary

    podman("stop", "--time", "5", chat)  # its model's memory is freed with it
    cycle.until(lambda: Alert.objects.filter(pk=alert.pk, state="resolved").exists())
    unloaded = LedgerChange.objects.filter(component__endswith=":loaded_models").latest("at")
    assert (unloaded.before_bytes, unloaded.after_bytes) == (MODEL_SIZE, 0)
