"""The main pages in a real browser, on a node whose last hour tells the seeds' story.

Two vLLM engines share a GB10: an idle Gemma-like engine and a Nemotron-like neighbour that is
restarted (planned) with a bigger KV pool, 8 → 24 GiB, which squeezes Gemma's prefill. Beside
them, as on many such nodes, a small llama.cpp ``llama-server`` and an Ollama server that loaded
its model on demand: a mixed node, each engine shown with the same figures and what its kind
cannot report as "unknown — why". The world is written with SparkOps' own ledger, engine-kind
readers, unplanned-restart and alert code where it exists, and as the collectors' rows
otherwise. The tests take screenshots of the main pages into their own
temporary directory; with ``SPARKOPS_UPDATE_SCREENSHOTS=1`` they write them into ``docs/`` instead,
replacing the committed ones.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import Permission
from django.utils import timezone

from collectors.kinds.base import KindStartup
from collectors.kinds.llamacpp import LlamaCppReader
from collectors.kinds.ollama import OllamaReader, loaded_models, models_state
from collectors.ledger import build_ledger, record_changes
from collectors.models import (
    Collection,
    Engine,
    EngineMetric,
    EngineReading,
    Event,
    HostReading,
    Metric,
    Node,
)
from collectors.processes import ProcessGroup
from collectors.readings import ENGINE, HOST, Sample
from dashboard.alerting.models import Alert, RuleSetting
from dashboard.alerting.pipeline import run_alerts
from dashboard.alerting.settings import RULES
from dashboard.restarts import planning
from dashboard.restarts.models import Restart
from dashboard.restarts.unplanned import record_unplanned_restarts
from tests.conftest import PROJECT

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

GIB = 1024**3
MIB = 1024**2
DOCS = PROJECT / "docs"
UPDATE_SCREENSHOTS = "SPARKOPS_UPDATE_SCREENSHOTS"  # "1": write docs/*.png
PASSWORD = "a-long-test-password"
STEP = 10  # seconds between the seeded collections
WIDE = {"width": 1400, "height": 900}
PHONE = {"width": 390, "height": 844}
NEMOTRON_MODEL = "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4"
GEMMA_MODEL = "google/gemma-4-26B-A4B-it-NVFP4"
QWEN_GGUF = "/models/Qwen3-1.7B-Q4_K_M.gguf"
OLLAMA_MODEL = "qwen3:1.7b"
GEMMA_KV_GIB = 6  # pinned, as in the demo's story
# What each engine holds (GiB): weights + KV pool + CUDA graphs for the vLLM engines; the
# llama-server's weights, KV pool and compute buffer with its CUDA context; Ollama's model.
GEMMA_HOLDS = 14.6 + GEMMA_KV_GIB + 0.6
QWEN_HOLDS = 1.9
OLLAMA_HOLDS = 1.7
OLLAMA_SIZE = int(1.6 * GIB)  # /api/ps "size" of the loaded model


# --- the world -----------------------------------------------------------------------------------

def _engine(node: Node, name: str, model: str, kv_gib: float, weights_gib: float,
            started: datetime, decode: float, **extra) -> Engine:
    labels = {"sparkops.engine": "vllm", **extra.pop("labels", {})}
    return Engine.objects.create(
        node=node, name=name, container_id=name[0] * 64, container_state="running",
        phase="ready", image="vllm/vllm-openai:v0.33.0", started_at=started, labels=labels,
        command=["vllm", "serve", model, "--kv-cache-memory-bytes", f"{kv_gib:.0f}G",
                 "--max-num-batched-tokens", "8192", "--max-num-seqs", "8"],
        config={"model": model, "served_model_name": name, "max_num_seqs": 8,
                "max_num_batched_tokens": 8192, "kv_cache_memory_bytes": int(kv_gib * GIB),
                "all_flags": {"kv-cache-memory-bytes": f"{kv_gib:.0f}G",
                              "max-num-batched-tokens": "8192", "max-num-seqs": "8"}},
        startup={"phase": "ready", "version": "0.33.0", "weights_gib": weights_gib,
                 "kv_cache_gib": kv_gib, "kv_cache_pinned": True, "cuda_graph_gib": 0.6,
                 "backends": ["FlashInfer"], "startup_seconds": 492, "errors": []},
        metrics={"snapshot": {"model_name": model, "requests_running": 1, "requests_waiting": 0,
                              "kv_cache_usage": 0.12}},
        rates={"prefill_tokens_per_s": 0.0, "decode_tokens_per_s": decode, "ttft_p95_s": 0.41},
        gpu_memory_bytes=int((weights_gib + kv_gib + 0.6) * GIB), **extra,
    )


# llama-server's startup log for the small model, in the format of llama.cpp 0c1e5709
# (tests/fixtures/llamacpp/startup_gb10.log): Qwen3-1.7B has 28 layers of 8 KV heads × 128,
# so 112 KiB of f16 KV per cell, 448 MiB for -c 4096.
QWEN_LOG = """\
0.00.000.031 I srv  llama_server: initializing ...
0.00.118.602 I srv    load_model: loading model '/models/Qwen3-1.7B-Q4_K_M.gguf'
0.00.121.940 I llama_model_loader: loaded meta data with 33 key-value pairs and 311 tensors \
from /models/Qwen3-1.7B-Q4_K_M.gguf (version GGUF V3 (latest))
0.01.811.302 I load_tensors: offloaded 29/29 layers to GPU
0.01.811.390 I load_tensors:        CUDA0 model buffer size =  1000.55 MiB
0.01.811.395 I load_tensors:   CPU_Mapped model buffer size =    77.61 MiB
0.01.984.602 I llama_kv_cache: size =  448.00 MiB (  4096 cells,  28 layers,  1/1 seqs), \
K (f16):  224.00 MiB, V (f16):  224.00 MiB
0.02.211.874 I sched_reserve:      CUDA0 compute buffer size =   300.75 MiB
0.02.211.880 I sched_reserve:  CUDA_Host compute buffer size =    12.01 MiB
0.02.436.119 I srv  llama_server: model loaded
0.02.436.190 I srv  llama_server: listening on http://0.0.0.0:8080
"""


def _llamacpp_engine(node: Node, started: datetime) -> Engine:
    """A small llama-server next to the vLLM engines, read as its reader reads one."""
    reader = LlamaCppReader()
    command = ["/app/llama-server", "-m", QWEN_GGUF, "-a", "qwen3-1.7b", "--host", "0.0.0.0",
               "--port", "8080", "-c", "4096", "-np", "1", "-ngl", "99", "--metrics"]
    launch = reader.parse_launch(command, {})
    parser = reader.new_log_parser()
    parser.feed(QWEN_LOG)
    startup = parser.result()
    props = {"total_slots": 1, "n_ctx_per_slot": 4096, "model_path": QWEN_GGUF,
             "model_alias": "qwen3-1.7b", "build_info": "b7420-0c1e5709", "is_sleeping": False,
             "endpoint_metrics": True, "endpoint_slots": True}
    slots = [{"id": 0, "n_ctx": 4096, "is_processing": True, "n_prompt_tokens": 812,
              "n_decoded": 48}]
    return Engine.objects.create(
        node=node, name="qwen3-1.7b", kind="llamacpp", container_id="q" * 64,
        container_state="running", phase="ready", started_at=started,
        image="ghcr.io/ggml-org/llama.cpp:server-cuda-b7420", command=command,
        config=launch.config, startup=startup.as_dict(),
        findings=reader.findings(launch, startup, []),
        metrics={"snapshot": {"model_name": "qwen3-1.7b", "requests_running": 1,
                              "requests_waiting": 0, "kv_cache_usage": (812 + 48) / 4096,
                              "kv_cache_size_tokens": 4096,
                              "kv_cache_size_source": "/slots n_ctx"},
                 "details": {"props": props, "slots": slots, "state": "1 of 1 slots busy"},
                 "unknown": dict(reader.never_reported)},
        rates={"prefill_tokens_per_s": 0.0, "decode_tokens_per_s": 118.4},
        gpu_memory_bytes=int(QWEN_HOLDS * GIB), metrics_url="http://127.0.0.1:8080",
        labels={"sparkops.engine": "llamacpp"},
    )


def _ollama_engine(node: Node, started: datetime, now: datetime) -> Engine:
    """An Ollama server as its reader reads one, with nothing loaded yet (see
    :func:`_ollama_loads`)."""
    reader = OllamaReader()
    env = {"OLLAMA_HOST": "0.0.0.0:11434", "OLLAMA_KEEP_ALIVE": "30m",
           "OLLAMA_CONTEXT_LENGTH": "4096"}
    launch = reader.parse_launch(["/bin/ollama", "serve"], env)
    startup = KindStartup(phase="ready", version="0.33.0", listening_on="[::]:11434",
                          startup_count=1)
    engine = Engine.objects.create(
        node=node, name="ollama", kind="ollama", container_id="o" * 64,
        container_state="running", phase="ready", started_at=started,
        image="ollama/ollama:0.33.0", command=["/bin/ollama", "serve"], env=env,
        config=launch.config, startup=startup.as_dict(),
        findings=reader.findings(launch, startup, []), rates={},
        gpu_memory_bytes=int(0.1 * GIB), metrics_url="http://127.0.0.1:11434",
        labels={"sparkops.engine": "ollama"},
    )
    _ollama_models(engine, [], now)
    return engine


def _ollama_models(engine: Engine, ps_models: list[dict], now: datetime) -> None:
    """What ``/api/ps`` said at ``now``, stored as the Ollama reader stores it."""
    models = loaded_models({"models": ps_models})
    engine.metrics = {
        "snapshot": {"model_name": models[0]["name"] if models else None},
        "details": {"version": "0.33.0", "models": models,
                    "size_bytes": sum(m["size_bytes"] for m in models),
                    "size_vram_bytes": sum(m["size_vram_bytes"] for m in models),
                    "state": models_state(models, now)},
        "unknown": dict(OllamaReader.never_reported)}
    engine.gpu_memory_bytes = int((OLLAMA_HOLDS if models else 0.1) * GIB)
    engine.save()


def _ollama_loads(engine: Engine, now: datetime) -> None:
    """A chat asked Ollama for its model: loaded, and kept 30 min after the last request."""
    expires = (now + timedelta(minutes=28)).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")
    _ollama_models(engine, [{
        "name": OLLAMA_MODEL, "model": OLLAMA_MODEL, "size": OLLAMA_SIZE,
        "size_vram": OLLAMA_SIZE, "digest": "8f68893c685c" + "0" * 52,
        "details": {"parent_model": "", "format": "gguf", "family": "qwen3",
                    "families": ["qwen3"], "parameter_size": "2.0B",
                    "quantization_level": "Q4_K_M"},
        "expires_at": expires, "context_length": 4096}], now)


def _figures(available_gib: float, minimum_gib: float) -> dict[str, int]:
    return {"mem_total": int(121.69 * GIB), "mem_available": int(available_gib * GIB),
            "mem_available_min": int(minimum_gib * GIB),
            "page_cache_reclaimable": int(3.2 * GIB), "swap_used": 0}


PROCESSES = [ProcessGroup("postgres", int(1.1 * GIB), 6),
             ProcessGroup("open-webui", int(0.5 * GIB), 2)]
# MemAvailable before and after the neighbour grew (its interval minima 1 GiB lower), with every
# engine up: MemTotal less the engines, the processes and the kernel's share. While an engine is
# down its memory is available too.
AVAILABLE_BEFORE, AVAILABLE_AFTER = 24.0, 8.0
OLLAMA_LOADED_AGO = 50  # minutes: a chat asked for its model then


def seed_world(node: Node, now: datetime, *, squeeze_alert: bool) -> dict[str, Engine]:
    """An hour of the node: samples every 10 s, ledger changes, restarts, events and alerts."""
    start = now - timedelta(hours=1)
    gemma = _engine(node, "gemma-4-26b", GEMMA_MODEL, GEMMA_KV_GIB, 14.6,
                    start - timedelta(days=1), 41.1,
                    labels={"sparkops.prefill-bytes-per-token": str(MIB),
                            "sparkops.manage": "true"})
    precheck = {"code": "kv-bytes-skips-precheck", "severity": "warning",
                "message": "--kv-cache-memory-bytes skips vLLM's memory pre-check: SparkOps is "
                           "the pre-check."}
    nemotron = _engine(node, "nemotron-120b", NEMOTRON_MODEL, 8, 62.9,
                       now - timedelta(minutes=34), 23.2, findings=[precheck])
    qwen = _llamacpp_engine(node, start - timedelta(days=3))
    ollama = _ollama_engine(node, start - timedelta(days=3), start)
    engines = [gemma, nemotron, qwen, ollama]
    # The ledger as SparkOps built it: the pools appear; Ollama loads its model when a chat
    # asks for it; then the neighbour's pool grows 8 → 24 GiB.
    loaded_before = OLLAMA_SIZE / GIB
    record_changes(node, build_ledger(node, start, _figures(AVAILABLE_BEFORE + loaded_before,
                                                            AVAILABLE_BEFORE + loaded_before - 1),
                                      engines, PROCESSES), start)
    loaded = now - timedelta(minutes=OLLAMA_LOADED_AGO)
    _ollama_loads(ollama, now)
    record_changes(node, build_ledger(node, loaded, _figures(AVAILABLE_BEFORE,
                                                             AVAILABLE_BEFORE - 1),
                                      engines, PROCESSES), loaded)
    grown = now - timedelta(minutes=25)
    nemotron.startup = {**nemotron.startup, "kv_cache_gib": 24}
    nemotron.config = {**nemotron.config, "kv_cache_memory_bytes": 24 * GIB}
    nemotron.gpu_memory_bytes = int((62.9 + 24 + 0.6) * GIB)
    nemotron.save()
    record_changes(node, build_ledger(node, grown, _figures(AVAILABLE_AFTER, AVAILABLE_AFTER - 1),
                                      engines, PROCESSES), grown)
    _samples(node, gemma, nemotron, now)
    _small_engine_samples(qwen, ollama, now)
    # Every engine answered its last read (vLLM's /metrics, llama-server's and Ollama's APIs).
    Engine.objects.filter(node=node).update(last_scrape_at=now, last_scrape_ok_at=now)
    _events_and_restarts(node, gemma, nemotron, now)
    RuleSetting.objects.create(rule="prefill-squeeze", for_seconds=0)
    for rule in RULES:
        if rule != "prefill-squeeze":
            RuleSetting.objects.create(rule=rule, enabled=False)
    if squeeze_alert:
        run_alerts(node, now)
    Alert.objects.create(rule="queue-backlog", node=node, engine=gemma, scope="backlog-gemma",
                         state="resolved", severity="warning",
                         summary="gemma-4-26b: requests waited 17 s for a slot (8 slots busy)",
                         threshold=15, started_at=now - timedelta(minutes=48),
                         fired_at=now - timedelta(minutes=47),
                         resolved_at=now - timedelta(minutes=44),
                         last_evaluated_at=now - timedelta(minutes=44))
    return {"gemma": gemma, "nemotron": nemotron, "qwen": qwen, "ollama": ollama}


def _phase(minutes_ago: float, down: tuple[float, float]) -> bool:
    """Whether an engine is up at ``minutes_ago``, given the outage (from, to) in minutes ago."""
    return not down[1] < minutes_ago <= down[0]


def _samples(node: Node, gemma: Engine, nemotron: Engine, now: datetime) -> None:
    host: list[HostReading] = []
    collections: list[Collection] = []
    engine_rows: list[EngineReading] = []
    for i in range(3600 // STEP):
        at = now - timedelta(seconds=3600 - STEP * (i + 1))
        ago = (now - at).total_seconds() / 60
        gemma_up, nemotron_up = _phase(ago, (45, 40)), _phase(ago, (34, 25))
        available = AVAILABLE_AFTER if ago <= 25 else AVAILABLE_BEFORE
        available += (0 if gemma_up else GEMMA_HOLDS) + (0 if nemotron_up else 71.5)
        available += OLLAMA_SIZE / GIB if ago > OLLAMA_LOADED_AGO else 0
        prefill = gemma_up and i % 17 == 0
        minimum = available - (2.6 if prefill else 0.3)
        collections.append(Collection(node=node, at=at, window_started_at=at - timedelta(
            seconds=STEP), ok=True))
        pressure = 4.0 + 3 * math.sin(i / 5) if ago <= 25 else 0.2
        figures = [Sample(metric, at, value * GIB) for metric, value in [
            (Metric.MEM_AVAILABLE, available), (Metric.MEM_AVAILABLE_MIN, minimum),
            (Metric.MEM_FREE, available - 3.2 - 0.02 * (i % 9)),
            (Metric.PAGE_CACHE_RECLAIMABLE, 3.2), (Metric.SWAP_USED, 0.0)]]
        figures.append(Sample(Metric.PSI_SOME_AVG10, at, pressure))
        host.append(HOST.reading(node, at, figures))
        if gemma_up:
            busy = (i // 12) % 2 == 0  # two-minute stretches of one chat, then idle
            engine_rows += _engine_rows(gemma, at, running=2 if prefill else int(busy),
                                        decode=41.1 if busy else 0.0,
                                        prefill=2383.0 if prefill else 0.0,
                                        kv=0.05 + 0.02 * busy, held=GEMMA_HOLDS)
        if nemotron_up:
            engine_rows += _engine_rows(nemotron, at, running=1, decode=23.2 + 0.4 * math.sin(i),
                                        prefill=1636.0 if i % 29 == 0 else 0.0,
                                        kv=0.08 + 0.01 * (i % 5),
                                        held=87.5 if ago <= 25 else 71.5)
    Collection.objects.bulk_create(collections)
    HostReading.objects.bulk_create(host)
    EngineReading.objects.bulk_create(engine_rows)


def _small_engine_samples(qwen: Engine, ollama: Engine, now: datetime) -> None:
    """The llama-server's samples as its /metrics and /slots give them (no latency
    histograms), and Ollama's only what NVML sees it hold: it keeps no counters at all."""
    rows: list[EngineReading] = []
    for i in range(3600 // STEP):
        at = now - timedelta(seconds=3600 - STEP * (i + 1))
        ago = (now - at).total_seconds() / 60
        chatting = (i // 9) % 3 != 2
        rows += _engine_rows(qwen, at, running=int(chatting), decode=118.4 if chatting else 0.0,
                             prefill=5120.0 if i % 13 == 0 else 0.0,
                             kv=0.21 if chatting else 0.0, held=QWEN_HOLDS)
        held = OLLAMA_HOLDS if ago <= OLLAMA_LOADED_AGO else 0.1
        rows.append(ENGINE.reading(ollama, at, [Sample(EngineMetric.GPU_MEMORY, at, held * GIB)]))
    EngineReading.objects.bulk_create(rows)


def _engine_rows(engine: Engine, at: datetime, *, running: int, decode: float, prefill: float,
                 kv: float, held: float) -> list[EngineReading]:
    values = {EngineMetric.REQUESTS_RUNNING: running, EngineMetric.REQUESTS_WAITING: 0,
              EngineMetric.DECODE_TPS: decode, EngineMetric.PREFILL_TPS: prefill,
              EngineMetric.KV_CACHE_USAGE: kv, EngineMetric.GPU_MEMORY: held * GIB}
    return [ENGINE.reading(engine, at, [Sample(metric, at, value)
                                        for metric, value in values.items()])]


def _events_and_restarts(node: Node, gemma: Engine, nemotron: Engine, now: datetime) -> None:
    def event(engine: Engine, minutes_ago: float, kind: str, message: str,
              severity: str = "info") -> None:
        Event.objects.create(node=node, engine=engine, at=now - timedelta(minutes=minutes_ago),
                             kind=kind, severity=severity, message=message)

    # Gemma fell over and came back by itself: an unplanned restart, found from its events.
    event(gemma, 45, "engine-exited", "Engine gemma-4-26b stopped: container exited, exit code "
                                      "137.", "warning")
    event(gemma, 44, "engine-restarted", "Engine gemma-4-26b restarted; counters reset.",
          "warning")
    record_unplanned_restarts(node, now - timedelta(minutes=40))
    # The neighbour was restarted on purpose, with a bigger KV pool.
    Restart.objects.create(
        node=node, engine=nemotron, kind="planned", status="succeeded",
        requested_at=now - timedelta(minutes=40), scheduled_for=now - timedelta(minutes=35),
        started_at=now - timedelta(minutes=35), finished_at=now - timedelta(minutes=25),
        startup_seconds=492, reason="KV pool 8 → 24 GiB for longer documents",
        outcome="ready after 8 min 12 s",
    )
    event(nemotron, 34, "phase-change", "nemotron-120b: ready → stopped")
    event(nemotron, 25.2, "phase-change", "nemotron-120b: loading → ready")
    event(gemma, 12, "prefill-stall", "gemma-4-26b: decode stalled for 83 s while a long prompt "
                                      "prefilled", "warning")


# --- helpers -------------------------------------------------------------------------------------

def _login(page, base: str, username: str = "admin") -> None:
    page.goto(f"{base}/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r".*/nodes/.*|.*/$"))


@pytest.fixture
def screenshot(tmp_path) -> Callable[..., None]:
    """``screenshot(page, name, full_page=True, element=None)`` saves ``name`` (the page, or
    only the element a selector names) into the test's temporary directory, or into ``docs/``
    when SPARKOPS_UPDATE_SCREENSHOTS=1, so that an ordinary run never rewrites the committed
    images."""
    folder = DOCS if os.environ.get(UPDATE_SCREENSHOTS) == "1" else tmp_path
    folder.mkdir(exist_ok=True)

    def take(page, name: str, full_page: bool = True,
             element: tuple[str, str] | None = None) -> None:
        clip = None
        if element is not None:  # from the top of the first element to the end of the last
            clip = page.evaluate("""([first, last]) => {
                const a = document.querySelector(first).getBoundingClientRect();
                const b = document.querySelector(last).getBoundingClientRect();
                const pad = 12, top = Math.max(a.top + window.scrollY - pad, 0);
                return {x: 0, y: top, width: document.documentElement.clientWidth,
                        height: b.bottom + window.scrollY + pad - top};
            }""", list(element))
        page.screenshot(path=str(folder / name), full_page=full_page or clip is not None,
                        clip=clip)
        assert (folder / name).stat().st_size > 0

    return take


def _x_ranges(page) -> list[list[float]]:
    """Every timeline panel's x range, as epoch milliseconds."""
    return page.evaluate("""() => {
        const layout = document.getElementById('timeline')._fullLayout;
        return Object.keys(layout).filter(k => /^xaxis\\d*$/.test(k)).sort()
            .map(k => layout[k].range.map(v => Math.round(layout[k].r2l(v))));
    }""")


def _wait_for_timeline(page) -> None:
    page.wait_for_function("document.getElementById('timeline')?.data?.length > 20",
                           timeout=15_000)


# --- the tests -----------------------------------------------------------------------------------

def test_overview_tells_the_story_on_one_timeline_and_zoom_moves_every_panel(
        live_server, page, django_user_model, settings, screenshot):
    settings.SPARKOPS_NODE_NAME = "spark-a"
    settings.SPARKOPS_COLLECT_INTERVAL = float(STEP)
    node = Node.objects.create(name="spark-a", mem_total_bytes=int(121.69 * GIB))
    now = timezone.now()
    seed_world(node, now, squeeze_alert=True)
    django_user_model.objects.create_superuser("admin", "", PASSWORD)

    # Anonymous visitors are sent to the login page, for pages and data alike.
    for path in ["/nodes/spark-a/", "/nodes/spark-a/engines/gemma-4-26b/",
                 "/api/nodes/spark-a/timeline.json?range=1h"]:
        page.goto(f"{live_server.url}{path}")
        assert "/login/?next=" in page.url
        assert page.locator("input[name=password]").count() == 1

    page.set_viewport_size(WIDE)
    session = page.context.new_cdp_session(page)
    session.send("Emulation.setTimezoneOverride", {"timezoneId": "Asia/Seoul"})
    _login(page, live_server.url)
    page.wait_for_url("**/nodes/spark-a/")
    _wait_for_timeline(page)

    # The ledger and the firing squeeze are on the page, with humanised units.
    assert page.locator("#ledger .ledger-bar .seg").count() >= 6
    ledger_row = page.locator('#ledger tr[data-engine="nemotron-120b"]').inner_text()
    assert "24.0 GiB" in ledger_row and "62.9 GiB" in ledger_row
    strip = page.locator("#firing-alerts").inner_text()
    assert "1 firing alert" in strip and "prefill-squeeze" in strip
    assert "nemotron-120b's KV pool went 8.00 → 24.00 GiB" in strip
    # Times are relative, with the exact time in the viewer's zone as a tooltip.
    collected = page.locator("#collected-at time")
    assert re.fullmatch(r"just now|\d+ min ago", collected.inner_text())
    seoul = now.astimezone(ZoneInfo("Asia/Seoul"))
    assert f"{seoul:%Y-%m-%d %H:%M}" in collected.get_attribute("title")
    assert collected.get_attribute("title").endswith(" KST")

    # Every panel has its data: markers, headroom, ledger steps, KV usage, prefill and decode.
    traces = page.evaluate("document.getElementById('timeline').data.map(t => t.meta)")
    for key in ["mem_available", "mem_available_min", "nemotron-120b:kv_pool",
                "gemma-4-26b:holds", "gemma-4-26b:kv_usage", "gemma-4-26b:prefill_tps",
                "nemotron-120b:decode_tps", "marker:restart-planned", "marker:restart-unplanned",
                "marker:alert-fired", "marker:prefill-stall", "marker:phase-change"]:
        assert key in traces, key
    pool = page.evaluate("""document.getElementById('timeline').data
        .find(t => t.meta === 'nemotron-120b:kv_pool').y""")
    assert pool[0] == 8.0 and pool[-1] == 24.0
    ranges = _x_ranges(page)
    assert len(ranges) == 6 and all(r == ranges[0] for r in ranges)
    screenshot(page, "overview.png")

    # A mixed node: every kind's card with the same figures, what a kind cannot report said as
    # "unknown — why", never a 0.
    cards = {name: page.locator(f'#engine-cards article[data-engine="{name}"]')
             for name in ("gemma-4-26b", "nemotron-120b", "qwen3-1.7b", "ollama")}
    assert all(card.count() == 1 for card in cards.values())
    assert cards["qwen3-1.7b"].locator('[data-field="kind"]').inner_text() == \
        "llama.cpp server b7420-0c1e5709"
    assert cards["qwen3-1.7b"].locator('[data-field="kv"]').inner_text() == "0.44 GiB (pinned)"
    assert cards["qwen3-1.7b"].locator('[data-field="decode"]').inner_text() == "118 tok/s"
    assert cards["qwen3-1.7b"].locator('[data-field="ttft"]').inner_text() == \
        "unknown — llama-server's /metrics has no latency histograms"
    ollama = cards["ollama"]
    assert ollama.locator('[data-field="kind"]').inner_text() == "Ollama 0.33.0"
    assert ollama.locator('[data-field="decode"]').inner_text().startswith(
        "unknown — Ollama has no /metrics")
    assert ollama.locator('[data-field="slots"]').inner_text() == \
        "unknown — Ollama reports no running or waiting requests"
    assert ollama.locator('[data-field="models"]').inner_text() == \
        "1 loaded: qwen3:1.7b (unloads in 28 min if idle)"
    assert ollama.locator('[data-field="reported"]').inner_text().startswith("1.60 GiB")
    for card in cards.values():  # the same figures on every card
        assert card.locator("dt").all_inner_texts()[:7] == [
            "KV reserved", "KV tokens", "KV usage", "Running / waiting", "Prefill", "Decode",
            "TTFT p95"]
    screenshot(page, "mixed-node.png", element=("h2:has(+ #engine-cards)", "#engine-cards"))

    # Dragging across the decode panel zooms it, and every other panel follows.
    page.locator("#timeline").scroll_into_view_if_needed()
    box = page.evaluate("""() => {
        const l = document.getElementById('timeline')._fullLayout;
        const r = document.getElementById('timeline').getBoundingClientRect();
        return {left: r.left + l.xaxis6._offset, width: l.xaxis6._length,
                top: r.top + l.yaxis6._offset, height: l.yaxis6._length};
    }""")
    page.mouse.move(box["left"] + box["width"] * 0.5, box["top"] + box["height"] / 2)
    page.mouse.down()
    page.mouse.move(box["left"] + box["width"] * 0.7, box["top"] + box["height"] / 2, steps=8)
    page.mouse.up()
    page.wait_for_function("""(() => { const a = document.getElementById('timeline')
        ._fullLayout.xaxis; return a.r2l(a.range[1]) - a.r2l(a.range[0]) < 30 * 60e3; })()""")
    zoomed = _x_ranges(page)
    assert all(r == zoomed[0] for r in zoomed)  # one axis: all panels show the same span
    span = (zoomed[0][1] - zoomed[0][0]) / 60_000
    assert 8 < span < 16  # about a fifth of the hour

    # So does a zoom made in code on another panel, and a range button resets them all.
    page.evaluate("""Plotly.relayout('timeline', {'xaxis3.range': [
        new Date(Date.now() - 30 * 60000).toISOString(),
        new Date(Date.now() - 20 * 60000).toISOString()]})""")
    relaid = _x_ranges(page)
    assert all(r == relaid[0] for r in relaid) and relaid != zoomed
    with page.expect_response(lambda r: "timeline.json?range=6h" in r.url) as answer:
        page.click('.ranges button[data-range="6h"]')
    # The node has collected for about an hour: a 6 h range shows what it has data for, from
    # its first collection, not five empty hours before it.
    answered = answer.value.json()
    page.wait_for_function("""(() => { const r = document.getElementById('timeline')
        ._fullLayout.xaxis4.range; return new Date(r[1]) - new Date(r[0]) > 40 * 60e3; })()""")
    six = _x_ranges(page)
    assert all(r == six[0] for r in six)
    # (The axis is in the viewer's zone, so compare spans rather than instants.)
    has_data_for = page.evaluate("([s, e]) => new Date(e) - new Date(s)",
                                 [answered["shown_start"], answered["end"]])
    assert abs((six[0][1] - six[0][0]) - has_data_for) < 60e3, (six[0], answered["shown_start"])

    # On a phone the page stacks and nothing runs off the side.
    page.set_viewport_size(PHONE)
    page.goto(f"{live_server.url}/nodes/spark-a/")
    _wait_for_timeline(page)
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
    page.evaluate("document.getElementById('firing-alerts').scrollIntoView()")
    screenshot(page, "overview-phone.png", full_page=False)


def test_engine_page_shows_its_roofline_charts_and_restart_history(
        live_server, page, django_user_model, settings, screenshot):
    settings.SPARKOPS_NODE_NAME = "spark-a"
    settings.SPARKOPS_COLLECT_INTERVAL = float(STEP)
    node = Node.objects.create(name="spark-a", mem_total_bytes=int(121.69 * GIB))
    seed_world(node, timezone.now(), squeeze_alert=False)
    django_user_model.objects.create_superuser("admin", "", PASSWORD)
    page.set_viewport_size(WIDE)
    _login(page, live_server.url)

    page.goto(f"{live_server.url}/nodes/spark-a/engines/nemotron-120b/")

    assert page.locator('[data-field="ceiling"]').inner_text() == "40.4 tok/s"
    measured = float(page.locator('[data-field="measured"]').inner_text().split()[0])
    assert 22.7 <= measured <= 23.7  # the seed's single-stream decode
    assert page.locator('[data-field="ratio"]').inner_text().startswith("0.57")
    assert "A12B" in page.locator('[data-field="active-params"]').inner_text()
    assert "NVFP4" in page.locator('[data-field="bytes-per-param"]').inner_text()
    history = page.locator("table.restart-history").inner_text().lower()
    assert "planned" in history and "succeeded" in history and "8 min 12 s" in history
    page.wait_for_function("document.getElementById('engine-charts')?.data?.length >= 9")
    screenshot(page, "engine.png")

    page.goto(f"{live_server.url}/nodes/spark-a/engines/gemma-4-26b/")
    history = page.locator("table.restart-history").inner_text().lower()
    assert "unplanned" in history and "detected" in history

    # An Ollama server's page: what it holds and until when, and why the rest is unknown.
    page.goto(f"{live_server.url}/nodes/spark-a/engines/ollama/")
    body = page.locator("main").inner_text()
    assert "1 loaded: qwen3:1.7b (unloads in 28 min if idle)" in body
    assert "unknown — Ollama has no /metrics" in body
    assert "Ollama API answers" in page.locator('[data-field="health"]').inner_text()
    # A llama-server's page: the same figures, its own words for what it cannot report.
    page.goto(f"{live_server.url}/nodes/spark-a/engines/qwen3-1.7b/")
    assert "llama-server API answers" in page.locator('[data-field="health"]').inner_text()
    page.wait_for_function("document.getElementById('engine-charts')?.data?.length >= 5")
    screenshot(page, "engine-llamacpp.png")


def test_a_squeeze_alert_appears_on_the_open_overview_and_the_alerts_page(
        live_server, page, django_user_model, settings, screenshot):
    settings.SPARKOPS_NODE_NAME = "spark-a"
    settings.SPARKOPS_COLLECT_INTERVAL = 2.0  # the page refreshes its cards every 2 s
    node = Node.objects.create(name="spark-a", mem_total_bytes=int(121.69 * GIB))
    seed_world(node, timezone.now(), squeeze_alert=False)
    django_user_model.objects.create_superuser("admin", "", PASSWORD)
    page.set_viewport_size(WIDE)
    _login(page, live_server.url)
    page.wait_for_url("**/nodes/spark-a/")
    assert "No firing alerts" in page.locator("#firing-alerts").inner_text()

    run_alerts(node, timezone.now())  # the squeezed ledger makes prefill-squeeze fire

    page.wait_for_function("document.getElementById('firing-alerts').textContent"
                           ".includes('prefill-squeeze')", timeout=10_000)
    strip = page.locator("#firing-alerts").inner_text()
    assert "gemma-4-26b may not fit its next prefill" in strip and "CRITICAL" in strip
    page.goto(f"{live_server.url}/alerts/")
    listed = page.locator("body").inner_text()
    assert "prefill-squeeze" in listed and "nemotron-120b's KV pool went 8.00 → 24.00" in listed
    screenshot(page, "alerts.png")


def test_an_operator_plans_a_restart_through_the_form(live_server, page, django_user_model,
                                                      settings, monkeypatch, screenshot):
    settings.SPARKOPS_NODE_NAME = "spark-a"
    settings.SPARKOPS_COLLECT_INTERVAL = float(STEP)
    # The runbook is not under test here: keep the plan scheduled instead of queueing a run.
    monkeypatch.setattr(planning, "_dispatch_due_restarts", lambda: None)
    node = Node.objects.create(name="spark-a", mem_total_bytes=int(121.69 * GIB))
    engines = seed_world(node, timezone.now(), squeeze_alert=False)
    operator = django_user_model.objects.create_user("operator", password=PASSWORD)
    operator.user_permissions.add(Permission.objects.get(codename="run_restarts"))
    page.set_viewport_size(WIDE)
    _login(page, live_server.url, "operator")

    page.goto(f"{live_server.url}/restarts/plan/spark-a/")
    page.select_option("select[name=engine]", str(engines["gemma"].pk))
    page.select_option("select[name=when]", "now")
    page.fill("textarea[name=reason]", "new chat template")
    page.click("button:has-text('Plan restart')")
    page.wait_for_url(re.compile(r".*/restarts/\d+/$"))

    planned = Restart.objects.get(kind="planned", status="scheduled")
    assert planned.engine == engines["gemma"] and planned.reason == "new chat template"
    assert planned.requested_by == operator
    body = page.locator("body").inner_text()
    assert "planned for" in body and "expected back by" in body
    page.goto(f"{live_server.url}/restarts/?node=spark-a")
    assert "back by" in page.locator("body").inner_text()
    screenshot(page, "restarts.png")
