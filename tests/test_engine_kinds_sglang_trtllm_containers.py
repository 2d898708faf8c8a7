"""SGLang and TensorRT-LLM (``trtllm-serve``) in real containers (Podman's Docker-compatible
API), each running the emulator in that kind's dialect: discovered with its kind, its memory in
the ledger, its rates (or why there are none), its phase and health on the engine page,
``manage.py inspect`` reading it, faulty endpoints failing the read with nothing committed, and
a ``prefill-squeeze`` with an SGLang server as the cause and a trtllm-serve as the victim."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from collectors import docker_api
from collectors.hostmemory import collect_host_memory, window_figures
from collectors.ledger import update_ledger
from collectors.models import Engine, EngineMetric, Event, LedgerChange
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
SGLANG, TRTLLM = str(BIN / "sglang"), str(BIN / "trtllm-serve")
QUICK = ["--emulator-load-seconds", "0.3", "--emulator-weights-bytes", "32M",
         "--emulator-kv-bytes-per-token", "16K"]


def _sglang(port: int, tokens: int = 4096, *extra: str) -> list[str]:
    return [SGLANG, "serve", "--model-path", "Qwen/Qwen3-8B", "--port", str(port),
            "--max-total-tokens", str(tokens), "--max-running-requests", "8", *QUICK, *extra]


def _trtllm(port: int, *extra: str) -> list[str]:
    return [TRTLLM, "Qwen/Qwen3-8B", "--host", "127.0.0.1", "--port", str(port), *QUICK, *extra]


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


def _page(client, node, name: str) -> str:
    return client.get(reverse("dashboard:engine", args=[node.name, name])).content.decode()


def test_sglang_server_end_to_end(node, api, admin_client, tmp_path):
    port, name = free_port(), unique_name("sgl")
    # No label: found because its command runs `sglang serve`.
    run_container(name, _sglang(port, 4096, "--enable-metrics", "--emulator-load", "4:200:40"))

    engines = collect_engines_until(node, api, lambda found: name in found
                             and found[name].phase == "ready"
                             and found[name].rates.get("decode_tokens_per_s"))
    engine = engines[name]
    assert engine.kind == "sglang" and engine.config["max_num_seqs"] == 8
    assert engine.metrics_url == f"http://127.0.0.1:{port}"
    assert engine.startup["kv_cache_tokens"] == 4096
    assert engine.memory_usage_bytes > 96 * MIB  # really reserved, seen by the cgroup
    assert engine.rates["prefill_tokens_per_s"] > 0 and engine.rates["decode_tokens_per_s"] > 0
    assert engine.metrics["snapshot"]["ttft"]["count"] > 0
    assert engine_samples(engine, EngineMetric.DECODE_TPS)
    assert "mem-fraction-unset" not in {f["code"] for f in engine.findings}  # --max-total-tokens

    share = _ledger(node)[name]
    assert share["kv_pool"] == 64 * MIB  # 4,096 tokens × 16 KiB, from kv_cache_memory_usage_gb
    assert share["weights"] == pytest.approx(32 * MIB, abs=6 * MIB)  # "mem usage=0.03 GB"
    assert share["actual"] > 96 * MIB

    page = _page(admin_client, node, name)
    assert "SGLang 0.5.23" in page and 'data-field="phase">ready<' in page
    assert "SGLang API answers" in page and " of 8 running, " in page

    read = json.loads(_inspect("metrics", f"http://127.0.0.1:{port}", "--json"))
    assert read["kind"] == "sglang" and read["snapshot"]["generation_tokens_total"] > 0
    log_path = tmp_path / "engine.log"
    log_path.write_text(podman("logs", name))
    summary = json.loads(_inspect("log", str(log_path), "--json"))
    assert (summary["kind"], summary["phase"], summary["kv_cache_tokens"]) == \
        ("sglang", "ready", 4096)


def test_trtllm_servers_with_and_without_prometheus(node, api, admin_client, tmp_path):
    options = tmp_path / "llm_api_options.yaml"
    options.write_text("return_perf_metrics: true\nkv_cache_config:\n  max_tokens: 4096\n")
    port, name = free_port(), unique_name("trt")
    plain_port, plain = free_port(), unique_name("trt-plain")
    run_container(name, _trtllm(port, "--config", str(options), "--emulator-load", "4:200:10"))
    run_container(plain, _trtllm(plain_port, "--emulator-load", "4:200:40"))

    engines = collect_engines_until(node, api, lambda found: {name, plain} <= set(found)
                             and found[name].rates.get("decode_tokens_per_s")
                             and found[plain].metrics.get("snapshot", {}).get("requests_running"))
    engine = engines[name]
    assert engine.kind == "trtllm" and engine.phase == "ready"
    assert engine.config["extra_llm_api_options"] == str(options)
    assert engine.startup["kv_cache_tokens"] == 4096
    assert engine.metrics["details"]["source"] == "/prometheus/metrics"
    assert engine.rates["prefill_tokens_per_s"] > 0  # counted as requests finish
    share = _ledger(node)[name]
    assert share["kv_pool"] == pytest.approx(64 * MIB, abs=6 * MIB)  # "Allocated 0.06 GiB"
    assert share["weights"] is None and share["actual"] > 96 * MIB

    # Without return_perf_metrics: the iteration stats, and no rates, said with the reason.
    other = engines[plain]
    assert other.metrics["details"]["source"] == "/metrics"
    assert other.rates.get("decode_tokens_per_s") is None
    assert other.metrics["unknown"]["rates"].startswith("trtllm-serve runs without")
    assert engine_samples(other, EngineMetric.REQUESTS_RUNNING)
    assert not engine_samples(other, EngineMetric.DECODE_TPS)
    assert {"kv-fraction-of-free-memory", "metrics-disabled"} <= {
        f["code"] for f in other.findings}

    page = _page(admin_client, node, plain)
    assert "TensorRT-LLM 1.2.1" in page and 'data-field="phase">ready<' in page
    assert "trtllm-serve API answers" in page and "unknown — trtllm-serve runs without" in page
    read = json.loads(_inspect("metrics", f"http://127.0.0.1:{port}", "--json"))
    assert read["kind"] == "trtllm" and read["details"]["source"] == "/prometheus/metrics"


GARBAGE = b"<html><body>502 Bad Gateway</body></html>\n"


@pytest.mark.parametrize(("kind", "responder", "reason"), [
    ("sglang", faultserver.complete(GARBAGE, content_type="text/html"),
     "GET /server_info: not JSON"),
    ("sglang", faultserver.short_body(b'{"version": "0.5.23"', declared=400),
     "GET /server_info: truncated"),
    ("sglang", faultserver.complete(b'{"version": "0.33.0", "models": []}',
                                    content_type="application/json"),
     "GET /server_info: not an SGLang /server_info"),
    ("trtllm", faultserver.complete(b"[" + b"1," * (3 * MIB) + b"1]",
                                    content_type="application/json"),
     "GET /version: response larger than"),
    ("trtllm", faultserver.trickle(at_once=b"HTTP/1.1 200 OK\r\nContent-Length: 900\r\n\r\n{"),
     "GET /version: timed out"),
])
def test_faulty_endpoints_fail_the_read_and_commit_nothing(node, api, kind, responder, reason):
    name = unique_name(f"faulty-{kind}")
    with FaultServer(responder) as server:
        command = _sglang(free_port()) if kind == "sglang" else _trtllm(free_port())
        run_container(name, command, labels={"sparkops.url": server.url("")})
        engine = collect_engines_until(node, api, lambda found: bool(
            found.get(name) and found[name].last_scrape_error), timeout=60)[name]

    assert engine.kind == kind and reason in engine.last_scrape_error
    assert "\n" not in engine.last_scrape_error
    assert engine.metrics == {} and engine.rates == {}
    assert not [s for s in engine_samples(engine) if s.metric in {
        EngineMetric.REQUESTS_RUNNING, EngineMetric.DECODE_TPS, EngineMetric.KV_CACHE_USAGE,
    }]
    assert Event.objects.filter(engine=engine, kind="scrape-failed").count() == 1


# --- the squeeze: SGLang's KV pool grows, trtllm-serve's prefill loses its room ---------------

NEED = 256 * MIB  # the victim's prefill need: --max_num_tokens 512 × 512 KiB per token
SMALL, BIG = 4096, 266240  # --max-total-tokens × 16 KiB: 64 MiB, then 4,160 MiB
# The victim's need sits 2 GiB inside the headroom before the cause grows by 4 GiB and 2 GiB
# beyond it after. The headroom is the room in a memory budget of the test's own
# (``tests.containers.memory_budget``), which only the two engines move: other programs
# allocating and freeing memory on the machine meanwhile do not decide the outcome.
GAP = 2.0 * GIB
# The budget: both engines at their largest (32 MiB of weights each, the victim's KV pool at
# the emulator's 256 MiB cap for a memory fraction, the cause's 4,160 MiB), the victim's
# prefill buffer and the gap; their programs are counted by the fixture.
BUDGET = 2 * 32 * MIB + 256 * MIB + 4160 * MIB + NEED + int(GAP)


def _changes_of(node, name: str) -> list[tuple]:
    """The ledger's recorded moves of one engine, for a failure's message."""
    return list(LedgerChange.objects.filter(node=node, engine__name=name).order_by("at")
                .values_list("at", "component", "before_bytes", "after_bytes"))


def test_sglang_growth_squeezes_trtllm_prefill_and_resolves(node, api, memory_budget):
    for rule in RULES:
        if rule != "prefill-squeeze":
            RuleSetting.objects.create(rule=rule, enabled=False)
    budget = memory_budget(BUDGET, programs=2)
    victim, cause = unique_name("trt"), unique_name("sgl")
    cause_port = free_port()
    run_container(victim, _trtllm(free_port(), "--max_num_tokens", "512"),
                  labels={"sparkops.prefill-bytes-per-token": str(NEED // 512)},
                  cgroup_parent=budget.parent)
    run_container(cause, _sglang(cause_port, SMALL, "--enable-metrics"),
                  cgroup_parent=budget.parent)
    cycle = CollectionCycle(node, api)
    # The cause's pool as its metrics tell it (exact), not as its start-up log rounds it (0.06
    # GiB), which a cycle may read first: wait for a scrape of the cause as well.
    cycle.until(lambda: ledger_shares(node).get(cause, {}).get("kv_pool")
                and ledger_shares(node).get(victim, {}).get("prefill_need")
                and (Engine.objects.get(node=node, name=cause).metrics or {}).get("snapshot"))
    assert ledger_shares(node)[victim]["prefill_need"] == NEED
    assert ledger_shares(node)[cause]["kv_pool"] == 64 * MIB

    margin_gib = budget_squeeze_margin_gib(node.ledger, NEED, GAP)
    RuleSetting.objects.create(rule="prefill-squeeze", for_seconds=4, thresholds={
        "margin_gib": margin_gib, "hysteresis_gib": 0.5})
    for _ in range(3):
        cycle()
    assert not Alert.objects.exists()

    podman("rm", "--force", "--time", "0", cause)  # recreated with a bigger pool
    run_container(cause, _sglang(cause_port, BIG, "--enable-metrics"),
                  cgroup_parent=budget.parent)
    cycle.until(lambda: Alert.objects.filter(state="firing").exists())
    alert = Alert.objects.get()
    assert alert.rule == "prefill-squeeze" and alert.engine.name == victim
    assert alert.engine.kind == "trtllm"
    first_cause = alert.details["causes"][0]
    if first_cause["label"] == f"{cause}'s KV pool":
        # Its pool was reported before the alert fired: its size as its metrics tell it
        # (exact), or its log (two decimals of GB), whichever the collection read first. The
        # move from the log's 0.06 GiB to the exact 64 MiB is under the ledger's change
        # fraction and is not recorded, so the growth starts from the size first recorded.
        assert first_cause["before_bytes"] in (64 * MIB, int(0.06 * GIB)), \
            _changes_of(node, cause)
        assert first_cause["after_bytes"] == pytest.approx(4160 * MIB, abs=0.01 * 1024**3)
    else:
        # It fired while the new container was still allocating (a slow machine): the cause is
        # then what the loading neighbour holds, its pool not yet reported, grown past the gap
        # that kept the victim's prefill room.
        assert first_cause["label"] == f"{cause}'s memory (KV pool not reported)", \
            _changes_of(node, cause)
        assert GAP < first_cause["growth_bytes"] <= 4160 * MIB + 0.5 * GIB

    podman("rm", "--force", "--time", "0", cause)  # back to its old size
    run_container(cause, _sglang(cause_port, SMALL, "--enable-metrics"),
                  cgroup_parent=budget.parent)
    cycle.until(lambda: Alert.objects.filter(state="resolved").exists())
    assert Engine.objects.get(node=node, name=cause).kind == "sglang"
