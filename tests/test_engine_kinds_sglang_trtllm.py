"""SGLang and TensorRT-LLM (``trtllm-serve``) as engine kinds, their pure parts: discovery,
launch settings and findings, startup logs, and every endpoint format, against fixtures rendered
from each engine's own definitions (tests/fixtures/sglang, tests/fixtures/trtllm, with their
sources); the card's "unknown — why"; ``manage.py inspect`` on each kind's files."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from django.core.management import call_command

from collectors.docker_api import engine_kind
from collectors.enginecard import engine_card
from collectors.kinds import sglang, trtllm
from collectors.kinds.base import LaunchError
from collectors.kinds.registry import READERS
from collectors.models import Engine
from collectors.vllm.scrape import ScrapeError

FIXTURES = Path(__file__).parent / "fixtures"
SGLANG, TRTLLM = FIXTURES / "sglang", FIXTURES / "trtllm"
GIB = 1024**3


def _attrs(path="python3", args=(), image="", labels=None):
    return {"Path": path, "Args": list(args), "Config": {"Image": image, "Labels": labels or {}}}


@pytest.mark.parametrize(("attrs", "kind"), [
    (_attrs("python3", ["-m", "sglang.launch_server", "--model-path", "m"]), "sglang"),
    (_attrs("sh", image="lmsysorg/sglang:v0.5.23-cu129"), "sglang"),
    (_attrs("/usr/local/bin/trtllm-serve", ["m", "--port", "8001"]), "trtllm"),
    (_attrs("sh", image="nvcr.io/nvidia/tensorrt-llm/release:1.2.1"), "trtllm"),
    (_attrs("sleep", labels={"sparkops.engine": "tensorrt-llm"}), "trtllm"),
    # A vLLM flag naming a TensorRT-LLM kernel is not TensorRT-LLM.
    (_attrs("vllm", ["serve", "m", "--moe-backend", "flashinfer_trtllm"]), "vllm"),
])
def test_discovery_recognises_sglang_and_trtllm(attrs, kind):
    assert engine_kind(attrs) == kind


# --- SGLang ---------------------------------------------------------------------------------------


def test_sglang_launch_settings_and_findings():
    launch = READERS["sglang"].parse_launch(
        ["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-30B-A3B-FP8",
         "--port=30001", "--mem_fraction_static", "0.45", "--max-running-requests", "32",
         "--api-key", "sk-1", "--enable-torch-compile"], {})
    config = launch.config
    assert (launch.model, launch.port) == ("Qwen/Qwen3-30B-A3B-FP8", 30001)
    assert config["mem_fraction_static"] == 0.45 and config["max_num_seqs"] == 32
    # No --chunked-prefill-size: SGLang's choice for a device of a GB10's size.
    assert config["max_num_batched_tokens"] == 8192 and config["chunked_prefill_default"]
    assert config["unknown_flags"] == {"enable-torch-compile": True}
    codes = {f["code"] for f in READERS["sglang"].findings(launch, None, [])}
    assert codes == {"metrics-disabled"}
    bare = READERS["sglang"].parse_launch(["sglang", "serve", "--model-path", "m",
                                           "--enable-metrics", "--chunked-prefill-size", "4096"],
                                          {})
    assert bare.port == 30000 and bare.config["max_num_batched_tokens"] == 4096
    assert {f["code"] for f in READERS["sglang"].findings(bare, None, [])} == \
        {"mem-fraction-unset"}
    with pytest.raises(LaunchError, match="between 0 and 1"):
        READERS["sglang"].parse_launch(["sglang", "serve", "--mem-fraction-static", "45"], {})
    with pytest.raises(LaunchError, match="no SGLang server launch"):
        READERS["sglang"].parse_launch(["python3", "app.py"], {})


def _sglang_log(*names: str):
    parser = sglang.SglangLogParser()
    for name in names:
        parser.feed((SGLANG / name).read_text())
    return parser.result()


def test_sglang_startup_log():
    startup = _sglang_log("startup_gb10.log")
    assert startup.phase == "ready" and startup.startup_count == 1
    assert (startup.weights_gib, startup.weights_load_seconds) == (16.92, 148.92)
    assert startup.kv_cache_gib == pytest.approx(16.46) and startup.kv_cache_tokens == 367404
    assert startup.kv_cache_pinned is False and startup.cuda_graph_gib == 0.58
    # 367,404 tokens hold 8.97 requests of the 40,960-token context.
    assert (startup.max_concurrency, startup.concurrency_for_tokens) == (8.97, 40960)
    assert startup.startup_seconds == 206.0 and startup.listening_on == "http://0.0.0.0:30000"


def test_sglang_failed_start_and_a_restart_in_the_same_log():
    failed = _sglang_log("startup_oom.log")
    assert failed.phase == "failed" and failed.kv_cache_gib is None
    assert [e.kind for e in failed.errors] == ["scheduler-exception", "kv-pool-too-small"]
    assert {f["code"] for f in READERS["sglang"].findings(None, failed, [])} == {"startup-error"}
    again = _sglang_log("startup_oom.log", "startup_gb10.log")
    assert (again.phase, again.startup_count, again.errors) == ("ready", 2, [])


def test_sglang_metrics_read_rank_zero_and_sum_the_streaming_split():
    snapshot, details = sglang.parse_metrics((SGLANG / "metrics.txt").read_text())
    # Two tensor-parallel ranks report the same 5 requests: counted once.
    assert (snapshot.requests_running, snapshot.requests_waiting) == (5, 2)
    assert snapshot.kv_cache_usage == 0.42 and snapshot.kv_cache_size_tokens == 367404
    assert snapshot.prompt_tokens_total == 901233 + 333104
    assert snapshot.generation_tokens_total == 70120 + 18090
    assert snapshot.prefix_cache_hits_total == 402113
    assert snapshot.kv_cache_memory_bytes == int(16.46 * GIB)
    assert snapshot.ttft.count == 8 and snapshot.inter_token_latency.count == 40
    assert snapshot.process_start_time_seconds is None and snapshot.created == {}
    assert details["gen_throughput_tps"] == 187.42 and details["kv_used_tokens"] == 154310


def test_sglang_server_info():
    info = sglang.server_info(json.loads((SGLANG / "server_info.json").read_text()))
    assert (info["version"], info["mem_fraction_static"], info["max_running_requests"]) == \
        ("0.5.23", 0.45, 32)
    assert (info["weights_gib"], info["kv_cache_gib"], info["graphs_gib"]) == \
        (16.92, 16.46, 0.58)
    assert info["enable_metrics"] is True and info["max_total_num_tokens"] == 367404
    with pytest.raises(ScrapeError, match="not an SGLang /server_info"):
        sglang.server_info({"version": "0.33.0", "models": []})


# --- TensorRT-LLM ---------------------------------------------------------------------------------


def test_trtllm_launch_settings_and_findings():
    launch = READERS["trtllm"].parse_launch(
        ["trtllm-serve", "serve", "nvidia/Qwen3-30B-A3B-FP4", "--host", "0.0.0.0", "--port",
         "8001", "--max_batch_size", "64", "--free_gpu_memory_fraction", "0.2",
         "--config", "/etc/trtllm.yaml", "--tp_size", "1"], {})
    config = launch.config
    assert (launch.model, launch.port) == ("nvidia/Qwen3-30B-A3B-FP4", 8001)
    assert (config["max_num_seqs"], config["max_num_batched_tokens"]) == (64, 8192)
    assert config["kv_cache_free_gpu_memory_fraction"] == 0.2
    assert config["extra_llm_api_options"] == "/etc/trtllm.yaml"
    assert READERS["trtllm"].findings(launch, None, []) == []
    default = READERS["trtllm"].parse_launch(["trtllm-serve", "m"], {})
    assert (default.port, default.config["max_num_seqs"]) == (8000, 2048)
    findings = READERS["trtllm"].findings(default, None, [])
    assert [f["code"] for f in findings] == ["kv-fraction-of-free-memory", "metrics-disabled"]
    assert "0.9 (the default)" in findings[0]["message"]
    with pytest.raises(LaunchError, match="needs a MODEL"):
        READERS["trtllm"].parse_launch(["trtllm-serve", "--port", "8000"], {})


def test_trtllm_startup_log_and_uvicorn_lines_alone():
    parser = trtllm.TrtllmLogParser()
    parser.feed((TRTLLM / "startup_gb10.log").read_text())
    startup = parser.result()
    assert (startup.phase, startup.version, startup.startup_count) == ("ready", "1.2.1", 1)
    assert (startup.kv_cache_gib, startup.kv_cache_tokens) == (16.05, 263008)
    assert startup.weights_gib is None and startup.listening_on == "http://0.0.0.0:8000"
    other = trtllm.TrtllmLogParser()
    other.feed("INFO:     Application startup complete.\n")
    assert not other.result().recognised


def test_trtllm_prometheus_metrics():
    snapshot, details = trtllm.parse_prometheus((TRTLLM / "prometheus.txt").read_text())
    assert (snapshot.requests_running, snapshot.requests_waiting) == (12, 3)
    assert snapshot.kv_cache_usage == 0.6133 and snapshot.model_name is None  # "undefined"
    assert (snapshot.prompt_tokens_total, snapshot.generation_tokens_total) == (1843112, 120455)
    assert snapshot.kv_cache_size_tokens == 8219 * 32 and snapshot.ttft.count == 6
    assert details["kv_blocks"] == {"max": 8219, "free": 3178, "used": 5041,
                                    "tokens_per_block": 32}
    # The multiprocess collector's pid label is not configuration.
    assert details["kv_cache_config"]["free_gpu_memory_fraction"] == "0.2"
    assert "pid" not in details["kv_cache_config"]


def test_trtllm_iteration_stats():
    snapshot, details = trtllm.parse_iteration_stats(
        json.loads((TRTLLM / "iteration_stats.json").read_text()))
    assert (snapshot.requests_running, snapshot.requests_waiting) == (12, 3)
    assert snapshot.kv_cache_usage == pytest.approx(5041 / 8219)
    assert snapshot.prompt_tokens_total is None  # iteration stats keep no token counters
    assert details["iteration"] == 40212
    idle, idle_details = trtllm.parse_iteration_stats([])
    assert idle.requests_running is None and idle_details["idle"] is True
    with pytest.raises(ScrapeError, match="invalid iteration stats: numActiveRequests"):
        trtllm.parse_iteration_stats([{"iter": 1, "numActiveRequests": -1}])


# --- refused whole ----------------------------------------------------------------------------


@pytest.mark.parametrize(("parse", "text", "reason"), [
    (sglang.parse_metrics, "", "not Prometheus text: the body is empty"),
    (sglang.parse_metrics, "sglang:num_running_reqs 5", "the last line does not end"),
    (sglang.parse_metrics, "<html>oops</html>\n", "not Prometheus text"),
    (sglang.parse_metrics, "vllm:num_requests_running 1\n", "not an SGLang /metrics endpoint"),
    (sglang.parse_metrics, "sglang:num_running_reqs 1\nsglang:token_usage 4.2\n",
     "sglang:token_usage is 4.2, not a fraction"),
    (sglang.parse_metrics, "sglang:num_running_reqs -1\n", "sglang:num_running_reqs is -1.0"),
    (trtllm.parse_prometheus, "llamacpp:prompt_tokens_total 5\n",
     "not a TensorRT-LLM metrics endpoint"),
    (trtllm.parse_prometheus, 'trtllm_num_requests_running 1\n'
     'trtllm_time_to_first_token_seconds_bucket{le="1.0"} 3\n',
     "trtllm_time_to_first_token_seconds has no +Inf bucket"),
])
def test_metrics_are_refused_whole(parse, text, reason):
    with pytest.raises(ScrapeError) as raised:
        parse(text)
    assert reason in str(raised.value) and raised.value.kind == "parse"


# --- the card and inspect -------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_trtllm_card_without_prometheus_says_why(node):
    engine = Engine.objects.create(
        node=node, name="trt", kind="trtllm", container_id="c" * 64, container_state="running",
        phase="ready", metrics={"snapshot": {"requests_running": 2}, "unknown": {
            "rates": trtllm.NO_PROMETHEUS}, "details": {"version": "1.2.1", "state": "2 running"}},
        rates={})
    card = engine_card(engine)
    assert card["kind_title"] == "TensorRT-LLM" and card["version"] == "1.2.1"
    assert card["prefill_text"].startswith("unknown — trtllm-serve runs without "
                                           "return_perf_metrics")
    assert card["running"] == 2


def _inspect(*args: str) -> str:
    out = io.StringIO()
    call_command("inspect", *args, stdout=out)
    return out.getvalue()


def test_inspect_reads_each_file_of_both_kinds():
    log = json.loads(_inspect("log", str(SGLANG / "startup_gb10.log"), "--json"))
    assert (log["kind"], log["kv_cache_tokens"]) == ("sglang", 367404)
    log = json.loads(_inspect("log", str(TRTLLM / "startup_gb10.log"), "--json"))
    assert (log["kind"], log["kv_cache_gib"]) == ("trtllm", 16.05)
    metrics = json.loads(_inspect("metrics", str(SGLANG / "metrics.txt"), "--json"))
    assert metrics["kind"] == "sglang" and metrics["snapshot"]["requests_running"] == 5
    info = _inspect("metrics", str(SGLANG / "server_info.json"))
    assert "mem fraction static:  0.45" in info
    stats = json.loads(_inspect("metrics", str(TRTLLM / "iteration_stats.json"), "--json"))
    assert stats["kind"] == "trtllm" and stats["snapshot"]["requests_waiting"] == 3
    prometheus = _inspect("metrics", str(TRTLLM / "prometheus.txt"))
    assert "requests running:" in prometheus and "unknown — trtllm-serve does not log" in prometheus
    flags = json.loads(_inspect("flags", "trtllm-serve m --max_batch_size 16", "--json"))
    assert (flags["kind"], flags["max_num_seqs"]) == ("trtllm", 16)
