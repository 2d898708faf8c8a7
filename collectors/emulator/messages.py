"""The text of every vLLM line the emulator prints, per style.

Each function returns `(source, message)` for `VllmLog.api/core`. The `0.33` texts are those of
the vLLM 0.33.0 wheel (vllm/v1/worker/gpu_worker.py, gpu_model_runner.py,
vllm/v1/core/kv_cache_utils.py, vllm/v1/metrics/loggers.py, vllm/entrypoints/...); the `0.10`
variants are texts seen in real 2025 logs in public vLLM issues. Line numbers are plausible, not
real: they change between every vLLM version, so nothing may match on them.

Numbers: 2026 code formats GiB as `str(round(x, 2))` (so `0.19`, `5.0`); 2025 code used `%.2f`
or `%.4f` depending on the line.
"""

from __future__ import annotations

from typing import Any

from .planning import KvPlan
from .styles import Style
from .units import GIB, format_gib_2026, gib

Line = tuple[str, str]


def _gib(style: Style, nbytes: float, legacy_format: str = "{:.2f}") -> str:
    return format_gib_2026(nbytes) if style.modern else legacy_format.format(gib(nbytes))


def api_version(style: Style, version: str) -> Line:
    return ("api_server.py:1912" if style.modern else "api_server.py:1805"), (
        f"vLLM API server version {version}"
    )


def non_default_args(style: Style, args: dict[str, Any]) -> Line:
    # vllm/entrypoints/common/startup.py: a Python dict repr, the easiest way to recover the
    # flags from a log.
    source = "startup.py:118" if style.modern else "utils.py:326"
    return source, f"non-default args: {args!r}"


def max_model_len(style: Style, length: int) -> Line:
    return ("model.py:1611" if style.modern else "__init__.py:1750"), (
        f"Using max model len {length}"
    )


def chunked_prefill(style: Style, batched_tokens: int) -> Line:
    return ("scheduler.py:241" if style.modern else "scheduler.py:222"), (
        f"Chunked prefill is enabled with max_num_batched_tokens={batched_tokens}."
    )


def engine_config(
    style: Style,
    *,
    version: str,
    model: str,
    max_seq_len: int,
    quantization: str | None,
    enforce_eager: bool,
    kv_cache_dtype: str,
    served_model_name: str,
    enable_prefix_caching: bool,
    moe_backend: str,
    speculative: str = "None",
) -> Line:
    """`Initializing a V1 LLM engine (vX) with config: …`: the line that gives the vLLM
    version and the effective engine config; `speculative` is the SpeculativeConfig's repr."""
    parts = [
        f"model='{model}'",
        f"speculative_config={speculative}",
        f"tokenizer='{model}'",
        "skip_tokenizer_init=False",
        "tokenizer_mode=auto",
        "revision=None",
        "trust_remote_code=False",
        "dtype=torch.bfloat16",
        f"max_seq_len={max_seq_len}",
        "download_dir=None",
        "load_format=auto",
        "tensor_parallel_size=1",
        "pipeline_parallel_size=1",
        "data_parallel_size=1",
        "disable_custom_all_reduce=False",
        f"quantization={quantization}",
        f"enforce_eager={enforce_eager}",
        f"kv_cache_dtype={kv_cache_dtype}",
        "device_config=cuda",
        "seed=0",
        f"served_model_name={served_model_name}",
        f"enable_prefix_caching={enable_prefix_caching}",
        "chunked_prefill_enabled=True",
    ]
    if style.modern:
        parts.append(f"kernel_config=KernelConfig(moe_backend='{moe_backend}')")
    source = "core.py:101" if style.modern else "core.py:74"
    return source, f"Initializing a V1 LLM engine (v{version}) with config: {', '.join(parts)}"


def speculative_config_repr(method: str | None, model: str | None, tokens: int) -> str:
    """`SpeculativeConfig.__repr__` (vllm/config/speculative.py:2196 of 0.33)."""
    return f"SpeculativeConfig(method={method!r}, model={model!r}, num_spec_tokens={tokens})"


def spec_decode_line(*, drafts: int, draft_tokens: int, accepted: int, seconds: float,
                     per_position: list[float]) -> Line:
    """`SpecDecodingLogging.log` (vllm/v1/spec_decode/metrics.py of 0.33), after the stats
    line of an interval that drafted."""
    rate = accepted / draft_tokens * 100 if draft_tokens else float("nan")
    return "metrics.py:124", (
        f"SpecDecoding metrics: Mean acceptance length: {1 + accepted / drafts:.2f}, "
        f"Accepted throughput: {accepted / seconds:.2f} tokens/s, "
        f"Drafted throughput: {draft_tokens / seconds:.2f} tokens/s, "
        f"Accepted: {accepted} tokens, Drafted: {draft_tokens} tokens, "
        f"Per-position acceptance rate: {', '.join(f'{p:.3f}' for p in per_position)}, "
        f"Avg Draft acceptance rate: {rate:.1f}%"
    )


def starting_to_load(model: str) -> Line:
    return "gpu_model_runner.py:3342", f"Starting to load model {model}..."


def loading_weights_took(seconds: float) -> Line:
    return "default_loader.py:291", f"Loading weights took {seconds:.2f} seconds"


def model_loading_took(style: Style, weights_bytes: int, seconds: float) -> Line:
    if style.modern:
        return "gpu_model_runner.py:3371", (
            f"Model loading took {_gib(style, weights_bytes)} GiB memory and {seconds:.6f} seconds"
        )
    return "gpu_model_runner.py:1892", (
        f"Model loading took {gib(weights_bytes):.4f} GiB and {seconds:.6f} seconds"
    )


def warmup_took(style: Style, seconds: float) -> Line:
    if style.modern:
        return "monitor.py:48", f"Initial profiling/warmup run took {seconds:.2f} s"
    return "monitor.py:34", f"torch.compile takes {seconds:.2f} s in total"


def cudagraph_profile() -> Line:
    """The first of the two CUDA-graph estimate lines (2026; gpu_model_runner.py
    profile_cudagraph_memory)."""
    return "gpu_model_runner.py:4680", (
        "Profiling CUDA graph memory: PIECEWISE=51 (largest=512), FULL=35 (largest=256)"
    )


def estimated_cudagraph_memory(graph_bytes: int) -> Line:
    return (
        "gpu_model_runner.py:4741",
        f"Estimated CUDA graph memory: {gib(graph_bytes):.2f} GiB total",
    )


def available_kv(style: Style, pool_bytes: int) -> Line:
    # gpu_worker.py:determine_available_memory; not printed when --kv-cache-memory-bytes is set.
    return ("gpu_worker.py:388" if style.modern else "gpu_worker.py:276"), (
        f"Available KV cache memory: {_gib(style, pool_bytes)} GiB"
    )


def pinned_kv(style: Style, initial_free: int, pool_bytes: int) -> Line:
    return ("gpu_worker.py:351" if style.modern else "gpu_worker.py:243"), (
        f"Initial free memory {_gib(style, initial_free)} GiB, reserved "
        f"{_gib(style, pool_bytes)} GiB memory for KV Cache as specified by kv_cache_memory_bytes "
        "config and skipped memory profiling. This does not respect the gpu_memory_utilization "
        "config. Only use kv_cache_memory_bytes config when you want manual control of KV cache "
        "memory size. If OOM'ed, check the difference of initial free memory between the current "
        "run and the previous run where kv_cache_memory_bytes is suggested and update it "
        "correspondingly."
    )


def cudagraph_accounting_note(util: float, graph_bytes: int, mem_total: int) -> Line:
    """The v0.21+ note on graph memory profiling (gpu_worker.py), for an unpinned pool (2026
    style only)."""
    share = graph_bytes / mem_total if mem_total else 0.0
    return "gpu_worker.py:421", (
        "CUDA graph memory profiling is enabled (default since v0.21.0). The current "
        f"--gpu-memory-utilization={util:.4f} is equivalent to "
        f"--gpu-memory-utilization={max(util - share, 0.0):.4f} without CUDA graph memory "
        "profiling. To maintain the same effective KV cache size as before, increase "
        f"--gpu-memory-utilization to {min(util + share, 1.0):.4f}. To disable, set "
        "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0."
    )


def kv_capacity(style: Style, plan: KvPlan) -> list[Line]:
    """kv_cache_utils.py:update_kv_cache_capacity: one combined line since vLLM PR #50462
    (2026), two lines before."""
    size = f"GPU KV cache size: {plan.tokens:,} tokens"
    concurrency = (
        f"Maximum concurrency for {plan.max_model_len:,} tokens per request: "
        f"{plan.max_concurrency:.2f}x"
    )
    if style.modern:
        return [("kv_cache_utils.py:1297", f"{size}, {concurrency}")]
    return [("kv_cache_utils.py:849", size), ("kv_cache_utils.py:853", concurrency)]


def graph_capture(seconds: float, graph_bytes: int) -> Line:
    return "gpu_model_runner.py:4902", (
        f"Graph capturing finished in {seconds:.0f} secs, took {gib(graph_bytes):.2f} GiB"
    )


def graph_pool(actual: int, estimated: int) -> Line:
    diff = actual - estimated
    pct = 100.0 * diff / estimated if estimated else 0.0
    return "gpu_worker.py:512", (
        f"CUDA graph pool memory: {format_gib_2026(actual)} GiB (actual), "
        f"{format_gib_2026(estimated)} GiB (estimated), difference: {format_gib_2026(diff)} GiB "
        f"({pct:.1f}%)."
    )


def sizing_advice(
    *,
    mem_free: int,
    mem_total: int,
    util: float,
    consumed: int,
    peak_activation: int,
    graph_bytes: int,
    fit_bytes: int,
    full_bytes: int,
    in_use: int,
) -> Line:
    """gpu_worker.py's sizing advice, printed when KV bytes were not pinned (2026 style)."""
    f = format_gib_2026
    return "gpu_worker.py:466", (
        f"Free memory on device ({f(mem_free)}/{f(mem_total)} GiB) on startup. Desired GPU "
        f"memory utilization is ({util}, {f(util * mem_total)} GiB). Actual usage is "
        f"{f(consumed)} GiB for consumed memory (weights + non-torch), {f(peak_activation)} GiB "
        f"for peak activation, and {f(graph_bytes)} GiB for CUDAGraph memory. Replace "
        f"gpu_memory_utilization config with `--kv-cache-memory={fit_bytes}` ({f(fit_bytes)} "
        f"GiB) to fit into requested memory, or `--kv-cache-memory={full_bytes}` "
        f"({f(full_bytes)} GiB) to fully utilize gpu memory. Current kv cache memory in use is "
        f"{f(in_use)} GiB."
    )


def init_engine_took(style: Style, seconds: float) -> Line:
    if style.modern:
        return "core.py:262", (
            f"init engine (profile, create kv cache, warmup model) took {seconds:.2f} s"
        )
    return "core.py:214", (
        f"init engine (profile, create kv cache, warmup model) took {seconds:.2f} seconds"
    )


def cache_config_info_logged(num_gpu_blocks: int) -> Line:
    # INFO in 2025; DEBUG for the per-engine logger in 0.33, so only the 0.10 style prints it.
    return "loggers.py:142", (
        f"Engine 000: vllm cache_config_info with initialization after num_gpu_blocks is: "
        f"{num_gpu_blocks}"
    )


def supported_tasks(style: Style) -> Line:
    return ("api_server.py:1702" if style.modern else "api_server.py:1611"), (
        "Supported tasks: ['generate']"
    )


def starting_server(style: Style, url: str) -> Line:
    if style.modern:
        return "entry.py:87", f"Starting vLLM server on {url}"
    return "api_server.py:1880", f"Starting vLLM API server 0 on {url}"


ROUTES: tuple[tuple[str, str], ...] = (
    ("/health", "GET"),
    ("/load", "GET"),
    ("/ping", "GET, POST"),
    ("/version", "GET"),
    ("/metrics", "GET"),
    ("/v1/models", "GET"),
    ("/v1/completions", "POST"),
    ("/v1/chat/completions", "POST"),
)


# Registered only with VLLM_SERVER_DEV_MODE=1 (vllm/entrypoints/serve/dev/sleep/api_router.py).
DEV_ROUTES: tuple[tuple[str, str], ...] = (
    ("/sleep", "POST"),
    ("/wake_up", "POST"),
    ("/is_sleeping", "GET"),
)


def route_lines(dev_mode: bool = False) -> list[Line]:
    lines = [("launcher.py:29", "Available routes are:")]
    routes = ROUTES + (DEV_ROUTES if dev_mode else ())
    lines += [("launcher.py:37", f"Route: {path}, Methods: {methods}") for path, methods in routes]
    return lines


def stats_line(
    style: Style,
    *,
    prompt_tps: float,
    generation_tps: float,
    running: int,
    waiting: int,
    preemptions: int,
    kv_usage: float,
    prefix_hit_rate: float | None,
) -> Line:
    """The periodic stats line of vllm/v1/metrics/loggers.py, logged by the frontend every
    VLLM_LOG_STATS_INTERVAL seconds while busy."""
    parts = [
        f"Engine 000: Avg prompt throughput: {prompt_tps:.1f} tokens/s",
        f"Avg generation throughput: {generation_tps:.1f} tokens/s",
        f"Running: {running} reqs",
        f"Waiting: {waiting} reqs",
    ]
    if style.modern and preemptions:
        parts.append(f"Preemptions: {preemptions}")
    parts.append(f"GPU KV cache usage: {kv_usage * 100:.1f}%")
    if prefix_hit_rate is not None:
        parts.append(f"Prefix cache hit rate: {prefix_hit_rate * 100:.1f}%")
    return ("loggers.py:259" if style.modern else "loggers.py:123"), ", ".join(parts)


# --- sleep mode (vllm/v1/worker/gpu_worker.py, vllm/v1/executor/abstract.py) ----------------


def sleep_freed(style: Style, freed: int, in_use: int) -> Line:
    """The worker's measurement as it falls asleep: `format_gib` (0.14-0.33) or `%.2f`."""
    return ("gpu_worker.py:335" if style.modern else "gpu_worker.py:117"), (
        f"Sleep mode freed {_gib(style, freed)} GiB memory, {_gib(style, in_use)} GiB memory is "
        "still in use."
    )


def fell_asleep(seconds: float) -> Line:
    return "abstract.py:408", f"It took {seconds:.6f} seconds to fall asleep."


def woke_up(seconds: float, tags_text: str) -> Line:
    """`tags_text`: the tags asked for (a list's repr), or the set of those that slept."""
    return "abstract.py:426", f"It took {seconds:.6f} seconds to wake up tags {tags_text}."


def wake_up_request(style: Style, tags: list[str] | None) -> Line:
    return ("api_router.py:50" if style.modern else "api_server.py:1088"), (
        f"wake up the engine with tags: {tags}"
    )


# --- startup failures (vllm/v1/worker/utils.py, vllm/v1/core/kv_cache_planning.py) -----------


def free_memory_error(style: Style, mem_free: int, mem_total: int, util: float) -> str:
    """`vllm/v1/worker/utils.py:request_memory`; older text lacks `cuda:0`."""
    device = "cuda:0 " if style.modern else ""
    return (
        f"ValueError: Free memory on device {device}({gib(mem_free):.2f}/{gib(mem_total):.2f} GiB) "
        f"on startup is less than desired GPU memory utilization ({util}, "
        f"{gib(util * mem_total):.2f} GiB). Decrease GPU memory utilization or reduce GPU memory "
        "used by other processes."
    )


def profiling_error(initial_free: int, current_free: int) -> str:
    return (
        f"AssertionError: Error in memory profiling. Initial free memory {gib(initial_free):.2f} "
        f"GiB, current free memory {gib(current_free):.2f} GiB. This happens when other processes "
        "sharing the same container release GPU memory while vLLM is profiling during "
        "initialization. To fix this, ensure consistent GPU memory allocation or isolate vLLM in "
        "its own container."
    )


def max_seq_len_error(max_model_len: int, needed: int, available: int, estimated: int) -> str:
    # The stray "(" before the GiB figure is in vLLM's source (kv_cache_planning.py).
    return (
        f"ValueError: To serve at least one request with the model's max seq len "
        f"({max_model_len}), ({needed / GIB:.2f} GiB KV cache is needed, which is larger than the "
        f"available KV cache memory ({available / GIB:.2f} GiB). Based on the available memory, "
        f"the estimated maximum model length is {estimated}. Try increasing "
        "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
    )


def no_cache_memory_error() -> str:
    return (
        "ValueError: No available memory for the cache blocks. Try increasing "
        "`gpu_memory_utilization` when initializing the engine."
    )


def weights_oom_error() -> str:
    return "RuntimeError: Failed to load model - not enough GPU memory."


def kv_oom_error(nbytes: int, mem_total: int, mem_free: int) -> str:
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {gib(nbytes):.2f} GiB. "
        f"GPU 0 has a total capacity of {gib(mem_total):.2f} GiB of which {gib(mem_free):.2f} GiB "
        "is free."
    )


def headless_executor(version: str, head_address: str) -> Line:
    """A headless node of multi-node tensor/pipeline parallelism joining its head
    (vllm/entrypoints/cli/serve.py:224-229 of 0.33.0)."""
    return "serve.py:224", (
        f"Launching vLLM (v{version}) headless multiproc executor, with head node address "
        f"{head_address} for torch.distributed process group."
    )


def headless_data_parallel(engines: int, handshake_address: str) -> Line:
    """A headless node of data parallelism joining its head (serve.py:239-244 of 0.33.0)."""
    return "serve.py:239", (
        f"Launching {engines} data parallel engine(s) in headless mode, with head node address "
        f"{handshake_address}."
    )
