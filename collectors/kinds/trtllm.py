"""TensorRT-LLM's ``trtllm-serve`` as an engine kind: its flags, its startup log, its
Prometheus metrics or, without them, its iteration stats.

Source: github.com/NVIDIA/TensorRT-LLM (the wheel on PyPI, 1.2.1, is several GB and was not
downloaded): ``tensorrt_llm/commands/serve.py`` at commit 00209af1, ``tensorrt_llm/serve/
openai_server.py`` at 00057725, ``tensorrt_llm/metrics/collector.py`` at 050f80de and
``cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp``, read through the code index.

**Flags** (click options of ``serve``, exact names with underscores): ``MODEL`` (positional),
``--host`` (localhost), ``--port`` (8000), ``--backend`` (pytorch), ``--max_batch_size``
(slots; ``BuildConfig``'s default 2048), ``--max_num_tokens`` (the batched tokens of one step,
so the width of a prefill's activations; ``BuildConfig``'s default 8192), ``--max_seq_len``,
``--tp_size``/``--tensor_parallel_size``, ``--free_gpu_memory_fraction``/
``--kv_cache_free_gpu_memory_fraction`` (0.9: the share of the memory free *after* weights and
buffers that the KV pool takes), ``--config``/``--extra_llm_api_options`` (a YAML file of LLM
API options, e.g. ``return_perf_metrics: true``).

**Startup log**: ``[TensorRT-LLM] TensorRT-LLM version: V`` when the package loads; the C++
runtime's ``[TensorRT-LLM][INFO] Memory usage when calculating max tokens in paged kv cache:
total: T GiB, available: A GiB``, ``Number of tokens per block: B.`` and ``[MemUsageChange]
Allocated X GiB for max tokens in paged KV cache (N).`` (kvCacheManager.cpp: ``cacheSizeBytes
/ (1 << 30)``, so GiB, and the pool's tokens) — the KV pool; uvicorn's ``Uvicorn running on
URL`` and ``Application startup complete.`` — ready. Weights and CUDA graphs are not logged
in a form SparkOps can read.

**Endpoints** (openai_server.py ``register_routes``): ``/health`` (200, or 503 "LLM is
unavailable"), ``/version``, ``/v1/models``; ``/prometheus/metrics`` only when the LLM API
options set ``return_perf_metrics: true`` (``mount_metrics``: ``prometheus_client``'s
multiprocess collector, so no ``_created`` series and no process start; labels
``model_name="undefined"``, ``engine_type="undefined"`` at that commit); and ``/metrics``,
which answers JSON iteration stats (``get_iteration_stats``: a list of the engine's
``IterationStats`` since the last call, each with ``numActiveRequests``,
``numQueuedRequests``, ``gpuMemUsage`` and ``kvCacheStats`` ``{maxNumBlocks, freeNumBlocks,
usedNumBlocks, tokensPerBlock, …}``). That list is *drained* by each read, and with
Prometheus on, the server's own collector loop (``_iteration_stats_collector_loop``) drains
the same queue to fill the gauges: so SparkOps reads ``/metrics`` only where
``/prometheus/metrics`` answers 404, and never competes with the collector.

Metric names (collector.py ``MetricsCollector``, prefix ``trtllm_``): gauges
``num_requests_running``, ``num_requests_waiting``, ``kv_cache_utilization`` (0-1),
``kv_cache_max_blocks``, ``kv_cache_free_blocks``, ``kv_cache_used_blocks``,
``kv_cache_tokens_per_block``, ``gpu_memory_usage_bytes``; counters ``prompt_tokens_total``,
``generation_tokens_total``, ``prompt_cached_tokens_total``,
``spec_decode_num_draft_tokens_total``, ``spec_decode_num_accepted_tokens_total``; histograms
``time_to_first_token_seconds``, ``time_per_output_token_seconds`` (a per-request mean, not the
inter-token latency); the info gauge ``kv_cache_config_info``. The token counters grow when a
request *finishes* (``log_request_metrics_dict``), so a 5 s rate moves in steps as requests end.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from collectors.kinds.base import (
    KindStartup,
    Launch,
    LaunchError,
    LineLogParser,
    ModuleKind,
    Reading,
)
from collectors.kinds.http import Clock, get, get_json, parse_error
from collectors.kinds.prometheus import Exposition, decode, histogram_names, parse
from collectors.vllm.metrics import MetricsSnapshot

DEFAULT_PORT = 8000
# tensorrt_llm BuildConfig defaults, the click options' defaults (commands/serve.py).
DEFAULT_MAX_BATCH_SIZE = 2048
DEFAULT_MAX_NUM_TOKENS = 8192
DEFAULT_FREE_FRACTION = 0.9
PROMETHEUS_PATH = "/prometheus/metrics"

# --- flags ----------------------------------------------------------------------------------------

_FLAGS: dict[str, tuple[str, bool]] = {
    "--host": ("host", True), "--port": ("port", True), "--backend": ("backend", True),
    "--tokenizer": ("tokenizer", True),
    "--max_batch_size": ("max_batch_size", True), "--max_num_tokens": ("max_num_tokens", True),
    "--max_seq_len": ("max_seq_len", True), "--max_beam_width": ("max_beam_width", True),
    "--tp_size": ("tp_size", True), "--tensor_parallel_size": ("tp_size", True),
    "--pp_size": ("pp_size", True), "--pipeline_parallel_size": ("pp_size", True),
    "--ep_size": ("ep_size", True), "--moe_expert_parallel_size": ("ep_size", True),
    "--free_gpu_memory_fraction": ("kv_cache_free_gpu_memory_fraction", True),
    "--kv_cache_free_gpu_memory_fraction": ("kv_cache_free_gpu_memory_fraction", True),
    "--config": ("extra_llm_api_options", True),
    "--extra_llm_api_options": ("extra_llm_api_options", True),
    "--log_level": ("log_level", True), "--num_postprocess_workers": ("num_postprocess_workers",
                                                                      True),
    "--reasoning_parser": ("reasoning_parser", True), "--tool_parser": ("tool_parser", True),
    "--trust_remote_code": ("trust_remote_code", False),
    "--enable_chunked_prefill": ("enable_chunked_prefill", False),
}


def _tokens(command: Sequence[str]) -> list[str]:
    """The arguments after ``trtllm-serve`` (and its ``serve`` subcommand), also inside
    ``sh -c "…"``."""
    words = list(command)
    for index, word in enumerate(words):
        if " " in word and "trtllm-serve" in word:
            return _tokens(shlex.split(word))
        if word.rsplit("/", 1)[-1] == "trtllm-serve":
            rest = words[index + 1:]
            return rest[1:] if rest[:1] == ["serve"] else rest
    raise LaunchError("no trtllm-serve invocation found in the command line")


def _scan(args: list[str]) -> tuple[str | None, dict[str, str | bool]]:
    model: str | None = None
    found: dict[str, str | bool] = {}
    index = 0
    while index < len(args):
        word = args[index]
        index += 1
        if not word.startswith("--"):
            model = model or word
            continue
        name, has_inline, inline = word.partition("=")
        long, takes_value = _FLAGS.get(name, (name[2:], None))
        if takes_value is None:
            takes_value = index < len(args) and not args[index].startswith("--")
        if not takes_value:
            found[long] = True
        elif has_inline:
            found[long] = inline
        elif index < len(args):
            found[long] = args[index]
            index += 1
        else:
            raise LaunchError(f"{name} expects a value")
    return model, found


def _number(found: Mapping[str, str | bool], name: str, kind: type = int) -> Any:
    value = found.get(name)
    if value is None or value is True:
        return None
    try:
        return kind(str(value))
    except ValueError:
        raise LaunchError(f"--{name} expects a number, not {value!r}") from None


def parse_launch(command: Sequence[str], env: Mapping[str, str]) -> Launch:
    """A ``trtllm-serve`` launch: ``max_num_seqs`` is ``--max_batch_size``,
    ``max_num_batched_tokens`` ``--max_num_tokens`` (TensorRT-LLM's defaults when unset)."""
    model, found = _scan(_tokens(command))
    if model is None:
        raise LaunchError("trtllm-serve needs a MODEL argument")
    fraction = _number(found, "kv_cache_free_gpu_memory_fraction", float)
    if fraction is not None and not 0 < fraction <= 1:
        raise LaunchError(f"--kv_cache_free_gpu_memory_fraction must be in (0, 1], not {fraction}")
    batch = _number(found, "max_batch_size")
    tokens = _number(found, "max_num_tokens")
    port = _number(found, "port") or DEFAULT_PORT
    config: dict[str, Any] = {
        "launcher": "trtllm-serve",
        "model": model,
        "served_model_name": None,
        "host": found.get("host") if isinstance(found.get("host"), str) else None,
        "port": port,
        "port_explicit": "port" in found,
        "backend": found.get("backend") or "pytorch",
        "max_batch_size": batch,
        "max_num_seqs": batch or DEFAULT_MAX_BATCH_SIZE,
        "max_num_tokens": tokens,
        "max_num_batched_tokens": tokens or DEFAULT_MAX_NUM_TOKENS,
        "max_seq_len": _number(found, "max_seq_len"),
        "kv_cache_free_gpu_memory_fraction": fraction,
        "kv_free_fraction": fraction if fraction is not None else DEFAULT_FREE_FRACTION,
        "extra_llm_api_options": found.get("extra_llm_api_options")
        if isinstance(found.get("extra_llm_api_options"), str) else None,
        "kv_cache_memory_bytes": None,
        "all_flags": dict(found),
        "unknown_flags": {name: value for name, value in found.items()
                          if f"--{name}" not in _FLAGS},
    }
    return Launch(model=model, port=port, config=config)


def check_launch(config: Mapping[str, Any]) -> list[dict[str, str]]:
    findings = []
    fraction = config.get("kv_free_fraction") or DEFAULT_FREE_FRACTION
    if fraction >= 0.5:
        given = "" if config.get("kv_cache_free_gpu_memory_fraction") is not None \
            else " (the default)"
        findings.append({"code": "kv-fraction-of-free-memory", "severity": "warning", "message":
                         f"--kv_cache_free_gpu_memory_fraction {fraction:g}{given} gives the KV "
                         f"pool {fraction:.0%} of the memory free after the weights load. On a "
                         "GB10 that memory is shared with every other engine and the page "
                         "cache, so the pool takes whatever happens to be free and leaves "
                         "neighbours no room for their prefill. Set a small fraction, or "
                         "kv_cache_config.max_tokens in the --config YAML."})
    if not config.get("extra_llm_api_options"):
        findings.append({"code": "metrics-disabled", "severity": "warning", "message":
                         "trtllm-serve serves /prometheus/metrics only with "
                         "return_perf_metrics: true in the --config (--extra_llm_api_options) "
                         "YAML. Without it SparkOps reads /metrics' iteration stats: running, "
                         "queued and KV blocks, but no token counters or latencies."})
    return findings


# --- startup log ----------------------------------------------------------------------------------

_VERSION = re.compile(r"\[TensorRT-LLM\] TensorRT-LLM version: (\S+)")
_PROFILE = re.compile(r"Memory usage when calculating max tokens in paged kv cache: total: "
                      r"([\d.]+) GiB, available: ([\d.]+) GiB")
_BLOCK = re.compile(r"Number of tokens per block: (\d+)")
_KV = re.compile(r"\[MemUsageChange\] Allocated ([\d.]+) GiB for max tokens in paged KV cache "
                 r"\((\d+)\)")
_LISTENING = re.compile(r"Uvicorn running on (\S+)")
_READY = re.compile(r"Application startup complete\.")
_ERRORS = (
    ("out-of-memory", re.compile(r"(torch\.OutOfMemoryError|CUDA out of memory|"
                                 r"\[TensorRT-LLM\]\[ERROR\].*[Oo]ut of memory).*")),
    ("bind-failed", re.compile(r"Failed to bind socket to .*")),
    ("executor-failed", re.compile(r"Executor worker returned error.*")),
)


class TrtllmLogParser(LineLogParser):
    """``trtllm-serve``'s log, fed in complete lines; the last startup wins."""

    ERRORS = _ERRORS

    def _line(self, line: str) -> None:
        if match := _VERSION.search(line):
            if self.startup.phase not in ("unknown", "loading"):
                self.startup = KindStartup()  # started again: a new startup in the same log
            if self.startup.phase == "unknown":
                self._startups += 1
            self.startup.version = match.group(1)
            self.startup.reach("loading")
        elif _PROFILE.search(line):
            self.startup.reach("profiling")
        elif match := _KV.search(line):
            self.startup.kv_cache_gib = float(match.group(1))
            self.startup.kv_cache_tokens = int(match.group(2))
            self.startup.kv_cache_pinned = False
            self.startup.kv_sized_by = ("--kv_cache_free_gpu_memory_fraction: a share of the "
                                        "memory free after the weights")
            self.startup.reach("kv_allocated")
        elif self.startup.phase == "unknown":
            return  # uvicorn's lines alone (any Python server's) are not a trtllm-serve start
        elif match := _LISTENING.search(line):
            self.startup.listening_on = match.group(1)
        elif _READY.search(line):
            if self.startup.phase != "failed":
                self.startup.reach("ready")
        elif not _BLOCK.search(line):
            self._error(line)



# --- endpoints ------------------------------------------------------------------------------------

P = "trtllm_"
RUNNING, WAITING = f"{P}num_requests_running", f"{P}num_requests_waiting"
KV_UTIL = f"{P}kv_cache_utilization"
MAX_BLOCKS, FREE_BLOCKS = f"{P}kv_cache_max_blocks", f"{P}kv_cache_free_blocks"
USED_BLOCKS, PER_BLOCK = f"{P}kv_cache_used_blocks", f"{P}kv_cache_tokens_per_block"
GPU_MEMORY = f"{P}gpu_memory_usage_bytes"
PROMPT, GENERATION = f"{P}prompt_tokens_total", f"{P}generation_tokens_total"
CACHED = f"{P}prompt_cached_tokens_total"
DRAFT, ACCEPTED = f"{P}spec_decode_num_draft_tokens_total", \
    f"{P}spec_decode_num_accepted_tokens_total"
TTFT = f"{P}time_to_first_token_seconds"
KV_CONFIG = f"{P}kv_cache_config_info"
_WANTED = frozenset({RUNNING, WAITING, KV_UTIL, MAX_BLOCKS, FREE_BLOCKS, USED_BLOCKS, PER_BLOCK,
                     GPU_MEMORY, PROMPT, GENERATION, CACHED, DRAFT, ACCEPTED, KV_CONFIG,
                     *histogram_names(TTFT)})
# Labels that are not configuration: the engine labels, and the pid the multiprocess
# collector adds to a gauge of the default mode ("all").
_NOT_CONFIG = {"model_name", "engine_type", "pid"}


def parse_prometheus(text: str) -> tuple[MetricsSnapshot, dict[str, Any]]:
    """``/prometheus/metrics``: the snapshot and what only TensorRT-LLM reports (its blocks, its
    own GPU memory figure, its KV-cache configuration); all or nothing."""
    exposition = parse(text, PROMETHEUS_PATH, _WANTED)
    if not exposition.has(PROMPT) and not exposition.has(RUNNING):
        raise parse_error(f"GET {PROMETHEUS_PATH}: not a TensorRT-LLM metrics endpoint: no "
                          f"{PROMPT} or {RUNNING}")
    blocks, per_block = exposition.count(MAX_BLOCKS), exposition.count(PER_BLOCK)
    prompt, cached = exposition.count(PROMPT), exposition.count(CACHED)
    snapshot = MetricsSnapshot(
        model_name=_model_name(exposition),
        engine=None,
        requests_running=exposition.count(RUNNING),
        requests_waiting=exposition.count(WAITING),
        kv_cache_usage=exposition.fraction(KV_UTIL),
        prompt_tokens_total=prompt,
        generation_tokens_total=exposition.count(GENERATION),
        prefix_cache_queries_total=prompt if cached is not None else None,
        prefix_cache_hits_total=cached,
        spec_decode_draft_tokens_total=exposition.count(DRAFT),
        spec_decode_accepted_tokens_total=exposition.count(ACCEPTED),
        ttft=exposition.histogram(TTFT),
        kv_cache_size_tokens=blocks * per_block if blocks and per_block else None,
        kv_cache_size_source="trtllm_kv_cache_max_blocks × tokens_per_block"
        if blocks and per_block else None,
        num_gpu_blocks=blocks,
        block_size=per_block,
    )
    config = exposition.labels(KV_CONFIG)
    details = {
        "kv_blocks": {"max": blocks, "free": exposition.count(FREE_BLOCKS),
                      "used": exposition.count(USED_BLOCKS), "tokens_per_block": per_block},
        "gpu_memory_usage_bytes": exposition.count(GPU_MEMORY),
        "kv_cache_config": {k: v for k, v in config[0].items() if k not in _NOT_CONFIG}
        if config else None,
        "source": PROMETHEUS_PATH,
    }
    return snapshot, details


def _model_name(exposition: Exposition) -> str | None:
    for name in (PROMPT, RUNNING):
        for labels in exposition.labels(name):
            model = labels.get("model_name")
            if model and model != "undefined":
                return model
    return None


def parse_iteration_stats(data: Any) -> tuple[MetricsSnapshot, dict[str, Any]]:
    """``/metrics``' iteration stats: the latest iteration's requests and KV blocks (an empty
    list: no iteration ran since the last read)."""
    if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
        raise parse_error("GET /metrics: not TensorRT-LLM iteration stats: not a list of objects")
    if not data:
        return MetricsSnapshot(model_name=None, engine=None), {
            "source": "/metrics", "idle": True}
    latest = data[-1]
    if "iter" not in latest or "numActiveRequests" not in latest:
        raise parse_error("GET /metrics: not TensorRT-LLM iteration stats: no iter or "
                          "numActiveRequests")
    kv = latest.get("kvCacheStats") if isinstance(latest.get("kvCacheStats"), dict) else {}
    counts = {key: latest.get(key) for key in ("numActiveRequests", "numQueuedRequests",
                                                "gpuMemUsage")}
    counts.update({key: kv.get(key) for key in ("maxNumBlocks", "freeNumBlocks",
                                                "usedNumBlocks", "tokensPerBlock")})
    for key, value in counts.items():
        if value is not None and not _whole(value):
            raise parse_error(f"GET /metrics: invalid iteration stats: {key} is {value!r}")
    blocks, used, per_block = counts["maxNumBlocks"], counts["usedNumBlocks"], \
        counts["tokensPerBlock"]
    snapshot = MetricsSnapshot(
        model_name=None, engine=None,
        requests_running=counts["numActiveRequests"],
        requests_waiting=counts["numQueuedRequests"],
        kv_cache_usage=min(used / blocks, 1.0) if blocks and used is not None else None,
        kv_cache_size_tokens=blocks * per_block if blocks and per_block else None,
        kv_cache_size_source="kvCacheStats maxNumBlocks × tokensPerBlock"
        if blocks and per_block else None,
        num_gpu_blocks=blocks, block_size=per_block)
    return snapshot, {"source": "/metrics", "iteration": latest.get("iter"),
                      "kv_blocks": {"max": blocks, "free": counts["freeNumBlocks"],
                                    "used": used, "tokens_per_block": per_block},
                      "gpu_memory_usage_bytes": counts["gpuMemUsage"]}


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


NO_PROMETHEUS = ("trtllm-serve runs without return_perf_metrics: true (its --config YAML), so "
                 "it serves no /prometheus/metrics: no token counters or latencies")


def read_endpoints(base_url: str, *, deadline: float) -> Reading:
    """``/version``, then ``/prometheus/metrics``, or ``/metrics``' iteration stats where it
    answers 404, within one ``deadline``."""
    clock = Clock(deadline)
    _, version = get_json(base_url, "/version", clock)
    if not isinstance(version, dict) or not isinstance(version.get("version"), str):
        raise parse_error("GET /version: not trtllm-serve's /version: no version")
    status, _, body = get(base_url, PROMETHEUS_PATH, clock, accept=(200, 404))
    unknown: dict[str, str] = {}
    if status == 200:
        snapshot, details = parse_prometheus(decode(body, PROMETHEUS_PATH))
    else:
        _, stats = get_json(base_url, "/metrics", clock)
        snapshot, details = parse_iteration_stats(stats)
        unknown = {"rates": NO_PROMETHEUS, "ttft": NO_PROMETHEUS}
    details["version"] = version["version"]
    details["state"] = _state(snapshot, details)
    return Reading(snapshot=snapshot, details=details, unknown=unknown)


def _state(snapshot: MetricsSnapshot, details: dict[str, Any]) -> str:
    if details.get("idle"):
        return "idle: no iteration since the last read"
    blocks = details.get("kv_blocks") or {}
    kv = f", KV blocks {blocks['used']:,} of {blocks['max']:,} used" \
        if blocks.get("used") is not None and blocks.get("max") else ""
    return f"{snapshot.requests_running} running, {snapshot.requests_waiting or 0} queued{kv}"


class TrtllmReader(ModuleKind):
    kind = "trtllm"
    title = "TensorRT-LLM"
    endpoints = "trtllm-serve API"
    default_port = DEFAULT_PORT
    health_path = "/health"
    never_reported: Mapping[str, str] = {
        "weights": "trtllm-serve does not log its weights' size; the container's memory holds "
                   "them",
        "cuda_graphs": "trtllm-serve does not log CUDA-graph memory",
    }
    log_parser = TrtllmLogParser
    launch_parser = staticmethod(parse_launch)
    launch_checks = staticmethod(check_launch)
    endpoint_reader = staticmethod(read_endpoints)
