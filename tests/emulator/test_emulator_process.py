"""The emulator as SparkOps meets it: a separate process, its log, its HTTP port, its memory.

Every test here starts `python -m collectors.emulator` for real on 127.0.0.1; the whole module
runs in well under a minute.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from .harness import FAST_PHASES, MIB, Emulator, metric_value

pytestmark = pytest.mark.slow

MODEL = "org/test-model"
WEIGHTS = 48 * MIB
TS = r"\d\d-\d\d \d\d:\d\d:\d\d"
SRC = r"\[[\w.]+\.py:\d+\]"


def api(message: str) -> str:
    return rf"^\(APIServer pid=\d+\) INFO {TS} {SRC} {message}"


def core(process: str, message: str) -> str:
    return rf"^\({process} pid=\d+\) INFO {TS} {SRC} {message}"


NEW, OLD = "EngineCore", "EngineCore_DP0"
STARTUP_LINES = {
    # 0.33: pinned KV of 64 MiB -> 0.06 GiB; 64 MiB / 16 B per token = 4,194,304 tokens.
    "0.33": [
        api(r"vLLM API server version 0\.33\.0$"),
        api(r"non-default args: \{'model_tag': 'org/test-model', "
            r".*'kv_cache_memory_bytes': 67108864"),
        core(NEW, r"Initializing a V1 LLM engine \(v0\.33\.0\) with config: "
             r"model='org/test-model', .*max_seq_len=8192, "),
        core(NEW, r"Model loading took 0\.05 GiB memory and \d+\.\d{6} seconds$"),
        core(NEW, r"Initial free memory [\d.]+ GiB, reserved 0\.06 GiB memory for KV Cache "
             r"as specified by kv_cache_memory_bytes config and skipped memory profiling\. "),
        core(NEW, r"GPU KV cache size: 4,194,304 tokens, Maximum concurrency for 8,192 "
             r"tokens per request: 512\.00x$"),
        core(NEW, r"Graph capturing finished in \d+ secs, took 0\.00 GiB$"),
        core(NEW, r"init engine \(profile, create kv cache, warmup model\) took \d+\.\d\d s$"),
        api(r"Starting vLLM server on http://127\.0\.0\.1:\d+$"),
        r"^\(APIServer pid=\d+\) INFO:     Application startup complete\.$",
    ],
    # 0.10: unpinned pool clamped to the 80 MiB cap -> 0.08 GiB; 5,242,880 tokens; 2025 texts.
    "0.10": [
        api(r"vLLM API server version 0\.10\.1$"),
        api(r"non-default args: \{'model_tag': 'org/test-model', "),
        core(OLD, r"Initializing a V1 LLM engine \(v0\.10\.1\) with config: "),
        core(OLD, r"Model loading took 0\.0469 GiB and \d+\.\d{6} seconds$"),
        core(OLD, r"Available KV cache memory: 0\.08 GiB$"),
        core(OLD, r"GPU KV cache size: 5,242,880 tokens$"),
        core(OLD, r"Maximum concurrency for 8,192 tokens per request: 640\.00x$"),
        core(OLD, r"Graph capturing finished in \d+ secs, took 0\.00 GiB$"),
        core(OLD, r"init engine \(profile, create kv cache, warmup model\) took \d+\.\d\d "
             r"seconds$"),
        api(r"Starting vLLM API server 0 on http://127\.0\.0\.1:\d+$"),
        r"^\(APIServer pid=\d+\) INFO:     Application startup complete\.$",
    ],
}  # fmt: skip

STYLE_ARGS = {
    "0.33": ["--kv-cache-memory-bytes", "64M"],
    "0.10": ["--emulator-style", "0.10", "--emulator-kv-cap-bytes", "80M",
             "--gpu-memory-utilization", "0.5"],
}  # fmt: skip
KV_BYTES = {"0.33": 64 * MIB, "0.10": 80 * MIB}

# Load: 4 requests/s of 200 prompt + 20 generated tokens -> 800 and 80 tokens/s.
LOAD_RPS, LOAD_PROMPT, LOAD_GEN = 4, 200, 20


class Started:
    def __init__(self, style: str, emulator: Emulator, statuses: list[int]) -> None:
        self.style = style
        self.emulator = emulator
        self.statuses = statuses


@pytest.fixture(scope="module", params=["0.33", "0.10"])
def started(request: pytest.FixtureRequest) -> Iterator[Started]:
    """An emulator per style, watched from its first second, with the load generator on."""
    style = request.param
    emulator = Emulator(
        *FAST_PHASES,
        *STYLE_ARGS[style],
        "--emulator-weights-bytes", "48M",
        "--emulator-decode-tps", "200",
        "--emulator-load", f"{LOAD_RPS}:{LOAD_PROMPT}:{LOAD_GEN}",
        "--emulator-stats-interval", "1",
        "--trust-remote-code",
        "--tensor-parallel-size", "1",
    )  # fmt: skip
    try:
        statuses = emulator.health_statuses_until_ready()
        yield Started(style, emulator, statuses)
    finally:
        emulator.close()


def test_health_is_503_while_starting_then_200(started: Started) -> None:
    statuses = started.statuses
    assert statuses[0] == 503
    assert statuses[-1] == 200
    assert set(statuses[:-1]) == {503}


def test_startup_lines_appear_in_order_in_the_styles_format(started: Started) -> None:
    emulator = started.emulator
    emulator.wait_for_line(r"Application startup complete\.")
    lines = emulator.log_text().splitlines()
    positions = []
    for pattern in STARTUP_LINES[started.style]:
        found = [i for i, line in enumerate(lines) if re.search(pattern, line)]
        assert found, f"missing {pattern!r} in:\n" + "\n".join(lines)
        positions.append(found[0])
    assert positions == sorted(positions)
    # A pinned pool suppresses `Available KV cache memory` (vLLM's gpu_worker.py prints it only
    # for a profiled pool) and vice versa.
    text = "\n".join(lines)
    if started.style == "0.33":
        assert "Available KV cache memory" not in text
    else:
        assert "as specified by kv_cache_memory_bytes" not in text


def test_weights_and_kv_pool_are_really_resident(started: Started) -> None:
    expected = WEIGHTS + KV_BYTES[started.style]
    rss = started.emulator.rss_bytes()
    assert expected <= rss <= expected + 64 * MIB


def _families(emulator: Emulator) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(emulator.metrics_text())}


MODERN_ONLY = {
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries",
    "vllm:inter_token_latency_seconds",
    "vllm:request_time_per_output_token_seconds",
    "vllm:num_requests_waiting_by_reason",
}
LEGACY_ONLY = {
    "vllm:gpu_cache_usage_perc",
    "vllm:gpu_prefix_cache_queries",
    "vllm:time_per_output_token_seconds",
}
COMMON = {
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:num_preemptions",
    "vllm:request_success",
    "vllm:time_to_first_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:cache_config_info",
    "process_start_time_seconds",
}


def test_metrics_parse_and_use_the_styles_names_and_labels(started: Started) -> None:
    families = _families(started.emulator)
    names = set(families)
    present, absent = (
        (MODERN_ONLY, LEGACY_ONLY) if started.style == "0.33" else (LEGACY_ONLY, MODERN_ONLY)
    )
    assert COMMON | present <= names
    assert not absent & names
    running = families["vllm:num_requests_running"].samples[0]
    assert running.labels == {"model_name": MODEL, "engine": "0"}
    ttft_buckets = [s for s in families["vllm:time_to_first_token_seconds"].samples
                    if s.name.endswith("_bucket")]  # fmt: skip
    assert [s.labels["le"] for s in ttft_buckets][:3] == ["0.001", "0.005", "0.01"]
    assert ttft_buckets[-1].labels["le"] == "+Inf"

    info = families["vllm:cache_config_info"].samples[0].labels
    assert "model_name" not in info
    assert info["engine"] == "0"
    if started.style == "0.33":
        assert info["kv_cache_memory_bytes"] == str(64 * MIB)
        assert info["kv_cache_size_tokens"] == "4194304"
        assert info["num_gpu_blocks"] == str(4194304 // 16)
    else:
        assert info["kv_cache_memory_bytes"] == "None"
        assert info["num_gpu_blocks"] == str(5242880 // 16)
        assert "kv_cache_size_tokens" not in info


def test_models_and_version_endpoints(started: Started) -> None:
    models = started.emulator.get_json("/v1/models")
    assert models["object"] == "list"
    card = models["data"][0]
    assert (card["id"], card["root"], card["owned_by"]) == (MODEL, MODEL, "vllm")
    assert card["max_model_len"] == 8192
    version = started.emulator.get_json("/version")
    assert version == {"version": "0.33.0" if started.style == "0.33" else "0.10.1"}


def test_load_generator_moves_counters_at_the_configured_rate(started: Started) -> None:
    emulator = started.emulator

    def sample() -> tuple[float, float, float]:
        families = _families(emulator)
        return (
            time.monotonic(),
            metric_value(families, "vllm:prompt_tokens_total"),
            metric_value(families, "vllm:generation_tokens_total"),
        )

    t0, prompt0, gen0 = sample()
    time.sleep(3.0)
    t1, prompt1, gen1 = sample()
    prompt_rate = (prompt1 - prompt0) / (t1 - t0)
    gen_rate = (gen1 - gen0) / (t1 - t0)
    assert 0.5 * LOAD_RPS * LOAD_PROMPT <= prompt_rate <= 1.5 * LOAD_RPS * LOAD_PROMPT
    assert 0.5 * LOAD_RPS * LOAD_GEN <= gen_rate <= 1.5 * LOAD_RPS * LOAD_GEN
    emulator.wait_for_line(
        r"\[loggers\.py:\d+\] Engine 000: Avg prompt throughput: \d+\.\d tokens/s, "
        r"Avg generation throughput: \d+\.\d tokens/s, Running: \d+ reqs, Waiting: \d+ reqs, "
        r"GPU KV cache usage: \d+\.\d%, Prefix cache hit rate: \d+\.\d%$"
    )


# --- serving: requests, slots, prefill buffers --------------------------------------------------

ACTIVATION_PER_TOKEN = 32 * 1024
BATCHED = 2048
PREFILL_TPS = 2048
DECODE_TPS = 50


@pytest.fixture(scope="module")
def serving() -> Iterator[Emulator]:
    """A 0.33 engine with 2 slots and a wide, slow prefill (64 MiB buffer, 1 s per chunk)."""
    emulator = Emulator(
        *FAST_PHASES,
        "--kv-cache-memory-bytes", "32M",
        "--emulator-weights-bytes", "16M",
        "--max-num-seqs", "2",
        "--max-num-batched-tokens", str(BATCHED),
        "--emulator-activation-bytes-per-token", str(ACTIVATION_PER_TOKEN),
        "--emulator-prefill-tps", str(PREFILL_TPS),
        "--emulator-decode-tps", str(DECODE_TPS),
        "--disable-uvicorn-access-log",
    )  # fmt: skip
    try:
        emulator.wait_ready()
        yield emulator
    finally:
        emulator.close()


def _complete_in_thread(emulator: Emulator, body: dict[str, Any]) -> dict[str, Any]:
    """Start a completion; the returned dict fills in `status`, `body` and `seconds`."""
    result: dict[str, Any] = {}

    def call() -> None:
        started = time.monotonic()
        status, raw = emulator.request("/v1/completions", body)
        result.update(status=status, body=json.loads(raw), seconds=time.monotonic() - started)

    thread = threading.Thread(target=call)
    thread.start()
    result["thread"] = thread
    return result


def test_prefill_holds_a_transient_buffer_then_frees_it(serving: Emulator) -> None:
    base = serving.rss_bytes()
    call = _complete_in_thread(
        serving, {"model": MODEL, "prompt": "x", "sparkops_prompt_tokens": 4096, "max_tokens": 1}
    )
    peak = base
    while call["thread"].is_alive():
        peak = max(peak, serving.rss_bytes())
        time.sleep(0.05)
    after = serving.rss_bytes()
    assert call["status"] == 200
    buffer = BATCHED * ACTIVATION_PER_TOKEN  # min(prompt, max-num-batched-tokens) x per-token
    assert peak - base >= 0.9 * buffer
    assert after - base < 8 * MIB


def test_a_long_prefill_stalls_decode_of_the_other_requests(serving: Emulator) -> None:
    # Alone, 50 tokens at 50 tokens/s take 1 s; a 4096-token prompt needs two 1 s chunks, and
    # while each chunk runs the decoding request gets one token per step.
    decoding = _complete_in_thread(
        serving, {"model": MODEL, "prompt": "short", "sparkops_prompt_tokens": 10, "max_tokens": 50}
    )
    time.sleep(0.2)
    prefill = _complete_in_thread(
        serving, {"model": MODEL, "prompt": "x", "sparkops_prompt_tokens": 4096, "max_tokens": 1}
    )
    decoding["thread"].join(30)
    prefill["thread"].join(30)
    assert decoding["status"] == prefill["status"] == 200
    assert decoding["seconds"] > 1.0 + 0.8 * 4096 / PREFILL_TPS
    # The stall shows in the inter-token latency histogram: samples above 0.75 s exist.
    families = _families(serving)
    count = metric_value(families, "vllm:inter_token_latency_seconds_count")
    below = metric_value(families, "vllm:inter_token_latency_seconds_bucket", le="0.75")
    assert below < count


def test_requests_beyond_max_num_seqs_wait_for_a_slot(serving: Emulator) -> None:
    body = {"model": MODEL, "prompt": "short", "sparkops_prompt_tokens": 10, "max_tokens": 50}
    calls = [_complete_in_thread(serving, body) for _ in range(3)]
    seen: set[tuple[float, float]] = set()
    while any(c["thread"].is_alive() for c in calls):
        families = _families(serving)
        seen.add(
            (
                metric_value(families, "vllm:num_requests_running"),
                metric_value(families, "vllm:num_requests_waiting"),
            )
        )
        time.sleep(0.05)
    assert (2.0, 1.0) in seen
    assert all(c["status"] == 200 for c in calls)
    assert all(c["body"]["usage"]["completion_tokens"] == 50 for c in calls)


def test_completion_and_chat_answers_carry_usage(serving: Emulator) -> None:
    status, raw = serving.request(
        "/v1/completions",
        {"model": MODEL, "prompt": "one two three four five six seven eight nine ten",
         "max_tokens": 3},
    )  # fmt: skip
    assert status == 200
    body = json.loads(raw)
    assert body["object"] == "text_completion"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 13, "total_tokens": 16, "completion_tokens": 3,
                             "prompt_tokens_details": None}  # fmt: skip

    status, raw = serving.request(
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "hello there"}],
         "sparkops_gen_tokens": 2},
    )  # fmt: skip
    assert status == 200
    chat = json.loads(raw)
    assert chat["object"] == "chat.completion"
    assert chat["choices"][0]["finish_reason"] == "stop"
    assert chat["choices"][0]["message"]["role"] == "assistant"
    assert chat["usage"]["completion_tokens"] == 2


def test_unknown_model_and_too_long_requests_are_refused(serving: Emulator) -> None:
    status, raw = serving.request("/v1/completions", {"model": "other", "prompt": "hi"})
    assert status == 404
    assert json.loads(raw)["error"]["type"] == "NotFoundError"
    status, raw = serving.request(
        "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 9000}
    )
    assert status == 400
    assert "maximum context length is 8192 tokens" in json.loads(raw)["error"]["message"]


def test_streaming_sends_events_then_done(serving: Emulator) -> None:
    status, raw = serving.request(
        "/v1/completions",
        {"model": MODEL, "prompt": "hi", "max_tokens": 5, "stream": True,
         "stream_options": {"include_usage": True}},
    )  # fmt: skip
    assert status == 200
    events = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["usage"]["completion_tokens"] == 5
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


# --- refusals, failures, shutdown --------------------------------------------------------------


@pytest.mark.parametrize(
    ("style", "flag"),
    [("0.33", "--max-num-partial-prefills"), ("0.10", "--moe-backend")],
)
def test_flags_the_release_does_not_know_fail_like_argparse(style: str, flag: str) -> None:
    emulator = Emulator("--emulator-style", style, flag, "2")
    try:
        assert emulator.wait_exit() == 2
        assert f"vllm serve: error: unrecognized arguments: {flag} 2" in emulator.log_text()
    finally:
        emulator.close()


FAILURES = {
    "free-memory": r"ERROR .* ValueError: Free memory on device cuda:0 \([\d.]+/[\d.]+ GiB\) on "
    r"startup is less than desired GPU memory utilization \(0\.92, [\d.]+ GiB\)\. Decrease GPU "
    r"memory utilization or reduce GPU memory used by other processes\.$",
    "profiling": r"ERROR .* AssertionError: Error in memory profiling\. Initial free memory "
    r"[\d.]+ GiB, current free memory [\d.]+ GiB\. This happens when other processes sharing",
    "max-seq-len": r"ERROR .* ValueError: To serve at least one request with the model's max seq "
    r"len \(8192\), \([\d.]+ GiB KV cache is needed, which is larger than the available KV cache "
    r"memory \([\d.]+ GiB\)\. Based on the available memory, the estimated maximum model length "
    r"is \d+\.",
}


@pytest.mark.parametrize("mode", sorted(FAILURES))
def test_forced_failures_print_vllms_line_and_exit_nonzero(mode: str) -> None:
    emulator = Emulator(*FAST_PHASES, "--emulator-fail", mode)
    try:
        assert emulator.wait_exit() == 1
        emulator.wait_for_line(FAILURES[mode], timeout=1)
        emulator.wait_for_line(r"RuntimeError: Engine core initialization failed\.", timeout=1)
    finally:
        emulator.close()


def test_a_pool_too_small_for_max_model_len_fails_at_start() -> None:
    # 64 MiB at 4 KiB per token holds 16,384 tokens, fewer than one 131,072-token request.
    emulator = Emulator(
        *FAST_PHASES,
        "--kv-cache-memory-bytes", "64M",
        "--emulator-kv-bytes-per-token", "4K",
        "--max-model-len", "131072",
    )  # fmt: skip
    try:
        assert emulator.wait_exit() == 1
        emulator.wait_for_line(
            r"max seq len \(131072\), \(0\.50 GiB KV cache is needed, which is larger than the "
            r"available KV cache memory \(0\.06 GiB\)\. Based on the available memory, the "
            r"estimated maximum model length is 16384\.",
            timeout=1,
        )
    finally:
        emulator.close()


def test_sigterm_when_serving_exits_cleanly() -> None:
    emulator = Emulator(*FAST_PHASES, "--emulator-style", "0.10", serve=False)
    try:
        emulator.wait_ready()
        assert emulator.terminate() == 0
        emulator.wait_for_line(r"INFO:     Application shutdown complete\.$", timeout=1)
    finally:
        emulator.close()


def test_sigterm_while_loading_exits_cleanly() -> None:
    emulator = Emulator("--emulator-load-seconds", "60")
    try:
        emulator.wait_for_line(r"Starting to load model")
        started = time.monotonic()
        assert emulator.terminate() == 0
        assert time.monotonic() - started < 5
    finally:
        emulator.close()
