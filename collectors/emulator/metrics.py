"""The engine's Prometheus metrics, named and labelled like the impersonated vLLM release.

Families follow `PrometheusStatLogger` in vllm/v1/metrics/loggers.py of the 0.33.0 wheel, and
for the `0.10` style the names before vLLM PRs #18354 and #29330 renamed them; buckets are the
defaults of `vllm/v1/metrics/buckets.py`. Every engine series carries `model_name` (first served
name, else the model) and `engine="0"`; `cache_config_info` carries every CacheConfig field
(`vllm/config/cache.py:metrics_info`) plus `engine`, and no `model_name`.

All series are created when the engine initialises (as vLLM pre-creates them), so a scrape right
after startup already shows zeros and a restart shows fresh `_created` times and reset counters.
With speculative decoding the four counters of `SpecDecodingProm` (vllm/v1/spec_decode/metrics.py)
are declared too: drafts, draft tokens, accepted tokens, and accepted tokens per draft position
(`position` "0" to k-1).
"""

from __future__ import annotations

import os
import platform
import resource
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from .exposition import Family, Series, go_float, render_family
from .styles import Style

# vLLM's default buckets (vllm/v1/metrics/buckets.py).
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)


def one_two_five_buckets(limit: int) -> list[int]:
    """vLLM's `build_1_2_5_buckets`: 1, 2, 5, 10, 20, 50, … up to `limit`."""
    buckets: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > limit:
                return buckets
            buckets.append(value)
        exponent += 1


@dataclass(frozen=True)
class FinishedRequest:
    """What the metrics need to know about a request when it leaves the engine."""

    finished_reason: str
    prompt_tokens: int
    computed_prompt_tokens: int
    generation_tokens: int
    max_tokens: int
    num_preemptions: int
    queue_seconds: float
    prefill_seconds: float
    decode_seconds: float
    inference_seconds: float
    e2e_seconds: float


@dataclass(frozen=True)
class EngineGauges:
    """The scheduler's state at scrape time."""

    running: int
    waiting: int
    kv_usage: float


class EngineMetrics:
    """vLLM's `PrometheusStatLogger` for one engine. Thread-safe; every method is O(buckets)."""

    # fmt: off
    def __init__(
        self,
        style: Style,
        *,
        model_name: str,
        max_model_len: int,
        cache_config: dict[str, str],
        engine: str = "0",
        num_speculative_tokens: int | None = None,
    ) -> None:
        self.style = style
        self._lock = threading.Lock()
        self._base = {"model_name": model_name, "engine": engine}
        self._families: list[Family] = []
        # Declaration order is exposition order, as in vLLM's PrometheusStatLogger.
        self._declare_gauges(style)
        self._declare_counters(style)
        self._declare_spec_decode(num_speculative_tokens)
        self._declare_token_histograms(style, one_two_five_buckets(max_model_len))
        self._declare_latency_histograms(style)
        # loggers.py:log_metrics_info: labels are the CacheConfig fields plus `engine`, never
        # `model_name`.
        info = Family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig",
                      (*cache_config, "engine"))
        info.series(**cache_config, engine=engine).set(1)
        self._families.append(info)

    def _declare_gauges(self, style: Style) -> None:
        """The scheduler-state gauges: running, waiting (by reason), KV usage, sleep state."""
        modern = style.modern
        self.running = self._single("vllm:num_requests_running", "gauge",
                                    "Number of requests in model execution batches.")
        self.waiting = self._single("vllm:num_requests_waiting", "gauge",
                                    "Number of requests waiting to be processed.")
        self.waiting_capacity: Series | None = None
        self.sleep_state: dict[str, Series] = {}
        if modern:
            by_reason = self._labelled("vllm:num_requests_waiting_by_reason", "gauge",
                                       "Number of requests waiting to be processed, by reason.",
                                       "reason", ("capacity", "deferred"))
            self.waiting_capacity = by_reason["capacity"]
        self.kv_usage = self._single(style.kv_usage_metric, "gauge",
                                     ("" if modern else "GPU ")
                                     + "KV-cache usage. 1 means 100 percent usage.")
        if modern:
            sleep = self._labelled("vllm:engine_sleep_state", "gauge",
                                   "Engine sleep state; awake = 0 means engine is sleeping; "
                                   "awake = 1 means engine is awake; weights_offloaded = 1 means "
                                   "sleep level 1; discard_all = 1 means sleep level 2.",
                                   "sleep_state", ("awake", "weights_offloaded", "discard_all"))
            sleep["awake"].set(1)
            self.sleep_state = sleep

    def _declare_counters(self, style: Style) -> None:
        """The token and request counters (exposed with `_total` and a `_created` twin)."""
        modern = style.modern
        self.prefix_queries = self._single(style.prefix_queries_metric, "counter",
                                           "Prefix cache queries, in terms of number of queried "
                                           "tokens.")
        self.prefix_hits = self._single(style.prefix_hits_metric, "counter",
                                        "Prefix cache hits, in terms of number of cached tokens.")
        self.preemptions = self._single("vllm:num_preemptions", "counter",
                                        "Cumulative number of preemption from the engine.")
        self.prompt_tokens = self._single("vllm:prompt_tokens", "counter",
                                          "Number of prefill tokens processed.")
        self.prompt_by_source: dict[str, Series] = {}
        self.prompt_cached: Series | None = None
        if modern:
            self.prompt_by_source = self._labelled(
                "vllm:prompt_tokens_by_source", "counter", "Number of prompt tokens by source.",
                "source", ("local_compute", "local_cache_hit", "external_kv_transfer"))
            self.prompt_cached = self._single("vllm:prompt_tokens_cached", "counter",
                                              "Number of cached prompt tokens (local + external).")
        self.generation_tokens = self._single("vllm:generation_tokens", "counter",
                                              "Number of generation tokens processed.")
        reasons = ("stop", "length", "abort") + (("error", "repetition") if modern else ())
        self.success = self._labelled("vllm:request_success", "counter",
                                      "Count of successfully processed requests.",
                                      "finished_reason", reasons)

    def _declare_spec_decode(self, num_speculative_tokens: int | None) -> None:
        """`SpecDecodingProm`'s counters, only with --speculative-config (as in vLLM)."""
        self.spec: dict[str, Series] = {}
        self.spec_per_position: list[Series] = []
        if num_speculative_tokens is None:
            return
        for key, name, doc in (
            ("drafts", "vllm:spec_decode_num_drafts", "Number of spec decoding drafts."),
            ("draft_tokens", "vllm:spec_decode_num_draft_tokens", "Number of draft tokens."),
            ("accepted", "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."),
        ):
            self.spec[key] = self._single(name, "counter", doc)
        positions = self._labelled("vllm:spec_decode_num_accepted_tokens_per_pos", "counter",
                                   "Accepted tokens per draft position.", "position",
                                   [str(p) for p in range(num_speculative_tokens)])
        self.spec_per_position = list(positions.values())

    def _declare_token_histograms(self, style: Style, lengths: Sequence[int]) -> None:
        """Histograms counted in tokens or request parameters; ``lengths`` are the 1-2-5
        buckets up to max_model_len."""
        modern = style.modern
        self.h_prompt = self._single("vllm:request_prompt_tokens", "histogram",
                                     "Number of prefill tokens processed.", lengths)
        self.h_generation = self._single("vllm:request_generation_tokens", "histogram",
                                         "Number of generation tokens processed.", lengths)
        self.h_kv_computed: Series | None = None
        if modern:
            self.h_kv_computed = self._single(
                "vllm:request_prefill_kv_computed_tokens", "histogram",
                "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
                lengths)
        self.h_iteration = self._single("vllm:iteration_tokens_total", "histogram",
                                        "Histogram of number of tokens per engine_step.",
                                        ITERATION_TOKEN_BUCKETS)
        self.h_max_generation = self._single(
            "vllm:request_max_num_generation_tokens", "histogram",
            "Histogram of maximum number of requested generation tokens.", lengths)
        self.h_params_n = self._single("vllm:request_params_n", "histogram",
                                       "Histogram of the n request parameter.", PARAMS_N_BUCKETS)
        self.h_params_max_tokens = self._single("vllm:request_params_max_tokens", "histogram",
                                                "Histogram of the max_tokens request parameter.",
                                                lengths)

    def _declare_latency_histograms(self, style: Style) -> None:
        """Histograms counted in seconds (TTFT, ITL/TPOT, request phases) and preemptions."""
        modern = style.modern
        self.h_ttft = self._single("vllm:time_to_first_token_seconds", "histogram",
                                   "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self.h_itl = self._single(style.inter_token_metric, "histogram",
                                  "Histogram of inter-token latency in seconds." if modern
                                  else "Histogram of time per output token in seconds.",
                                  ITL_BUCKETS)
        self.h_tpot: Series | None = None
        if modern:
            self.h_tpot = self._single("vllm:request_time_per_output_token_seconds", "histogram",
                                       "Histogram of time_per_output_token_seconds per request.",
                                       ITL_BUCKETS)
        self.h_latency = {
            key: self._single(name, "histogram", doc, REQUEST_LATENCY_BUCKETS)
            for key, name, doc in (
                ("e2e", "vllm:e2e_request_latency_seconds",
                 "Histogram of e2e request latency in seconds."),
                ("queue", "vllm:request_queue_time_seconds",
                 "Histogram of time spent in WAITING phase for request."),
                ("inference", "vllm:request_inference_time_seconds",
                 "Histogram of time spent in RUNNING phase for request."),
                ("prefill", "vllm:request_prefill_time_seconds",
                 "Histogram of time spent in PREFILL phase for request."),
                ("decode", "vllm:request_decode_time_seconds",
                 "Histogram of time spent in DECODE phase for request."),
            )
        }
        self.h_preemptions: Series | None = None
        if modern:
            self.h_preemptions = self._single("vllm:request_num_preemptions", "histogram",
                                              "Number of preemptions per finished request.",
                                              PREEMPTION_BUCKETS)
    # fmt: on

    def _single(
        self, name: str, kind: str, doc: str, buckets: Sequence[float] | None = None
    ) -> Series:
        """Declare a family with the base labels and return its one series."""
        family = Family(name, kind, doc, ("model_name", "engine"), buckets)
        self._families.append(family)
        return family.series(**self._base)

    def _labelled(
        self, name: str, kind: str, doc: str, label: str, values: Sequence[str]
    ) -> dict[str, Series]:
        """Declare a family with one extra label and pre-create a series per value."""
        family = Family(name, kind, doc, ("model_name", "engine", label))
        self._families.append(family)
        return {value: family.series(**self._base, **{label: value}) for value in values}

    # --- recording, called by the engine under its own lock -------------------------------------

    def record_prefix(self, queries: int, hits: int) -> None:
        with self._lock:
            self.prefix_queries.inc(queries)
            self.prefix_hits.inc(hits)

    def record_prompt(self, prompt_tokens: int, cached_tokens: int) -> None:
        """A prefill finished: vLLM's `prompt_tokens` counts the whole prompt, cached tokens
        included."""
        with self._lock:
            self.prompt_tokens.inc(prompt_tokens)
            if self.prompt_by_source:
                self.prompt_by_source["local_compute"].inc(prompt_tokens - cached_tokens)
                self.prompt_by_source["local_cache_hit"].inc(cached_tokens)
            if self.prompt_cached is not None:
                self.prompt_cached.inc(cached_tokens)

    def record_step(self, scheduled_tokens: int, generated_tokens: int) -> None:
        with self._lock:
            self.h_iteration.observe(scheduled_tokens)
            self.generation_tokens.inc(generated_tokens)

    def record_first_token(self, ttft_seconds: float) -> None:
        with self._lock:
            self.h_ttft.observe(ttft_seconds)

    def record_inter_token(self, seconds: float, tokens: int = 1) -> None:
        with self._lock:
            self.h_itl.observe(seconds, tokens)

    def record_spec_decode(self, drafts: int, draft_tokens: int, accepted: int,
                           per_position: Sequence[int]) -> None:
        """One step's drafts, as `SpecDecodingProm.observe` counts them."""
        if not self.spec:
            return
        with self._lock:
            self.spec["drafts"].inc(drafts)
            self.spec["draft_tokens"].inc(draft_tokens)
            self.spec["accepted"].inc(accepted)
            for series, count in zip(self.spec_per_position, per_position, strict=True):
                series.inc(count)

    def record_sleep_state(self, sleep: int = 0, level: int = 0) -> None:
        """vLLM's `PrometheusStatLogger.record_sleep_state` (vllm/v1/metrics/loggers.py:1335 of
        0.33): awake=1 unless asleep; weights_offloaded=1 at level 1, discard_all=1 at level 2."""
        if not self.sleep_state:
            return
        with self._lock:
            self.sleep_state["awake"].set(0 if sleep else 1)
            self.sleep_state["weights_offloaded"].set(1 if sleep and level == 1 else 0)
            self.sleep_state["discard_all"].set(1 if sleep and level == 2 else 0)

    def record_preemption(self) -> None:
        with self._lock:
            self.preemptions.inc()

    def record_finished(self, done: FinishedRequest) -> None:
        with self._lock:
            self.success[done.finished_reason].inc()
            self.h_prompt.observe(done.prompt_tokens)
            self.h_generation.observe(done.generation_tokens)
            self.h_max_generation.observe(done.max_tokens)
            self.h_params_n.observe(1)
            self.h_params_max_tokens.observe(done.max_tokens)
            if self.h_kv_computed is not None:
                self.h_kv_computed.observe(done.computed_prompt_tokens)
            if self.h_tpot is not None and done.generation_tokens > 1:
                self.h_tpot.observe(done.decode_seconds / (done.generation_tokens - 1))
            if self.h_preemptions is not None:
                self.h_preemptions.observe(done.num_preemptions)
            self.h_latency["e2e"].observe(done.e2e_seconds)
            self.h_latency["queue"].observe(done.queue_seconds)
            self.h_latency["inference"].observe(done.inference_seconds)
            self.h_latency["prefill"].observe(done.prefill_seconds)
            self.h_latency["decode"].observe(done.decode_seconds)

    def render(self, gauges: EngineGauges) -> list[str]:
        """Exposition lines of all engine families, gauges set from `gauges` first."""
        with self._lock:
            self.running.set(gauges.running)
            self.waiting.set(gauges.waiting)
            if self.waiting_capacity is not None:
                self.waiting_capacity.set(gauges.waiting)
            self.kv_usage.set(gauges.kv_usage)
            lines: list[str] = []
            for fam in self._families:
                lines += render_family(fam, self.style.sort_labels)
            return lines


# CacheConfig fields that the emulator never changes, by release line, in vLLM's field order.
# 2025 CacheConfig: swap space and CPU offload fields, no capacity labels yet.
_CACHE_CONFIG_FIXED_0_10 = {
    "swap_space": "4",
    "prefix_caching_hash_algo": "builtin",
    "cpu_offload_gb": "0",
    "calculate_kv_scales": "False",
    "swap_space_bytes": str(4 << 30),
}
_CACHE_CONFIG_FIXED_0_33 = {
    "kv_cache_layout": "None",
    "prefix_match_unit": "None",
    "prefix_caching_hash_algo": "sha256",
    "prefix_cache_retention_interval": "None",
    "kv_cache_dtype_skip_layers": "[]",
    "skip_page_size_padded": "None",
    "mamba_block_size": "None",
    "mamba_cache_dtype": "auto",
    "mamba_ssm_cache_dtype": "auto",
    "mamba_cache_mode": "none",
    "enable_mamba_shared_prefix_checkpoint": "False",
    "replayssm_buffer_len": "None",
    "use_replayssm": "False",
    "use_kda_recoverssm": "False",
    "simple_cpu_offload_num_blocks": "None",
    "swa_bounded_replay": "False",
    "kv_offloading_size": "None",
    "kv_offloading_backend": "None",
}


def cache_config_labels(
    style: Style,
    *,
    block_size: int,
    user_specified_block_size: bool,
    gpu_memory_utilization: float,
    cache_dtype: str,
    kv_cache_memory_bytes: int | None,
    num_gpu_blocks: int,
    enable_prefix_caching: bool,
    kv_cache_size_tokens: int,
    kv_cache_max_concurrency: float,
) -> dict[str, str]:
    """`CacheConfig.metrics_info()` (vllm/config/cache.py) as label strings for this style, in
    vLLM's field order (the order the `0.10` style exposes them in).

    Unset values are the string "None", as `str(None)` gives in vLLM.
    """
    block = str(block_size)
    common = {
        "block_size": block,
        "gpu_memory_utilization": str(gpu_memory_utilization),
        "cache_dtype": cache_dtype,
        "kv_cache_memory_bytes": str(kv_cache_memory_bytes),
        "num_gpu_blocks": str(num_gpu_blocks),
        "num_gpu_blocks_override": "None",
        "num_cpu_blocks": "None",
        "enable_prefix_caching": str(enable_prefix_caching),
        "is_attention_free": "False",
        "sliding_window": "None",
        "kv_sharing_fast_prefill": "False",
        "mamba_page_size_padded": "None",
    }
    if not style.modern:
        return {**common, **_CACHE_CONFIG_FIXED_0_10}
    return {
        **common,
        "user_specified_block_size": str(user_specified_block_size),
        **_CACHE_CONFIG_FIXED_0_33,
        "effective_attention_block_size": block,
        "kv_cache_size_tokens": str(kv_cache_size_tokens),
        "kv_cache_max_concurrency": str(round(kv_cache_max_concurrency, 2)),
        "hash_block_size": block,
        "cache_hit_alignment_tokens": block,
    }


# --- process and platform metrics (prometheus_client's default collectors) ---------------------


def _process_stat() -> tuple[float, float, int, int] | None:
    """(cpu seconds, start time since epoch, vsize bytes, rss bytes) from /proc/self/stat."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/stat") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime"))
    except (OSError, StopIteration, IndexError, ValueError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    # Field numbers from proc(5), minus the 3 consumed by the split at ")".
    utime, stime = int(fields[11]), int(fields[12])
    start_ticks, vsize, rss_pages = int(fields[19]), int(fields[20]), int(fields[21])
    return (
        (utime + stime) / ticks,
        btime + start_ticks / ticks,
        vsize,
        rss_pages * os.sysconf("SC_PAGE_SIZE"),
    )


def render_process_metrics() -> list[str]:
    """`python_info` and `process_*`, as prometheus_client's default registry exposes them.

    `process_start_time_seconds` is what lets a collector see a restart even before it notices
    counters going back to zero.
    """
    impl = platform.python_implementation()
    major, minor, patch = platform.python_version_tuple()
    lines = [
        "# HELP python_info Python platform information",
        "# TYPE python_info gauge",
        f'python_info{{implementation="{impl}",major="{major}",minor="{minor}",'
        f'patchlevel="{patch}",version="{platform.python_version()}"}} 1.0',
    ]
    stat = _process_stat()
    if stat is None:
        return lines
    cpu, start, vsize, rss = stat
    try:
        open_fds = len(os.listdir("/proc/self/fd"))
    except OSError:
        open_fds = 0
    max_fds = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    for name, kind, doc, value in (
        ("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", vsize),
        ("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", rss),
        ("process_start_time_seconds", "gauge",
         "Start time of the process since unix epoch in seconds.", start),
        ("process_cpu_seconds_total", "counter",
         "Total user and system CPU time spent in seconds.", cpu),
        ("process_open_fds", "gauge", "Number of open file descriptors.", open_fds),
        ("process_max_fds", "gauge", "Maximum number of open file descriptors.", max_fds),
    ):  # fmt: skip
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}", f"{name} {go_float(value)}"]
    return lines
