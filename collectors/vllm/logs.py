"""vLLM startup logs: what an engine loaded, reserved and reported while starting.

:func:`parse_startup_log` reads container log text from any vLLM release since early 2025 (V0
and V1 engines, up to 0.33):
lines with or without a process prefix (``(APIServer pid=1)``, ``(EngineCore_DP0 pid=…)``,
``(VllmWorker rank=0 pid=…)``), with brackets around ``file.py:LINE`` or without, behind a docker
compose ``service  | `` prefix, a ``docker logs --timestamps`` stamp or a journald prefix, with
GiB printed as ``6.9``, ``%.2f`` or ``%.4f``. Patterns are searched inside each line and never
name a source line number, which changes with every vLLM version.

Each fact has one pattern and an anchor, the literal text its line starts with in vLLM's own
format string (the comments name the releases and the ``file:line`` of each). A line that holds
an anchor but not its pattern (``Model loading took nan GiB …``) is kept in
``StartupLog.unparsed`` with the fact's name: it is reported, never read as something else and
never silently dropped. Every pattern is checked against lines rendered from the format strings
of each minor release 0.6-0.33 (tests/fixtures/vllm_releases/).

A log can hold several startups (a container restarted); only the last one is reported, and
``startup_count`` says how many there were.

After it serves, an engine started with ``--enable-sleep-mode`` can be put to sleep and woken
(``POST /sleep?level=N``, ``/wake_up``); the lines it prints then (``It took … seconds to fall
asleep.``, ``Sleep mode freed … GiB memory, … GiB memory is still in use.``, ``It took …
seconds to wake up tags …``) make the phase a sleeping one and back. They do not say the
level, except 0.7's ``sleep the engine with level N``; vLLM's ``vllm:engine_sleep_state``
metric does (``collectors.vllm.sleep``).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import Any

from collectors.redaction import mask_data

# The phases of a startup, in the order an engine reaches them (or "failed").
STARTUP_PHASES = ("unknown", "loading", "profiling", "kv_allocated", "ready", "failed")
# A ready engine put to sleep (vLLM's sleep mode): not a step of its startup but a state it can
# enter and leave. By level (vllm/v1/engine/core.py ``EngineCore.sleep`` of 0.33): 1 offloads
# the weights to host memory and discards the KV cache, 2 discards both, 0 only pauses
# scheduling; "sleeping" when the level was not reported (the log alone does not say it).
SLEEP_PHASE_BY_LEVEL: dict[int | None, str] = {
    1: "sleeping_level_1", 2: "sleeping_level_2", 0: "paused", None: "sleeping",
}
SLEEPING_PHASES = tuple(SLEEP_PHASE_BY_LEVEL.values())
PHASE_WORDS = {
    "sleeping_level_1": "sleeping (level 1)",
    "sleeping_level_2": "sleeping (level 2)",
    "paused": "paused (sleep level 0)",
    "sleeping": "sleeping (level not reported)",
}
PHASES = STARTUP_PHASES + SLEEPING_PHASES
_RANK = {phase: rank for rank, phase in enumerate(STARTUP_PHASES)}
# The tags vLLM's sleep mode frees and restores (vllm/v1/executor/abstract.py:36 ``SLEEP_TAGS``).
SLEEP_TAGS = ("kv_cache", "weights")
_MAX_MESSAGE = 500
MAX_UNPARSED = 10


@dataclass(frozen=True)
class LogError:
    """A startup failure recognised in the log: a stable ``kind`` and vLLM's own one-line text."""

    kind: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "message": self.message}


@dataclass(frozen=True)
class UnparsedLine:
    """A line that looks like the one vLLM prints for ``fact`` but whose figures did not parse
    (e.g. ``nan`` or ``None`` where a number belongs): the fact stays unknown and this says why."""

    fact: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"fact": self.fact, "message": self.message}


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
    ``MM-DD HH:MM:SS`` (no year). ``unparsed`` lists lines of a known kind whose figures could
    not be read (at most :data:`MAX_UNPARSED`), so that a figure left unknown says why.

    Sleep mode: ``asleep`` is None while the log says nothing of it, True after the engine fell
    asleep, False once it woke up; ``sleeping_tags`` what is still asleep (``kv_cache``,
    ``weights``: a partial wake-up restores one); ``sleep_level`` the level asked for when the
    log says it (0.7); ``asleep_since`` the time it fell asleep; ``sleep_freed_gib`` and
    ``sleep_in_use_gib`` what vLLM measured when it fell asleep (device memory freed, and in use
    on the whole device after it; on GB10 that is the node's unified memory).
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
    asleep: bool | None = None
    sleep_level: int | None = None
    sleeping_tags: list[str] = field(default_factory=list)
    asleep_since: str | None = None
    sleep_freed_gib: float | None = None
    sleep_in_use_gib: float | None = None
    errors: list[LogError] = field(default_factory=list)
    unparsed: list[UnparsedLine] = field(default_factory=list)

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
        values["unparsed"] = [UnparsedLine(**line) for line in data.get("unparsed", [])]
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
            "asleep": self.asleep,
            "sleep_level": self.sleep_level,
            "sleeping_tags": list(self.sleeping_tags),
            "asleep_since": self.asleep_since,
            "sleep_freed_gib": self.sleep_freed_gib,
            "sleep_in_use_gib": self.sleep_in_use_gib,
            "errors": [error.as_dict() for error in self.errors],
            "unparsed": [line.as_dict() for line in self.unparsed],
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
    r"\[?(?P<source>[^\s\]]+):\d+\]\s?"
)
_PROCESS_PREFIX = re.compile(r"\([^()]*?pid=\d+\)\s*")


@dataclass(frozen=True)
class _Line:
    """One log line's message; ``source`` is the file name its header names ("cuda.py"; vLLM
    prints a shortened relative path at DEBUG level), None without a header."""

    message: str
    timestamp: str | None
    source: str | None = None


def _parse_line(raw_line: str) -> _Line | None:
    line = _ANSI.sub("", raw_line).strip()
    if not line:
        return None
    header = _HEADER.search(line)
    if header is not None:
        source = header.group("source").rsplit("/", 1)[-1]
        return _Line(line[header.end() :].strip(), header.group("ts"), source)
    prefix = _PROCESS_PREFIX.search(line)
    message = line[prefix.end() :] if prefix is not None else line
    return _Line(message.strip(), None)


# --- facts: vLLM's memory-planning and server-ready lines, current texts and older variants ----
#
# Release ranges and file:line are those of the newest release of each minor version, read from
# vLLM's source (tests/fixtures/vllm_releases/<version>.json holds every site).

_NUM = r"(-?\d+(?:\.\d+)?)"
_INT = r"(\d[\d,]*)"


@dataclass(frozen=True)
class _Fact:
    """One fact a line states: ``anchor`` is literal text of vLLM's format string that every
    variant of the line holds, ``pattern`` reads the figures. A line with the anchor that the
    pattern does not read is reported as unparsed."""

    name: str
    anchor: str
    pattern: re.Pattern[str]


# What each fact is, for people: a line whose figures did not parse leaves this unknown.
FACT_WORDS = {
    "weights": "the weights' memory",
    "weights_load_seconds": "the weights' loading time",
    "cuda_graph_estimate_gib": "the CUDA-graph estimate",
    "kv_cache_gib": "the KV cache size",
    "kv_cache_tokens": "the KV cache size in tokens",
    "max_concurrency": "the maximum concurrency",
    "num_gpu_blocks": "the number of KV blocks",
    "device_total_gib": "the device's total memory",
    "cuda_graph_gib": "the CUDA-graph memory",
    "startup_free_gib": "the free memory at startup",
    "init_engine_seconds": "the engine's initialisation time",
    "sleep_freed_gib": "the memory sleep mode freed",
}


def _fact(name: str, anchor: str, pattern: str) -> _Fact:
    return _Fact(name, anchor, re.compile(pattern))


# Lines that begin a startup; the same kind twice means the engine started again.
_START_MARKERS = {
    # "vLLM API server version %s" 0.6-0.16 (vllm/entrypoints/openai/api_server.py, later
    # entrypoints/api_server.py:129 up to 0.24); "vLLM server version %s, serving model %s"
    # 0.15-0.33 (vllm/entrypoints/common/startup.py:38, when the logo is off); "vLLM gRPC server
    # version %s" 0.14 (vllm/entrypoints/grpc_server.py:411).
    "server_version": re.compile(r"vLLM (?:API |gRPC )?server version ([^\s,]+)"),
    # The logo, 0.15-0.33 (vllm/entrypoints/common/startup.py:21): "█  version %s".
    "banner": re.compile(r"█\s+version\s+(\S+)"),
    # "non-default args: %s" 0.9-0.33 (vllm/entrypoints/common/startup.py:96).
    "args": re.compile(r"non-default args: (\{.*\})\s*$"),
    # "Initializing an LLM engine (v%s)" 0.6, "a V0/V1 LLM engine" 0.7-0.33
    # (vllm/v1/engine/core.py:139; vllm/engine/llm_engine.py up to 0.10).
    "engine": re.compile(
        r"Initializing an? (?:V\d )?LLM engine \(v?([^)\s]+)\) with config: (.*)$"
    ),
    # A headless node of multi-node tensor/pipeline parallelism: "Launching vLLM (v%s) headless
    # multiproc executor, with head node address %s …" (vllm/entrypoints/cli/serve.py:224-229
    # of 0.33.0); it starts no API server, so no server-version line follows.
    "headless": re.compile(r"Launching vLLM \(v?([^)\s]+)\) headless multiproc executor"),
}
# "Model loading took %.4f GiB and %.6f seconds" 0.8-0.13, "… GiB memory and …" 0.11-0.33
# (vllm/v1/worker/gpu_model_runner.py:5088, v1/worker/gpu/model_runner.py:428), with "%s" GiB
# (format_gib, e.g. "6.9") from 0.14.
_WEIGHTS = _fact(
    "weights", "Model loading took ",
    r"Model loading took " + _NUM + r" (?:GiB|GB)(?: memory)? and " + _NUM + " s",
)
# "Loading model weights took %.4f GB" 0.6-0.7 (vllm/worker/model_runner.py:1115,
# v1/worker/gpu_model_runner.py): "GB" but divided by 2**30, so GiB.
_WEIGHTS_OLD = _fact(
    "weights", "Loading model weights took ", r"Loading model weights took " + _NUM + r" (?:GiB|GB)"
)
# "Loading weights took %.2f seconds" 0.8-0.33 (model_loader/default_loader.py:506).
_LOADER_SECONDS = _fact(
    "weights_load_seconds", "Loading weights took ", r"Loading weights took " + _NUM + " seconds"
)
# "Starting to load model %s..." 0.6-0.33 (v1/worker/gpu_model_runner.py:4978).
_LOADING = re.compile(r"Starting to load model")
# "Memory profiling takes %.2f seconds" (V0, vllm/worker/worker.py, 0.6-0.10), "torch.compile
# takes %.2f s in total" 0.6-0.17 (compilation/monitor.py), "%sInitial profiling/warmup run took
# %.2f s" 0.18-0.33 (compilation/monitor.py:91), "Profiling CUDA graph memory: %s" 0.18-0.33
# (v1/worker/gpu_model_runner.py:6304).
_PROFILING = re.compile(
    r"Initial profiling/warmup run took|torch\.compile take|Memory profiling takes|"
    r"Profiling CUDA graph memory"
)
# "Estimated CUDA graph memory: %.2f GiB total" 0.18-0.33 (v1/worker/gpu_model_runner.py:6409).
_GRAPH_ESTIMATE = _fact(
    "cuda_graph_estimate_gib", "Estimated CUDA graph memory: ",
    r"Estimated CUDA graph memory: " + _NUM + " GiB",
)
# "Available KV cache memory: %.2f GiB" 0.9-0.13, "%s GiB" 0.14-0.33
# (v1/worker/gpu_worker.py:772). Not printed for a --kv-cache-memory-bytes pool.
_KV_AVAILABLE = _fact(
    "kv_cache_gib", "Available KV cache memory: ",
    r"Available KV cache memory: " + _NUM + " GiB",
)
# "Initial free memory %s GiB, reserved %sGiB memory for KV Cache as specified by
# kv_cache_memory_bytes config …": no space before "GiB" in 0.10 (v1/worker/gpu_worker.py:251),
# "reserved %s GiB" 0.11-0.33 (v1/worker/gpu_worker.py:676).
_KV_PINNED = _fact(
    "kv_cache_gib", "memory for KV Cache as specified by kv_cache_memory_bytes",
    r"Initial free memory " + _NUM + r" GiB, reserved " + _NUM + r" ?GiB memory for KV Cache as "
    r"specified by kv_cache_memory_bytes",
)
# "Applying persisted startup plan (fingerprint %s): kv_cache_memory_bytes=%d (%.2f GiB), …,
# current %.2f GiB." 0.26-0.33, VLLM_ENABLE_STARTUP_PLAN=1 (v1/worker/startup_plan.py:153).
_STARTUP_PLAN = _fact(
    "kv_cache_gib", "Applying persisted startup plan ",
    r"Applying persisted startup plan .*?kv_cache_memory_bytes=\d+ \(" + _NUM + r" GiB\).*?"
    r"current " + _NUM + " GiB",
)
# "GPU KV cache size: %s tokens" 0.8-0.27 (v1/core/kv_cache_utils.py), one line with the
# concurrency since 0.28 ("%s KV cache size: %s tokens, Maximum concurrency for %s tokens per
# request: %.2fx", v1/core/kv_cache_utils.py:1147; "GPU" is the device type, "GPU + host" with
# hisparse).
_KV_TOKENS = _fact("kv_cache_tokens", "KV cache size: ", r"KV cache size: " + _INT + " tokens")
# "Maximum concurrency for %s tokens per request: %.2fx" 0.6-0.33 (V0
# executor/executor_base.py up to 0.10; v1/core/kv_cache_utils.py).
_CONCURRENCY = _fact(
    "max_concurrency", "Maximum concurrency for ",
    r"Maximum concurrency for " + _INT + " tokens per request: " + _NUM + "x",
)
# "# GPU blocks: %d, # CPU blocks: %d" (V0 executor/gpu_executor.py, 0.6), "# GPU blocks: %d"
# (V1 0.6-0.7, v1/core/kv_cache_utils.py:522).
_GPU_BLOCKS = _fact("num_gpu_blocks", "# GPU blocks: ", r"# GPU blocks: (\d+)")
# "Engine %03d: vllm cache_config_info with initialization after num_gpu_blocks is: %d" and
# "%d Engines: …" 0.9-0.33 (v1/metrics/loggers.py:350, 425; DEBUG for one engine since 0.11).
_CACHE_INFO_BLOCKS = _fact(
    "num_gpu_blocks", "num_gpu_blocks is: ", r"num_gpu_blocks is: (\d+)"
)
# V0's memory profile, 0.6-0.10 (vllm/worker/worker.py:290), one message on three lines.
_V0_BUDGET = _fact(
    "device_total_gib", "x gpu_memory_utilization",
    r"total_gpu_memory \(" + _NUM + r" ?GiB\) x gpu_memory_utilization",
)
_V0_PROFILE = _fact(
    "kv_cache_gib", "reserved for KV Cache is ",
    r"model weights take " + _NUM + r" ?GiB;.*reserved for KV Cache is " + _NUM + r" ?GiB",
)
# "Graph capturing finished in %.0f secs, took %.2f GiB" 0.6-0.33 (v1/worker/gpu_model_runner.py,
# v1/worker/gpu/model_runner.py:1163; V0 worker/model_runner.py up to 0.10).
_GRAPH_CAPTURED = _fact(
    "cuda_graph_gib", "Graph capturing finished in ",
    r"Graph capturing finished in \d+ secs?, took " + _NUM + " GiB",
)
# "CUDA graph pool memory: %s GiB (actual), %s GiB (estimated), …" 0.18-0.33
# (v1/worker/gpu_worker.py:1003).
_GRAPH_POOL = _fact(
    "cuda_graph_gib", "CUDA graph pool memory: ",
    r"CUDA graph pool memory: " + _NUM + r" GiB \(actual\)",
)
# Both the sizing advice ("Free memory on device (%s/%s GiB) on startup. Desired …" 0.10-0.33,
# v1/worker/gpu_worker.py:1066) and the "less than desired" error start like this; the device
# ("cuda:0") is named in the error since 0.14 (v1/worker/utils.py:762).
_FREE_AT_START = _fact(
    "startup_free_gib", "Free memory on device ",
    r"Free memory on device (?:\S+ )?\(" + _NUM + "/" + _NUM + r" GiB\) on startup",
)
# The sizing advice's last sentence: "… in use is %d bytes." in 0.10, "… %s GiB." 0.11-0.33.
_KV_IN_USE = _fact(
    "kv_cache_gib", "Current kv cache memory in use is ",
    r"Current kv cache memory in use is " + _NUM + r" (GiB|bytes)",
)
# "init engine (profile, create kv cache, warmup model) took %.2f seconds" 0.6-0.19, "… %.2f s"
# with an optional compilation note 0.20-0.33 (v1/engine/core.py:395-412).
_INIT_ENGINE = _fact(
    "init_engine_seconds", "init engine (profile, create kv cache, warmup model) took ",
    r"init engine \(profile, create kv cache, warmup model\) took " + _NUM + " s",
)
# "Starting vLLM API server on http://%s:%d" 0.7-0.8, "Starting vLLM API server %d on %s" 0.9-0.17
# (entrypoints/openai/api_server.py), "Starting vLLM server on %s" 0.18-0.33
# (entrypoints/launchers/api_server/entry.py:139); uvicorn's "Application startup complete".
_READY = re.compile(r"Starting vLLM (?:API )?server(?: \d+)? on |Application startup complete")
# Sleep mode, after the engine serves. "It took %.6f seconds to fall asleep." 0.7-0.33
# (vllm/executor/executor_base.py:208 of 0.7 up to 0.10, vllm/v1/executor/abstract.py:408 of
# 0.33); "It took %.6f seconds to wake up." 0.7, "… to wake up tags %s." 0.8-0.33 (abstract.py:426;
# the tags woken, or the set of those that slept); "Sleep mode freed %.2f GiB memory, %.2f GiB
# memory is still in use." 0.7-0.13, "%s GiB" 0.14-0.33 (v1/worker/gpu_worker.py:335; V0
# worker/worker.py up to 0.10); "sleep the engine with level %s" 0.7 only
# (entrypoints/openai/api_server.py:632).
_FELL_ASLEEP = re.compile(r"It took \S+ seconds to fall asleep")
_WOKE_UP = re.compile(r"It took \S+ seconds to wake up(?: tags (.*?))?\.?\s*$")
_SLEEP_FREED = _fact(
    "sleep_freed_gib", "Sleep mode freed ",
    r"Sleep mode freed " + _NUM + r" GiB memory, " + _NUM + r" GiB memory is still in use",
)
_SLEEP_REQUEST = re.compile(r"sleep the engine with level (\d+)")
_TAG = re.compile(r"'(\w+)'")
# "Unknown vLLM environment variable detected: %s" 0.17-0.33 (vllm/envs.py, platforms/interface.py
# :1469).
_UNKNOWN_ENV = re.compile(r"Unknown vLLM environment variable detected: (\w+)")

# Backend choices as vLLM logs them: "Using %s attention backend out of potential backends: %s"
# 0.12-0.33 (platforms/cuda.py:508); "Using %s backend." with an AttentionBackendEnum 0.11-0.33
# (platforms/cuda.py:448); "Using Flash Attention backend on V1 engine." and the like 0.7-0.10
# ("Using FlashInfer backend with HND KV cache layout on V1 engine by default for Blackwell" 0.10);
# V0's "Using XFormers backend." 0.6-0.10 (platforms/cuda.py). MoE: "Using '%s' NvFp4 MoE backend
# out of potential backends: %s" and "Using %s Fp8 / Int8 / W4A8 Int8 / Unquantized MoE backend
# …" (model_executor/layers/fused_moe/oracle/*.py, 0.17-0.33). GEMM: "Using %s for NVFP4 GEMM"
# 0.11-0.33 (model_executor/kernels/linear/__init__.py:1259).
_MOE_BACKEND = re.compile(r"Using '?(\w+)'? (?:((?:\w+ )*?\w+) )?MoE backend")
_ATTENTION_BACKEND = re.compile(
    r"Using (\w+) attention backend|Using AttentionBackendEnum\.(\w+) backend"
)
# The bare forms ("Using Flash Attention backend on V1 engine.", "Using XFormers backend.") are
# attention only where vLLM picks the attention backend: platforms/cuda.py (0.7-0.33) and
# attention/selector.py (0.6-0.9). Elsewhere the same words name other things ("Using
# Transformers modeling backend.", models/transformers/base.py; "Using FlashInfer KDA prefill
# backend.", models/kimi_k3/nvidia/kda.py).
_ATTENTION_BACKEND_BARE = re.compile(
    r"Using ([\w ]+?) backend(?: with [\w ]+?)? on V1 engine|^Using ([A-Z][\w ]*?) backend\.$"
)
_ATTENTION_SOURCES = frozenset({"cuda.py", "selector.py"})
_ENCODER_ATTENTION = re.compile(r"Using AttentionBackendEnum\.(\w+) for MMEncoderAttention")
_MLA_PREFILL = re.compile(r"Using (\w+) MLA prefill backend")
_GEMM_KERNEL = re.compile(r"Using (\w+) (?:backend )?for (\w+) GEMM")
_MARLIN_FP4 = re.compile(r"Weight-only FP4 compression will be used leveraging the Marlin kernel")

# (kind, pattern); the first match on a line wins. vLLM's startup failures, as the traceback's
# last line ("ValueError: …") or a log line:
# - free memory: "… on startup is less than desired GPU memory utilization" 0.9-0.33
#   (v1/worker/utils.py:762) and "… less than the engine's budget after excluding external
#   process's weights" 0.33 (v1/worker/utils.py:741);
# - "Error in memory profiling." 0.6-0.33 (an assert, v1/worker/gpu_worker.py:732);
# - "To serve at least one request with the models's max seq len" 0.7-0.21, "model's" 0.22-0.33
#   (v1/core/kv_cache_planning.py:77);
# - "No available memory for the cache blocks." 0.6-0.33 (v1/core/kv_cache_planning.py:57) and
#   "Cannot auto-fit max_model_len: not enough GPU memory" 0.14-0.33 (…:1381);
# - "Failed to load model - not enough GPU memory." 0.13-0.33 (v1/worker/gpu_model_runner.py);
# - "Quantization method specified in the model config (%s) does not match …" (config/model.py);
# - the CUDA runtime's PTX error (an image built with a newer CUDA than the host driver; on
#   GB10 also `ptxas` refusing sm_121a) and argparse refusing a flag (CPython Lib/argparse.py:
#   "unrecognized arguments: %s"; vLLM removed the flag), which are not vLLM's own text.
# The engine's own report that it failed: "EngineCoreProc failed to start." 0.6, "%s
# initialization failed. See root cause above." 0.7, "EngineCore failed to start." /
# "WorkerProc failed to start." (logged with the traceback) and "Engine core initialization
# failed. See root cause above. Failed core proc(s): %s" 0.8-0.33 (v1/engine/core.py:1584,
# v1/engine/utils.py:1473).
_ERRORS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "free-memory-below-utilization",
        re.compile(r"Free memory on device.* is less than (?:desired|the engine's budget)"),
    ),
    ("memory-profiling-error", re.compile(r"Error in memory profiling\.")),
    ("max-seq-len-too-long", re.compile(r"To serve at least one request with the models?'s max")),
    (
        "no-cache-memory",
        re.compile(r"No available memory for the cache blocks|Cannot auto-fit max_model_len"),
    ),
    ("ptx-toolchain", re.compile(r"PTX was compiled with an unsupported toolchain|ptxas fatal")),
    ("not-enough-gpu-memory", re.compile(r"Failed to load model - not enough GPU memory")),
    (
        "quantization-mismatch",
        re.compile(r"Quantization method specified in the model config .* does not match"),
    ),
    ("unrecognized-arguments", re.compile(r"error: unrecognized arguments: \S")),
    # Generic symptoms, reported only when no specific cause above was found.
    ("cuda-out-of-memory", re.compile(r"CUDA out of memory")),
    (
        "engine-core-init-failed",
        re.compile(
            r"Engine core initialization failed|(?:EngineCore|EngineCoreProc|WorkerProc) failed "
            r"to start|initialization failed\. See root cause above"
        ),
    ),
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
        self.unparsed: list[UnparsedLine] = []

    def starts_new_startup(self, message: str) -> bool:
        """A start marker seen before, or any start of loading after the KV cache or a failure."""
        late = self.rank >= _RANK["kv_allocated"] or bool(self.errors)
        for kind, pattern in _START_MARKERS.items():
            if pattern.search(message):
                return kind in self.markers or late
        return late and bool(
            _WEIGHTS.pattern.search(message) or _WEIGHTS_OLD.pattern.search(message)
        )

    def read(self, fact: _Fact, message: str) -> re.Match[str] | None:
        """The fact's figures in this line; a line with the fact's anchor whose figures do not
        parse is noted as unparsed (and the fact stays as it was)."""
        if fact.anchor not in message:
            return None
        match = fact.pattern.search(message)
        if match is None and len(self.unparsed) < MAX_UNPARSED:
            self.unparsed.append(UnparsedLine(fact.name, _one_line(message)))
        return match

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
        log.unparsed = list(self.unparsed)
        if log.errors:
            log.phase = "failed"
        elif log.asleep:
            log.phase = SLEEP_PHASE_BY_LEVEL.get(log.sleep_level, "sleeping")
        else:
            log.phase = STARTUP_PHASES[self.rank]
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
    message = line.message
    if match := startup.read(_WEIGHTS, message):
        startup.log.weights_gib = _gib(match)
        startup.log.weights_load_seconds = _gib(match, 2)
    elif match := startup.read(_WEIGHTS_OLD, message):
        startup.log.weights_gib = _gib(match)
    elif match := startup.read(_LOADER_SECONDS, message):
        startup.loader_seconds = _gib(match)
        startup.reach("loading")
        return True
    elif _LOADING.search(message):
        startup.reach("loading")
        return True
    else:
        return False
    startup.reach("profiling")
    return True


def _on_profiling(startup: _Startup, line: _Line) -> bool:
    message = line.message
    if match := startup.read(_GRAPH_ESTIMATE, message):
        startup.log.cuda_graph_estimate_gib = _gib(match)
    elif match := startup.read(_V0_BUDGET, message):
        startup.log.device_total_gib = _gib(match)
    elif match := startup.read(_STARTUP_PLAN, message):
        startup.log.kv_cache_gib = _gib(match)
        startup.log.kv_cache_pinned = True
        startup.log.startup_free_gib = _gib(match, 2)
    elif not _PROFILING.search(message):
        return False
    startup.reach("profiling")
    return True


def _on_kv_budget(startup: _Startup, line: _Line) -> bool:
    log, message = startup.log, line.message
    if match := startup.read(_KV_PINNED, message):
        log.startup_free_gib = _gib(match)
        log.kv_cache_gib = _gib(match, 2)
        log.kv_cache_pinned = True
    elif match := startup.read(_KV_AVAILABLE, message):
        log.kv_cache_gib = _gib(match)
        log.kv_cache_pinned = False
    elif match := startup.read(_V0_PROFILE, message):
        if log.weights_gib is None:
            log.weights_gib = _gib(match)
        log.kv_cache_gib = _gib(match, 2)
        log.kv_cache_pinned = False
    else:
        return False
    startup.reach("kv_allocated")
    return True


def _on_kv_capacity(startup: _Startup, line: _Line) -> bool:
    log, message = startup.log, line.message
    matched = False
    if match := startup.read(_KV_TOKENS, message):
        log.kv_cache_tokens = _int(match)
        matched = True
    if match := startup.read(_CONCURRENCY, message):
        log.concurrency_for_tokens = _int(match)
        log.max_concurrency = _gib(match, 2)
        matched = True
    if match := startup.read(_GPU_BLOCKS, message) or startup.read(_CACHE_INFO_BLOCKS, message):
        log.num_gpu_blocks = _int(match)
        matched = True
    if matched:
        startup.reach("kv_allocated")
    return matched


def _on_graphs_and_init(startup: _Startup, line: _Line) -> bool:
    log, message = startup.log, line.message
    if match := startup.read(_GRAPH_CAPTURED, message) or startup.read(_GRAPH_POOL, message):
        log.cuda_graph_gib = _gib(match)
    elif match := startup.read(_INIT_ENGINE, message):
        log.init_engine_seconds = _gib(match)
    else:
        return False
    startup.reach("kv_allocated")
    return True


def _on_free_memory(startup: _Startup, line: _Line) -> bool:
    log, message = startup.log, line.message
    matched = False
    if match := startup.read(_FREE_AT_START, message):
        log.startup_free_gib = _gib(match)
        log.device_total_gib = _gib(match, 2)
        matched = True
    if (match := startup.read(_KV_IN_USE, message)) and log.kv_cache_gib is None:
        in_use = _gib(match)
        # 0.10 printed the size in bytes; every other figure here is GiB.
        log.kv_cache_gib = round(in_use / 2**30, 2) if match.group(2) == "bytes" else in_use
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
    label = _backend_label(startup, line.message, line.source)
    if label is None:
        return False
    if label not in startup.log.backends:
        startup.log.backends.append(label)
    return True


def _backend_label(startup: _Startup, message: str, source: str | None) -> str | None:
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
    match = _ATTENTION_BACKEND.search(message)
    if match is None and (source is None or source in _ATTENTION_SOURCES):
        match = _ATTENTION_BACKEND_BARE.search(message)
    if match is not None:
        name = next(group for group in match.groups() if group)
        startup.log.attention_backend = name
        return f"attention: {name}"
    return None


def _on_sleep(startup: _Startup, line: _Line) -> bool:
    log, message = startup.log, line.message
    if match := _SLEEP_REQUEST.search(message):
        log.sleep_level = int(match.group(1))
        return True
    if _SLEEP_FREED.anchor in message:
        if match := startup.read(_SLEEP_FREED, message):
            log.sleep_freed_gib, log.sleep_in_use_gib = _gib(match), _gib(match, 2)
        _fall_asleep(log, line.timestamp)
        return True
    if _FELL_ASLEEP.search(message):
        _fall_asleep(log, line.timestamp)
        return True
    if match := _WOKE_UP.search(message):
        woken = _TAG.findall(match.group(1) or "")
        # No tags (0.7) or every tag that slept: fully awake. A partial wake-up leaves the rest
        # asleep (the executor stays asleep until every tag is back).
        log.sleeping_tags = [tag for tag in log.sleeping_tags if woken and tag not in woken]
        if not log.sleeping_tags:
            log.asleep, log.sleep_level, log.asleep_since = False, None, None
        return True
    return False


def _fall_asleep(log: StartupLog, timestamp: str | None) -> None:
    if not log.asleep:
        log.asleep_since = timestamp
    log.asleep = True
    log.sleeping_tags = list(SLEEP_TAGS)


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
    _on_sleep,
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
