"""Engine kinds, their pure parts: discovery words and labels, llama.cpp's and Ollama's launch
settings, startup logs and endpoint formats (fixtures in tests/fixtures/llamacpp and
tests/fixtures/ollama, with their sources), the card's "unknown — why", and ``manage.py
inspect`` on each kind's files."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from collectors.docker_api import engine_kind, is_vllm_engine
from collectors.enginecard import engine_card
from collectors.kinds.base import LaunchError
from collectors.kinds.llamacpp import (
    LlamaCppLogParser,
    _props,
    _slots,
    _snapshot,
    kv_usage,
    parse_metrics,
    router_models,
)
from collectors.kinds.ollama import host_and_port, loaded_models, models_state
from collectors.kinds.registry import READERS
from collectors.models import Engine
from collectors.vllm.scrape import ScrapeError

FIXTURES = Path(__file__).parent / "fixtures"
LLAMA = FIXTURES / "llamacpp"
OLLAMA = FIXTURES / "ollama"
MIB = 1024**2


def _attrs(path="python3", args=(), image="", labels=None):
    return {"Path": path, "Args": list(args), "Config": {"Image": image, "Labels": labels or {}}}


@pytest.mark.parametrize(("attrs", "kind"), [
    (_attrs("/app/llama-server", ["-m", "/models/q.gguf"]), "llamacpp"),
    (_attrs("sh", image="ghcr.io/ggml-org/llama.cpp:server-cuda"), "llamacpp"),
    (_attrs("sh", ["-c", "exec /opt/llama-server -m /m.gguf --port 9000"]), "llamacpp"),
    (_attrs("/bin/ollama", ["serve"], image="ollama/ollama:0.33.0"), "ollama"),
    (_attrs("sleep", ["300"], labels={"sparkops.engine": "llama.cpp"}), "llamacpp"),
    (_attrs("sleep", ["300"], labels={"sparkops.engine": "Ollama"}), "ollama"),
    (_attrs("vllm", ["serve", "m"]), "vllm"),
    # The command decides before the image: a vLLM command in an image named after llama.cpp.
    (_attrs("vllm", ["serve", "m"], image="acme/llama.cpp-tools"), "vllm"),
    (_attrs("/app/llama-server", labels={"sparkops.engine": "none"}), None),
    (_attrs("sleep", labels={"sparkops.engine": "tgi"}), None),  # a kind SparkOps cannot read
    (_attrs("node", ["server.js"], image="llamacppish/app"), None),
    (_attrs("postgres"), None),
])
def test_discovery_recognises_each_kind(attrs, kind):
    assert engine_kind(attrs) == kind
    assert is_vllm_engine(attrs) is (kind == "vllm")


# --- llama.cpp: launch ---------------------------------------------------------------------------


def test_llamacpp_flags_short_long_and_from_the_environment():
    launch = READERS["llamacpp"].parse_launch(
        ["/app/llama-server", "-m", "/models/q.gguf", "-c", "65536", "-np", "4", "-ub=1024",
         "--metrics", "-ctk", "q8_0", "--api-key", "sk-1", "--rope-scale", "2"],
        {"LLAMA_ARG_N_GPU_LAYERS": "all", "LLAMA_ARG_PORT": "9000", "LLAMA_ARG_CTX_SIZE": "4096"})
    config = launch.config
    assert (launch.model, launch.port) == ("/models/q.gguf", 9000)
    assert config["ctx_size"] == 65536  # the command line wins over LLAMA_ARG_CTX_SIZE
    assert (config["max_num_seqs"], config["max_num_batched_tokens"]) == (4, 1024)
    assert config["n_gpu_layers"] == "all" and config["cache_type_k"] == "q8_0"
    assert config["metrics_endpoint"] is True and config["slots_endpoint"] is True
    assert config["all_flags"]["ctx-size"] == "65536"  # long names, as the page shows them
    assert config["unknown_flags"] == {"rope-scale": "2"}


def test_llamacpp_defaults_are_llamacpps_own():
    config = READERS["llamacpp"].parse_launch(["llama-server", "-hf", "org/model-GGUF"], {}).config
    assert config["port"] == 8080 and config["model"] == "org/model-GGUF"
    assert config["max_num_batched_tokens"] == 512 and config["ubatch_default"] is True
    assert config["max_num_seqs"] is None  # -np auto: the server decides (4 slots), /props says
    codes = {f["code"] for f in READERS["llamacpp"].findings(
        READERS["llamacpp"].parse_launch(["llama-server", "-m", "m", "-ngl", "0"], {}), None, [])}
    assert codes == {"metrics-disabled", "cpu-only"}


def test_llamacpp_flags_inside_a_shell_and_refusals():
    launch = READERS["llamacpp"].parse_launch(
        ["sh", "-c", "exec /opt/llama-server -m /m.gguf --port 9100 --no-slots"], {})
    assert launch.port == 9100 and launch.config["slots_endpoint"] is False
    with pytest.raises(LaunchError, match="--ctx-size expects a whole number"):
        READERS["llamacpp"].parse_launch(["llama-server", "-m", "m", "-c", "lots"], {})
    with pytest.raises(LaunchError, match="no llama-server invocation"):
        READERS["llamacpp"].parse_launch(["python3", "app.py"], {})


# --- llama.cpp: log ------------------------------------------------------------------------------


def _log(name: str):
    parser = LlamaCppLogParser()
    parser.feed((LLAMA / name).read_text())
    return parser.result()


def test_llamacpp_gb10_startup_log():
    startup = _log("startup_gb10.log")
    assert startup.phase == "ready" and startup.startup_count == 1
    assert startup.weights_gib == pytest.approx((17056.58 + 166.92) / 1024)
    assert startup.kv_cache_gib == pytest.approx(6.0) and startup.kv_cache_tokens == 65536
    assert startup.kv_sized_by == "-c: 65,536 cells reserved at start"
    assert startup.compute_buffer_gib == pytest.approx((300.75 + 136.01) / 1024)
    assert startup.layers_offloaded == "49/49" and startup.startup_seconds == pytest.approx(8.436)
    assert startup.listening_on == "http://0.0.0.0:8080" and startup.cuda_graph_gib is None


def test_llamacpp_2025_log_reads_kv_self_size_once():
    startup = _log("startup_2025.log")
    assert startup.phase == "ready"
    # "KV buffer size" and "KV self size" say the same 15,872 MiB: counted once.
    assert startup.kv_cache_gib == pytest.approx(15872 / 1024)
    assert startup.weights_gib == pytest.approx((15694.06 + 1102.50) / 1024)
    assert startup.listening_on == "http://0.0.0.0:8080"


def test_llamacpp_failed_load_and_a_restart_in_the_same_log():
    failed = _log("startup_oom.log")
    assert failed.phase == "failed" and failed.weights_gib is None
    assert [e.kind for e in failed.errors][:2] == ["out-of-memory", "out-of-memory"]
    findings = READERS["llamacpp"].findings(None, failed, [])
    assert findings and all(f["code"] == "startup-error" for f in findings)
    parser = LlamaCppLogParser()
    parser.feed((LLAMA / "startup_oom.log").read_text())
    parser.feed((LLAMA / "startup_gb10.log").read_text())
    again = parser.result()
    assert (again.phase, again.startup_count, again.errors) == ("ready", 2, [])


# --- llama.cpp: endpoints ------------------------------------------------------------------------


def test_llamacpp_metrics_with_six_significant_digits():
    metrics = parse_metrics((LLAMA / "metrics.txt").read_text(), "1796148117")
    assert metrics.counters["prompt_tokens_total"] == 1_234_570
    assert metrics.counters["generation_tokens_total"] == 88210
    assert metrics.gauges == {"requests_running": 3, "requests_waiting": 1}
    assert metrics.process_start == 1796148117.0


@pytest.mark.parametrize(("text", "reason"), [
    ("", "not a llama.cpp /metrics endpoint: the body is empty"),
    ("llamacpp:prompt_tokens_total 5", "not Prometheus text: the last line does not end"),
    ("<html>oops</html>\n", "not Prometheus text"),
    ("vllm:num_requests_running 1\n", "not a llama.cpp /metrics endpoint"),
    ("llamacpp:prompt_tokens_total -5\nllamacpp:tokens_predicted_total 1\n",
     "invalid llama.cpp metrics: llamacpp:prompt_tokens_total is -5.0"),
])
def test_llamacpp_metrics_refused_whole(text, reason):
    with pytest.raises(ScrapeError) as raised:
        parse_metrics(text)
    assert reason in str(raised.value) and raised.value.kind == "parse"


def test_llamacpp_props_and_slots_keep_numbers_never_prompts():
    props = _props(json.loads((LLAMA / "props.json").read_text()))
    slots = _slots(json.loads((LLAMA / "slots.json").read_text()))
    assert (props["total_slots"], props["n_ctx_per_slot"]) == (4, 16384)
    assert "Summarise" not in json.dumps(slots)
    # Busy slots hold 6,120 + 152 and 1,830 + 40 tokens of the 4 × 16,384.
    assert kv_usage(slots) == pytest.approx((6120 + 152 + 1830 + 40) / 65536)
    snapshot = _snapshot(props, parse_metrics((LLAMA / "metrics.txt").read_text()), slots)
    assert snapshot.model_name == "qwen3-30b"
    assert snapshot.prefix_cache_queries_total == 1_234_570 + 402_113
    with pytest.raises(ScrapeError, match="not a llama-server /props"):
        _props({"status": "ok"})
    with pytest.raises(ScrapeError, match="invalid slot"):
        _slots([{"id": 0, "n_ctx": "big", "is_processing": False}])


def test_llamacpp_router_models_and_log():
    models = router_models(json.loads((LLAMA / "router_models.json").read_text()))
    assert [(m["name"], m["status"], m["failed"]) for m in models] == [
        ("qwen3-30b", "loaded", False), ("gemma-3-27b", "sleeping", False),
        ("llama-3.3-70b", "unloaded", True)]
    assert models[2]["exit_code"] == 1
    with pytest.raises(ScrapeError, match="needs an id and a known status.value"):
        router_models({"data": [{"id": "x", "status": {"value": "dreaming"}}]})
    parser = LlamaCppLogParser()
    parser.feed("0.00.001 I srv  llama_server: starting server in router mode. models will be "
                "automatically loaded on-demand\n"
                "0.00.002.000 I srv  llama_server: listening on http://0.0.0.0:8080\n"
                "[50123] 0.02.000.000 I load_tensors:  CUDA0 model buffer size =  9000.00 MiB\n")
    startup = parser.result()
    # Ready once it listens; a child's weights are the child's, not the router's startup.
    assert (startup.phase, startup.weights_gib) == ("ready", None)
    assert READERS["llamacpp"].parse_launch(
        ["llama-server", "--models-dir", "/models"], {}).config["router"] is True


# --- Ollama ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [
    (None, ("127.0.0.1", 11434)), ("0.0.0.0", ("0.0.0.0", 11434)),
    ("0.0.0.0:11500", ("0.0.0.0", 11500)), ("http://ollama.lan", ("ollama.lan", 80)),
    ("https://ollama.lan:8443/x", ("ollama.lan", 8443)), ("[::1]:11435", ("::1", 11435)),
])
def test_ollama_host_as_ollama_reads_it(value, expected):
    assert host_and_port(value) == expected


def test_ollama_launch_needs_serve_and_reads_its_environment():
    launch = READERS["ollama"].parse_launch(["/bin/ollama", "serve"], {
        "OLLAMA_HOST": "127.0.0.1:11600", "OLLAMA_KEEP_ALIVE": "0", "OLLAMA_NUM_PARALLEL": "2"})
    assert launch.port == 11600 and launch.config["max_num_seqs"] == 2
    assert launch.config["max_num_batched_tokens"] == 512
    assert {f["code"] for f in READERS["ollama"].findings(launch, None, [])} == {"keep-alive-zero"}
    with pytest.raises(LaunchError, match="ollama serve"):
        READERS["ollama"].parse_launch(["/bin/ollama", "run", "qwen3"], {})


def test_ollama_ps_sizes_and_expiry():
    models = loaded_models(json.loads((OLLAMA / "ps.json").read_text()))
    assert [m["name"] for m in models] == ["gpt-oss:120b", "qwen3:8b"]
    assert models[0]["size_bytes"] == 64 * 1024**3 and models[1]["context_length"] == 8192
    assert models[1]["expires_at"] == "2026-12-01T00:14:05.123456+00:00"
    now = datetime(2026, 12, 1, 0, 10, 5, tzinfo=UTC)
    assert models_state(models, now) == ("2 loaded: gpt-oss:120b (kept loaded), qwen3:8b "
                                         "(unloads in 4 min if idle)")
    assert models_state(models, now + timedelta(hours=1)).endswith("qwen3:8b (unloading)")
    assert models_state([], now) == "no model loaded"
    with pytest.raises(ScrapeError, match="invalid sizes"):
        loaded_models({"models": [{"name": "x", "size": 10, "size_vram": 20}]})
    with pytest.raises(ScrapeError, match="no models list"):
        loaded_models({"error": "nope"})


def test_ollama_log():
    parser = READERS["ollama"].new_log_parser()
    parser.feed((OLLAMA / "serve.log").read_text())
    startup = parser.result()
    assert (startup.phase, startup.version) == ("ready", "0.33.0")
    assert startup.listening_on == "[::]:11434"


# --- the card: unknown, with the reason -----------------------------------------------------------


@pytest.mark.django_db
def test_an_ollama_card_says_why_rates_and_kv_are_unknown(node):
    engine = Engine.objects.create(
        node=node, name="chat", kind="ollama", container_id="c" * 64, container_state="running",
        phase="ready", metrics={"snapshot": {"model_name": "qwen3:8b"}, "details": {
            "size_bytes": 8 * 1024**3, "size_vram_bytes": 8 * 1024**3,
            "state": "1 loaded: qwen3:8b (kept loaded)", "version": "0.33.0"}},
        rates={"prefill_tokens_per_s": None})
    card = engine_card(engine)
    assert card["kind_title"] == "Ollama" and card["version"] == "0.33.0"
    assert card["prefill_text"].startswith("unknown — Ollama has no /metrics")
    assert card["kv_text"].startswith("unknown — Ollama's /api/ps gives")
    assert card["reported_text"] == "8.00 GiB" and card["models_text"].startswith("1 loaded")
    vllm = Engine.objects.create(node=node, name="v", container_id="d" * 64,
                                 container_state="running")
    assert engine_card(vllm)["prefill_text"] == "unknown"  # vLLM reports it: not read yet


# --- manage.py inspect ----------------------------------------------------------------------------


def _inspect(*args: str) -> str:
    out = io.StringIO()
    call_command("inspect", *args, stdout=out)
    return out.getvalue()


def test_inspect_detects_each_kinds_log_flags_and_dumps():
    log = json.loads(_inspect("log", str(LLAMA / "startup_gb10.log"), "--json"))
    assert log["kind"] == "llamacpp" and log["kv_cache_tokens"] == 65536
    assert "llama.cpp server" in _inspect("log", str(LLAMA / "startup_gb10.log"))
    assert json.loads(_inspect("log", str(OLLAMA / "serve.log"), "--json"))["kind"] == "ollama"
    flags = json.loads(_inspect("flags", "llama-server -m /m.gguf -c 8192 -np 2", "--json"))
    assert (flags["kind"], flags["ctx_size"], flags["max_num_seqs"]) == ("llamacpp", 8192, 2)
    assert "metrics-disabled" in _inspect("flags", "llama-server -m /m.gguf")
    metrics = json.loads(_inspect("metrics", str(LLAMA / "metrics.txt"), "--json"))
    assert metrics["counters"]["generation_tokens_total"] == 88210
    ps = _inspect("metrics", str(OLLAMA / "ps.json"))
    assert "model gpt-oss:120b" in ps and "rates:" in ps and "unknown — Ollama has no" in ps
    with pytest.raises(CommandError, match="no Ollama startup line"):
        _inspect("log", str(LLAMA / "metrics.txt"), "--engine", "ollama")
