"""Fast in-process checks of the emulator's parts: flag parsing, sizing, exposition, scheduling."""

from __future__ import annotations

import threading
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from collectors.emulator.cli import CliError, parse_args
from collectors.emulator.engine import Engine, EngineSettings, Request
from collectors.emulator.exposition import Family, go_float, render_family
from collectors.emulator.memory import Reservation, TransientBuffer
from collectors.emulator.metrics import EngineMetrics, one_two_five_buckets
from collectors.emulator.planning import kv_bytes_per_token, plan_kv, unpinned_pool_bytes
from collectors.emulator.styles import CURRENT
from collectors.emulator.units import human_readable_int


@pytest.mark.parametrize(
    ("text", "value"),
    [("8G", 8 << 30), ("8g", 8 * 10**9), ("1K", 1024), ("1k", 1000), ("131k", 131_000),
     ("25.6k", 25_600), ("192M", 192 << 20), ("4096", 4096)],
)  # fmt: skip
def test_human_readable_ints_follow_vllm(text: str, value: int) -> None:
    assert human_readable_int(text) == value


def test_binary_suffixes_refuse_decimals() -> None:
    with pytest.raises(ValueError, match="Decimals are not allowed"):
        human_readable_int("1.5G")


def test_real_command_lines_parse_with_unknown_flags_ignored() -> None:
    config = parse_args(
        ["serve", "nvidia/Model-NVFP4", "--trust-remote-code", "--tensor_parallel_size", "1",
         "--kv-cache-memory=192M", "--max-model-len", "131k", "--served-model-name", "chat",
         "--moe-backend", "Flashinfer-Cutlass", "--enforce-eager", "--port", "8001",
         "--some-future-flag", "value", "--speculative-config", '{"method": "mtp"}']
    )  # fmt: skip
    assert config.model == "nvidia/Model-NVFP4"
    assert config.model_name == "chat"
    assert config.kv_cache_memory_bytes == 192 << 20
    assert config.max_model_len == 131_000
    assert config.moe_backend == "flashinfer_cutlass"
    assert config.enforce_eager is True
    assert config.port == 8001
    assert config.non_default_args["tensor_parallel_size"] == 1
    assert config.non_default_args["some_future_flag"] == "value"


def test_removed_flags_are_refused_only_where_removed() -> None:
    with pytest.raises(CliError, match="unrecognized arguments: --max-num-partial-prefills 4"):
        parse_args(["serve", "m", "--max-num-partial-prefills", "4"])
    legacy = parse_args(
        ["serve", "m", "--emulator-style", "0.10", "--max-num-partial-prefills", "4"]
    )
    assert legacy.style.key == "0.10"


def test_load_spec_and_model_flag_forms() -> None:
    config = parse_args(["--model", "m", "--emulator-load", "2:512:64"])
    assert config.load is not None
    assert (config.load.rps, config.load.prompt_tokens, config.load.gen_tokens) == (2.0, 512, 64)
    assert config.model_name == "m"


def test_kv_plan_counts_tokens_and_concurrency() -> None:
    # Scaled seed figure: a 20 MiB pool at 16 B/token holds 10 requests of 131,072 tokens.
    plan = plan_kv(pool_bytes=20 << 20, pinned=True, bytes_per_token=16, block_size=16,
                   max_model_len=131_072)  # fmt: skip
    assert plan.tokens == 1_310_720
    assert plan.max_concurrency == pytest.approx(10.0)
    assert kv_bytes_per_token(16, "fp8") == 8
    assert kv_bytes_per_token(16, "nvfp4") == 4


def test_unpinned_pool_depends_on_free_memory_and_cap() -> None:
    kwargs = {"gpu_memory_utilization": 0.5, "mem_total": 1000, "non_kv_bytes": 100,
              "cap_bytes": 10_000}  # fmt: skip
    assert unpinned_pool_bytes(mem_free=900, **kwargs) == 400  # util x total bounds it
    assert unpinned_pool_bytes(mem_free=300, **kwargs) == 200  # free memory at boot bounds it
    assert unpinned_pool_bytes(mem_free=900, **{**kwargs, "cap_bytes": 50}) == 50


def test_exposition_matches_prometheus_client_conventions() -> None:
    counter = Family("vllm:prompt_tokens", "counter", "Prompt tokens.", ("model_name", "engine"))
    counter.series(model_name="m", engine="0").inc(5)
    histogram = Family("vllm:ttft", "histogram", "TTFT.", ("model_name", "engine"), (0.1, 1.0))
    histogram.series(model_name="m", engine="0").observe(0.5, times=2)
    text = "\n".join(render_family(counter, True) + render_family(histogram, True)) + "\n"
    assert 'vllm:prompt_tokens_total{engine="0",model_name="m"} 5.0' in text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    buckets = {s.labels["le"]: s.value for s in families["vllm:ttft"].samples
               if s.name == "vllm:ttft_bucket"}  # fmt: skip
    assert buckets == {"0.1": 0.0, "1.0": 2.0, "+Inf": 2.0}
    assert go_float(1.7e9) == "1.7e+09"


def test_one_two_five_buckets() -> None:
    assert one_two_five_buckets(120) == [1, 2, 5, 10, 20, 50, 100]


def test_transient_buffer_holds_and_releases() -> None:
    buffer = TransientBuffer()
    buffer.hold(1 << 20)
    assert buffer.nbytes == 1 << 20
    buffer.release()
    assert buffer.nbytes == 0
    reservation = Reservation(3 << 20)
    reservation.touch(1 << 20)
    assert reservation.resident_bytes == 1 << 20
    reservation.free()


def _engine(num_gpu_blocks: int, max_num_seqs: int = 8) -> Engine:
    settings = EngineSettings(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=64,
        block_size=16,
        num_gpu_blocks=num_gpu_blocks,
        max_model_len=256,
        prefill_tps=100_000.0,
        decode_tps=2_000.0,
        activation_bytes_per_token=0,
        prefix_hit_rate=0.0,
    )
    metrics = EngineMetrics(CURRENT, model_name="m", max_model_len=256, cache_config={})
    return Engine(settings, metrics, TransientBuffer())


def _run_to_completion(engine: Engine, requests: list[Request]) -> None:
    stop = threading.Event()
    thread = threading.Thread(target=engine.run, args=(stop,))
    thread.start()
    try:
        for request in requests:
            engine.submit(request)
        for request in requests:
            assert request.done.wait(10)
    finally:
        stop.set()
        thread.join(5)


def test_a_full_kv_pool_preempts_and_still_finishes_everything() -> None:
    # 12 blocks of 16 tokens = 192 tokens; four requests growing to 160 tokens each cannot all
    # stay resident, so the newest are preempted and recomputed.
    engine = _engine(num_gpu_blocks=12)
    requests = [Request(f"r{i}", prompt_tokens=32, max_tokens=128, output_tokens=128)
                for i in range(4)]  # fmt: skip
    _run_to_completion(engine, requests)
    totals = engine.totals()
    assert totals.preemptions > 0
    assert all(r.finish_reason == "length" and r.generated == 128 for r in requests)
    assert totals.generation_tokens >= 4 * 128
    assert totals.kv_usage == 0.0


def test_requests_too_long_for_the_context_are_refused() -> None:
    engine = _engine(num_gpu_blocks=64)
    with pytest.raises(ValueError, match="exceed max_model_len"):
        engine.submit(Request("r", prompt_tokens=200, max_tokens=100, output_tokens=100))


def test_prompt_counter_counts_whole_prompt_when_prefill_ends() -> None:
    engine = _engine(num_gpu_blocks=64)
    started = time.monotonic()
    request = Request("r", prompt_tokens=100, max_tokens=3, output_tokens=3)
    _run_to_completion(engine, [request])
    assert engine.totals().prompt_tokens == 100
    assert request.first_token is not None and request.first_token >= started
