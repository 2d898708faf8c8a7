"""The emulator speaking llama.cpp's ``llama-server``: its command line, log, endpoints and
memory, from llama.cpp commit 0c1e5709 (the tree vendored by the llama-cpp-python 0.3.36 sdist).

    llama-server -m MODEL.gguf [-c N] [-np N] [-ub N] [--metrics] [--no-slots] [--port N] …
        [--emulator-* flags, see `knobs`]

What it does, as the real one does:

* **Memory, all reserved at start and held** (really resident, as the vLLM dialect's): the
  weights while "loading" (``load_tensors: CUDA0 model buffer size``), the KV cache of ``-c``
  cells (``llama_kv_cache: size = … MiB (N cells, …)``; ``-c 0`` or none: the model's own
  131,072), the compute buffer for one ``--ubatch-size`` batch (``sched_reserve: CUDA0 compute
  buffer size``). Nothing grows during a prefill.
* **Slots**: ``-np`` (default auto: 4 slots sharing one unified KV cache, tools/server/
  server.cpp); without ``--kv-unified`` an explicit ``-np N`` gives each slot ``n_ctx / N``.
* **Endpoints** (tools/server/server-context.cpp): ``/health`` (503 ``Loading model`` until the
  model is loaded, then ``{"status": "ok"}``), ``/props``, ``/slots`` (501 with ``--no-slots``),
  ``/metrics`` (501 without ``--metrics``; counters with C++'s six significant digits, the
  ``Process-Start-Time-Unix`` header), ``/v1/models``, ``POST /v1/completions`` and
  ``/completion``; every other endpoint answers 503 while loading (server-http.cpp).
* **Log** lines with common/log.cpp's ``M.SS.mmm.uuu I `` prefix.
* **Router mode** (``--models-dir DIR`` or ``--models-preset FILE`` without ``-m``;
  tools/server/server-models.cpp): the models of ``--emulator-router-models`` are listed by
  ``GET /models`` (``unloaded`` → ``loading`` → ``loaded``; ``sleeping`` after
  ``--sleep-idle-seconds`` idle, its memory freed); a model loads on ``POST /models/load``, on a
  completion naming it, or on ``/metrics?model=…``/``/slots?model=…`` unless ``autoload=false``
  (``--no-models-autoload`` turns that off), and unloads on ``POST /models/unload`` or when
  ``--models-max`` (4) are loaded and another is asked for (the least recently used goes). Each
  model is a "child" of its own (here in-process), with its own memory and scheduler, whose log
  lines the router copies as ``[ PORT] <line>``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, TextIO
from urllib.parse import parse_qs

from . import openai_api
from .cli import CliError
from .knobs import Knobs, split_knobs
from .memory import Reservation
from .openai_api import ApiError
from .serving import (
    Counters,
    JsonHandler,
    Server,
    generate,
    install_stop_signals,
    new_engine,
    start_thread,
    steady_load,
)
from .units import MIB

PROG = "llama-server"
DEFAULT_PORT = 8080
TRAINED_CONTEXT = 131_072  # the emulated model's own context (`-c 0` or no -c)
DEFAULT_UBATCH = 512  # common/common.h n_ubatch
LAYERS = 49
BUILD_INFO = "b7420-0c1e5709"
# KV bytes per token of each --cache-type-k/-v, relative to f16.
_KV_FACTOR = {"f32": 2.0, "f16": 1.0, "bf16": 1.0, "q8_0": 0.53, "q4_0": 0.28, "q4_1": 0.31,
              "q5_0": 0.34, "q5_1": 0.38, "iq4_nl": 0.28}
_VALUE_FLAGS = {"-m": "model", "--model": "model", "-hf": "hf", "--hf-repo": "hf",
                "-a": "alias", "--alias": "alias", "--host": "host", "--port": "port",
                "-c": "ctx", "--ctx-size": "ctx", "-np": "parallel", "--parallel": "parallel",
                "-ub": "ubatch", "--ubatch-size": "ubatch", "-b": "batch", "--batch-size": "batch",
                "-ctk": "ctk", "--cache-type-k": "ctk", "-ctv": "ctv", "--cache-type-v": "ctv",
                "-ngl": "ngl", "--gpu-layers": "ngl", "--n-gpu-layers": "ngl",
                "-t": "threads", "--threads": "threads", "-fa": "fa", "--flash-attn": "fa",
                "--api-key": "api_key", "-lm": "load_mode", "--load-mode": "load_mode"}
_VALUE_FLAGS.update({"--models-dir": "models_dir", "--models-preset": "models_preset",
                     "--models-max": "models_max", "--sleep-idle-seconds": "sleep_idle"})
_SWITCH_FLAGS = {"--metrics": "metrics", "--no-slots": "no_slots", "--slots": "slots",
                 "--no-models-autoload": "no_autoload", "--models-autoload": "autoload",
                 "-kvu": "kv_unified", "--kv-unified": "kv_unified", "--mlock": "mlock",
                 "--no-mmap": "no_mmap", "--jinja": "jinja", "--no-webui": "no_webui"}


@dataclass(frozen=True)
class LlamaConfig:
    model: str
    alias: str
    host: str
    port: int
    n_ctx: int
    slots: int
    unified: bool
    ubatch: int
    kv_factor: float
    metrics: bool
    slots_endpoint: bool
    knobs: Knobs
    router: bool = False
    models_dir: str = "/models"
    models_max: int = 4
    autoload: bool = True
    sleep_idle: float | None = None

    @property
    def slot_ctx(self) -> int:
        return self.n_ctx if self.unified else self.n_ctx // self.slots

    @property
    def kv_bytes(self) -> int:
        return int(self.n_ctx * self.knobs.kv_bytes_per_token * self.kv_factor)

    @property
    def compute_bytes(self) -> int:
        return self.ubatch * self.knobs.activation_bytes_per_token


def parse_args(argv: list[str]) -> LlamaConfig:
    """llama-server's command line (and its LLAMA_ARG_* environment) plus ``--emulator-*``."""
    knobs, rest = split_knobs(argv)
    values: dict[str, Any] = {}
    index = 0
    while index < len(rest):
        name, has_inline, inline = rest[index].partition("=")
        index += 1
        if name in _SWITCH_FLAGS:
            values[_SWITCH_FLAGS[name]] = True
        elif name in _VALUE_FLAGS:
            if not has_inline:
                if index >= len(rest):
                    raise CliError(f"error while handling argument \"{name}\": expected value")
                inline, index = rest[index], index + 1
            values[_VALUE_FLAGS[name]] = inline
        elif name.startswith("-"):
            raise CliError(f"invalid argument: {name}")
    env = os.environ
    for key, variable in (("ctx", "LLAMA_ARG_CTX_SIZE"), ("parallel", "LLAMA_ARG_N_PARALLEL"),
                          ("port", "LLAMA_ARG_PORT"), ("host", "LLAMA_ARG_HOST"),
                          ("model", "LLAMA_ARG_MODEL"), ("ubatch", "LLAMA_ARG_UBATCH")):
        if key not in values and env.get(variable):
            values[key] = env[variable]
    if env.get("LLAMA_ARG_ENDPOINT_METRICS", "").lower() in ("1", "true", "on"):
        values["metrics"] = True
    model = values.get("model") or values.get("hf")
    router = not model and bool(values.get("models_dir") or values.get("models_preset"))
    if router:
        model = "router"
    if not model:
        raise CliError("no model: pass -m FNAME or -hf REPO")
    try:
        parallel = int(values.get("parallel", -1))
        n_ctx = int(values.get("ctx", 0)) or TRAINED_CONTEXT
        port = int(values.get("port", DEFAULT_PORT))
        ubatch = int(values.get("ubatch", DEFAULT_UBATCH))
    except ValueError as error:
        raise CliError(f"invalid number: {error}") from None
    if parallel == 0 or n_ctx < 0 or ubatch < 1:
        raise CliError("error: invalid value for n_parallel, ctx-size or ubatch-size")
    auto = parallel < 0  # -np -1 (the default): 4 slots and a unified KV cache
    kv_type = values.get("ctk", "f16")
    if kv_type not in _KV_FACTOR:
        raise CliError(f"Unsupported cache type: {kv_type}")
    return LlamaConfig(
        model=model, alias=values.get("alias") or os.path.basename(model), port=port,
        host=values.get("host", "127.0.0.1"), n_ctx=n_ctx, slots=4 if auto else parallel,
        unified=auto or bool(values.get("kv_unified")), ubatch=ubatch,
        kv_factor=_KV_FACTOR[kv_type], metrics=bool(values.get("metrics")),
        slots_endpoint=not values.get("no_slots"), knobs=knobs, router=router,
        models_dir=values.get("models_dir") or "/models",
        models_max=int(values.get("models_max", 4)),
        autoload=not values.get("no_autoload"),
        sleep_idle=float(values["sleep_idle"]) if values.get("sleep_idle") else None,
    )


class LlamaLog:
    """llama.cpp's log lines: ``M.SS.mmm.uuu L `` (time since start, level), flushed."""

    def __init__(self, stream: TextIO, prefix: str = "") -> None:
        self._stream = stream
        self._start = time.monotonic()
        self._lock = threading.Lock()
        self._prefix = prefix  # a router's copy of a child's line: "[ PORT] "

    def child(self, port: int) -> LlamaLog:
        """The log of a router's child on ``port``, copied into this one."""
        return LlamaLog(self._stream, prefix=f"[{port:5d}] ")

    def line(self, message: str, level: str = "I") -> None:
        elapsed = int((time.monotonic() - self._start) * 1e6)
        stamp = (f"{elapsed // 60_000_000}.{elapsed // 1_000_000 % 60:02d}."
                 f"{elapsed // 1000 % 1000:03d}.{elapsed % 1000:03d}")
        with self._lock:
            try:
                self._stream.write(f"{self._prefix}{stamp} {level} {message}\n")
                self._stream.flush()
            except (OSError, ValueError):
                pass

    def srv(self, function: str, message: str, level: str = "I") -> None:
        """SRV_INF's ``srv  %12.*s: `` prefix (tools/server/server-common.h)."""
        self.line(f"srv  {function[:12]:>12}: {message}", level)

    def api(self, source: str, message: str, level: str = "INFO") -> None:
        """What the load generator reports (a warning line)."""
        self.line(f"srv  {'loadgen':>12}: {message}", "W" if level != "INFO" else "I")


def _mib(nbytes: int) -> str:
    return f"{nbytes / MIB:8.2f}"


class LlamaServer:
    """One llama-server process: the model, its memory, its scheduler, its endpoints."""

    def __init__(self, config: LlamaConfig, log: LlamaLog) -> None:
        self.config = config
        self.log = log
        self.stop = threading.Event()
        self.ready = False
        self.counters = Counters()
        self.reservations: list[Reservation] = []
        self.engine = new_engine(
            slots=config.slots, batch=config.ubatch, context_tokens=config.n_ctx,
            per_request_tokens=config.slot_ctx, prefill_tps=config.knobs.prefill_tps,
            decode_tps=config.knobs.decode_tps, counters=self.counters)

    def load(self) -> bool:
        """Load the model as llama-server logs it; False when it failed (and logged why)."""
        c, log = self.config, self.log
        log.srv("load_model", f"loading model '{c.model}'")
        log.line(f"llama_model_loader: loaded meta data with 40 key-value pairs and 579 tensors "
                 f"from {c.model} (version GGUF V3 (latest))")
        if c.knobs.fail == "load":
            size = c.knobs.weights_bytes / MIB
            log.line(f"ggml_backend_cuda_buffer_type_alloc_buffer: allocating {size:.2f} MiB on "
                     "device 0: cudaMalloc failed: out of memory", "E")
            log.line("llama_model_load: error loading model: unable to allocate CUDA0 buffer", "E")
            log.srv("load_model", f"failed to load model, '{c.model}'", "E")
            log.srv("llama_server", "exiting due to model loading error", "E")
            return False
        weights = Reservation(c.knobs.weights_bytes)
        self.reservations.append(weights)
        for step in range(1, 21):  # weights arrive tensor by tensor over the loading time
            weights.touch(c.knobs.weights_bytes * step // 20)
            if self.stop.wait(c.knobs.load_seconds / 20):
                return False
        log.line("load_tensors: offloading output layer to GPU")
        log.line(f"load_tensors: offloaded {LAYERS}/{LAYERS} layers to GPU")
        log.line(f"load_tensors: {'CUDA0':>12} model buffer size = {_mib(c.knobs.weights_bytes)} "
                 "MiB")
        log.line(f"llama_context: n_seq_max     = {c.slots}")
        log.line(f"llama_context: n_ctx         = {c.n_ctx}")
        self.reservations.append(Reservation(c.kv_bytes, populate=True))
        half = c.kv_bytes / 2
        log.line(f"llama_kv_cache: {'CUDA0':>10} KV buffer size = {_mib(c.kv_bytes)} MiB")
        log.line(f"llama_kv_cache: size = {c.kv_bytes / MIB:7.2f} MiB ({c.n_ctx:6d} cells, "
                 f"{LAYERS - 1:3d} layers, {c.slots:2d}/1 seqs), K (f16): {half / MIB:7.2f} MiB, "
                 f"V (f16): {half / MIB:7.2f} MiB")
        self.reservations.append(Reservation(c.compute_bytes, populate=True))
        log.line(f"sched_reserve: {'CUDA0':>10} compute buffer size = {_mib(c.compute_bytes)} "
                 "MiB")
        log.srv("load_model", f"initializing, n_slots = {c.slots}, n_ctx_slot = {c.slot_ctx}, "
                f"kv_unified = '{'true' if c.unified else 'false'}'")
        return True

    def free(self) -> None:
        for reservation in self.reservations:
            reservation.free()
        self.reservations.clear()

    # --- what the endpoints answer ---------------------------------------------------------------

    def props(self) -> dict[str, Any]:
        c = self.config
        return {
            "default_generation_settings": {"params": {}, "n_ctx": c.slot_ctx},
            "total_slots": c.slots, "model_alias": c.alias, "model_path": c.model,
            "modalities": {"vision": False, "video": False, "audio": False},
            "endpoint_slots": c.slots_endpoint, "endpoint_props": False,
            "endpoint_metrics": c.metrics, "chat_template": "", "build_info": BUILD_INFO,
            "is_sleeping": False,
        }

    def slots(self) -> list[dict[str, Any]]:
        busy = self.engine.running_requests()
        slots = []
        for index in range(self.config.slots):
            slot: dict[str, Any] = {"id": index, "n_ctx": self.config.slot_ctx,
                                    "speculative": False, "is_processing": index < len(busy)}
            if index < len(busy):
                prompt, generated = busy[index]
                slot.update({"id_task": index, "n_prompt_tokens": prompt,
                             "next_token": [{"has_next_token": True, "has_new_line": False,
                                             "n_remain": -1, "n_decoded": generated}]})
            slots.append(slot)
        return slots

    def metrics(self) -> str:
        """tools/server/server-task.cpp ``to_metrics``: HELP, TYPE, value per item."""
        counted = self.counters.snapshot()
        gauges = self.engine.gauges()
        counters = [
            ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens",
             counted["prompt_tokens"]),
            ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache",
             counted["prompt_cached"]),
            ("prompt_seconds_total", "Total time spent processing prompts",
             counted["prompt_seconds"]),
            ("tokens_predicted_total", "Number of generation tokens processed",
             counted["predicted_tokens"]),
            ("tokens_predicted_seconds_total", "Total time spent generating tokens",
             counted["predicted_seconds"]),
            ("n_decode_total", "Total number of llama_decode() calls, excluding speculative "
             "decoding and multimodal decoding", counted["decode_calls"]),
            ("n_tokens_max", "Largest observed sequence length (prompt + generation)",
             counted["tokens_max"]),
        ]
        gauge_items = [
            ("requests_processing", "Number of requests processing", gauges.running),
            ("requests_deferred", "Number of requests deferred", gauges.waiting),
        ]
        lines = []
        for kind, items in (("counter", counters), ("gauge", gauge_items)):
            for name, help_text, value in items:
                # std::stringstream << double: six significant digits, %g style.
                lines += [f"# HELP llamacpp:{name} {help_text}",
                          f"# TYPE llamacpp:{name} {kind}", f"llamacpp:{name} {value:g}"]
        return "\n".join(lines) + "\n"


class Router:
    """llama-server in router mode: a child per model, loaded on demand (see the module)."""

    def __init__(self, config: LlamaConfig, log: LlamaLog) -> None:
        self.config = config
        self.log = log
        self.stop = threading.Event()
        self.ready = False
        self.lock = threading.Lock()  # the states and children
        self.loading = threading.Lock()  # one load at a time: a second asker waits for it
        self.names = config.knobs.router_models
        self.state = dict.fromkeys(self.names, "unloaded")
        self.children: dict[str, LlamaServer] = {}
        self.used: dict[str, float] = {}

    def _child_config(self, name: str) -> LlamaConfig:
        return replace(self.config, model=f"{self.config.models_dir}/{name}.gguf", alias=name,
                       router=False)

    def load(self, name: str) -> LlamaServer:
        """The loaded child of ``name``, loading it (and unloading the least recently used one
        beyond ``--models-max``) first. KeyError for a model the router does not have."""
        if name not in self.state:
            raise KeyError(name)
        with self.loading:
            return self._load(name)

    def _load(self, name: str) -> LlamaServer:
        with self.lock:
            if self.state[name] == "loaded":
                self.used[name] = time.monotonic()
                return self.children[name]
            loaded = [n for n, s in self.state.items() if s == "loaded"]
            if len(loaded) >= self.config.models_max:
                victim = min(loaded, key=lambda n: self.used.get(n, 0.0))
                self.log.srv("load", f"models_max limit reached, removing LRU name={victim}")
                self._unload(victim, "unloaded")
            port = self.config.port + 1 + self.names.index(name)
            self.log.srv("load", f"spawning server instance with name={name} on port {port}")
            child = LlamaServer(self._child_config(name), self.log.child(port))
            self.state[name] = "loading"
        if not child.load():
            with self.lock:
                child.free()
                self.state[name] = "unloaded"
                self.log.srv("on_child_exit", f"instance name={name} exited with status 1")
            raise OSError(f"model {name} failed to load")
        start_thread(f"engine-{name}", child.engine.run, child.stop)
        child.ready = True
        child.log.srv("llama_server", "model loaded")
        with self.lock:
            self.children[name] = child
            self.state[name] = "loaded"
            self.used[name] = time.monotonic()
        return child

    def _unload(self, name: str, state: str) -> None:
        child = self.children.pop(name, None)
        if child is not None:
            child.stop.set()
            child.engine.abort_all()
            child.free()
        self.state[name] = state
        if state == "unloaded":
            self.log.srv("unload", f"stopping model instance name={name}")
            self.log.srv("on_child_exit", f"instance name={name} exited with status 0")
        else:
            self.log.srv("sleep", f"model name={name} is entering sleeping state")

    def unload(self, name: str) -> bool:
        with self.lock:
            if self.state.get(name) not in ("loaded", "sleeping"):
                return False
            self._unload(name, "unloaded")
            return True

    def child(self, name: str, autoload: bool) -> LlamaServer | None:
        """The child answering for ``name``: loaded now, or loaded on demand when allowed."""
        with self.lock:
            if self.state.get(name) == "loaded":
                self.used[name] = time.monotonic()
                return self.children[name]
        return self.load(name) if autoload else None

    def sleep_idle(self) -> None:
        """``--sleep-idle-seconds``: a loaded model idle that long sleeps (its memory freed)."""
        idle = self.config.sleep_idle
        while idle and not self.stop.wait(0.5):
            with self.lock:
                for name, state in list(self.state.items()):
                    child = self.children.get(name)
                    if state == "loaded" and child is not None and not child.engine.in_flight() \
                            and time.monotonic() - self.used.get(name, 0.0) > idle:
                        self._unload(name, "sleeping")

    def models(self) -> dict[str, Any]:
        with self.lock:
            data = [{"id": name, "aliases": [], "tags": [], "object": "model",
                     "owned_by": "llamacpp", "created": int(time.time()),
                     "status": {"value": state, "args": ["llama-server", "--port", "0"]},
                     "source": "models_dir", "can_remove": False}
                    for name, state in self.state.items()]
        return {"data": data, "object": "list"}

    def props(self) -> dict[str, Any]:
        return {"role": "router", "max_instances": self.config.models_max,
                "models_autoload": self.config.autoload, "model_alias": "llama-server",
                "model_path": "none", "default_generation_settings": {"params": {}, "n_ctx": 0},
                "ui_settings": {}, "build_info": BUILD_INFO, "cors_proxy_enabled": False}

    def free(self) -> None:
        with self.lock:
            for name in list(self.children):
                self._unload(name, "unloaded")


class Handler(JsonHandler):
    """One llama-server's endpoints; in router mode the router's, which hand a model's
    requests to its child."""

    server_version = "llama.cpp"
    server: Server

    @property
    def app(self) -> LlamaServer | Router:
        return self.server.app  # type: ignore[attr-defined]

    def _error(self, status: int, message: str, kind: str) -> None:
        self.send_json(status, {"error": {"code": status, "message": message, "type": kind}})

    def _query(self) -> dict[str, str]:
        query = parse_qs(self.path.partition("?")[2])
        return {name: values[0] for name, values in query.items()}

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        app = self.app
        if not app.ready:
            self._error(503, "Loading model", "unavailable_error")
            return
        if path in ("/health", "/v1/health"):
            self.send_json(200, {"status": "ok"})
        elif isinstance(app, Router):
            self._router_get(app, path)
        else:
            self._get(app, path)

    def _router_get(self, router: Router, path: str) -> None:
        query = self._query()
        if path in ("/models", "/v1/models"):
            self.send_json(200, router.models())
            return
        if path == "/props" and "model" not in query:
            self.send_json(200, router.props())
            return
        if path not in ("/props", "/metrics", "/slots"):
            self._error(404, "File Not Found", "not_found_error")
            return
        name = query.get("model", "")
        autoload = query["autoload"] in ("true", "1") if "autoload" in query \
            else router.config.autoload
        if not name:
            self._error(400, "model name is missing from the request", "invalid_request_error")
        elif name not in router.state:
            self._error(400, f"model '{name}' not found", "invalid_request_error")
        else:
            try:
                child = router.child(name, autoload)
            except OSError as error:
                self._error(500, str(error), "server_error")
                return
            if child is None:
                self._error(400, "model is not loaded", "invalid_request_error")
            else:
                self._get(child, path)

    def _get(self, app: LlamaServer, path: str) -> None:
        if path == "/props":
            self.send_json(200, app.props())
        elif path == "/slots":
            if not app.config.slots_endpoint:
                self._error(501, "This server does not support slots endpoint. Start it with "
                            "`--slots`", "not_supported_error")
            else:
                self.send_json(200, app.slots())
        elif path == "/metrics":
            if not app.config.metrics:
                self._error(501, "This server does not support metrics endpoint. Start it with "
                            "`--metrics`", "not_supported_error")
            else:
                self.send_body(200, app.metrics().encode(), "text/plain; version=0.0.4",
                               {"Process-Start-Time-Unix": str(int(app.counters.started))})
        elif path in ("/v1/models", "/models"):
            self.send_json(200, {"object": "list", "data": [
                {"id": app.config.alias, "object": "model", "owned_by": "llamacpp",
                 "created": int(time.time()), "meta": {"n_ctx_train": TRAINED_CONTEXT}}]})
        else:
            self._error(404, "File Not Found", "not_found_error")

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        app = self.app
        if not app.ready:
            self._error(503, "Loading model", "unavailable_error")
            return
        body = self.read_json()
        if isinstance(app, Router):
            name = body.get("model") if isinstance(body, dict) else None
            if path in ("/models/load", "/models/unload"):
                self._router_load(app, path, name)
                return
            if not isinstance(name, str) or name not in app.state:
                self._error(400, f"model '{name}' not found", "invalid_request_error")
                return
            try:
                child = app.child(name, app.config.autoload)
            except OSError as error:
                self._error(500, str(error), "server_error")
                return
            if child is None:
                self._error(400, "model is not loaded", "invalid_request_error")
                return
            self._complete(child, path, body)
        else:
            self._complete(app, path, body)

    def _router_load(self, router: Router, path: str, name: Any) -> None:
        if not isinstance(name, str) or name not in router.state:
            self._error(400, "model is not found", "invalid_request_error")
            return
        if path == "/models/unload":
            if not router.unload(name):
                self._error(400, "model is not running", "invalid_request_error")
                return
        else:
            try:
                router.load(name)
            except OSError as error:
                self._error(500, str(error), "server_error")
                return
        self.send_json(200, {"success": True})

    def _complete(self, app: LlamaServer, path: str, body: Any) -> None:
        if path not in ("/v1/completions", "/completion", "/completions"):
            self._error(404, "File Not Found", "not_found_error")
            return
        try:
            gen = openai_api.parse_generation(
                body, chat=False, served_names=(app.config.alias,),
                max_model_len=app.config.slot_ctx)
            request = generate(app.engine, gen.prompt_tokens, gen.output_tokens,
                               openai_api.new_request_id(False))
        except (ApiError, ValueError) as error:
            self._error(400, str(error), "invalid_request_error")
            return
        self.send_json(200, openai_api.response_body(gen, request.request_id,
                                                     int(time.time()), request.generated,
                                                     request.finish_reason or "stop"))


def _bind(config: LlamaConfig, log: LlamaLog) -> Server | None:
    try:
        return Server((config.host, config.port), Handler)
    except OSError as error:
        log.srv("start", f"couldn't bind HTTP server socket, hostname: {config.host}, port: "
                f"{config.port}: {error.strerror}", "E")
        log.srv("llama_server", "exiting due to HTTP server error", "E")
        return None


def run_router(config: LlamaConfig) -> int:
    """Router mode: serve until a stop signal; models load and unload on demand."""
    log = LlamaLog(sys.stdout)
    router = Router(config, log)
    log.srv("llama_server", "initializing ...")
    server = _bind(config, log)
    if server is None:
        return 1
    server.app = router  # type: ignore[attr-defined]
    install_stop_signals(router.stop)
    start_thread("http", server.serve_forever)
    start_thread("sleep", router.sleep_idle)
    log.srv("llama_server", "starting server in router mode. models will be automatically "
            "loaded on-demand")
    router.ready = True
    log.srv("llama_server", f"listening on http://{config.host}:{config.port}")
    try:
        while not router.stop.wait(0.5):
            pass
        log.srv("llama_server", "cleaning up before exit...")
        return 0
    finally:
        server.shutdown()
        server.server_close()
        router.free()


def run(config: LlamaConfig) -> int:
    if config.router:
        return run_router(config)
    log = LlamaLog(sys.stdout)
    app = LlamaServer(config, log)
    log.srv("llama_server", "initializing ...")
    server = _bind(config, log)
    if server is None:
        return 1
    server.app = app  # type: ignore[attr-defined]
    install_stop_signals(app.stop)
    start_thread("http", server.serve_forever)
    try:
        if not app.load():
            return 0 if app.stop.is_set() else 1
        threads = [start_thread("engine", app.engine.run, app.stop)]
        app.ready = True
        log.srv("llama_server", "model loaded")
        log.srv("llama_server", f"listening on http://{config.host}:{config.port}")
        load = config.knobs.load
        if load is not None:
            def one(n: int) -> None:
                try:
                    generate(app.engine, load.prompt_tokens, load.gen_tokens, f"load-{n}")
                except ValueError as error:
                    log.api("loadgen", f"Emulator load generator stopped: {error}", "WARNING")
            threads.append(start_thread("load", steady_load, load.rps, one, app.stop))
        while not app.stop.wait(0.5):
            pass
        log.srv("llama_server", "cleaning up before exit...")
        app.engine.abort_all()
        for thread in threads:
            thread.join(5)
        return 0
    finally:
        server.shutdown()
        server.server_close()
        app.free()


def main(argv: list[str]) -> int:
    if any(token in ("-h", "--help") for token in argv):
        sys.stdout.write(__doc__ or "")
        return 0
    try:
        config = parse_args(argv)
    except CliError as error:
        sys.stderr.write(f"{PROG}: {error}\n")
        return 1
    return run(config)
