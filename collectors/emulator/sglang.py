"""The emulator speaking SGLang 0.5.23: its command line, log, endpoints and memory, from the
sglang 0.5.23 wheel (the sources named in ``collectors/kinds/sglang.py``).

    sglang serve --model-path MODEL [--port 30000] [--mem-fraction-static F]
        [--max-total-tokens N] [--max-running-requests N] [--chunked-prefill-size N]
        [--context-length N] [--served-model-name NAME] [--enable-metrics] …
        [--emulator-* flags, see `knobs`]

(``python3 -m sglang.launch_server`` takes the same flags.) What it does, as the real one does:

* **Memory**: the weights while loading (``Load weight end. … mem usage=W GB``), then the KV
  pool (``KV Cache is allocated. … #tokens: N, K size: …, V size: …``): ``--max-total-tokens``
  × KV bytes per token when given, else ``--mem-fraction-static`` (0.88 when unset) of the
  memory total less the weights, capped by ``--emulator-kv-cap-bytes`` (scaled by 1/1024 like
  every reservation); then the CUDA graphs (``--emulator-graph-bytes``). Each prefill step
  holds a transient activation buffer for the tokens it computes, at most
  ``--chunked-prefill-size`` (8192) wide, given back when no prefill runs.
* **Endpoints**: ``/health`` (503 while starting), ``/server_info`` and the deprecated
  ``/get_server_info`` (which logs a warning, as the real one), ``/model_info``,
  ``/v1/models``, ``/metrics`` (404 without ``--enable-metrics``; the multiprocess collector's
  text: no ``_created`` series, sorted labels), ``POST /v1/completions`` and ``/generate``.
* **Log** lines ``[YYYY-MM-DD HH:MM:SS] message``; a ``Decode batch`` line every 40 steps is
  not emulated.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from . import openai_api
from .cli import CliError
from .exposition import Family, render_family
from .knobs import Knobs, split_knobs
from .openai_api import ApiError
from .pooled import Plan, PooledServer, Tally, gib, now_stamp, scaled_free_memory
from .serving import JsonHandler, Server, install_stop_signals, start_thread, steady_load

VERSION = "0.5.23"
DEFAULT_PORT = 30000
DEFAULT_FRACTION = 0.88  # what memory_hook.py settles on for a large device without a value
DEFAULT_CHUNK = 8192  # memory_hook.py: a 90-160 GiB device
MAX_PREFILL_TOKENS = 16384
DEFAULT_CONTEXT = 32768
# metrics_collector.py: TTFT and inter-token buckets (TokenizerMetricsCollector defaults).
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600,
                1200, 1800, 2400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040,
               0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000,
               8.000)
_VALUE_FLAGS = {"--model-path": "model", "--model": "model", "--port": "port", "--host": "host",
                "--served-model-name": "served", "--mem-fraction-static": "fraction",
                "--max-total-tokens": "max_total_tokens",
                "--max-running-requests": "max_running", "--chunked-prefill-size": "chunk",
                "--context-length": "context", "--tp-size": "tp", "--tp": "tp",
                "--kv-cache-dtype": "kv_dtype", "--api-key": "api_key",
                "--max-prefill-tokens": "max_prefill"}
_SWITCH_FLAGS = {"--enable-metrics": "metrics", "--trust-remote-code": "trust",
                 "--disable-cuda-graph": "no_graph"}


@dataclass(frozen=True)
class SglangConfig:
    model: str
    served: str
    host: str
    port: int
    fraction: float | None
    max_total_tokens: int | None
    max_running: int
    chunk: int
    context: int
    metrics: bool
    knobs: Knobs


def parse_args(argv: list[str]) -> SglangConfig:
    knobs, rest = split_knobs(argv)
    if rest[:1] == ["serve"]:
        rest = rest[1:]
    values: dict[str, Any] = {}
    index = 0
    while index < len(rest):
        name, has_inline, inline = rest[index].partition("=")
        name = "--" + name[2:].replace("_", "-") if name.startswith("--") else name
        index += 1
        if name in _SWITCH_FLAGS:
            values[_SWITCH_FLAGS[name]] = True
        elif name in _VALUE_FLAGS:
            if not has_inline:
                if index >= len(rest):
                    raise CliError(f"argument {name}: expected one argument")
                inline, index = rest[index], index + 1
            values[_VALUE_FLAGS[name]] = inline
        else:
            raise CliError(f"unrecognized arguments: {rest[index - 1]}")
    if not values.get("model"):
        raise CliError("the following arguments are required: --model-path")
    try:
        fraction = float(values["fraction"]) if "fraction" in values else None
        config = SglangConfig(
            model=values["model"], served=values.get("served") or values["model"],
            host=values.get("host", "127.0.0.1"), port=int(values.get("port", DEFAULT_PORT)),
            fraction=fraction,
            max_total_tokens=int(values["max_total_tokens"])
            if "max_total_tokens" in values else None,
            max_running=int(values.get("max_running", 0)) or 0,
            chunk=int(values.get("chunk", DEFAULT_CHUNK)),
            context=int(values.get("context", DEFAULT_CONTEXT)),
            metrics=bool(values.get("metrics")), knobs=knobs)
    except ValueError as error:
        raise CliError(f"invalid value: {error}") from None
    if fraction is not None and not 0 < fraction < 1:
        raise CliError("argument --mem-fraction-static: must be in (0, 1)")
    return config


class SglangLog:
    def __init__(self) -> None:
        self._lock = threading.Lock()

    def info(self, message: str) -> None:
        with self._lock:
            try:
                sys.stdout.write(f"[{now_stamp()}] {message}\n")
                sys.stdout.flush()
            except (OSError, ValueError):
                pass

    def api(self, source: str, message: str, level: str = "INFO") -> None:
        self.info(message)


class Sglang:
    """One SGLang server: its memory and scheduler (``PooledServer``) and what it reports."""

    def __init__(self, config: SglangConfig, log: SglangLog) -> None:
        self.config = config
        self.log = log
        knobs = config.knobs
        self.pool = PooledServer(
            Plan(slots=config.max_running or 48, batch=config.chunk, block_size=1,
                 context=config.context, weights_bytes=knobs.weights_bytes,
                 graph_bytes=knobs.graph_bytes, knobs=knobs),
            Tally(TTFT_BUCKETS, ITL_BUCKETS))
        self.started = time.time()

    def start_up(self) -> bool:
        """Load, size the pool, capture graphs, as SGLang logs them; False if it failed."""
        c, log, pool = self.config, self.log, self.pool
        total, free = scaled_free_memory()
        log.info(f"Load weight begin. avail mem={gib(free):.2f} GB")
        started = time.monotonic()
        if not pool.load():
            return False
        _, free = scaled_free_memory()
        log.info(f"Load weight end. elapsed={time.monotonic() - started:.2f} s, "
                 f"type=Qwen3ForCausalLM, dtype=torch.bfloat16, avail mem={gib(free):.2f} GB, "
                 f"mem usage={gib(c.knobs.weights_bytes):.2f} GB.")
        per_token = c.knobs.kv_bytes_per_token
        if c.max_total_tokens is not None:
            pool_bytes = c.max_total_tokens * per_token
        else:
            fraction = c.fraction if c.fraction is not None else DEFAULT_FRACTION
            pool_bytes = min(int(total * fraction) - c.knobs.weights_bytes,
                             c.knobs.kv_cap_bytes)
        if c.knobs.fail == "load" or pool_bytes < per_token * 16:
            log.info("Scheduler hit an exception: Traceback (most recent call last):")
            log.info("RuntimeError: Not enough memory. Please try to increase "
                     "--mem-fraction-static." + (f" Current value: mem_fraction_static="
                                                 f"{c.fraction}" if c.fraction else ""))
            return False
        pool.allocate_kv(pool_bytes)
        half = pool.kv_bytes / 2
        log.info(f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: {pool.kv_tokens}, "
                 f"K size: {gib(half):.2f} GB, V size: {gib(half):.2f} GB")
        _, free = scaled_free_memory()
        log.info(f"Memory pool end. avail mem={gib(free):.2f} GB")
        log.info("Capture target decode CUDA graph begin. backend=flashinfer, "
                 f"num_tokens_per_req=1, avail mem={gib(free):.2f} GB")
        pool.capture_graphs()
        _, after = scaled_free_memory()
        log.info(f"Capture target decode CUDA graph end. bs=[1, 2, 4, 8, 16, 24, 32, 40, 48], "
                 f"elapsed=0.10 s, mem usage={gib(c.knobs.graph_bytes):.2f} GB, "
                 f"avail mem={gib(after):.2f} GB.")
        log.info(f"max_total_num_tokens={pool.kv_tokens}, chunked_prefill_size={c.chunk}, "
                 f"max_prefill_tokens={MAX_PREFILL_TOKENS}, "
                 f"max_running_requests={pool.plan.slots}, context_len={c.context}, "
                 f"available_gpu_mem={gib(after):.2f} GB")
        return True

    # --- what the endpoints answer ---------------------------------------------------------------

    def server_info(self) -> dict[str, Any]:
        c, pool = self.config, self.pool
        fraction = c.fraction if c.fraction is not None else DEFAULT_FRACTION
        return {
            "model_path": c.model, "served_model_name": c.served, "host": c.host,
            "port": c.port, "mem_fraction_static": fraction,
            "max_running_requests": pool.plan.slots, "max_total_tokens": c.max_total_tokens,
            "chunked_prefill_size": c.chunk, "max_prefill_tokens": MAX_PREFILL_TOKENS,
            "context_length": c.context, "enable_metrics": c.metrics, "tp_size": 1,
            "launch_command": "sglang serve", "max_total_num_tokens": pool.kv_tokens,
            "max_req_input_len": c.context - 5, "startup_time": self.started,
            "internal_states": [{
                "world_size": 1, "startup_time": self.started,
                "effective_max_running_requests_per_dp": pool.plan.slots,
                "last_gen_throughput": 0.0,
                "memory_usage": {
                    "weight": round(gib(c.knobs.weights_bytes), 3),
                    "kvcache": round(gib(pool.kv_bytes), 3),
                    "startup_available": 0.0, "token_capacity": pool.kv_tokens,
                    "token_capacity_swa": None,
                    "graph": {"prefill": 0.0, "decode": round(gib(c.knobs.graph_bytes), 3),
                              "target_verify": 0.0, "draft_prefill": 0.0,
                              "draft_decode": 0.0, "draft_extend": 0.0}}}],
            "version": self.config.knobs.version or VERSION, "frontend": "python",
        }

    def metrics(self) -> str:
        """The multiprocess collector's exposition of the metrics SparkOps reads and their
        neighbours (metrics_collector.py names, types, help and label sets)."""
        c, pool = self.config, self.pool
        assert pool.engine is not None
        gauges = pool.engine.gauges()
        base = {"engine_type": "unified", "model_name": c.served}
        sched = {**base, "moe_ep_rank": "0", "pp_rank": "0", "tp_rank": "0"}
        tally = pool.tally
        families: list[Family] = []

        def gauge(name: str, doc: str, value: float, labels: dict[str, str] = sched) -> None:
            family = Family(name, "gauge", doc, sorted(labels))
            family.series(**labels).set(value)
            families.append(family)

        used = int(round(gauges.kv_usage * pool.kv_tokens))
        gauge("sglang:num_running_reqs", "The number of running requests.", gauges.running)
        gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.",
              gauges.waiting)
        gauge("sglang:gen_throughput", "The generation throughput (token/s).",
              c.knobs.decode_tps * gauges.running)
        gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", 0.0)
        gauge("sglang:token_usage", "The token usage.", gauges.kv_usage)
        gauge("sglang:num_used_tokens", "The number of used tokens.", used)
        gauge("sglang:kv_available_tokens", "Number of free token slots in the KV cache pool.",
              pool.kv_tokens - used)
        gauge("sglang:kv_used_tokens", "Number of actively used token slots in the KV cache "
              "pool.", used)
        gauge("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache "
              "pool.", pool.kv_tokens)
        gauge("sglang:weight_memory_usage_gb", "Memory used by model weights in GB.",
              gib(c.knobs.weights_bytes))
        gauge("sglang:kv_cache_memory_usage_gb", "Memory used by the KV cache pools in GB.",
              gib(pool.kv_bytes))
        gauge("sglang:graph_memory_usage_gb", "Memory used by captured device graphs in GB.",
              gib(c.knobs.graph_bytes), {**sched, "phase": "decode"})
        gauge("sglang:context_len", "Maximum context length.", c.context)

        def read(t: Tally) -> dict[str, Any]:
            return {"prompt": t.prompt_whole, "generated": t.predicted_tokens,
                    "finished": t.finished, "ttft": (t.ttft.bucket_counts[:], t.ttft.sum,
                                                     t.ttft.count),
                    "itl": (t.itl.bucket_counts[:], t.itl.sum, t.itl.count)}

        seen: dict[str, Any] = tally.read(read)  # type: ignore[assignment]
        streaming = {**base, "is_streaming": "false"}
        for name, doc, value in (
                ("sglang:prompt_tokens", "Number of prefill tokens processed.", seen["prompt"]),
                ("sglang:generation_tokens", "Number of generation tokens processed.",
                 seen["generated"]),
                ("sglang:num_requests", "Number of requests processed.", seen["finished"])):
            family = Family(name, "counter", doc, sorted(streaming))
            family.series(**streaming).inc(value)
            families.append(family)
        cached = Family("sglang:cached_tokens", "counter", "Number of cached prompt tokens by "
                        "source (device/host/storage).", sorted({**base, "cache_source": ""}))
        cached.series(**base, cache_source="device").inc(0)
        families.append(cached)
        for name, doc, buckets, key, labels in (
                ("sglang:time_to_first_token_seconds",
                 "Histogram of time to first token in seconds.", TTFT_BUCKETS, "ttft",
                 streaming),
                ("sglang:inter_token_latency_seconds",
                 "Histogram of inter-token latency in seconds.", ITL_BUCKETS, "itl", base)):
            family = Family(name, "histogram", doc, sorted(labels), buckets)
            series = family.series(**labels)
            series.bucket_counts, series.sum, series.count = seen[key]
            families.append(family)
        lines: list[str] = []
        for family in families:
            lines += render_family(family, sort_labels=True, with_created=False)
        return "\n".join(lines) + "\n"


class Handler(JsonHandler):
    server_version = "uvicorn"
    server: Server

    @property
    def app(self) -> Sglang:
        return self.server.app  # type: ignore[attr-defined]

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        app = self.app
        if path in ("/health", "/health_generate"):
            self.send_body(200 if app.pool.ready else 503, b"", "text/plain")
        elif not app.pool.ready:
            self.send_json(503, {"detail": "Server is starting"})
        elif path in ("/server_info", "/get_server_info"):
            if path == "/get_server_info":
                app.log.info("Endpoint '/get_server_info' is deprecated and will be removed in "
                             "a future version. Please use '/server_info' instead.")
            self.send_json(200, app.server_info())
        elif path in ("/model_info", "/get_model_info"):
            self.send_json(200, {"model_path": app.config.model,
                                 "served_model_name": app.config.served,
                                 "is_generation": True})
        elif path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [
                {"id": app.config.served, "object": "model", "owned_by": "sglang",
                 "created": int(app.started), "max_model_len": app.config.context}]})
        elif path == "/metrics" and app.config.metrics:
            self.send_body(200, app.metrics().encode(), "text/plain; version=0.0.4; "
                           "charset=utf-8")
        else:
            self.send_json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        app = self.app
        if not app.pool.ready:
            self.send_json(503, {"detail": "Server is starting"})
            return
        if path not in ("/v1/completions", "/generate"):
            self.send_json(404, {"detail": "Not Found"})
            return
        body = self.read_json()
        try:
            gen = openai_api.parse_generation(body, chat=False, served_names=(app.config.served,),
                                              max_model_len=app.config.context)
            request = app.pool.generate(gen.prompt_tokens, gen.output_tokens,
                                        openai_api.new_request_id(False))
        except (ApiError, ValueError) as error:
            self.send_json(400, {"object": "error", "message": str(error),
                                 "type": "BadRequestError", "code": 400})
            return
        self.send_json(200, openai_api.response_body(gen, request.request_id, int(time.time()),
                                                     request.generated,
                                                     request.finish_reason or "stop"))


def run(config: SglangConfig) -> int:
    log = SglangLog()
    app = Sglang(config, log)
    log.info(f"server_args=ServerArgs(model_path='{config.model}', host='{config.host}', "
             f"port={config.port}, mem_fraction_static={config.fraction}, "
             f"max_running_requests={config.max_running or None}, "
             f"chunked_prefill_size={config.chunk}, enable_metrics={config.metrics})")
    try:
        server = Server((config.host, config.port), Handler)
    except OSError as error:
        log.info(f"OSError: [Errno {error.errno}] error while attempting to bind on address "
                 f"('{config.host}', {config.port}): {error.strerror}")
        return 1
    server.app = app  # type: ignore[attr-defined]
    install_stop_signals(app.pool.stop)
    start_thread("http", server.serve_forever)
    try:
        if not app.start_up():
            return 0 if app.pool.stop.is_set() else 1
        app.pool.start()
        sys.stdout.write(f"INFO:     Uvicorn running on http://{config.host}:{config.port} "
                         "(Press CTRL+C to quit)\n")
        log.info("The server is fired up and ready to roll!")
        load = config.knobs.load
        if load is not None:
            def one(n: int) -> None:
                try:
                    app.pool.generate(load.prompt_tokens, load.gen_tokens, f"load-{n}")
                except ValueError as error:
                    log.info(f"Emulator load generator: {error}")
            start_thread("load", steady_load, load.rps, one, app.pool.stop)
        while not app.pool.stop.wait(0.5):
            pass
        return 0
    finally:
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
        sys.stderr.write(f"usage: sglang serve [-h] --model-path MODEL_PATH ...\n"
                         f"sglang serve: error: {error}\n")
        return 2
    return run(config)
