"""Engine start-up: loading → profiling → KV cache → CUDA graphs, with real memory at each step.

The order and texts are those of vLLM's memory-planning and server-ready lines, in the order a
real start prints them (vllm/v1/worker/gpu_worker.py, gpu_model_runner.py, kv_cache_utils.py,
vllm/entrypoints/...); durations are the `--emulator-*-seconds` flags (a real GB10 start takes
about ten minutes). What each phase holds, for real:

* loading — the weights, made resident gradually over the loading time (the part
  `--emulator-leak-on-stop` names at once, in a file that outlives the engine);
* profiling — additionally a peak activation buffer of `max_num_batched_tokens` tokens, released
  at the end (vLLM's profile run uses the same width as the largest prefill step);
* KV cache — the pool: exactly `--kv-cache-memory-bytes` when pinned, else what
  `planning.unpinned_pool_bytes` computes from `--gpu-memory-utilization` and MemFree at boot;
* graph capture — `--emulator-graph-bytes`, skipped with `--enforce-eager` as in vLLM.

A failure raises `StartupFailed` carrying vLLM's exception line; `report_failure` prints it the way
a dying EngineCore does. SIGTERM during start-up raises `Interrupted`.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

from . import messages
from .cli import EmulatorConfig
from .logs import API_PROCESS, VllmLog
from .memory import LeftBehind, Reservation, host_memory
from .planning import (
    KvPlan,
    estimated_max_model_len,
    kv_bytes_per_token,
    plan_kv,
    unpinned_pool_bytes,
)
from .units import GIB

LOAD_STEPS = 20
VLLM_ROOT = "/usr/local/lib/python3.12/dist-packages/vllm"

# Innermost frames of each failure's traceback: (file under vllm/, line, function, code).
Frame = tuple[str, int, str, str]
FRAMES_FREE_MEMORY: list[Frame] = [
    ("v1/worker/gpu_worker.py", 247, "init_device", "self.requested_memory = request_memory("),
    ("v1/worker/utils.py", 412, "request_memory", "raise ValueError("),
]
FRAMES_PROFILING: list[Frame] = [
    ("v1/worker/gpu_worker.py", 341, "determine_available_memory", "with memory_profiling("),
    ("utils/mem_utils.py", 298, "memory_profiling", "assert free_memory < init_free_memory"),
]
FRAMES_KV: list[Frame] = [
    ("v1/engine/core.py", 233, "_initialize_kv_caches", "kv_cache_configs = get_kv_cache_configs("),
    ("v1/core/kv_cache_utils.py", 702, "check_enough_kv_cache_memory", "raise ValueError("),
]
FRAMES_LOAD: list[Frame] = [
    ("v1/worker/gpu_model_runner.py", 3360, "load_model", "self.model = model_loader.load_model("),
]
FRAMES_KV_ALLOC: list[Frame] = [
    ("v1/worker/gpu_model_runner.py", 5012, "initialize_kv_cache_tensors", "torch.zeros("),
]


class StartupFailed(Exception):
    """The engine refused to start; `error` is the exception line vLLM prints last."""

    def __init__(self, error: str, frames: list[Frame]) -> None:
        super().__init__(error)
        self.error = error
        self.frames = frames


class Interrupted(Exception):
    """A stop was requested (SIGTERM) before the engine was ready."""


@dataclass
class Resources:
    """Everything an engine holds for its whole life; freed together at exit."""

    weights: Reservation | None = None
    kv: Reservation | None = None
    graphs: Reservation | None = None
    transient: list[Reservation] = field(default_factory=list)
    # The part of the weights that outlives the engine (--emulator-leak-on-stop): never freed.
    left_behind: LeftBehind | None = None

    def free_all(self) -> None:
        for reservation in (self.weights, self.kv, self.graphs, *self.transient):
            if reservation is not None:
                reservation.free()
        self.transient.clear()


class Startup:
    """Runs the start-up phases once; `run` returns the KV plan of the ready engine."""

    def __init__(
        self, config: EmulatorConfig, log: VllmLog, stop: threading.Event, resources: Resources
    ) -> None:
        self.config = config
        self.log = log
        self.stop = stop
        self.resources = resources
        self.style = config.style
        self.mem_total = 0
        self.boot_free = 0

    def _sleep(self, seconds: float) -> None:
        if seconds > 0 and self.stop.wait(seconds):
            raise Interrupted
        if self.stop.is_set():
            raise Interrupted

    def announce(self) -> None:
        """The API server's first lines (`non-default args`, the engine config), before the
        engine core starts."""
        c = self.config
        self.log.api(*messages.api_version(self.style, c.version))
        self.log.api(*messages.non_default_args(self.style, c.non_default_args))
        if c.max_model_len is not None:
            self.log.api(*messages.max_model_len(self.style, c.max_model_len))
        self.log.api(*messages.chunked_prefill(self.style, c.max_num_batched_tokens))

    def run(self) -> KvPlan:
        """The phases in order; a headless rank's workers log only their own lines (the engine
        configuration, the KV capacity and the engine's start-up time are the head's engine
        core's: vllm/v1/engine/core.py, vllm/v1/core/kv_cache_utils.py)."""
        c = self.config
        started = time.monotonic()
        if not c.rank.headless:
            self._log_engine_config()
        self._check_free_memory()
        self._load_weights()
        peak = self._profile()
        plan = self._size_kv(peak)
        self._allocate_kv(plan)
        self._capture_graphs()
        if self.style.modern and not plan.pinned:
            self._log_sizing_advice(plan, peak)
        if not c.rank.headless:
            self.log.core(*messages.init_engine_took(self.style, time.monotonic() - started))
        return plan

    def _log_engine_config(self) -> None:
        c = self.config
        self.log.core(
            *messages.engine_config(
                self.style,
                version=c.version,
                model=c.model,
                max_seq_len=c.max_model_len or 131072,
                quantization=c.quantization,
                enforce_eager=c.enforce_eager,
                kv_cache_dtype=c.kv_cache_dtype,
                served_model_name=c.model_name,
                enable_prefix_caching=c.enable_prefix_caching,
                moe_backend=c.moe_backend,
                speculative=messages.speculative_config_repr(
                    c.speculative.method, c.speculative.model, c.speculative.num_speculative_tokens)
                if c.speculative else "None",
            )
        )

    # --- phases ---------------------------------------------------------------------------------

    def _check_free_memory(self) -> None:
        """vLLM's pre-check `free >= util × total` (vllm/v1/worker/utils.py:request_memory),
        real only with --emulator-strict-memory."""
        c = self.config
        self.mem_total, self.boot_free = host_memory()
        requested = c.gpu_memory_utilization * self.mem_total
        shown_free = self.boot_free
        if c.fail == "free-memory":
            # A forced failure shows numbers shaped like a real one, not a measurement.
            shown_free = min(self.boot_free, int(requested * 0.97))
        elif not (c.strict_memory and self.boot_free < requested):
            return
        raise StartupFailed(
            messages.free_memory_error(
                self.style, shown_free, self.mem_total, c.gpu_memory_utilization
            ),
            FRAMES_FREE_MEMORY,
        )

    def _load_weights(self) -> None:
        c = self.config
        self.log.core(*messages.starting_to_load(c.model))
        started = time.monotonic()
        private = c.weights_bytes - c.leak_on_stop_bytes
        try:
            if c.leak_on_stop_bytes:
                # The first shard: held in a file the container's end does not free.
                self.resources.left_behind = LeftBehind(
                    c.leak_dir or "", c.leak_on_stop_bytes,
                    f"emulator-weights-{os.uname().nodename}-{c.port}-{time.time_ns()}")
            weights = Reservation(private)
        except (OSError, MemoryError):
            raise StartupFailed(messages.weights_oom_error(), FRAMES_LOAD) from None
        self.resources.weights = weights
        # Weights arrive shard by shard: memory grows over the loading time, as on a real node.
        for step in range(1, LOAD_STEPS + 1):
            weights.touch(private * step // LOAD_STEPS)
            self._sleep(c.load_seconds / LOAD_STEPS)
        elapsed = time.monotonic() - started
        self.log.core(*messages.loading_weights_took(elapsed))
        self.log.core(*messages.model_loading_took(self.style, c.weights_bytes, elapsed))

    def _profile(self) -> int:
        """Hold the profile run's activation peak; returns its size in bytes."""
        c = self.config
        started = time.monotonic()
        peak = c.max_num_batched_tokens * c.activation_bytes_per_token
        buffer = Reservation(peak, populate=True)
        self.resources.transient.append(buffer)
        try:
            self._sleep(c.profile_seconds)
        finally:
            buffer.free()
            self.resources.transient.remove(buffer)
        if self.style.modern or not c.enforce_eager:
            self.log.core(*messages.warmup_took(self.style, time.monotonic() - started))
        if self.style.modern and not c.enforce_eager:
            self.log.core(*messages.cudagraph_profile())
            self.log.core(*messages.estimated_cudagraph_memory(c.graph_bytes))
        self._check_profiling()
        return peak

    def _check_profiling(self) -> None:
        """vLLM asserts free memory fell while it profiled; a neighbour freeing memory breaks it."""
        c = self.config
        _, now_free = host_memory()
        if c.fail == "profiling":
            now_free = max(now_free, self.boot_free + max(c.weights_bytes, GIB))
        elif not (c.strict_memory and now_free >= self.boot_free):
            return
        raise StartupFailed(messages.profiling_error(self.boot_free, now_free), FRAMES_PROFILING)

    def _size_kv(self, peak: int) -> KvPlan:
        c = self.config
        pinned = c.kv_cache_memory_bytes is not None
        if c.kv_cache_memory_bytes is not None:
            pool = c.kv_cache_memory_bytes
            self.log.core(*messages.pinned_kv(self.style, self.boot_free, pool))
        else:
            pool = unpinned_pool_bytes(
                gpu_memory_utilization=c.gpu_memory_utilization,
                mem_total=self.mem_total,
                mem_free=self.boot_free,
                non_kv_bytes=c.weights_bytes + peak + c.graph_bytes,
                cap_bytes=c.kv_cap_bytes,
            )
            if pool <= 0:
                raise StartupFailed(messages.no_cache_memory_error(), FRAMES_KV)
            self.log.core(*messages.available_kv(self.style, pool))
            if self.style.modern and not c.enforce_eager:
                self.log.core(
                    *messages.cudagraph_accounting_note(
                        c.gpu_memory_utilization, c.graph_bytes, self.mem_total
                    )
                )
        plan = plan_kv(
            pool_bytes=pool,
            pinned=pinned,
            bytes_per_token=kv_bytes_per_token(c.kv_bytes_per_token, c.kv_cache_dtype),
            block_size=c.block_size,
            max_model_len=c.max_model_len,
        )
        if plan.num_gpu_blocks == 0:
            raise StartupFailed(messages.no_cache_memory_error(), FRAMES_KV)
        if c.max_model_len is None and not c.rank.headless:
            self.log.api(*messages.max_model_len(self.style, plan.max_model_len))
        needed = plan.max_model_len * plan.bytes_per_token
        if c.fail == "max-seq-len" or plan.tokens < plan.max_model_len:
            available = max(0, min(pool, needed - plan.block_size * plan.bytes_per_token))
            estimated = plan_kv(
                pool_bytes=available,
                pinned=pinned,
                bytes_per_token=plan.bytes_per_token,
                block_size=plan.block_size,
                max_model_len=plan.max_model_len,
            )
            raise StartupFailed(
                messages.max_seq_len_error(
                    plan.max_model_len, needed, available, estimated_max_model_len(estimated)
                ),
                FRAMES_KV,
            )
        return plan

    def _allocate_kv(self, plan: KvPlan) -> None:
        try:
            self.resources.kv = Reservation(plan.pool_bytes, populate=True)
        except (OSError, MemoryError):
            _, free = host_memory()
            raise StartupFailed(
                messages.kv_oom_error(plan.pool_bytes, self.mem_total, free), FRAMES_KV_ALLOC
            ) from None
        if not self.config.rank.headless:
            for line in messages.kv_capacity(self.style, plan):
                self.log.core(*line)

    def _capture_graphs(self) -> None:
        c = self.config
        if c.enforce_eager:
            return
        started = time.monotonic()
        self._sleep(c.graph_seconds)
        self.resources.graphs = Reservation(c.graph_bytes, populate=True)
        self.log.core(*messages.graph_capture(time.monotonic() - started, c.graph_bytes))
        if self.style.modern:
            self.log.core(*messages.graph_pool(c.graph_bytes, c.graph_bytes))

    def _log_sizing_advice(self, plan: KvPlan, peak: int) -> None:
        c = self.config
        non_kv = c.weights_bytes + peak + c.graph_bytes
        self.log.core(
            *messages.sizing_advice(
                mem_free=self.boot_free,
                mem_total=self.mem_total,
                util=c.gpu_memory_utilization,
                consumed=c.weights_bytes,
                peak_activation=peak,
                graph_bytes=c.graph_bytes,
                fit_bytes=plan.pool_bytes,
                full_bytes=max(self.boot_free - non_kv, 0),
                in_use=plan.pool_bytes,
            )
        )


def report_failure(log: VllmLog, failure: StartupFailed) -> None:
    """Print a failure as vLLM does: the EngineCore's ERROR traceback, then the API server's."""
    source = "core.py:1027" if log.style.modern else "core.py:700"
    log.engine_error(source, "EngineCore failed to start.")
    log.engine_error(source, "Traceback (most recent call last):")
    frames: list[Frame] = [
        (
            "v1/engine/core.py",
            1019,
            "run_engine_core",
            "engine_core = EngineCoreProc(*args, **kwargs)",
        ),
        *failure.frames,
    ]
    for path, line, function, code in frames:
        log.engine_error(source, f'  File "{VLLM_ROOT}/{path}", line {line}, in {function}')
        log.engine_error(source, f"    {code}")
    log.engine_error(source, failure.error)
    log.plain(API_PROCESS, "Traceback (most recent call last):")
    log.plain(API_PROCESS, '  File "/usr/local/bin/vllm", line 10, in <module>')
    log.plain(API_PROCESS, "    sys.exit(main())")
    log.plain(
        API_PROCESS,
        "RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {}",
    )
