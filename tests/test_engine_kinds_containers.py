"""Every engine kind in real containers (Podman's Docker-compatible API), each running the
emulator in that kind's dialect: discovered with its kind, its memory in the ledger, its rates
(or why there are none), its phase and health on the engine page, ``manage.py inspect`` reading
it, faulty endpoints failing the read with nothing committed, and a ``prefill-squeeze`` with a
llama.cpp server as the cause and an Ollama server as the victim."""

from __future__ import annotations

import io
import json
import urllib.request

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from collectors import docker_api
from collectors.hostmemory import collect_host_memory, window_figures
from collectors.ledger import update_ledger
from collectors.models import Engine, EngineMetric, Event
from collectors.procfs import Procfs
from dashboard.alerting.models import Alert, RuleSetting
from dashboard.alerting.settings import RULES
from sparkops.testing.ports import free_port
from tests.conftest import PROJECT
from tests.containers import budget_squeeze_margin_gib, podman, run_container, unique_name
from tests.cycles import CollectionCycle, collect_engines_until, ledger_shares
from tests.scrape import faultserver
from tests.scrape.faultserver import FaultServer
from tests.stored import engine_samples

pytestmark = [pytest.mark.slow, pytest.mark.django_db]
MIB = 1024**2
GIB = 1024**3
BIN = PROJECT / "collectors" / "emulator" / "bin"
LLAMA_SERVER, OLLAMA = str(BIN / "llama-server"), str(BIN / "ollama")
QUICK = ["--emulator-load-seconds", "0.3"]


def _llama_server(port: int, *extra: str) -> list[str]:
    return [LLAMA_SERVER, "-m", "/models/Qwen3-30B-A3B-Q4_K_M.gguf", "--port", str(port),
            "-c", "8192", "-np", "4", "--metrics", "--emulator-weights-bytes", "32M",
            "--emulator-kv-bytes-per-token", "4K", *QUICK, *extra]


def _ollama(*extra: str) -> list[str]:
    return [OLLAMA, "serve", "--emulator-model", "qwen3:8b", "--emulator-preload",
            "--emulator-weights-bytes", "32M", "--emulator-kv-bytes-per-token", "4K", *QUICK,
            *extra]


def _ollama_env(port: int, **more: str) -> dict[str, str]:
    return {"OLLAMA_HOST": f"127.0.0.1:{port}", "OLLAMA_CONTEXT_LENGTH": "4096", **more}


@pytest.fixture
def api(docker_host):
    client = docker_api.client(docker_host)
    yield client
    client.close()


def _ledger(node) -> dict:
    _, window = collect_host_memory(node, Procfs(), duration=0.3, period=0.1)
    update_ledger(node, window_figures(window), timezone.now())
    node.refresh_from_db()
    return {share["name"]: share for share in node.ledger["engines"]}


def _inspect(*args: str) -> str:
    out = io.StringIO()
    call_command("inspect", *args, stdout=out)
    return out.getvalue()


def test_llamacpp_server_end_to_end(node, api, admin_client, tmp_path):
    port, name = free_port(), unique_name("qwen")
    # No label: found because its command runs llama-server.
    run_container(name, _llama_server(port, "--emulator-load", "4:200:40"))
    run_container(unique_name("bystander"), ["sleep", "300"])

    engines = collect_engines_until(node, api, lambda found: name in found
                             and found[name].phase == "ready"
                             and found[name].rates.get("decode_tokens_per_s"))
    engine = engines[name]
    assert set(engines) == {name} and engine.kind == "llamacpp"
    assert engine.config["ctx_size"] == 8192 and engine.config["max_num_seqs"] == 4
    assert engine.metrics_url == f"http://127.0.0.1:{port}"
    assert engine.startup["weights_gib"] == pytest.approx(32 / 1024)
    assert engine.startup["kv_cache_gib"] == pytest.approx(32 / 1024)  # 8192 cells × 4 KiB
    assert engine.memory_usage_bytes > 64 * MIB  # really reserved, seen by the cgroup
    assert engine.rates["prefill_tokens_per_s"] > 0 and engine.rates["decode_tokens_per_s"] > 0
    assert engine.metrics["details"]["props"]["total_slots"] == 4
    assert engine_samples(engine, EngineMetric.DECODE_TPS)
    assert "context-split-across-slots" in {f["code"] for f in engine.findings}

    share = _ledger(node)[name]
    assert share["weights"] == 32 * MIB and share["kv_pool"] == 32 * MIB
    assert share["actual"] > 64 * MIB

    page = admin_client.get(reverse("dashboard:engine", args=[node.name, name])).content.decode()
    assert "llama.cpp server b7420-0c1e5709" in page
    assert 'data-field="phase">ready<' in page and "llama-server API answers" in page
    assert "-c: 8,192 cells reserved at start" in page and " of 4 slots busy" in page

    read = json.loads(_inspect("metrics", f"http://127.0.0.1:{port}", "--json"))
    assert read["kind"] == "llamacpp" and read["snapshot"]["generation_tokens_total"] > 0
    log_path = tmp_path / "engine.log"
    log_path.write_text(podman("logs", name))
    summary = json.loads(_inspect("log", str(log_path), "--json"))
    assert (summary["kind"], summary["phase"], summary["kv_cache_tokens"]) == \
        ("llamacpp", "ready", 8192)


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_llamacpp_router_scrapes_never_load_a_model(node, api, admin_client):
    port, name = free_port(), unique_name("router")
    run_container(name, [LLAMA_SERVER, "--models-dir", "/models", "--port", str(port),
                         "--metrics", "-c", "4096", "--emulator-router-models", "qwen,gemma",
                         "--emulator-weights-bytes", "48M", *QUICK])

    for _ in range(3):  # several reads: autoload=false, so nothing loads
        engines = collect_engines_until(node, api, lambda found: name in found
                                 and found[name].phase == "ready"
                                 and found[name].last_scrape_ok_at)
    engine = engines[name]
    assert engine.kind == "llamacpp" and engine.config["router"] is True
    assert engine.metrics["details"]["state"] == \
        "router: 0 of 2 models loaded (qwen: unloaded, gemma: unloaded)"
    idle_memory = engine.memory_usage_bytes

    _post(f"http://127.0.0.1:{port}/v1/completions",  # a client asks for qwen: it loads
          {"model": "qwen", "prompt": "hello " * 50, "max_tokens": 20})
    engines = collect_engines_until(node, api, lambda found: found[name].metrics["details"]["state"]
                             .startswith("router: 1 of 2"))
    engine = engines[name]
    assert [(m["name"], m["status"]) for m in engine.metrics["details"]["models"]] == \
        [("qwen", "loaded"), ("gemma", "unloaded")]
    assert engine.metrics["snapshot"]["generation_tokens_total"] == 20
    assert engine.memory_usage_bytes > idle_memory + 40 * MIB  # the child's weights are held
    assert engine.metrics["unknown"]["kv_pool"].startswith("llama-server in router mode")
    page = admin_client.get(reverse("dashboard:engine", args=[node.name, name])).content.decode()
    assert "router: 1 of 2 models loaded (qwen: loaded, gemma: unloaded)" in page
    assert "unknown — llama-server in router mode" in page


def test_ollama_server_end_to_end(node, api, admin_client):
    port, name = free_port(), unique_name("chat")
    run_container(name, _ollama("--emulator-load", "1:100:20"), env=_ollama_env(port))

    engines = collect_engines_until(node, api, lambda found: name in found
                             and found[name].phase == "ready"
                             and (found[name].metrics.get("details") or {}).get("models"))
    engine = engines[name]
    assert engine.kind == "ollama" and engine.config["port"] == port
    models = engine.metrics["details"]["models"]
    kv = 4096 * 4 * 1024
    assert [m["name"] for m in models] == ["qwen3:8b"]
    assert models[0]["size_bytes"] == 32 * MIB + kv + 512 * 1024  # weights + KV + compute
    assert engine.memory_usage_bytes > 32 * MIB
    # No /metrics: no rates at all, said with the reason, never a 0.
    assert engine.rates.get("decode_tokens_per_s") is None
    assert engine.metrics["unknown"]["rates"].startswith("Ollama has no /metrics")
    assert not [s for s in engine_samples(engine) if s.metric in {
        EngineMetric.DECODE_TPS, EngineMetric.PREFILL_TPS, EngineMetric.REQUESTS_RUNNING}]

    share = _ledger(node)[name]
    assert share["actual"] > 32 * MIB and share["kv_pool"] is None and share["weights"] is None

    page = admin_client.get(reverse("dashboard:engine", args=[node.name, name])).content.decode()
    assert "Ollama 0.33.0" in page and 'data-field="phase">ready<' in page
    assert "unknown — Ollama has no /metrics" in page
    assert "1 loaded: qwen3:8b (unloads in 5 min if idle)" in page
    cards = admin_client.get(reverse("dashboard:engine-cards", args=[node.name])).content.decode()
    assert "unknown — Ollama has no /metrics" in cards

    read = json.loads(_inspect("metrics", f"http://127.0.0.1:{port}", "--json"))
    assert read["kind"] == "ollama" and read["details"]["models"][0]["name"] == "qwen3:8b"


def test_an_ollama_model_unloads_when_its_keep_alive_runs_out(node, api):
    port, name = free_port(), unique_name("brief")
    run_container(name, _ollama(), env=_ollama_env(port, OLLAMA_KEEP_ALIVE="3s"))
    collect_engines_until(node, api, lambda found: name in found
                   and (found[name].metrics.get("details") or {}).get("models"))
    engines = collect_engines_until(
        node, api, lambda found: found[name].metrics["details"]["models"] == [], timeout=30)
    assert engines[name].metrics["details"]["state"] == "no model loaded"
    assert engines[name].phase == "ready"


GARBAGE = b"<html><body>502 Bad Gateway</body></html>\n"


@pytest.mark.parametrize(("kind", "responder", "reason"), [
    ("llamacpp", faultserver.complete(GARBAGE, content_type="text/html"), "GET /props: not JSON"),
    ("llamacpp", faultserver.short_body(b'{"total_slots": 4', declared=400),
     "GET /props: truncated"),
    ("llamacpp", faultserver.complete(b"[" + b"1," * (3 * MIB) + b"1]",
                                      content_type="application/json"),
     "GET /props: response larger than"),
    ("ollama", faultserver.trickle(at_once=b"HTTP/1.1 200 OK\r\nContent-Length: 900\r\n\r\n{"),
     "GET /api/version: timed out"),
    ("ollama", faultserver.complete(b'{"version": "0.33.0", "models": "many"}',
                                    content_type="application/json"), "GET /api/ps: not an"),
])
def test_faulty_endpoints_fail_the_read_and_commit_nothing(node, api, kind, responder, reason):
    name = unique_name(f"faulty-{kind}")
    with FaultServer(responder) as server:
        command = _llama_server(free_port()) if kind == "llamacpp" else _ollama()
        env = _ollama_env(free_port()) if kind == "ollama" else None
        run_container(name, command, env=env, labels={"sparkops.url": server.url("")})
        engine = collect_engines_until(node, api, lambda found: bool(
            found.get(name) and found[name].last_scrape_error), timeout=60)[name]

    assert engine.kind == kind and reason in engine.last_scrape_error
    assert "\n" not in engine.last_scrape_error
    assert engine.metrics == {} and engine.rates == {}
    assert not [s for s in engine_samples(engine) if s.metric in {
        EngineMetric.REQUESTS_RUNNING, EngineMetric.DECODE_TPS, EngineMetric.KV_CACHE_USAGE,
    }]
    assert Event.objects.filter(engine=engine, kind="scrape-failed").count() == 1


# --- the squeeze: llama.cpp's KV grows, Ollama's prefill loses its room ------------------------

NEED = 256 * MIB  # the Ollama model's prefill need: 512 batched tokens × 512 KiB per token
SMALL_CTX, BIG_CTX = "4096", "266240"  # × 16 KiB per cell: 64 MiB, then 4,160 MiB
# The victim's need sits 2 GiB inside the headroom before the cause grows by 4 GiB and 2 GiB
# beyond it after. The headroom is the room in a memory budget of the test's own
# (``tests.containers.memory_budget``), which only the two engines move: other programs
# allocating and freeing memory on the machine meanwhile do not decide the outcome.
GAP = 2.0 * GIB
# The budget: both engines at their largest (32 MiB of weights each, the Ollama model's 16 MiB
# of KV and 0.5 MiB of compute, the cause's 4,160 MiB), the victim's prefill buffer and the gap;
# their programs are counted by the fixture.
BUDGET = 2 * 32 * MIB + 4096 * 4 * 1024 + 512 * 1024 + 4160 * MIB + NEED + int(GAP)


def _start_cause(name: str, port: int, ctx: str, cgroup_parent: str) -> None:
    run_container(name, [LLAMA_SERVER, "-m", "/models/neighbour.gguf", "--port", str(port),
                         "-c", ctx, "--emulator-weights-bytes", "32M",
                         "--emulator-kv-bytes-per-token", "16K", *QUICK],
                  cgroup_parent=cgroup_parent)


def test_llamacpp_growth_squeezes_ollamas_prefill_and_resolves(node, api, memory_budget):
    for rule in RULES:
        if rule != "prefill-squeeze":
            RuleSetting.objects.create(rule=rule, enabled=False)
    budget = memory_budget(BUDGET, programs=2)
    victim, cause = unique_name("chat"), unique_name("neighbour")
    cause_port = free_port()
    run_container(victim, _ollama(), env=_ollama_env(free_port()),
                  labels={"sparkops.prefill-bytes-per-token": str(NEED // 512)},
                  cgroup_parent=budget.parent)
    _start_cause(cause, cause_port, SMALL_CTX, budget.parent)
    cycle = CollectionCycle(node, api)
    cycle.until(lambda: ledger_shares(node).get(cause, {}).get("kv_pool")
                and ledger_shares(node).get(victim, {}).get("prefill_need"))
    assert ledger_shares(node)[victim]["prefill_need"] == NEED
    assert ledger_shares(node)[cause]["kv_pool"] == 64 * MIB

    margin_gib = budget_squeeze_margin_gib(node.ledger, NEED, GAP)
    RuleSetting.objects.create(rule="prefill-squeeze", for_seconds=4, thresholds={
        "margin_gib": margin_gib, "hysteresis_gib": 0.5})
    for _ in range(3):
        cycle()
    assert not Alert.objects.exists()

    podman("rm", "--force", "--time", "0", cause)  # recreated with a bigger context
    _start_cause(cause, cause_port, BIG_CTX, budget.parent)
    cycle.until(lambda: Alert.objects.filter(state="firing").exists())
    alert = Alert.objects.get()
    assert alert.rule == "prefill-squeeze" and alert.engine.name == victim
    assert alert.engine.kind == "ollama"
    first_cause = alert.details["causes"][0]
    if first_cause["label"] == f"{cause}'s KV pool":
        assert (first_cause["before_bytes"], first_cause["after_bytes"]) == (64 * MIB, 4160 * MIB)
    else:
        # It fired while the new server was still allocating (a slow machine): the cause is
        # then what the loading neighbour holds, its pool not yet reported, grown by most of
        # the 4 GiB it takes.
        assert first_cause["label"] == f"{cause}'s memory (KV pool not reported)", first_cause
        assert 2 * GIB < first_cause["growth_bytes"] <= 4160 * MIB + GIB // 2, first_cause

    podman("rm", "--force", "--time", "0", cause)  # back to its old size
    _start_cause(cause, cause_port, SMALL_CTX, budget.parent)
    cycle.until(lambda: Alert.objects.filter(pk=alert.pk, state="resolved").exists())
    assert Alert.objects.count() == 1  # no other alert, pending or fired, on the way
    assert Engine.objects.get(node=node, name=cause).kind == "llamacpp"
