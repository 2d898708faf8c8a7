"""Startup-log parsing across every vLLM log format since early 2025: process prefixes, bracketed
or bare sources, GiB formats, one- and two-line KV capacity, V0 lines and startup failures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collectors.vllm.logs import ERROR_KINDS, PHASES, StartupLog, parse_startup_log

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "vllm_logs"
REQUIRED_KEYS = {
    "unparsed",
    "phase",
    "version",
    "weights_gib",
    "weights_load_seconds",
    "kv_cache_gib",
    "kv_cache_pinned",
    "kv_cache_tokens",
    "max_concurrency",
    "concurrency_for_tokens",
    "cuda_graph_gib",
    "backends",
    "errors",
}


def parse_fixture(name: str) -> StartupLog:
    return parse_startup_log((FIXTURES / name).read_text(encoding="utf-8"))


# --- whole startups, one per historic format ----------------------------------------------------


def test_v033_pinned_kv_cache_combined_capacity_line() -> None:
    log = parse_fixture("v033_pinned.log")
    assert log.phase == "ready"
    assert log.version == "0.33.0"
    assert (log.weights_gib, log.weights_load_seconds) == (16.9, 78.402113)
    assert (log.kv_cache_gib, log.kv_cache_pinned, log.startup_free_gib) == (20.0, True, 88.37)
    assert (log.kv_cache_tokens, log.max_concurrency, log.concurrency_for_tokens) == (
        1_230_848,
        9.39,
        131_072,
    )
    assert (log.cuda_graph_gib, log.cuda_graph_estimate_gib) == (0.62, -2.41)
    assert log.init_engine_seconds == 277.85
    assert (log.started_at, log.ready_at, log.startup_seconds) == (
        "11-03 08:14:02",
        "11-03 08:19:26",
        324.0,
    )
    assert (log.moe_backend, log.moe_quantization, log.attention_backend) == (
        "MARLIN",
        "NvFp4",
        "FLASHINFER",
    )
    assert log.backends == [
        "attention: FLASHINFER",
        "NVFP4 GEMM: FlashInferCutlassNvFp4LinearKernel",
        "MoE (NvFp4): MARLIN",
        "FP4 GEMM: Marlin (weight-only)",
    ]
    assert log.non_default_args is not None
    assert log.non_default_args["kv_cache_memory_bytes"] == 21_474_836_480
    assert log.non_default_args["served_model_name"] == ["gemma-4"]
    assert log.engine_config["quantization"] == "modelopt_fp4"
    assert log.errors == []
    assert log.startup_count == 1


def test_v033_profiled_kv_cache_with_sizing_advice() -> None:
    log = parse_fixture("v033_profiled.log")
    assert log.phase == "ready"
    assert (log.kv_cache_gib, log.kv_cache_pinned) == (6.1, False)
    assert (log.kv_cache_tokens, log.max_concurrency, log.concurrency_for_tokens) == (
        24_976,
        1.52,
        16_384,
    )
    assert (log.startup_free_gib, log.device_total_gib) == (101.36, 121.69)
    assert (log.cuda_graph_gib, log.cuda_graph_estimate_gib) == (1.09, 1.12)
    assert log.attention_backend == "FLASH_ATTN"
    assert log.engine_config["quantization"] == "fp8"
    # A value that is not a Python literal (a config object's repr) is kept as text.
    assert log.non_default_args is not None
    assert log.non_default_args["compilation_config"].startswith("CompilationConfig(mode=3")
    assert log.non_default_args["gpu_memory_utilization"] == 0.35


def test_2025_engine_core_dp0_two_line_capacity() -> None:
    log = parse_fixture("v2025_engine_core_dp0.log")
    assert (log.phase, log.version) == ("ready", "0.10.1.1")
    assert (log.weights_gib, log.weights_load_seconds) == (29.0445, 72.118204)
    assert (log.kv_cache_gib, log.kv_cache_pinned) == (21.87, False)
    assert (log.kv_cache_tokens, log.max_concurrency, log.concurrency_for_tokens) == (
        238_864,
        3.64,
        65_536,
    )
    assert log.num_gpu_blocks == 14_929  # from the cache_config_info line
    assert log.cuda_graph_gib == 0.84
    assert log.init_engine_seconds == 103.87
    assert log.ready_at == "09-12 10:04:20"  # "Starting vLLM API server 0 on …"
    assert log.backends == ["attention: Flash Attention"]


def test_2025_tensor_parallel_vllm_worker_prefix() -> None:
    log = parse_fixture("v2025_tp2_vllmworker.log")
    assert (log.phase, log.version) == ("ready", "0.9.1")
    assert (log.weights_gib, log.weights_load_seconds) == (19.2411, 129.8711)
    assert (log.kv_cache_gib, log.kv_cache_tokens, log.max_concurrency) == (21.43, 140_432, 4.29)
    assert log.cuda_graph_gib == 2.31
    assert log.engine_config["tensor_parallel_size"] == "2"
    assert log.startup_count == 1


def test_early_2025_gpu_blocks_and_gb_weights() -> None:
    log = parse_fixture("early2025_gpu_blocks.log")
    assert (log.phase, log.version) == ("ready", "0.7.2")
    assert log.weights_gib == 67.7229  # printed as "GB", computed with 2**30
    assert log.weights_load_seconds is None
    assert log.num_gpu_blocks == 1381
    assert log.kv_cache_tokens is None  # blocks × block size is wrong for hybrid models
    assert (log.max_concurrency, log.concurrency_for_tokens) == (10.79, 2048)
    assert (log.kv_cache_gib, log.kv_cache_pinned) == (None, None)
    assert log.init_engine_seconds == 37.22
    assert log.ready_at == "02-11 09:34:52"


def test_v0_without_process_prefix_or_brackets() -> None:
    log = parse_fixture("v0_no_prefix.log")
    assert (log.phase, log.version) == ("ready", "0.6.3.post1")
    assert log.weights_gib == 14.9595  # the "took" line, not the rounded profile summary
    assert (log.kv_cache_gib, log.kv_cache_pinned) == (11.12, False)
    assert log.device_total_gib == 39.5
    assert log.num_gpu_blocks == 5691
    assert (log.max_concurrency, log.concurrency_for_tokens) == (2.78, 32_768)
    assert log.cuda_graph_gib is None  # V0 did not print the graph size
    assert log.ready_at is None  # uvicorn's line has no timestamp
    assert log.startup_seconds is None
    assert log.attention_backend == "XFormers"


def test_compose_prefixed_2026_log_with_negative_gb10_figures() -> None:
    log = parse_fixture("compose_v027_moe_flashinfer.log")
    assert (log.phase, log.version) == ("ready", "0.27.1")
    assert (log.weights_gib, log.kv_cache_gib, log.kv_cache_tokens) == (18.45, 24.6, 268_688)
    assert (log.cuda_graph_gib, log.cuda_graph_estimate_gib) == (-0.45, -3.17)
    assert (log.startup_free_gib, log.device_total_gib) == (95.12, 121.69)
    assert log.moe_backend == "FLASHINFER_CUTLASS"
    assert log.unknown_env_vars == ["VLLM_FLASHINFER_MOE_BACKEND", "VLLM_BUILD_COMMIT"]
    assert log.ready_at == "09-02 06:43:08"


# --- failures -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "kind", "text"),
    [
        ("fail_free_memory.log", "free-memory-below-utilization", "(97.07/121.69 GiB)"),
        ("fail_memory_profiling.log", "memory-profiling-error", "Initial free memory 61.2 GiB"),
        ("fail_max_seq_len.log", "max-seq-len-too-long", "estimated maximum model length is 1902"),
        ("fail_no_cache_memory.log", "no-cache-memory", "No available memory for the cache blocks"),
        ("fail_ptx_toolchain.log", "ptx-toolchain", "unsupported toolchain"),
        ("fail_not_enough_memory.log", "not-enough-gpu-memory", "not enough GPU memory"),
        ("fail_quantization_mismatch.log", "quantization-mismatch", "(modelopt_fp4) does not"),
    ],
)
def test_each_failure_signature(fixture: str, kind: str, text: str) -> None:
    log = parse_fixture(fixture)
    assert log.phase == "failed"
    # One entry: repeats are dropped, and the generic "Engine core initialization failed" and
    # "CUDA out of memory" lines give way to the specific cause.
    assert [error.kind for error in log.errors] == [kind]
    assert text in log.errors[0].message
    assert "\n" not in log.errors[0].message


def test_failure_keeps_what_was_logged_before_it() -> None:
    log = parse_fixture("fail_no_cache_memory.log")
    assert (log.weights_gib, log.kv_cache_gib, log.cuda_graph_estimate_gib) == (2.2, -0.85, 0.08)
    free = parse_fixture("fail_free_memory.log")
    assert (free.startup_free_gib, free.device_total_gib) == (97.07, 121.69)


def test_generic_failure_alone_is_reported() -> None:
    log = parse_startup_log(
        "(APIServer pid=1) INFO 01-02 03:04:05 [api_server.py:1] vLLM API server version 0.30.0\n"
        "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above.\n"
    )
    assert log.phase == "failed"
    assert [error.kind for error in log.errors] == ["engine-core-init-failed"]


def test_ptxas_refusing_sm121_is_a_toolchain_error() -> None:
    log = parse_startup_log(
        "(EngineCore pid=9) ERROR 01-02 03:04:05 [core.py:1] ptxas fatal   : Value 'sm_121a' is "
        "not defined for option 'gpu-name'\n"
    )
    assert [error.kind for error in log.errors] == ["ptx-toolchain"]


def test_error_kinds_are_stable() -> None:
    assert ERROR_KINDS == (
        "free-memory-below-utilization",
        "memory-profiling-error",
        "max-seq-len-too-long",
        "no-cache-memory",
        "ptx-toolchain",
        "not-enough-gpu-memory",
        "quantization-mismatch",
        "unrecognized-arguments",
        "cuda-out-of-memory",
        "engine-core-init-failed",
    )


# --- restarts: the last startup wins --------------------------------------------------------------


def test_failed_then_successful_startup() -> None:
    log = parse_fixture("two_startups.log")
    assert log.startup_count == 2
    assert log.phase == "ready"
    assert log.errors == []
    assert (log.kv_cache_gib, log.kv_cache_pinned, log.startup_free_gib) == (8.0, True, 101.2)
    assert log.kv_cache_tokens == 492_336
    assert log.started_at == "11-04 21:20:11"
    assert log.non_default_args is not None
    assert log.non_default_args["kv_cache_memory_bytes"] == 8_589_934_592


def test_restart_still_loading_does_not_inherit_the_previous_startup() -> None:
    first = (FIXTURES / "v033_pinned.log").read_text(encoding="utf-8")
    second = (FIXTURES / "v033_profiled.log").read_text(encoding="utf-8").splitlines()
    partial = "\n".join(second[:9])  # up to "Model loading took 32.81 GiB …"
    log = parse_startup_log(first + partial)
    assert log.startup_count == 2
    assert log.phase == "profiling"
    assert log.weights_gib == 32.81
    assert (log.kv_cache_gib, log.kv_cache_pinned, log.kv_cache_tokens) == (None, None, None)
    assert log.ready_at is None
    assert log.moe_backend is None


def test_restart_of_a_startup_killed_while_loading() -> None:
    killed = (FIXTURES / "v033_profiled.log").read_text(encoding="utf-8").splitlines()[:9]
    restarted = (FIXTURES / "v033_pinned.log").read_text(encoding="utf-8")
    log = parse_startup_log("\n".join(killed) + "\n" + restarted)
    assert log.startup_count == 2
    assert log.started_at == "11-03 08:14:02"
    assert "attention: FLASH_ATTN" not in log.backends
    assert log.startup_seconds == 324.0


def test_restart_without_version_line_is_still_detected() -> None:
    once = (
        "INFO 01-30 03:19:14 [gpu_model_runner.py:1] Model loading took 9.5 GiB and 3.0 seconds\n"
        "INFO 01-30 03:19:40 [gpu_worker.py:2] Available KV cache memory: 10.0 GiB\n"
    )
    again = "INFO 01-30 03:29:14 [model_runner.py:1] Model loading took 9.7 GiB and 4.0 seconds\n"
    log = parse_startup_log(once + again)
    assert log.startup_count == 2
    assert (log.phase, log.weights_gib, log.kv_cache_gib) == ("profiling", 9.7, None)


def test_many_versions_across_restarts() -> None:
    text = "".join(
        (FIXTURES / name).read_text(encoding="utf-8")
        for name in ("v0_no_prefix.log", "early2025_gpu_blocks.log", "v2025_engine_core_dp0.log")
    )
    log = parse_startup_log(text)
    assert (log.startup_count, log.version, log.kv_cache_tokens) == (3, "0.10.1.1", 238_864)


# --- line formats ---------------------------------------------------------------------------------

KV_LINE = (
    "GPU KV cache size: 1,230,848 tokens, Maximum concurrency for 131,072 tokens per request: 9.39x"
)
ENGINE_CORE = "(EngineCore pid=212) INFO 11-03 08:18:50 [k.py:1]"
INFO = "INFO 01-30 03:19:14 [any_file.py:1]"


@pytest.mark.parametrize(
    "line",
    [
        f"(EngineCore pid=212) INFO 11-03 08:18:50 [kv_cache_utils.py:1402] {KV_LINE}",
        f"(EngineCore_DP0 pid=212) INFO 11-03 08:18:50 [kv_cache_utils.py:88] {KV_LINE}",
        f"(EngineCore_0 pid=212) INFO 11-03 08:18:50 [kv_cache_utils.py:88] {KV_LINE}",
        f"(Worker_TP0 pid=301) INFO 11-03 08:18:50 [kv_cache_utils.py:88] {KV_LINE}",
        f"(VllmWorker rank=0 pid=301) INFO 11-03 08:18:50 [kv_cache_utils.py:88] {KV_LINE}",
        f"INFO 11-03 08:18:50 [kv_cache_utils.py:398] {KV_LINE}",
        f"INFO 11-03 08:18:50 kv_cache_utils.py:398] {KV_LINE}",
        f"gemma-1  | (EngineCore pid=212) INFO 11-03 08:18:50 [kv_cache_utils.py:1402] {KV_LINE}",
        f"vllm_gb10_server | INFO 11-03 08:18:50 [kv_cache_utils.py:7] {KV_LINE}",
        f"2026-11-03T08:18:50.123456789Z {ENGINE_CORE} {KV_LINE}",
        f"Nov 03 08:18:50 spark vllm[212]: {ENGINE_CORE} {KV_LINE}",
        f"\x1b[1;36m(EngineCore pid=212)\x1b[0;0m INFO 11-03 08:18:50 [k.py:1] {KV_LINE}",
    ],
)
def test_every_prefix_style(line: str) -> None:
    log = parse_startup_log(line)
    assert (log.kv_cache_tokens, log.max_concurrency, log.concurrency_for_tokens) == (
        1_230_848,
        9.39,
        131_072,
    )
    assert log.phase == "kv_allocated"
    assert log.started_at == "11-03 08:18:50"


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("Available KV cache memory: 6.9 GiB", 6.9),
        ("Available KV cache memory: 5.0 GiB", 5.0),
        ("Available KV cache memory: 40.52 GiB", 40.52),
        ("Available KV cache memory: 11.4384 GiB", 11.4384),
        ("Available KV cache memory: -0.85 GiB", -0.85),
        ("Available KV cache memory: 12 GiB", 12.0),
    ],
)
def test_gib_formats(message: str, expected: float) -> None:
    log = parse_startup_log(f"(EngineCore pid=1) INFO 01-30 03:19:14 [gpu_worker.py:276] {message}")
    assert log.kv_cache_gib == expected
    assert log.kv_cache_pinned is False


@pytest.mark.parametrize(
    ("message", "gib", "seconds"),
    [
        ("Model loading took 6.9 GiB memory and 5.338305 seconds", 6.9, 5.338305),
        ("Model loading took 11.4384 GiB and 5.338305 seconds", 11.4384, 5.338305),
        ("Loading model weights took 67.7229 GB", 67.7229, None),
    ],
)
def test_weights_line_variants(message: str, gib: float, seconds: float | None) -> None:
    log = parse_startup_log(f"INFO 01-30 03:19:14 [gpu_model_runner.py:1] {message}")
    assert (log.weights_gib, log.weights_load_seconds, log.phase) == (gib, seconds, "profiling")


def test_loader_timing_fills_in_when_the_weights_line_has_none() -> None:
    log = parse_startup_log(
        "INFO 01-30 03:19:10 [default_loader.py:1] Loading weights took 9.86 seconds\n"
        "INFO 01-30 03:19:14 [gpu_model_runner.py:1] Loading model weights took 14.9 GB\n"
    )
    assert (log.weights_gib, log.weights_load_seconds) == (14.9, 9.86)


def test_two_line_and_device_variants_of_kv_capacity() -> None:
    log = parse_startup_log(
        "INFO 01-30 03:19:14 [kv_cache_utils.py:1] GPU + host KV cache size: 2,000,000 tokens\n"
        "INFO 01-30 03:19:14 [kv_cache_utils.py:2] Maximum concurrency for 2048 tokens per "
        "request: 976.56x\n"
    )
    assert (log.kv_cache_tokens, log.max_concurrency, log.concurrency_for_tokens) == (
        2_000_000,
        976.56,
        2048,
    )
    xpu = parse_startup_log("INFO 01-30 03:19:14 [kv_cache.py:1] XPU KV cache size: 512 tokens")
    assert xpu.kv_cache_tokens == 512


def test_v0_gpu_and_cpu_blocks_line() -> None:
    line = "INFO 10-20 07:11:46 gpu_executor.py:122] # GPU blocks: 5691, # CPU blocks: 2048"
    log = parse_startup_log(line)
    assert log.num_gpu_blocks == 5691


def test_startup_plan_pins_the_kv_cache() -> None:
    log = parse_startup_log(
        "(EngineCore pid=5) INFO 11-01 10:00:00 [startup_plan.py:90] Applying persisted startup "
        "plan (fingerprint 3f2a9c): kv_cache_memory_bytes=21474836480 (20.0 GiB), recorded "
        "free-memory baseline 96.4 GiB, current 95.1 GiB. Memory profiling will be skipped."
    )
    assert (log.kv_cache_gib, log.kv_cache_pinned, log.startup_free_gib) == (20.0, True, 95.1)


def test_init_engine_line_with_seconds_or_s() -> None:
    old = parse_startup_log(
        "INFO 01-30 03:19:14 [core.py:1] init engine (profile, create kv cache, warmup model) took "
        "25.99 seconds"
    )
    new = parse_startup_log(
        "INFO 01-30 03:19:14 [core.py:1] init engine (profile, create kv cache, warmup model) took "
        "277.85 s (compilation: 61.27 s)"
    )
    assert (old.init_engine_seconds, new.init_engine_seconds) == (25.99, 277.85)


def test_startup_across_new_year() -> None:
    log = parse_startup_log(
        "INFO 12-31 23:58:00 [api_server.py:1] vLLM API server version 0.33.0\n"
        "INFO 01-01 00:03:00 [entry.py:1] Starting vLLM server on http://0.0.0.0:8000\n"
    )
    assert log.startup_seconds == 300.0


@pytest.mark.parametrize(
    ("text", "phase"),
    [
        (f"{INFO} vLLM API server version 0.33.0", "loading"),
        (f"{INFO} Starting to load model a/b...", "loading"),
        (f"{INFO} Initial profiling/warmup run took 2.55 s", "profiling"),
        (f"{INFO} Estimated CUDA graph memory: -1.5 GiB total", "profiling"),
        (f"{INFO} Available KV cache memory: 1.0 GiB", "kv_allocated"),
        ("INFO:     Application startup complete.", "ready"),
        ("everything is fine\nno vLLM here", "unknown"),
        ("", "unknown"),
    ],
)
def test_phases(text: str, phase: str) -> None:
    assert parse_startup_log(text).phase == phase
    assert phase in PHASES


def test_stats_and_access_lines_are_ignored() -> None:
    log = parse_startup_log(
        "(APIServer pid=1) INFO 11-03 08:21:06 [loggers.py:271] Engine 000: Avg prompt throughput: "
        "351.2 tokens/s, Avg generation throughput: 40.9 tokens/s, Running: 1 reqs, Waiting: 0 "
        "reqs, GPU KV cache usage: 0.3%, Prefix cache hit rate: 0.0%\n"
        '(APIServer pid=1) INFO:     127.0.0.1:50312 - "GET /health HTTP/1.1" 200 OK\n'
    )
    assert log.phase == "unknown"


def test_nothing_recognised_is_unknown_not_zero() -> None:
    log = parse_startup_log("hello\nworld\n")
    data = log.as_dict()
    assert log.recognised is False
    assert data["phase"] == "unknown"
    assert data["startup_count"] == 0
    numeric = [
        key for key in REQUIRED_KEYS if key not in {"phase", "backends", "errors", "unparsed"}
    ]
    assert all(data[key] is None for key in numeric)
    assert (data["backends"], data["errors"], data["unparsed"]) == ([], [], [])


def test_as_dict_is_json_ready_with_the_agreed_keys() -> None:
    data = json.loads(json.dumps(parse_fixture("fail_free_memory.log").as_dict()))
    assert set(data) >= REQUIRED_KEYS
    assert data["errors"] == [
        {
            "kind": "free-memory-below-utilization",
            "message": "ValueError: Free memory on device cuda:0 (97.07/121.69 GiB) on startup is "
            "less than desired GPU memory utilization (0.8, 97.35 GiB). Decrease GPU memory "
            "utilization or reduce GPU memory used by other processes.",
        }
    ]
    assert data["weights_gib"] is None


@pytest.mark.parametrize(
    "text",
    [
        "INFO 13-45 99:99:99 [api_server.py:1] vLLM API server version 0.33.0\n"
        "INFO 13-45 99:99:99 [entry.py:1] Starting vLLM server on http://0.0.0.0:8000",
        "INFO 01-30 03:19:14 [startup.py:1] non-default args: {" + "[" * 5000 + "]" * 5000 + "}",
        "INFO 01-30 03:19:14 [startup.py:1] non-default args: {'a': 1, oops}",
        "\x00\xff garbage \ufffd\n" * 3,
    ],
)
def test_odd_input_never_raises(text: str) -> None:
    log = parse_startup_log(text)
    assert log.phase in PHASES


def test_every_stored_parse_round_trips() -> None:
    from collectors.vllm.logs import StartupLog

    names = sorted(p.name for p in (Path(__file__).parent.parent / "fixtures" / "vllm_logs")
                   .glob("*.log"))
    assert len(names) >= 10
    for name in names:
        parsed = parse_fixture(name)
        assert StartupLog.from_dict(json.loads(json.dumps(parsed.as_dict()))) == parsed


# --- lines of a known kind whose figures do not parse -------------------------------------------


def test_near_miss_is_reported_and_the_figure_stays_unknown() -> None:
    log = parse_startup_log(
        "(EngineCore pid=9) INFO 01-30 03:19:14 [gpu_worker.py:1] Available KV cache memory: 6.1 "
        "GiB\n"
        "(EngineCore pid=9) INFO 01-30 03:19:15 [gpu_model_runner.py:1] Model loading took nan GiB "
        "memory and 78.402113 seconds\n"
    )
    assert (log.weights_gib, log.weights_load_seconds) == (None, None)
    assert log.kv_cache_gib == 6.1
    assert [(line.fact, line.message) for line in log.unparsed] == [
        ("weights", "Model loading took nan GiB memory and 78.402113 seconds")
    ]
    assert StartupLog.from_dict(json.loads(json.dumps(log.as_dict()))) == log


def test_unparsed_lines_are_capped() -> None:
    line = "INFO 01-30 03:19:14 [gpu_worker.py:1] Available KV cache memory: None GiB\n"
    log = parse_startup_log(line * 50)
    assert len(log.unparsed) == 10
    assert log.kv_cache_gib is None


def test_a_line_without_the_anchor_is_not_a_near_miss() -> None:
    log = parse_startup_log(
        "INFO 01-30 03:19:14 [kv_cache_utils.py:1] Multiplying the GPU KV cache size by the "
        "dcp_world_size 2.\n"
        "INFO 01-30 03:19:14 [base.py:1] Using Transformers modeling backend.\n"
    )
    assert log.unparsed == []
    assert log.attention_backend is None
