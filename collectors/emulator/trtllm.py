"""The emulator speaking TensorRT-LLM's ``trtllm-serve`` (PyTorch backend): its command line,
log, endpoints and memory, from the sources named in ``collectors/kinds/trtllm.py``.

    trtllm-serve MODEL [--port 8000] [--host localhost] [--max_batch_size 2048]
        [--max_num_tokens 8192] [--max_seq_len N] [--kv_cache_free_gpu_memory_fraction 0.9]
        [--config FILE.yaml] … [--emulator-* flags, see `knobs`]

What it does, as the real one does:

* **The ``--config`` (``--extra_llm_api_options``) YAML** is read for ``return_perf_metrics``
  (mounts ``/prometheus/metrics``) and ``kv_cache_config`` (``max_tokens``,
  ``free_gpu_memory_fraction``, which override the flag); only flat ``key: value`` lines and
  one level of nesting are understood.
* **Memory**: the weights while loading; then the KV pool, ``kv_cache_config.max_tokens`` ×
  KV bytes per token when given, else the fraction of the memory free after the weights
  (scaled by 1/1024 like every reservation), capped by ``--emulator-kv-cap-bytes``, in whole
  blocks of 32 tokens (``[MemUsageChange] Allocated X GiB for max tokens in paged KV cache
  (N).``). Each step's prefill holds a transient buffer for its tokens, at most
  ``--max_num_tokens``.
* **Endpoints**: ``/health`` (503 until the executor is up), ``/version``, ``/v1/models``,
  ``/metrics`` (the iteration stats since the last read, drained by each read; with
  ``return_perf_metrics`` the server's own collector drains them every second, as the real
  one's background loop does), ``/prometheus/metrics`` (404 without ``return_perf_metrics``;
  the multiprocess collector's text), ``POST /v1/completions``. Token counters grow when a
  request finishes, as ``log_request_metrics_dict`` does.
* **Log**: ``[TensorRT-LLM] TensorRT-LLM version: V``, the C++ runtime's
  ``[TensorRT-LLM][INFO] …`` KV lines, ``[MM/DD/YYYY-HH:MM:SS] [TRT-LLM] [I] …`` and uvicorn's
  ``INFO:     …`` lines.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import openai_api
from .cli import CliError
from .exposition import Family, render_family
from .knobs import Knobs, split_knobs
from .openai_api import ApiError
from .pooled import Plan, PooledServer, Tally, gib, scaled_free_memory
from .serving import JsonHandler, Server, install_stop_signals, start_thread, steady_load

VERSION = "1.2.1"
DEFAULT_PORT = 8000
TOKENS_PER_BLOCK = 32
# collector.py: MetricsCollector's default buckets.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0)
_VALUE_FLAGS = {"--host": "host", "--port": "port", "--backend": "backend",
                "--max_batch_size": "max_batch_size", "--max_num_tokens": "max_num_tokens",
                "--max_seq_len": "max_seq_len", "--tp_size": "tp", "--tensor_parallel_size": "tp",
                "--kv_cache_free_gpu_memory_fraction": "fraction",
                "--free_gpu_memory_fraction": "fraction", "--config": "config",
                "--extra_llm_api_options": "config", "--log_level": "log_level",
                "--tokenizer": "tokenizer"}
_SWITCH_FLAGS = {"--trust_remote_code": "trust", "--enable_chunked_prefill": "chunked"}


@dataclass(frozen=True)
class TrtllmConfig:
    model: str
    host: str
    port: int
    max_batch_size: int
    max_num_tokens: int
    max_seq_len: int
    fraction: float
    max_tokens: int | None
    perf_metrics: bool
    knobs: Knobs


def read_options(path: str) -> dict[str, Any]:
    """The LLM API options YAML, as far as this emulator reads it: ``key: value`` lines and
    one level of indented ``key: value`` under a ``section:`` line."""
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise CliError(f"cannot read {path}: {error.strerror}") from None
    options: dict[str, Any] = {}
    section: dict[str, Any] | None = None
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        key, _, value = line.strip().partition(":")
        value = value.strip()
        if raw[:1] in (" ", "\t") and section is not None:
            section[key] = _scalar(value)
        elif not value:
            section = options.setdefault(key, {})
        else:
            section = None
            options[key] = _scalar(value)
    return options


def _scalar(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text.strip("'\"")


def parse_args(argv: list[str]) -> TrtllmConfig:
    knobs, rest = split_knobs(argv)
    if rest[:1] == ["serve"]:
        rest = rest[1:]
    values: dict[str, Any] = {}
    model = None
    index = 0
    while index < len(rest):
        name, has_inline, inline = rest[index].partition("=")
        index += 1
        if not name.startswith("--"):
            if model is not None:
                raise CliError(f"Got unexpected extra argument ({name})")
            model = name
        elif name in _SWITCH_FLAGS:
            values[_SWITCH_FLAGS[name]] = True
        elif name in _VALUE_FLAGS:
            if not has_inline:
                if index >= len(rest):
                    raise CliError(f"Option '{name}' requires an argument.")
                inline, index = rest[index], index + 1
            values[_VALUE_FLAGS[name]] = inline
        else:
            raise CliError(f"No such option: {name}")
    if model is None:
        raise CliError("Missing argument 'MODEL'.")
    options = read_options(values["config"]) if "config" in values else {}
    kv_options = options.get("kv_cache_config") if isinstance(
        options.get("kv_cache_config"), dict) else {}
    try:
        fraction = float(kv_options.get("free_gpu_memory_fraction",
                                        values.get("fraction", 0.9)))
        max_tokens = kv_options.get("max_tokens")
        return TrtllmConfig(
            model=model, host=values.get("host", "localhost"),
            port=int(values.get("port", DEFAULT_PORT)),
            max_batch_size=int(values.get("max_batch_size", 2048)),
            max_num_tokens=int(values.get("max_num_tokens", 8192)),
            max_seq_len=int(values.get("max_seq_len", 32768)), fraction=fraction,
            max_tokens=int(max_tokens) if max_tokens is not None else None,
            perf_metrics=options.get("return_perf_metrics") is True, knobs=knobs)
    except (TypeError, ValueError) as error:
        raise CliError(f"Invalid value: {error}") from None


class TrtllmLog:
    def __init__(self) -> None:
        self._lock = threading.Lock()

    def raw(self, line: str) -> None:
        with self._lock:
            try:
                sys.stdout.write(line + "\n")
                sys.stdout.flush()
            except (OSError, ValueError):
                pass

    def cpp(self, message: str) -> None:
        self.raw(f"[TensorRT-LLM][INFO] {message}")

    def py(self, message: str, level: str = "I") -> None:
        self.raw(f"[{time.strftime('%m/%d/%Y-%H:%M:%S')}] [TRT-LLM] [{level}] {message}")

    def api(self, source: str, message: str, level: str = "INFO") -> None:
        self.py(message, "W" if level != "INFO" else "I")


class Trtllm:
    """One trtllm-serve: its memory and scheduler, iteration stats and Prometheus metrics."""

    def __init__(self, config: TrtllmConfig, log: TrtllmLog) -> None:
        self.config = config
        self.log = log
        self.pool = PooledServer(
            Plan(slots=config.max_batch_size, batch=config.max_num_tokens,
                 block_size=TOKENS_PER_BLOCK, context=config.max_seq_len,
                 weights_bytes=config.knobs.weights_bytes, graph_bytes=0,
                 knobs=config.knobs),
            Tally(TTFT_BUCKETS, TPOT_BUCKETS))
        self.lock = threading.Lock()
        self.iterations: list[dict[str, Any]] = []  # not yet drained
        self.iteration = 0
        self.gauges: dict[str, Any] = {}  # what the collector loop last logged

    def start_up(self) -> bool:
        c, log, pool = self.config, self.log, self.pool
        log.raw(f"[TensorRT-LLM] TensorRT-LLM version: {c.knobs.version or VERSION}")
        log.py(f"PyTorchConfig(backend=pytorch, max_batch_size={c.max_batch_size}, "
               f"max_num_tokens={c.max_num_tokens})")
        if not pool.load():
            return False
        total, free = scaled_free_memory()
        log.cpp(f"Memory usage when calculating max tokens in paged kv cache: total: "
                f"{gib(total):.2f} GiB, available: {gib(free):.2f} GiB")
        per_token = c.knobs.kv_bytes_per_token
        if c.max_tokens is not None:
            pool_bytes = c.max_tokens * per_token
        else:
            pool_bytes = min(int(free * c.fraction), c.knobs.kv_cap_bytes)
        if c.knobs.fail == "load" or pool_bytes < per_token * TOKENS_PER_BLOCK:
            log.raw("[TensorRT-LLM][ERROR] CUDA out of memory: the KV cache does not fit "
                    "(cudaMalloc failed)")
            log.py("RuntimeError: Executor worker returned error", "E")
            return False
        pool.allocate_kv(pool_bytes)
        blocks = pool.kv_tokens // TOKENS_PER_BLOCK
        log.cpp(f"Number of blocks in KV cache primary pool: {blocks}")
        log.cpp(f"Number of tokens per block: {TOKENS_PER_BLOCK}.")
        log.cpp(f"[MemUsageChange] Allocated {gib(pool.kv_bytes):.2f} GiB for max tokens in "
                f"paged KV cache ({pool.kv_tokens}).")
        log.py(f"max_seq_len={min(c.max_seq_len, pool.kv_tokens)}, "
               f"max_num_requests={c.max_batch_size}, max_num_tokens={c.max_num_tokens}, "
               f"max_batch_size={c.max_batch_size}")
        return True

    # --- iteration stats -------------------------------------------------------------------------

    def record_iterations(self) -> None:
        """One ``IterationStats`` a second while requests run (as the executor's stats queue
        fills per iteration), drained by ``/metrics`` or, with Prometheus on, by the server's
        own collector loop."""
        while not self.pool.stop.wait(1.0):
            engine = self.pool.engine
            if engine is None or not engine.in_flight():
                continue
            gauges = engine.gauges()
            blocks = self.pool.kv_tokens // TOKENS_PER_BLOCK
            used = int(round(gauges.kv_usage * blocks))
            self.iteration += 1
            stats = {
                "cpuMemUsage": 0, "gpuMemUsage": sum(r.nbytes for r in self.pool.reservations),
                "iter": self.iteration, "iterLatencyMS": 25.0,
                "kvCacheStats": {"allocNewBlocks": 0, "allocTotalBlocks": used,
                                 "cacheHitRate": 0.0, "freeNumBlocks": blocks - used,
                                 "maxNumBlocks": blocks, "missedBlocks": 0, "reusedBlocks": 0,
                                 "tokensPerBlock": TOKENS_PER_BLOCK, "usedNumBlocks": used},
                "inflightBatchingStats": {"avgNumDecodedTokensPerIter": 1.0,
                                          "numContextRequests": 0, "numCtxTokens": 0,
                                          "numGenRequests": gauges.running,
                                          "numPausedRequests": 0,
                                          "numScheduledRequests": gauges.running},
                "maxBatchSizeRuntime": self.config.max_batch_size,
                "maxBatchSizeStatic": self.config.max_batch_size,
                "maxNumActiveRequests": self.config.max_batch_size,
                "maxNumTokensRuntime": self.config.max_num_tokens,
                "numActiveRequests": gauges.running, "numCompletedRequests": 0,
                "numNewActiveRequests": 0, "numQueuedRequests": gauges.waiting,
                "pinnedMemUsage": 0, "timestamp": time.strftime("%m-%d-%Y %H:%M:%S"),
            }
            with self.lock:
                if self.config.perf_metrics:  # the collector loop takes it at once
                    self.gauges = stats
                else:
                    self.iterations.append(stats)

    def drain(self) -> list[dict[str, Any]]:
        with self.lock:
            taken, self.iterations = self.iterations, []
        return taken

    def prometheus(self) -> str:
        c, pool, tally = self.config, self.pool, self.pool.tally
        labels = {"engine_type": "undefined", "model_name": "undefined"}
        with self.lock:
            stats = dict(self.gauges)
        assert pool.engine is not None
        now = pool.engine.gauges()
        blocks = pool.kv_tokens // TOKENS_PER_BLOCK
        kv = stats.get("kvCacheStats") or {"maxNumBlocks": blocks, "freeNumBlocks": blocks,
                                           "usedNumBlocks": 0,
                                           "tokensPerBlock": TOKENS_PER_BLOCK}
        families: list[Family] = []

        def family(name: str, kind: str, doc: str, value: float,
                   extra: dict[str, str] | None = None) -> None:
            keys = {**labels, **(extra or {})}
            item = Family(f"trtllm_{name}", kind, doc, sorted(keys))
            series = item.series(**keys)
            series.inc(value) if kind == "counter" else series.set(value)
            families.append(item)

        seen: dict[str, Any] = tally.read(lambda t: {  # type: ignore[assignment]
            "prompt": t.prompt_whole, "generated": t.predicted_tokens, "finished": t.finished,
            "ttft": (t.ttft.bucket_counts[:], t.ttft.sum, t.ttft.count)})
        family("request_success", "counter", "Count of successfully processed requests.",
               seen["finished"], {"finished_reason": "length"})
        family("prompt_tokens", "counter", "Cumulative number of prompt (input) tokens "
               "processed.", seen["prompt"])
        family("generation_tokens", "counter", "Cumulative number of generation (output) tokens "
               "produced.", seen["generated"])
        family("prompt_cached_tokens", "counter", "Process-lifetime total prompt tokens served "
               "from KV cache. Resets only when the serving process restarts, not when the KV "
               "cache is flushed or evicted.", 0)
        # The collector's gauges hold what its loop last logged; running/waiting follow the
        # latest iteration, which an idle engine no longer produces.
        family("num_requests_running", "gauge", "Number of active requests", now.running)
        family("num_requests_waiting", "gauge", "Number of queued requests", now.waiting)
        family("kv_cache_utilization", "gauge", "KV cache utilization",
               kv["usedNumBlocks"] / kv["maxNumBlocks"] if kv["maxNumBlocks"] else 0.0)
        family("kv_cache_max_blocks", "gauge", "Maximum number of KV cache blocks",
               kv["maxNumBlocks"])
        family("kv_cache_free_blocks", "gauge", "Number of free KV cache blocks",
               kv["freeNumBlocks"])
        family("kv_cache_used_blocks", "gauge", "Number of used KV cache blocks",
               kv["usedNumBlocks"])
        family("kv_cache_tokens_per_block", "gauge", "Number of tokens per KV cache block",
               kv["tokensPerBlock"])
        family("gpu_memory_usage_bytes", "gauge", "GPU memory usage in bytes",
               stats.get("gpuMemUsage", 0))
        family("kv_cache_config_info", "gauge", "KV cache configuration info", 1,
               {"enable_block_reuse": "True", "free_gpu_memory_fraction": f"{c.fraction}",
                "max_tokens": f"{c.max_tokens}", "tokens_per_block": f"{TOKENS_PER_BLOCK}"})
        ttft = Family("trtllm_time_to_first_token_seconds", "histogram",
                      "Histogram of time to first token in seconds.", sorted(labels),
                      TTFT_BUCKETS)
        series = ttft.series(**labels)
        series.bucket_counts, series.sum, series.count = seen["ttft"]
        families.append(ttft)
        lines: list[str] = []
        for item in families:
            lines += render_family(item, sort_labels=True, with_created=False)
        return "\n".join(lines) + "\n"


class Handler(JsonHandler):
    server_version = "uvicorn"
    server: Server

    @property
    def app(self) -> Trtllm:
        return self.server.app  # type: ignore[attr-defined]

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        app = self.app
        if path == "/health":
            if app.pool.ready:
                self.send_body(200, b"", "text/plain")
            else:
                self.send_body(503, b"LLM is unavailable. Please check the server logs for more "
                               b"details.", "text/plain")
        elif not app.pool.ready:
            self.send_json(503, {"detail": "starting"})
        elif path == "/version":
            self.send_json(200, {"version": app.config.knobs.version or VERSION})
        elif path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [
                {"id": app.config.model, "object": "model", "owned_by": "tensorrt_llm"}]})
        elif path == "/metrics":
            self.send_json(200, app.drain())
        elif path == "/prometheus/metrics" and app.config.perf_metrics:
            self.send_body(200, app.prometheus().encode(), "text/plain; version=0.0.4; "
                           "charset=utf-8")
        else:
            self.send_json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        app = self.app
        if not app.pool.ready or path != "/v1/completions":
            self.send_json(404 if app.pool.ready else 503, {"detail": "Not Found"})
            return
        body = self.read_json()
        try:
            gen = openai_api.parse_generation(body, chat=False, served_names=(app.config.model,),
                                              max_model_len=app.config.max_seq_len)
            request = app.pool.generate(gen.prompt_tokens, gen.output_tokens,
                                        openai_api.new_request_id(False))
        except (ApiError, ValueError) as error:
            self.send_json(400, {"object": "error", "message": str(error),
                                 "type": "BadRequestError", "code": 400})
            return
        self.send_json(200, openai_api.response_body(gen, request.request_id, int(time.time()),
                                                     request.generated,
                                                     request.finish_reason or "stop"))


def run(config: TrtllmConfig) -> int:
    log = TrtllmLog()
    app = Trtllm(config, log)
    try:
        server = Server((config.host, config.port), Handler)
    except OSError as error:
        log.raw(f"RuntimeError: Failed to bind socket to {config.host}:{config.port}: "
                f"[Errno {error.errno}] {error.strerror}")
        return 1
    server.app = app  # type: ignore[attr-defined]
    install_stop_signals(app.pool.stop)
    try:
        if not app.start_up():
            return 0 if app.pool.stop.is_set() else 1
        app.pool.start()
        start_thread("iterations", app.record_iterations)
        start_thread("http", server.serve_forever)
        log.raw("INFO:     Started server process")
        log.raw("INFO:     Waiting for application startup.")
        if config.perf_metrics:
            log.py("Started background iteration stats collector task")
        log.raw("INFO:     Application startup complete.")
        log.raw(f"INFO:     Uvicorn running on http://{config.host}:{config.port} "
                "(Press CTRL+C to quit)")
        load = config.knobs.load
        if load is not None:
            def one(n: int) -> None:
                try:
                    app.pool.generate(load.prompt_tokens, load.gen_tokens, f"load-{n}")
                except ValueError as error:
                    log.api("loadgen", f"Emulator load generator: {error}", "WARNING")
            start_thread("load", steady_load, load.rps, one, app.pool.stop)
        while not app.pool.stop.wait(0.5):
            pass
        return 0
    finally:
        if app.pool.ready:  # uvicorn starts only once the executor is up, as trtllm-serve's
            server.shutdown()
        server.server_close()
        app.pool.free()


def main(argv: list[str]) -> int:
    if any(token in ("-h", "--help") for token in argv):
        sys.stdout.write(__doc__ or "")
        return 0
    try:
        config = parse_args(argv)
    except CliError as error:
        sys.stderr.write(f"Usage: trtllm-serve serve [OPTIONS] MODEL\n"
                         f"Try 'trtllm-serve serve --help' for help.\n\nError: {error}\n")
        return 2
    return run(config)
