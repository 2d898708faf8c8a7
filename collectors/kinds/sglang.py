"""SGLang as an engine kind: ``python -m sglang.launch_server`` (or ``sglang serve``), its
flags, its startup log, ``/server_info`` and ``/metrics``.

Source: the sglang 0.5.23 wheel on PyPI (``sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64``);
paths below are inside the ``sglang`` package, line numbers of that wheel.

**Flags** (srt/arg_groups/fields/): ``--model-path``/``--model`` (model.py:51), ``--host``
(127.0.0.1) and ``--port`` (30000, serving.py:65-66), ``--served-model-name``,
``--mem-fraction-static`` (schedule.py:27: the share of the device's memory for weights and the
KV pool together; chosen from the GPU's size when unset), ``--max-running-requests``
(schedule.py:31, slots), ``--max-total-tokens`` (the pool's size in tokens, fixed),
``--chunked-prefill-size`` (schedule.py:52: the prompt tokens one prefill step computes, so the
width of its activation buffer; unset, arg_groups/memory_hook.py:143-155 picks 8192 for a
device of 90-160 GiB, which a GB10's ~120 GiB is), ``--max-prefill-tokens`` (16384),
``--context-length``, ``--enable-metrics`` (observability.py:70, off by default), ``--tp-size``;
and, for one engine over several nodes (``collectors.spanning``), ``--nnodes``, ``--node-rank``
and ``--dist-init-addr`` (alias ``--nccl-init-addr``; parallel.py:32-44).

**Startup log** (``[YYYY-MM-DD HH:MM:SS] message``, utils/common.py:2630, a `` TP0`` or
`` DP0`` after the time with several ranks): ``Load weight begin. avail mem=X GB`` and ``Load
weight end. elapsed=…, type=…, avail mem=X GB, mem usage=W GB.``
(model_executor/model_runner.py:1274, 1373) — the weights; ``KV Cache is allocated. dtype: …,
#tokens: N, K size: a GB, V size: b GB`` (or ``KV size: c GB``; mem_cache/memory_pool.py:2088)
— the KV pool; ``Capture target decode CUDA graph end. bs=[…], elapsed=…, mem usage=G GB, …``
(model_executor/model_runner_components/cuda_graph_setup.py:786; ``prefill`` likewise) — the
graphs; ``max_total_num_tokens=N, chunked_prefill_size=…, max_running_requests=M,
context_len=L, available_gpu_mem=X GB`` (managers/scheduler.py:1269); ``The server is fired up
and ready to roll!`` (entrypoints/http_server.py:2600) — ready. "GB" is GiB throughout
(memory_pool.py:116 ``GB = 1024 * 1024 * 1024``; utils/common.py ``get_available_gpu_memory``
divides by 1 << 30). ``Not enough memory. Please try to increase --mem-fraction-static.``
(model_executor/pool_configurator.py:96) is a failed start.

**Endpoints** (entrypoints/http_server.py): ``/health`` (721; 503 while starting),
``/server_info`` (863; ``/get_server_info`` at 853 is its deprecated alias, which logs a
warning at every call, so it is read only where ``/server_info`` answers 404): every resolved
server argument (``mem_fraction_static``, ``max_running_requests``, ``chunked_prefill_size``,
``enable_metrics``, …), ``max_total_num_tokens``, ``version`` and ``internal_states[]`` (one per
DP rank: ``memory_usage`` with ``weight``, ``kvcache``, ``graph`` GiB and ``token_capacity``,
managers/scheduler_components/memory_usage.py:29; ``last_gen_throughput``); ``/metrics`` with
``--enable-metrics`` only (utils/common.py:2843: ``prometheus_client``'s multiprocess
collector, so no ``_created`` series and no process start), names from
observability/metrics_collector.py: gauges ``sglang:num_running_reqs`` (365),
``sglang:num_queue_reqs`` (371), ``sglang:gen_throughput`` (383), ``sglang:token_usage``
(405, a fraction), ``sglang:kv_used_tokens``/``kv_available_tokens`` (439-455),
``sglang:max_total_num_tokens`` (1290), ``sglang:weight_memory_usage_gb``,
``sglang:kv_cache_memory_usage_gb``, ``sglang:graph_memory_usage_gb{phase}`` (1302-1318);
counters ``sglang:prompt_tokens_total`` and ``sglang:generation_tokens_total`` (1856-1863,
split by ``is_streaming``: summed here), ``sglang:cached_tokens_total{cache_source}`` (1935);
histograms ``sglang:time_to_first_token_seconds`` (2041, split by ``is_streaming``) and
``sglang:inter_token_latency_seconds`` (2051). Scheduler metrics carry ``model_name``,
``engine_type``, ``tp_rank``, ``pp_rank``, ``moe_ep_rank`` (+ ``dp_rank``, ``priority``;
metrics_collector.py:1382-1391): SparkOps reads rank 0 of tensor, pipeline and expert
parallelism, sums data-parallel ranks, and skips per-priority breakdowns (their total is under
``priority=""``).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from datetime import datetime
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
from sparkops.units import GIB

DEFAULT_PORT = 30000
# arg_groups/memory_hook.py:143-155: a device of 90-160 GiB (a GB10's ~120 GiB) gets 8192.
GB10_CHUNKED_PREFILL = 8192

# --- flags ----------------------------------------------------------------------------------------

# Spelling -> (long name, takes a value). SGLang's argparse takes dashes; underscores are read
# as dashes too, as compose files often carry them.
_FLAGS: dict[str, tuple[str, bool]] = {
    "--model-path": ("model-path", True), "--model": ("model-path", True),
    "--host": ("host", True), "--port": ("port", True),
    "--served-model-name": ("served-model-name", True),
    "--mem-fraction-static": ("mem-fraction-static", True),
    "--max-running-requests": ("max-running-requests", True),
    "--max-total-tokens": ("max-total-tokens", True),
    "--chunked-prefill-size": ("chunked-prefill-size", True),
    "--max-prefill-tokens": ("max-prefill-tokens", True),
    "--context-length": ("context-length", True),
    "--enable-metrics": ("enable-metrics", False),
    "--tp-size": ("tp-size", True), "--tp": ("tp-size", True),
    "--tensor-parallel-size": ("tp-size", True),
    "--dp-size": ("dp-size", True), "--dp": ("dp-size", True),
    "--data-parallel-size": ("dp-size", True),
    "--pp-size": ("pp-size", True), "--pipeline-parallel-size": ("pp-size", True),
    # One engine over several nodes (collectors.spanning; arg_groups/fields/parallel.py:32-44).
    "--nnodes": ("nnodes", True), "--node-rank": ("node-rank", True),
    "--dist-init-addr": ("dist-init-addr", True), "--nccl-init-addr": ("dist-init-addr", True),
    "--kv-cache-dtype": ("kv-cache-dtype", True),
    "--page-size": ("page-size", True),
    "--api-key": ("api-key", True),
    "--trust-remote-code": ("trust-remote-code", False),
    "--disable-cuda-graph": ("disable-cuda-graph", False),
}


def _tokens(command: Sequence[str]) -> list[str]:
    """The arguments of the SGLang server: after ``sglang.launch_server`` (``python -m``) or
    ``sglang serve``, also inside ``sh -c "…"``; a command of flags only (an image whose
    entrypoint launches SGLang) is taken as its arguments."""
    words = list(command)
    for index, word in enumerate(words):
        if " " in word and "sglang" in word:
            return _tokens(shlex.split(word))
        if word in ("sglang.launch_server", "sglang.srt.server"):
            return words[index + 1:]
        if word.rsplit("/", 1)[-1] == "sglang" and words[index + 1:index + 2] == ["serve"]:
            return words[index + 2:]
    if words and words[0].startswith("-"):
        return words
    raise LaunchError("no SGLang server launch (python -m sglang.launch_server, sglang serve) "
                      "found in the command line")


def _scan(args: list[str]) -> dict[str, str | bool]:
    found: dict[str, str | bool] = {}
    index = 0
    while index < len(args):
        word = args[index]
        index += 1
        if not word.startswith("--"):
            continue
        name, has_inline, inline = word.partition("=")
        name = "--" + name[2:].replace("_", "-")
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
    return found


def _number(found: Mapping[str, str | bool], name: str, kind: type = int) -> Any:
    value = found.get(name)
    if value is None or value is True:
        return None
    try:
        return kind(str(value))
    except ValueError:
        raise LaunchError(f"--{name} expects a number, not {value!r}") from None


def parse_launch(command: Sequence[str], env: Mapping[str, str]) -> Launch:
    """An SGLang launch as a :class:`Launch`: ``max_num_seqs`` is ``--max-running-requests``,
    ``max_num_batched_tokens`` ``--chunked-prefill-size`` (else the 8192 SGLang picks on a
    GB10, as ``chunked_prefill_default`` says)."""
    found = _scan(_tokens(command))
    model = found.get("model-path")
    chunk = _number(found, "chunked-prefill-size")
    fraction = _number(found, "mem-fraction-static", float)
    if fraction is not None and not 0 < fraction < 1:
        raise LaunchError(f"--mem-fraction-static must be between 0 and 1, not {fraction}")
    port = _number(found, "port") or DEFAULT_PORT
    config: dict[str, Any] = {
        "launcher": "sglang",
        "model": model if isinstance(model, str) else None,
        "served_model_name": found.get("served-model-name")
        if isinstance(found.get("served-model-name"), str) else None,
        "host": found.get("host") if isinstance(found.get("host"), str) else None,
        "port": port,
        "port_explicit": "port" in found,
        "mem_fraction_static": fraction,
        "max_running_requests": _number(found, "max-running-requests"),
        "max_num_seqs": _number(found, "max-running-requests"),
        "max_total_tokens": _number(found, "max-total-tokens"),
        "chunked_prefill_size": chunk,
        "max_num_batched_tokens": chunk if chunk and chunk > 0 else GB10_CHUNKED_PREFILL,
        "chunked_prefill_default": chunk is None,
        "context_length": _number(found, "context-length"),
        "metrics_endpoint": bool(found.get("enable-metrics")),
        "kv_cache_memory_bytes": None,
        "all_flags": dict(found),
        "unknown_flags": {name: value for name, value in found.items()
                          if f"--{name}" not in _FLAGS},
    }
    return Launch(model=config["model"], port=port, config=config)


def check_launch(config: Mapping[str, Any]) -> list[dict[str, str]]:
    findings = []
    if not config.get("metrics_endpoint"):
        findings.append({"code": "metrics-disabled", "severity": "warning", "message":
                         "SGLang was started without --enable-metrics: it serves no /metrics, "
                         "so SparkOps shows no token rates, running or queued requests, or KV "
                         "usage for it. Add --enable-metrics."})
    if config.get("mem_fraction_static") is None and config.get("max_total_tokens") is None:
        findings.append({"code": "mem-fraction-unset", "severity": "warning", "message":
                         "--mem-fraction-static is not set: SGLang sizes weights plus KV pool "
                         "from the device's whole memory and what is free at start. On a GB10 "
                         "that memory is shared with every other engine, so the pool depends "
                         "on what else runs; set --mem-fraction-static (or --max-total-tokens) "
                         "explicitly."})
    return findings


# --- startup log ----------------------------------------------------------------------------------

_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d+)?[^\]]*\] ")
_WEIGHT_BEGIN = re.compile(r"Load weight begin\. avail mem=([\d.]+) GB")
_WEIGHT_END = re.compile(r"Load weight end\. elapsed=([\d.]+) s, .*mem usage=(-?[\d.]+) GB")
_KV = re.compile(r"KV Cache is allocated\. dtype: [^,]+, #tokens: (\d+), "
                 r"(?:K size: ([\d.]+) GB, V size: ([\d.]+) GB|KV size: ([\d.]+) GB)")
_GRAPH = re.compile(r"Capture (?:target|draft) (\w+) \w+ graph end\. .*mem usage=(-?[\d.]+) GB")
_SUMMARY = re.compile(r"max_total_num_tokens=(\d+), chunked_prefill_size=(-?\d+), "
                      r"max_prefill_tokens=\d+, max_running_requests=(\d+), context_len=(\d+)")
_READY = re.compile(r"The server is fired up and ready to roll!")
_LISTENING = re.compile(r"Uvicorn running on (\S+)")
_ERRORS = (
    ("kv-pool-too-small", re.compile(r"Not enough memory\. Please try to increase "
                                     r"--mem-fraction-static\..*")),
    ("out-of-memory", re.compile(r"(torch\.OutOfMemoryError|CUDA out of memory).*")),
    ("scheduler-exception", re.compile(r"Scheduler hit an exception.*")),
)


class SglangLogParser(LineLogParser):
    """SGLang's startup log, fed in complete lines; the last startup wins."""

    ERRORS = _ERRORS

    def __init__(self) -> None:
        super().__init__()
        self._new()

    def _new(self) -> None:
        self.startup = KindStartup()
        self._first_stamp: datetime | None = None
        self._graphs: dict[str, float] = {}

    def _line(self, line: str) -> None:
        stamp = _stamp(line)
        if _WEIGHT_BEGIN.search(line):
            if self.startup.phase != "unknown":
                self._new()  # the container started again: a new startup in the same log
            self._startups += 1
            self._first_stamp = stamp
            self.startup.started_at = stamp.isoformat() if stamp else None
            self.startup.reach("loading")
        elif match := _WEIGHT_END.search(line):
            self.startup.weights_load_seconds = float(match.group(1))
            self.startup.weights_gib = max(float(match.group(2)), 0.0)
            self.startup.reach("profiling")
        elif match := _KV.search(line):
            tokens, k, v, kv = match.groups()
            self.startup.kv_cache_tokens = int(tokens)
            self.startup.kv_cache_gib = float(kv) if kv else float(k) + float(v)
            self.startup.kv_cache_pinned = False
            self.startup.kv_sized_by = ("--mem-fraction-static (or --max-total-tokens): "
                                        "memory free at start less (1 − fraction) × total")
            self.startup.reach("kv_allocated")
        elif match := _GRAPH.search(line):
            self._graphs[match.group(1)] = max(float(match.group(2)), 0.0)
            self.startup.cuda_graph_gib = sum(self._graphs.values())
        elif match := _SUMMARY.search(line):
            tokens, context = int(match.group(1)), int(match.group(4))
            self.startup.kv_cache_tokens = tokens
            # As vLLM's "maximum concurrency": full-context requests the pool holds at once.
            self.startup.max_concurrency = round(tokens / context, 2) if context else None
            self.startup.concurrency_for_tokens = context
        elif match := _LISTENING.search(line):
            self.startup.listening_on = match.group(1)
        elif _READY.search(line):
            if self.startup.phase != "failed":
                self.startup.reach("ready")
                self.startup.ready_at = stamp.isoformat() if stamp else None
                if stamp and self._first_stamp:
                    self.startup.startup_seconds = (stamp - self._first_stamp).total_seconds()
        else:
            self._error(line)



def _stamp(line: str) -> datetime | None:
    match = _STAMP.match(line)
    return datetime.fromisoformat(match.group(1)) if match else None


# --- endpoints ------------------------------------------------------------------------------------

RUNNING, QUEUED = "sglang:num_running_reqs", "sglang:num_queue_reqs"
TOKEN_USAGE, GEN_THROUGHPUT = "sglang:token_usage", "sglang:gen_throughput"
KV_USED, KV_AVAILABLE = "sglang:kv_used_tokens", "sglang:kv_available_tokens"
MAX_TOKENS = "sglang:max_total_num_tokens"
WEIGHT_GB, KV_GB = "sglang:weight_memory_usage_gb", "sglang:kv_cache_memory_usage_gb"
GRAPH_GB = "sglang:graph_memory_usage_gb"
PROMPT, GENERATION = "sglang:prompt_tokens_total", "sglang:generation_tokens_total"
CACHED = "sglang:cached_tokens_total"
TTFT, ITL = "sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds"
_WANTED = frozenset({RUNNING, QUEUED, TOKEN_USAGE, GEN_THROUGHPUT, KV_USED, KV_AVAILABLE,
                     MAX_TOKENS, WEIGHT_GB, KV_GB, GRAPH_GB, PROMPT, GENERATION, CACHED,
                     *histogram_names(TTFT, ITL)})


def _rank_zero(labels: Mapping[str, str]) -> bool:
    """A scheduler series SparkOps counts: rank 0 of tensor, pipeline and expert parallelism
    (each rank reports the same requests), every data-parallel rank, and the total of a
    priority breakdown (``priority=""``), never the breakdown itself."""
    return all(labels.get(rank, "0") == "0" for rank in ("tp_rank", "pp_rank", "moe_ep_rank")) \
        and labels.get("priority", "") == ""


def parse_metrics(text: str) -> tuple[MetricsSnapshot, dict[str, Any]]:
    """SGLang's ``/metrics``: the snapshot, and what only SGLang reports (its own throughput
    gauge, KV tokens in use, memory by part); all or nothing."""
    exposition = parse(text, "/metrics", _WANTED)
    if not exposition.has(RUNNING):
        raise parse_error("GET /metrics: not an SGLang /metrics endpoint: no "
                          "sglang:num_running_reqs")
    snapshot = _snapshot(exposition)
    details = {
        "gen_throughput_tps": exposition.total(GEN_THROUGHPUT, _rank_zero),
        "kv_used_tokens": exposition.count(KV_USED, _rank_zero),
        "kv_available_tokens": exposition.count(KV_AVAILABLE, _rank_zero),
        "weights_gib": exposition.total(WEIGHT_GB, _rank_zero),
        "kv_cache_gib": exposition.total(KV_GB, _rank_zero),
        "graphs_gib": exposition.total(GRAPH_GB, _rank_zero),
    }
    return snapshot, details


def _snapshot(exposition: Exposition) -> MetricsSnapshot:
    prompt = exposition.count(PROMPT)
    cached = exposition.count(CACHED)
    kv_gib = exposition.total(KV_GB, _rank_zero)
    labels = exposition.labels(RUNNING)
    return MetricsSnapshot(
        model_name=labels[0].get("model_name") if labels else None,
        engine=None,
        requests_running=exposition.count(RUNNING, _rank_zero),
        requests_waiting=exposition.count(QUEUED, _rank_zero),
        kv_cache_usage=exposition.fraction(TOKEN_USAGE, _rank_zero),
        prompt_tokens_total=prompt,
        generation_tokens_total=exposition.count(GENERATION),
        # SGLang counts every prompt token, cached ones too (as vLLM): queried = prompt tokens.
        prefix_cache_queries_total=prompt if cached is not None else None,
        prefix_cache_hits_total=cached,
        ttft=exposition.histogram(TTFT),
        inter_token_latency=exposition.histogram(ITL),
        kv_cache_size_tokens=exposition.count(MAX_TOKENS, _rank_zero),
        kv_cache_size_source="sglang:max_total_num_tokens" if exposition.has(MAX_TOKENS)
        else None,
        kv_cache_memory_bytes=int(kv_gib * GIB) if kv_gib else None,
    )


def server_info(data: Any) -> dict[str, Any]:
    """The parts of ``/server_info`` SparkOps reads, checked (another server's JSON is refused)."""
    if not isinstance(data, dict) or "max_total_num_tokens" not in data \
            or not isinstance(data.get("version"), str):
        raise parse_error("GET /server_info: not an SGLang /server_info: no version or "
                          "max_total_num_tokens")
    states = data.get("internal_states") if isinstance(data.get("internal_states"), list) else []
    memory = [s.get("memory_usage") for s in states if isinstance(s, dict)
              and isinstance(s.get("memory_usage"), dict)]
    throughput = [s.get("last_gen_throughput") for s in states if isinstance(s, dict)]

    def numbers(key: str) -> float | None:
        values = [m.get(key) for m in memory]
        if not values or not all(_real(v) for v in values):
            return None
        return float(sum(values))

    graphs = [sum(v for v in m.get("graph", {}).values() if _real(v)) for m in memory
              if isinstance(m.get("graph"), dict)]
    return {
        "version": data["version"],
        "enable_metrics": data.get("enable_metrics") is True,
        "mem_fraction_static": data.get("mem_fraction_static")
        if _real(data.get("mem_fraction_static")) else None,
        "max_running_requests": data.get("max_running_requests")
        if _whole(data.get("max_running_requests")) else None,
        "chunked_prefill_size": data.get("chunked_prefill_size")
        if _whole(data.get("chunked_prefill_size")) else None,
        "max_total_num_tokens": data["max_total_num_tokens"]
        if _whole(data["max_total_num_tokens"]) else None,
        "served_model_name": data.get("served_model_name")
        if isinstance(data.get("served_model_name"), str) else None,
        "weights_gib": numbers("weight"),
        "kv_cache_gib": numbers("kvcache"),
        "graphs_gib": float(sum(graphs)) if graphs else None,
        "gen_throughput_tps": float(sum(throughput)) if throughput and all(
            _real(t) for t in throughput) else None,
    }


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _real(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0


NO_METRICS = ("SGLang runs without --enable-metrics: it serves no /metrics, so no token "
              "counters, running or queued requests or KV usage")


def read_endpoints(base_url: str, *, deadline: float) -> Reading:
    """``/server_info`` (``/get_server_info`` on a release without it), then ``/metrics`` when
    SGLang says metrics are on, within one ``deadline``."""
    clock = Clock(deadline)
    status, data = get_json(base_url, "/server_info", clock, accept=(200, 404))
    if status == 404:
        _, data = get_json(base_url, "/get_server_info", clock)
    info = server_info(data)
    unknown: dict[str, str] = {}
    if info["enable_metrics"]:
        _, _, body = get(base_url, "/metrics", clock)
        snapshot, measured = parse_metrics(decode(body, "/metrics"))
    else:
        unknown = {"rates": NO_METRICS, "requests": NO_METRICS, "kv_usage": NO_METRICS,
                   "ttft": NO_METRICS}
        kv_gib = info["kv_cache_gib"]
        snapshot = MetricsSnapshot(
            model_name=info["served_model_name"], engine=None,
            kv_cache_size_tokens=info["max_total_num_tokens"],
            kv_cache_size_source="/server_info max_total_num_tokens",
            kv_cache_memory_bytes=int(kv_gib * GIB) if kv_gib else None)
        measured = {}
    details = {"server_info": info, **{k: v for k, v in measured.items() if v is not None},
               "version": info["version"], "state": _state(snapshot, info)}
    return Reading(snapshot=snapshot, details=details, unknown=unknown)


def _state(snapshot: MetricsSnapshot, info: dict[str, Any]) -> str:
    slots = info["max_running_requests"]
    if snapshot.requests_running is None:
        return f"max {slots} running requests" if slots else "running requests not reported"
    of = f" of {slots}" if slots else ""
    return f"{snapshot.requests_running}{of} running, {snapshot.requests_waiting or 0} queued"


class SglangReader(ModuleKind):
    kind = "sglang"
    title = "SGLang"
    endpoints = "SGLang API"
    default_port = DEFAULT_PORT
    health_path = "/health"  # 503 while the server starts
    never_reported: Mapping[str, str] = {}
    log_parser = SglangLogParser
    launch_parser = staticmethod(parse_launch)
    launch_checks = staticmethod(check_launch)
    endpoint_reader = staticmethod(read_endpoints)
