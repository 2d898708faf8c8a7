"""vLLM startup logs: what an engine loaded, reserved and reported while starting.

:func:`parse_startup_log` reads container log text from any vLLM release since early 2025 (V0
and V1 engines, up to 0.33):
lines with or without a process prefix (``(APIServer pid=1)``, ``(EngineCore_DP0 pid=…)``,
``(VllmWorker rank=0 pid=…)``), with brackets around ``file.py:LINE`` or without, behind a docker
compose ``service  | `` prefix, a ``docker logs --timestamps`` stamp or a journald prefix, with
GiB printed as ``6.9``, ``%.2f`` or ``%.4f``. Patterns are searched inside each line and never
name a source line number, which changes with every vLLM version.

A log can hold several startups (a container restarted); only the last one is reported, and
``startup_count`` says how many there were.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import Any

from collectors.redaction import mask_data

PHASES = ("unknown", "loading", "profiling", "kv_allocated", "ready", "failed")
_RANK = {phase: rank for rank, phase in enumerate(PHASES)}
_MAX_MESSAGE = 500


@dataclass(frozen=True)
class LogError:
    """A startup failure recognised in the log: a stable ``kind`` and vLLM's own one-line text."""

    kind: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "message": self.message}


@dataclass
class StartupLog:
    """What the last startup in a log said about itself. ``None`` always means "not logged".

    Sizes are GiB as vLLM printed them (vLLM's "GB" lines are GiB too). ``phase`` is one of
    :data:`PHASES`: ``kv_allocated`` once the KV cache size is logged (the point after which the
    next engine may start: a neighbour whose memory changes while an engine profiles makes
    that engine's budget wrong or fails it), ``ready`` once the API server serves,
    ``failed`` once a startup error is recognised. ``kv_cache_pinned`` is True for a
    ``--kv-cache-memory-bytes`` pool, False for a profiled one. ``cuda_graph_gib`` is the measured
    graph memory and ``cuda_graph_estimate_gib`` the pre-allocation estimate; both can be
    negative on GB10 (a profiler artefact there). ``startup_free_gib`` is the free memory vLLM
    saw when it started (on GB10 it follows MemFree). ``moe_backend`` / ``moe_quantization`` come
    from the MoE kernel line (e.g. "MARLIN", "NvFp4"). Timestamps are vLLM's own
    ``MM-DD HH:MM:SS`` (no year).
    """

    phase: str = "unknown"
    version: str | None = None
    startup_count: int = 0
    started_at: str | None = None
    ready_at: str | None = None
    startup_seconds: float | None = None
    init_engine_seconds: float | None = None
    weights_gib: float | None = None
    weights_load_seconds: float | None = None
    kv_cache_gib: float | None = None
    kv_cache_pinned: bool | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    concurrency_for_tokens: int | None = None
    num_gpu_blocks: int | None = None
    cuda_graph_gib: float | None = None
    cuda_graph_estimate_gib: float | None = None
    startup_free_gib: float | None = None
    device_total_gib: float | None = None
    moe_backend: str | None = None
    moe_quantization: str | None = None
    attention_backend: str | None = None
    backends: list[str] = field(default_factory=list)
    engine_config: dict[str, str | None] = field(default_factory=dict)
    non_default_args: dict[str, Any] | None = None
    unknown_env_vars: list[str] = field(default_factory=list)
    errors: list[LogError] = field(default_factory=list)

    @property
    def recognised(self) -> bool:
        """False when not a single vLLM startup line was found."""
        return self.phase != "unknown"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StartupLog:
        """Inverse of :meth:`as_dict`, so a stored parse can feed the config checks again."""
        known = {item.name for item in fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        values["errors"] = [LogError(**error) for error in data.get("errors", [])]
        return cls(**values)

    def as_dict(self) -> dict[str, Any]:
        """Every field as JSON-ready values; unknown numbers stay ``None``, never 0."""
        return {
            "phase": self.phase,
            "version": self.version,
            "startup_count": self.startup_count,
            "started_at": self.started_at,
            "ready_at": self.ready_at,
            "startup_seconds": self.startup_seconds,
            "init_engine_seconds": self.init_engine_seconds,
            "weights_gib": self.weights_gib,
            "weights_load_seconds": self.weights_load_seconds,
            "kv_cache_gib": self.kv_cache_gib,
            "kv_cache_pinned": self.kv_cache_pinned,
            "kv_cache_tokens": self.kv_cache_tokens,
            "max_concurrency": self.max_concurrency,
            "concurrency_for_tokens": self.concurrency_for_tokens,
            "num_gpu_blocks": self.num_gpu_blocks,
            "cuda_graph_gib": self.cuda_graph_gib,
            "cuda_graph_estimate_gib": self.cuda_graph_estimate_gib,
            "startup_free_gib": self.startup_free_gib,
            "device_total_gib": self.device_total_gib,
            "moe_backend": self.moe_backend,
            "moe_quantization": self.moe_quantization,
            "attention_backend": self.attention_backend,
            "backends": list(self.backends),
            "engine_config": dict(self.engine_config),
            "non_default_args": self.non_default_args,
            "unknown_env_vars": list(self.unknown_env_vars),
            "errors": [error.as_dict() for error in self.errors],
        }


def parse_startup_log(text: str) -> StartupLog:
    """Parse container log text; the last startup in it wins.

    Never raises on odd input: a log without any recognised vLLM line gives ``phase="unknown"``.
    Linear in the size of the text.
    """
    parser = StartupLogParser()
    parser.feed(text)
    return parser.result()


class StartupLogParser:
    """:func:`parse_startup_log` for a log read in pieces: feeding the pieces one after the
    other gives what parsing their concatenation gives, as long as each piece ends at a line's
    end. The state is the last startup's facts, so it stays small however long the log is."""

    def __init__(self) -> None:
        self._builder = _Startup()
        self._startups = 0
        self.lines_read = 0

    def feed(self, text: str) -> None:
        """Take in more complete lines of the log. Linear in the size of ``text``."""
        for raw_line in text.splitlines():
            self.lines_read += 1
            if _RUNTIME_CHATTER.search(raw_line):
                continue
            line = _parse_line(raw_line)
            if line is None:
                continue
            if self._builder.starts_new_startup(line.message):
                self._builder = _Startup()
            if self._builder.feed(line) and not self._builder.counted:
                self._builder.counted = True
                self._startups += 1

    def result(self) -> StartupLog:
        """What the last startup so far said (a copy: feeding more later does not change it)."""
        result = self._builder.result()
        result.startup_count = self._startups
        return result


# --- one line -------------------------------------------------------------------------------------

# The bulk of a long-running engine's log: periodic stats (every VLLM_LOG_STATS_INTERVAL s, from
# vllm/v1/metrics/loggers.py) and HTTP access lines.
# Skipping them first keeps a large log cheap to parse.
_RUNTIME_CHATTER = re.compile(r"Avg prompt throughput|SpecDecoding metrics|HTTP/[\d.]+\" \d{3}")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# `(<Proc> pid=N) LEVEL MM-DD HH:MM:SS [file.py:LINE] message`, or without the process part, or
# the older `LEVEL MM-DD HH:MM:SS file.py:LINE] message` (2025 and before). Searched, not anchored,
# so compose, docker-timestamp and journald prefixes in front do not matter.
_HEADER = re.compile(
    r"(?:\([^()]*?pid=\d+\)\s*)?"
    r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+"
    r"(?P<ts>\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d+)?\s+"
    r"\[?[^\s\]]+:\d+\]\s?"
)
_PROCESS_PREFIX = re.compile(r"\([^()]*?pid=\d+\)\s*")


@dataclass(frozen=True)
class _Line:
    message: str
    timestamp: str | None


def _parse_line(raw_line: str) -> _Line | None:
    line = _ANSI.sub("", raw_line).strip()
    if not line:
        return None
    header = _HEADER.search(line)
    if header is not None:
        return _Line(line[header.end() :].strip(), header.group("ts"))
    prefix = _PROCESS_PREFIX.search(line)
    message = line[prefix.end() :] if prefix is not None else line
    return _Line(message.strip(), None)


# --- patterns: vLLM's memory-planning and server-ready lines, current texts and older variants ---

_NUM = r"(-?\d+(?:\.\d+)?)"
_INT = r"(\d[\d,]*)"

# Lines that begin a startup; the same kind twice means the engine started again.
_START_MARKERS = {
    "server_version": re.compile(r"vLLM API server version (\S+)"),
    "banner": re.compile(r"█\s+version\s+(\S+)"),
    "args": re.compile(r"non-default args: (\{.*\})\s*$"),
    "engine": re.compile(
        r"Initializing an? (?:V\d )?LLM engine \(v?([^)\s]+)\) with config: (.*)$"
    ),
}
_WEIGHTS = re.compile(r"Model loading took " + _NUM + r" (?:GiB|GB)(?: memory)? and " + _NUM + " s")
# Early-2025 V1 and V0 print "GB" but divide by 2**30: the value is GiB.
_WEIGHTS_OLD = re.compile(r"Loading model weights took " + _NUM + r" (?:GiB|GB)")
_LOADER_SECONDS = re.compile(r"Loading weights took " + _NUM + " seconds")
_LOADING = re.compile(r"Starting to load model")
_PROFILING = re.compile(
    r"Initial profiling/warmup run took|torch\.compile take|Memory profiling takes|"
    r"Profiling CUDA graph memory"
)
_GRAPH_ESTIMATE = re.compile(r"Estimated CUDA graph memory: " + _NUM + " GiB")
_KV_AVAILABLE = re.compile(r"Available KV cache memory: " + _NUM + " GiB")
_KV_PINNED = re.compile(
    r"Initial free memory " + _NUM + r" GiB, reserved " + _NUM + r" GiB memory for KV Cache as "
    r"specified by kv_cache_memory_bytes"
)
_STARTUP_PLAN = re.compile(
    r"Applying persisted startup plan .*?kv_cache_memory_bytes=\d+ \(" + _NUM + r" GiB\).*?"
    r"current " + _NUM + " GiB"
)
# "GPU" becomes the device type elsewhere, "GPU + host" with hisparse; one line or two.
_KV_TOKENS = re.compile(r"KV cache size: " + _INT + " tokens")
_CONCURRENCY = re.compile(r"Maximum concurrency for " + _INT + " tokens per request: " + _NUM + "x")
_GPU_BLOCKS = re.compile(r"# GPU blocks: (\d+)|num_gpu_blocks is: (\d+)")
_V0_BUDGET = re.compile(r"total_gpu_memory \(" + _NUM + r" ?GiB\) x gpu_memory_utilization")
_V0_PROFILE = re.compile(
    r"model weights take " + _NUM + r" ?GiB;.*reserved for KV Cache is " + _NUM + r" ?GiB"
)
_GRAPH_CAPTURED = re.compile(r"Graph capturing finished in \d+ secs?, took " + _NUM + " GiB")
_GRAPH_POOL = re.compile(r"CUDA graph pool memory: " + _NUM + r" GiB \(actual\)")
# Both the sizing advice and the "less than desired" error start like this; "cuda:0" since 2026.
_FREE_AT_START = re.compile(
    r"Free memory on device (?:\S+ )?\(" + _NUM + "/" + _NUM + r" GiB\) on startup"
)
_KV_IN_USE = re.compile(r"Current kv cache memory in use is " + _NUM + " GiB")
_INIT_ENGINE = re.compile(
    r"init engine \(profile, create kv cache, warmup model\) took " + _NUM + " s"
)
_READY = re.compile(r"Starting vLLM (?:API )?server(?: \d+)? on |Application startup complete")
_UNKNOWN_ENV = re.compile(r"Unknown vLLM environment variable detected: (\w+)")

# Backend choices as vLLM logs them, e.g. "Using 'MARLIN' NvFp4 MoE backend out of potential
# backends: […]", "Using FLASHINFER attention backend out of potential backends: […]",
# "Using AttentionBackendEnum.TRITON_ATTN backend.", "Using FlashInferCutlassNvFp4LinearKernel for
# NVFP4 GEMM", the 2025 "Using Flash Attention backend on V1 engine." and V0's "Using XFormers
# backend."
_MOE_BACKEND = re.compile(r"Using '?(\w+)'? (?:(\w+) )?MoE backend")
_ATTENTION_BACKEND = re.compile(
    r"Using (\w+) attention backend|Using AttentionBackendEnum\.(\w+) backend|"
    r"Using ([\w ]+?) backend on V1 engine|^Using ([A-Z][\w ]*?) backend\.$"
)
_ENCODER_ATTENTION = re.compile(r"Using AttentionBackendEnum\.(\w+) for MMEncoderAttention")
_MLA_PREFILL = re.compile(r"Using (\w+) MLA prefill backend")
_GEMM_KERNEL = re.compile(r"Using (\w+) for (\w+) GEMM")
_MARLIN_FP4 = re.compile(r"Weight-only FP4 compression will be used leveraging the Marlin kernel")

# (kind, pattern); the first match on a line wins. Texts of vLLM's startup failures
# (vllm/v1/worker/utils.py:request_memory, vllm/v1/core/kv_cache_planning.py, gpu_worker.py),
# plus vLLM's quantization check (ModelConfig._verify_quantization) and the CUDA runtime's PTX
# error (an image built with a newer CUDA than the host driver; on GB10 also `ptxas` refusing
# sm_121a).
_ERRORS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("free-memory-below-utilization", re.compile(r"Free memory on device.* is less than desired")),
    ("memory-profiling-error", re.compile(r"Error in memory profiling\.")),
    ("max-seq-len-too-long", re.compile(r"To serve at least one request with the model's max")),
    ("no-cache-memory", re.compile(r"No available memory for the cache blocks")),
    ("ptx-toolchain", re.compile(r"PTX was compiled with an unsupported toolchain|ptxas fatal")),
    ("not-enough-gpu-memory", re.compile(r"Failed to load model - not enough GPU memory")),
    (
        "quantization-mismatch",
        re.compile(r"Quantization method specified in the model config .* does not match"),
    ),
    # Generic symptoms, reported only when no specific cause above was found.
    ("cuda-out-of-memory", re.compile(r"CUDA out of memory")),
    ("engine-core-init-failed", re.compile(r"Engine core initialization failed")),
)
GENERIC_ERROR_KINDS = frozenset({"cuda-out-of-memory", "engine-core-init-failed"})
ERROR_KINDS = tuple(kind for kind, _ in _ERRORS)


# --- one startup ----------------------------------------------------------------------------------


class _Startup:
    """Accumulates one startup's facts; ``feed`` returns True when the line was recognised."""

    def __init__(self) -> None:
        self.log = StartupLog()
        self.rank = 0
        self.markers: set[str] = set()
        self.counted = False
        self.loader_seconds: float | None = None
        self.errors: dict[str, LogError] = {}

    def starts_new_startup(self, message: str) -> bool:
        """A start marker seen before, or any start of loading after the KV cache or a failure."""
        late = self.rank >= _RANK["kv_allocated"] or bool(self.errors)
        for kind, pattern in _START_MARKERS.items():
            if pattern.search(message):
                return kind in self.markers or late
        return late and bool(_WEIGHTS.search(message) or _WEIGHTS_OLD.search(message))

    def feed(self, line: _Line) -> bool:
        recognised = False
        for handler in _HANDLERS:
            recognised = handler(self, line) or recognised
        if recognised and line.timestamp and self.log.started_at is None:
            self.log.started_at = line.timestamp
        return recognised

    def reach(self, phase: str) -> None:
        self.rank = max(self.rank, _RANK[phase])

    def result(self) -> StartupLog:
        log = StartupLog.from_dict(self.log.as_dict())
        if log.weights_load_seconds is None:
            log.weights_load_seconds = self.loader_seconds
        log.errors = _without_generic_duplicates(list(self.errors.values()))
        log.phase = "failed" if log.errors else PHASES[self.rank]
        log.startup_seconds = _seconds_between(log.started_at, log.ready_at)
        return log


def _without_generic_duplicates(errors: list[LogError]) -> list[LogError]:
    specific = [error for error in errors if error.kind not in GENERIC_ERROR_KINDS]
    return specific or errors


def _seconds_between(start: str | None, end: str | None) -> float | None:
    """Seconds between two vLLM timestamps (``MM-DD HH:MM:SS``, no year; a new year wraps)."""
    if start is None or end is None:
        return None
    # 2024 is a leap year: 02-29 parses, and 366 days later is the same date a year on.
    try:
        first = datetime.strptime(f"2024-{start}", "%Y-%m-%d %H:%M:%S")
        last = datetime.strptime(f"2024-{end}", "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None
    if last < first:
        last += timedelta(days=366)
    return (last - first).total_seconds()


def _gib(match: re.Match[str], group: int = 1) -> float:
    return float(match.group(group))


def _int(match: re.Match[str], group: int = 1) -> int:
    return int(match.group(group).replace(",", ""))


# --- handlers: each reads one kind of line into the startup, returning True if it matched ---------


def _on_start_markers(startup: _Startup, line: _Line) -> bool:
    matched = False
    for kind, pattern in _START_MARKERS.items():
        match = pattern.search(line.message)
        if match is None:
            continue
        matched = True
        startup.markers.add(kind)
        startup.reach("loading")
        if kind == "args":
            # vLLM prints every non-default argument, --api-key's value included.
            startup.log.non_default_args = mask_data(parse_python_dict(match.group(1)))
            continue
        startup.log.version = match.group(1).removeprefix("v")
        if kind == "engine":
            startup.log.engine_config = mask_data(_engine_config(match.group(2)))
    return matched


def _on_weights(startup: _Startup, line: _Line) -> bool:
    if match := _WEIGHTS.search(line.message):
        startup.log.weights_gib = _gib(match)
        startup.log.weights_load_seconds = _gib(match, 2)
    elif match := _WEIGHTS_OLD.search(line.message):
        startup.log.weights_gib = _gib(match)
    elif match := _LOADER_SECONDS.search(line.message):
        startup.loader_seconds = _gib(match)
        startup.reach("loading")
        return True
    elif _LOADING.search(line.message):
        startup.reach("loading")
        return True
    else:
        return False
    startup.reach("profiling")
    return True


def _on_profiling(startup: _Startup, line: _Line) -> bool:
    if match := _GRAPH_ESTIMATE.search(line.message):
        startup.log.cuda_graph_estimate_gib = _gib(match)
    elif match := _V0_BUDGET.search(line.message):
        startup.log.device_total_gib = _gib(match)
    elif match := _STARTUP_PLAN.search(line.message):
        startup.log.kv_cache_gib = _gib(match)
        startup.log.kv_cache_pinned = True
        startup.log.startup_free_gib = _gib(match, 2)
    elif not _PROFILING.search(line.message):
        return False
    startup.reach("profiling")
    return True


def _on_kv_budget(startup: _Startup, line: _Line) -> bool:
    log = startup.log
    if match := _KV_PINNED.search(line.message):
        log.startup_free_gib = _gib(match)
        log.kv_cache_gib = _gib(match, 2)
        log.kv_cache_pinned = True
    elif match := _KV_AVAILABLE.search(line.message):
        log.kv_cache_gib = _gib(match)
        log.kv_cache_pinned = False
    elif match := _V0_PROFILE.search(line.message):
        if log.weights_gib is None:
            log.weights_gib = _gib(match)
        log.kv_cache_gib = _gib(match, 2)
        log.kv_cache_pinned = False
    else:
        return False
    startup.reach("kv_allocated")
    return True


def _on_kv_capacity(startup: _Startup, line: _Line) -> bool:
    log = startup.log
    matched = False
    if match := _KV_TOKENS.search(line.message):
        log.kv_cache_tokens = _int(match)
        matched = True
    if match := _CONCURRENCY.search(line.message):
        log.concurrency_for_tokens = _int(match)
        log.max_concurrency = _gib(match, 2)
        matched = True
    if match := _GPU_BLOCKS.search(line.message):
        log.num_gpu_blocks = int(match.group(1) or match.group(2))
        matched = True
    if matched:
        startup.reach("kv_allocated")
    return matched


def _on_graphs_and_init(startup: _Startup, line: _Line) -> bool:
    log = startup.log
    if match := _GRAPH_CAPTURED.search(line.message) or _GRAPH_POOL.search(line.message):
        log.cuda_graph_gib = _gib(match)
    elif match := _INIT_ENGINE.search(line.message):
        log.init_engine_seconds = _gib(match)
    else:
        return False
    startup.reach("kv_allocated")
    return True


def _on_free_memory(startup: _Startup, line: _Line) -> bool:
    log = startup.log
    matched = False
    if match := _FREE_AT_START.search(line.message):
        log.startup_free_gib = _gib(match)
        log.device_total_gib = _gib(match, 2)
        matched = True
    if (match := _KV_IN_USE.search(line.message)) and log.kv_cache_gib is None:
        log.kv_cache_gib = _gib(match)
        log.kv_cache_pinned = False
        matched = True
    return matched


def _on_ready(startup: _Startup, line: _Line) -> bool:
    if not _READY.search(line.message):
        return False
    startup.reach("ready")
    if line.timestamp is not None:
        startup.log.ready_at = line.timestamp
    return True


def _on_backends(startup: _Startup, line: _Line) -> bool:
    label = _backend_label(startup, line.message)
    if label is None:
        return False
    if label not in startup.log.backends:
        startup.log.backends.append(label)
    return True


def _backend_label(startup: _Startup, message: str) -> str | None:
    if match := _MOE_BACKEND.search(message):
        startup.log.moe_backend = match.group(1)
        startup.log.moe_quantization = match.group(2)
        kind = f"MoE ({match.group(2)})" if match.group(2) else "MoE"
        return f"{kind}: {match.group(1)}"
    if match := _ENCODER_ATTENTION.search(message):
        return f"encoder attention: {match.group(1)}"
    if match := _MLA_PREFILL.search(message):
        return f"MLA prefill: {match.group(1)}"
    if match := _GEMM_KERNEL.search(message):
        return f"{match.group(2)} GEMM: {match.group(1)}"
    if _MARLIN_FP4.search(message):
        return "FP4 GEMM: Marlin (weight-only)"
    if match := _ATTENTION_BACKEND.search(message):
        name = next(group for group in match.groups() if group)
        startup.log.attention_backend = name
        return f"attention: {name}"
    return None


def _on_env(startup: _Startup, line: _Line) -> bool:
    match = _UNKNOWN_ENV.search(line.message)
    if match is None:
        return False
    if match.group(1) not in startup.log.unknown_env_vars:
        startup.log.unknown_env_vars.append(match.group(1))
    return True


def _on_errors(startup: _Startup, line: _Line) -> bool:
    for kind, pattern in _ERRORS:
        if pattern.search(line.message):
            # The same failure is printed by the engine and again by the API server: keep the first.
            startup.errors.setdefault(kind, LogError(kind, _one_line(line.message)))
            return True
    return False


def _one_line(message: str) -> str:
    if len(message) <= _MAX_MESSAGE:
        return message
    return message[: _MAX_MESSAGE - 1] + "…"


_HANDLERS: tuple[Callable[[_Startup, _Line], bool], ...] = (
    _on_start_markers,
    _on_weights,
    _on_profiling,
    _on_kv_budget,
    _on_kv_capacity,
    _on_graphs_and_init,
    _on_free_memory,
    _on_ready,
    _on_backends,
    _on_env,
    _on_errors,
)


# --- structured parts of a line -------------------------------------------------------------------

_ENGINE_CONFIG_KEYS = (
    "model",
    "served_model_name",
    "dtype",
    "max_seq_len",
    "quantization",
    "kv_cache_dtype",
    "enforce_eager",
    "tensor_parallel_size",
)


def _engine_config(text: str) -> dict[str, str | None]:
    """The few keys of the "Initializing … engine" line that describe memory and speed."""
    config: dict[str, str | None] = {}
    for key in _ENGINE_CONFIG_KEYS:
        match = re.search(rf"(?:^|, ){key}=('[^']*'|[^,\s]+)", text)
        if match is not None:
            value = match.group(1).strip("'")
            config[key] = None if value == "None" else value
    return config


# What ast.literal_eval raises on text that is not a (reasonable) literal, deep nesting included.
_NOT_A_LITERAL = (ValueError, TypeError, SyntaxError, MemoryError, RecursionError)


def parse_python_dict(text: str) -> dict[str, Any] | None:
    """Read the ``non-default args: {…}`` dict vLLM prints with ``repr``.

    Literal values become Python values (tuples as lists); a value that is not a literal (an enum
    or a config object's repr) is kept as its text. ``None`` if the text is not a dict at all.
    """
    try:
        parsed = ast.literal_eval(text)
    except _NOT_A_LITERAL:
        return _dict_by_items(text)
    return {str(k): _jsonable(v) for k, v in parsed.items()} if isinstance(parsed, dict) else None


def _dict_by_items(text: str) -> dict[str, Any] | None:
    body = text.strip()
    if not (body.startswith("{") and body.endswith("}")):
        return None
    result: dict[str, Any] = {}
    for item in _top_level_items(body[1:-1]):
        key_text, separator, value_text = item.partition(":")
        if not separator:
            return None
        try:
            key = ast.literal_eval(key_text.strip())
        except _NOT_A_LITERAL:
            return None
        result[str(key)] = _literal_or_text(value_text.strip())
    return result


def _literal_or_text(text: str) -> Any:
    try:
        return _jsonable(ast.literal_eval(text))
    except _NOT_A_LITERAL:
        return text


def _top_level_items(body: str) -> list[str]:
    """Split on commas outside brackets and quotes."""
    items: list[str] = []
    depth, quote, start = 0, "", 0
    for index, char in enumerate(body):
        if quote:
            quote = "" if char == quote and body[index - 1] != "\\" else quote
        elif char in "'\"":
            quote = char
        elif char in "([{<":
            depth += 1
        elif char in ")]}>":
            depth -= 1
        elif char == "," and depth == 0:
            items.append(body[start:index])
            start = index + 1
    if body[start:].strip():
        items.append(body[start:])
    return items


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    return value
