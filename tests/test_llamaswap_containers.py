"""llama-swap in a real container (Podman's Docker-compatible API), running the emulator's
router with two llama.cpp models: the router discovered, both models adopted as engines of their
own, the one a request started holding its own memory in the ledger with its rates moving, the
other "unloaded"; a model with a TTL stopped by it and unloaded without an engine-down alert; a
``prefill-squeeze`` with an adopted model as the victim; ``manage.py inspect`` reading the
router."""

from __future__ import annotations

import io
import json
import time
import urllib.request

import pytest
from django.core.management import call_command
from django.utils import timezone

from collectors import docker_api
from collectors.engines import collect_engines
from collectors.hostmemory import collect_host_memory, configured_budget, window_figures
from collectors.ledger import update_ledger
from collectors.models import Engine, EngineMetric
from collectors.procfs import Procfs
from dashboard.alerting.models import Alert, RuleSetting
from dashboard.alerting.pipeline import run_alerts
from dashboard.alerting.settings import RULES
from sparkops.testing.ports import free_port
from tests.conftest import PROJECT
from tests.containers import budget_squeeze_margin_gib, podman, run_container, unique_name
from tests.stored import engine_samples

pytestmark = [pytest.mark.slow, pytest.mark.django_db]
MIB = 1024**2
GIB = 1024**3
BIN = PROJECT / "collectors" / "emulator" / "bin"


def _model_cmd(port: int, model: str, *extra: str) -> str:
    return (f"{BIN / 'llama-server'} -m /models/{model}.gguf --port {port} -c 4096 -np 2 "
            "--metrics --emulator-weights-bytes 48M --emulator-kv-bytes-per-token 4K "
            "--emulator-load-seconds 0.3 " + " ".join(extra)).strip()


def _start_router(tmp_path, ttl_of_gemma: int = 3,
                  cgroup_parent: str | None = None) -> tuple[str, int, int]:
    port, qwen_port, gemma_port = free_port(), free_port(), free_port()
    config = tmp_path / "llama-swap.json"
    config.write_text(json.dumps({"models": {
        "qwen": {"cmd": _model_cmd(qwen_port, "qwen", "--emulator-load", "2:200:40"),
                 "proxy": f"http://127.0.0.1:{qwen_port}", "ttl": 0},
        "gemma": {"cmd": _model_cmd(gemma_port, "gemma"),
                  "proxy": f"http://127.0.0.1:{gemma_port}", "ttl": ttl_of_gemma},
    }}))
    name = unique_name("swap")
    run_container(name, [str(BIN / "llama-swap"), "-config", str(config),
                         "-listen", f"127.0.0.1:{port}"], cgroup_parent=cgroup_parent)
    return name, port, gemma_port


@pytest.fixture
def api(docker_host):
    client = docker_api.client(docker_host)
    yield client
    client.close()


class _Cycle:
    """One collection as the beat runs it: engines, host memory (and the memory budget, when
    the test runs its engines in one) and ledger, alerts."""

    def __init__(self, node, api):
        self.node, self.api = node, api
        self.engines: dict[str, Engine] = {}

    def __call__(self) -> None:
        self.engines = {e.name: e for e in collect_engines(self.node, self.api, timezone.now())}
        _, window = collect_host_memory(self.node, Procfs(), duration=0.3, period=0.1,
                                        budget=configured_budget())
        update_ledger(self.node, window_figures(window), timezone.now())
        run_alerts(self.node, timezone.now())
        self.node.refresh_from_db()

    def until(self, condition, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self()
            if condition(self.engines):
                return
            if time.monotonic() > deadline:
                seen = [(e.name, e.kind, e.phase, e.memory_usage_bytes, e.last_scrape_error)
                        for e in self.engines.values()]
                raise AssertionError(f"not reached within {timeout} s: {seen}")
            time.sleep(0.5)


def _shares(node) -> dict:
    return {share["name"]: share for share in (node.ledger or {}).get("engines", [])}


def _wake(port: int, model: str) -> None:
    """A client's request for ``model``: llama-swap starts it."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/upstream/{model}/v1/completions", method="POST",
        data=json.dumps({"prompt": "hello " * 20, "max_tokens": 5}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        assert reply.status == 200


def test_a_routers_models_are_adopted_and_a_ttl_unloads_one(node, api, tmp_path):
    for rule in RULES:
        if rule != "engine-down":
            RuleSetting.objects.create(rule=rule, enabled=False)
    RuleSetting.objects.create(rule="engine-down", for_seconds=0)
    router, port, _ = _start_router(tmp_path)
    qwen, gemma = f"{router}/qwen", f"{router}/gemma"
    cycle = _Cycle(node, api)
    cycle.until(lambda found: router in found and found[router].phase == "ready"
                and gemma in found and qwen in found)
    assert cycle.engines[router].kind == "llamaswap"
    assert cycle.engines[qwen].phase == cycle.engines[gemma].phase == "unloaded"
    assert cycle.engines[qwen].memory_usage_bytes == 0  # nothing runs: it holds nothing

    _wake(port, "qwen")
    cycle.until(lambda found: found[qwen].phase == "ready"
                and found[qwen].rates.get("decode_tokens_per_s"))
    engine = cycle.engines[qwen]
    assert engine.kind == "llamacpp" and engine.container_id == cycle.engines[router].container_id
    assert engine.config["router"] == router and engine.config["ctx_size"] == 4096
    assert engine.config["ttl_words"].startswith("never unloaded")
    assert engine.labels == {}  # never manageable through the router's labels
    # Its own process's memory (48 MiB of weights and a 16 MiB KV cache really held), not the
    # container's: the router is given only its own.
    assert engine.memory_usage_bytes > 60 * MIB
    assert cycle.engines[router].memory_usage_bytes < engine.memory_usage_bytes
    assert engine_samples(engine, EngineMetric.DECODE_TPS)
    assert cycle.engines[gemma].phase == "unloaded"
    shares = _shares(node)
    assert shares[qwen]["actual"] == engine.memory_usage_bytes
    assert shares[router]["actual"] == cycle.engines[router].memory_usage_bytes

    _wake(port, "gemma")  # started by a request; its TTL (3 s) then stops it
    cycle.until(lambda found: found[gemma].phase == "ready"
                and (found[gemma].memory_usage_bytes or 0) > 40 * MIB)
    assert cycle.engines[gemma].config["ttl_words"] == "unloads after 3 s idle"
    assert "restart its 3 s idle timer" in cycle.engines[gemma].metrics["unknown"]["rates"]
    cycle.until(lambda found: found[gemma].phase == "unloaded", timeout=30)
    assert cycle.engines[gemma].memory_usage_bytes == 0
    assert cycle.engines[gemma].metrics["unknown"]["rates"].startswith("not loaded")
    for _ in range(2):
        cycle()
    assert not Alert.objects.filter(engine__name=gemma).exists()
    assert Engine.objects.get(node=node, name=gemma).present

    out = io.StringIO()
    call_command("inspect", "metrics", f"http://127.0.0.1:{port}", "--json", stdout=out)
    read = json.loads(out.getvalue())
    assert read["kind"] == "llamaswap"
    assert [(m["name"], m["state"]) for m in read["details"]["models"]] == \
        [("gemma", "unloaded"), ("qwen", "ready")]


NEED = 256 * MIB  # the adopted model's prefill need: 512 batched tokens × 512 KiB per token
# The victim's need sits 2 GiB inside the headroom before the cause grows by 4 GiB and 2 GiB
# beyond it after. The headroom is the room in a memory budget of the test's own
# (``tests.containers.memory_budget``), which only the router's models and the cause move:
# other programs allocating and freeing memory on the machine meanwhile do not decide the
# outcome.
GAP = 2.0 * GIB
# The budget: every model at its largest (qwen and gemma 48 MiB of weights and 16 MiB of KV
# each, should a request start gemma too; the cause 32 MiB and 4,160 MiB), the victim's prefill
# buffer and the gap; the programs (router, its two models, the cause) are counted by the
# fixture.
BUDGET = 2 * (48 + 16) * MIB + (32 + 4160) * MIB + NEED + int(GAP)


def _start_cause(name: str, port: int, ctx: str, cgroup_parent: str) -> None:
    run_container(name, [str(BIN / "llama-server"), "-m", "/models/neighbour.gguf", "--port",
                         str(port), "-c", ctx, "--emulator-weights-bytes", "32M",
                         "--emulator-kv-bytes-per-token", "16K", "--emulator-load-seconds",
                         "0.3"], cgroup_parent=cgroup_parent)


def test_a_neighbours_growth_squeezes_an_adopted_models_prefill(node, api, tmp_path,
                                                                 memory_budget):
    for rule in RULES:
        if rule != "prefill-squeeze":
            RuleSetting.objects.create(rule=rule, enabled=False)
    budget = memory_budget(BUDGET, programs=4)
    router, port, _ = _start_router(tmp_path, cgroup_parent=budget.parent)
    victim, cause, cause_port = f"{router}/qwen", unique_name("neighbour"), free_port()
    _start_cause(cause, cause_port, "4096", budget.parent)
    cycle = _Cycle(node, api)
    cycle.until(lambda found: victim in found and cause in found)
    _wake(port, "qwen")
    # The admin's estimate of its activations per batched token (the Engine page's setting).
    Engine.objects.filter(node=node, name=victim).update(prefill_bytes_per_token=NEED // 512)
    cycle.until(lambda found: found[victim].phase == "ready"
                and _shares(node).get(victim, {}).get("prefill_need")
                and _shares(node).get(cause, {}).get("kv_pool"))
    assert _shares(node)[victim]["prefill_need"] == NEED

    margin_gib = budget_squeeze_margin_gib(node.ledger, NEED, GAP)
    RuleSetting.objects.create(rule="prefill-squeeze", for_seconds=2, thresholds={
        "margin_gib": margin_gib, "hysteresis_gib": 0.5})
    for _ in range(2):
        cycle()
    assert not Alert.objects.exists()

    podman("rm", "--force", "--time", "0", cause)  # recreated with a 4 GiB bigger KV cache
    _start_cause(cause, cause_port, "266240", budget.parent)
    cycle.until(lambda found: Alert.objects.filter(state="firing").exists())
    alert = Alert.objects.get()
    assert alert.rule == "prefill-squeeze" and alert.engine.name == victim
    # Its KV cache as the cause, or, when the alert fired while the new server still allocated
    # it (a slow machine), all the loading neighbour held then: either way the neighbour.
    assert alert.details["causes"][0]["label"] in (f"{cause}'s KV pool",
                                                   f"{cause}'s memory (KV pool not reported)")

    podman("rm", "--force", "--time", "0", cause)
    _start_cause(cause, cause_port, "4096", budget.parent)
    cycle.until(lambda found: Alert.objects.filter(state="resolved").exists())
    assert Alert.objects.count() == 1  # no other alert, pending or fired, on the way
