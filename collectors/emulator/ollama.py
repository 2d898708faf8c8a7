"""The emulator speaking Ollama: ``ollama serve``, configured by its environment, loading a
model on demand (or at start with ``--emulator-preload``), from Ollama v0.33.0-rc2.

    ollama serve [--emulator-* flags, see `knobs`]
    OLLAMA_HOST=127.0.0.1:11434 OLLAMA_KEEP_ALIVE=5m OLLAMA_CONTEXT_LENGTH=4096
    OLLAMA_NUM_PARALLEL=1

What it does, as the real one does:

* **A model is loaded when a request names it** (``POST /api/generate``, ``/v1/completions``)
  and stays loaded ``OLLAMA_KEEP_ALIVE`` after its last request ends (Go durations, seconds,
  or a negative value for ever; ``0`` unloads at once). Loading reserves, for real, the
  weights, the KV cache (``OLLAMA_CONTEXT_LENGTH × OLLAMA_NUM_PARALLEL`` tokens) and the compute
  buffer for ``num_batch`` (512) tokens, through a ``llama-server`` child whose log lines are
  copied into Ollama's (llm/llama_server.go); unloading frees them.
* **Endpoints** (server/routes.go): ``GET /`` ("Ollama is running"), ``/api/version``,
  ``/api/ps`` (api/types.go ``ProcessModelResponse``: ``size`` and ``size_vram`` the whole
  model, ``expires_at``, ``context_length``), ``/api/tags``; ``POST /api/generate`` and
  ``/v1/completions`` (non-streaming). No ``/metrics``.
* **Log** in slog's text format (logutil/logutil.go): ``time=… level=INFO source=… msg=…``.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO

from . import openai_api
from .cli import CliError
from .engine import Engine
from .knobs import Knobs, split_knobs
from .llamacpp import LAYERS, LlamaLog
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

VERSION = "0.33.0"
DEFAULT_CONTEXT = 4096
NUM_BATCH = 512  # api/types.go DefaultOptions
# Go's time.Duration(math.MaxInt64): what a negative keep-alive becomes (api/types.go).
FOREVER = timedelta(microseconds=(2**63 - 1) // 1000)
_GO_DURATION = re.compile(r"(-?\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}


def keep_alive(text: str | None) -> timedelta:
    """``OLLAMA_KEEP_ALIVE`` as envconfig reads it: a Go duration ("5m", "1h30m") or seconds;
    negative means for ever; 5 minutes when unset or unreadable."""
    if not text:
        return timedelta(minutes=5)
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        parts = _GO_DURATION.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text.replace("+", ""):
            return timedelta(minutes=5)
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    return FOREVER if seconds < 0 else timedelta(seconds=seconds)


@dataclass(frozen=True)
class OllamaConfig:
    host: str
    port: int
    keep_alive: timedelta
    context: int
    parallel: int
    knobs: Knobs

    @property
    def kv_bytes(self) -> int:
        return self.context * self.parallel * self.knobs.kv_bytes_per_token

    @property
    def compute_bytes(self) -> int:
        return NUM_BATCH * self.knobs.activation_bytes_per_token

    @property
    def size(self) -> int:
        return self.knobs.weights_bytes + self.kv_bytes + self.compute_bytes


def parse_args(argv: list[str]) -> OllamaConfig:
    knobs, rest = split_knobs(argv)
    if rest[:1] != ["serve"]:
        raise CliError("the emulator speaks `ollama serve` only")
    if len(rest) > 1:
        raise CliError(f"unknown flag: {rest[1]}")
    host_port = os.environ.get("OLLAMA_HOST", "127.0.0.1:11434").split("://")[-1]
    host, _, port = host_port.rpartition(":")
    try:
        return OllamaConfig(
            host=host.strip("[]") or "127.0.0.1", port=int(port or 11434),
            keep_alive=keep_alive(os.environ.get("OLLAMA_KEEP_ALIVE")),
            context=int(os.environ.get("OLLAMA_CONTEXT_LENGTH") or DEFAULT_CONTEXT),
            parallel=int(os.environ.get("OLLAMA_NUM_PARALLEL") or 1), knobs=knobs)
    except ValueError as error:
        raise CliError(f"invalid environment: {error}") from None


class SlogLog:
    """Go's slog TextHandler lines with Ollama's options: ``time=… level=… source=… msg=…``;
    a ``llama-server`` child's lines are copied in as they are (``runner``)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def new_runner(self) -> LlamaLog:
        """The log of a ``llama-server`` child started now, copied into this one."""
        return LlamaLog(self._stream)

    def log(self, level: str, source: str, message: str, **attrs: Any) -> None:
        now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        extra = "".join(f" {key}={_quoted(value)}" for key, value in attrs.items())
        with self._lock:
            try:
                self._stream.write(f"time={now} level={level} source={source} "
                                   f"msg={_quoted(message)}{extra}\n")
                self._stream.flush()
            except (OSError, ValueError):
                pass

    def api(self, source: str, message: str, level: str = "INFO") -> None:
        self.log("WARN" if level != "INFO" else "INFO", source, message)


def _quoted(value: Any) -> str:
    text = str(value)
    return f'"{text}"' if not text or any(c in text for c in ' ="') else text


def go_time(moment: datetime) -> str:
    """Go's RFC 3339 with nanoseconds, as ``time.Time`` marshals a UTC time."""
    moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond:06d}000Z"


class LoadedModel:
    """One model in memory: its reservations, its scheduler, when it unloads if idle."""

    def __init__(self, name: str, config: OllamaConfig) -> None:
        self.name = name
        self.config = config
        self.counters = Counters()
        self.engine: Engine = new_engine(
            slots=config.parallel, batch=NUM_BATCH, context_tokens=config.context * config.parallel,
            per_request_tokens=config.context, prefill_tps=config.knobs.prefill_tps,
            decode_tps=config.knobs.decode_tps, counters=self.counters)
        self.stop = threading.Event()
        self.reservations: list[Reservation] = []
        self.in_flight = 0
        self.expires_at = datetime.now(UTC) + min(config.keep_alive, FOREVER)
        self.digest = hashlib.sha256(name.encode()).hexdigest()

    def ps_entry(self) -> dict[str, Any]:
        """api/types.go ProcessModelResponse."""
        return {
            "name": self.name, "model": self.name, "size": self.config.size,
            "digest": self.digest,
            "details": {"parent_model": "", "format": "gguf", "family": "llama",
                        "families": ["llama"], "parameter_size": "3.2B",
                        "quantization_level": "Q4_K_M"},
            "expires_at": go_time(self.expires_at), "size_vram": self.config.size,
            "context_length": self.config.context,
        }

    def free(self) -> None:
        self.stop.set()
        self.engine.abort_all()
        for reservation in self.reservations:
            reservation.free()
        self.reservations.clear()


class Ollama:
    """The server: at most one model loaded at a time (``OLLAMA_MAX_LOADED_MODELS`` is not
    emulated), loaded on demand and unloaded when its keep-alive runs out."""

    def __init__(self, config: OllamaConfig, log: SlogLog) -> None:
        self.config = config
        self.log = log
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.model: LoadedModel | None = None

    def ensure_loaded(self, name: str) -> LoadedModel:
        """The loaded model called ``name``, loading it (and unloading another) first."""
        with self.lock:
            if self.model is not None and self.model.name == name:
                return self.model
            if self.model is not None:
                self.model.free()
                self.model = None
            model = LoadedModel(name, self.config)
            self._load(model)
            start_thread(f"engine-{name}", model.engine.run, model.stop)
            self.model = model
            return model

    def _load(self, model: LoadedModel) -> None:
        c, log, knobs = self.config, self.log, self.config.knobs
        started = time.monotonic()
        blob = f"/root/.ollama/models/blobs/sha256-{model.digest}"
        log.log("INFO", "llama_server.go:1048", "loading model via llama-server", model=blob)
        runner = log.new_runner()  # the child's clock starts with it
        runner.srv("load_model", f"loading model '{blob}'")
        if knobs.fail == "load":
            runner.line("llama_model_load: error loading model: unable to allocate CUDA0 buffer",
                        "E")
            log.log("ERROR", "sched.go:641", "Load failed", model=blob,
                    error="llama-server exited: unable to allocate CUDA0 buffer")
            raise ApiError(500, "llama runner process has terminated: unable to allocate CUDA0 "
                                "buffer", "api_error")
        weights = Reservation(knobs.weights_bytes)
        model.reservations.append(weights)
        for step in range(1, 21):
            weights.touch(knobs.weights_bytes * step // 20)
            time.sleep(knobs.load_seconds / 20)
        runner.line(f"load_tensors: offloaded {LAYERS}/{LAYERS} layers to GPU")
        runner.line(f"load_tensors: {'CUDA0':>12} model buffer size = "
                    f"{knobs.weights_bytes / MIB:8.2f} MiB")
        model.reservations.append(Reservation(c.kv_bytes, populate=True))
        runner.line(f"llama_kv_cache: size = {c.kv_bytes / MIB:7.2f} MiB "
                    f"({c.context * c.parallel:6d} cells, {LAYERS - 1:3d} layers, "
                    f"{c.parallel:2d}/1 seqs), K (f16): {c.kv_bytes / 2 / MIB:7.2f} MiB, "
                    f"V (f16): {c.kv_bytes / 2 / MIB:7.2f} MiB")
        model.reservations.append(Reservation(c.compute_bytes, populate=True))
        runner.line(f"sched_reserve: {'CUDA0':>10} compute buffer size = "
                    f"{c.compute_bytes / MIB:8.2f} MiB")
        runner.srv("llama_server", "model loaded")
        log.log("INFO", "llama_server.go:1362",
                f"llama-server started in {time.monotonic() - started:0.2f} seconds")

    def request(self, name: str, prompt_tokens: int, output_tokens: int) -> Any:
        """One generation on ``name``; its keep-alive restarts when it ends."""
        model = self.ensure_loaded(name)
        with self.lock:
            model.in_flight += 1
        try:
            return generate(model.engine, prompt_tokens, output_tokens,
                            openai_api.new_request_id(False))
        finally:
            with self.lock:
                model.in_flight -= 1
                model.expires_at = datetime.now(UTC) + min(self.config.keep_alive, FOREVER)

    def expire(self) -> None:
        """Unload the model whose keep-alive ran out with nothing in flight."""
        while not self.stop.wait(0.2):
            with self.lock:
                model = self.model
                if model is None or model.in_flight or datetime.now(UTC) < model.expires_at:
                    continue
                model.free()
                self.model = None

    def ps(self) -> dict[str, Any]:
        with self.lock:
            return {"models": [self.model.ps_entry()] if self.model else []}

    def shutdown(self) -> None:
        with self.lock:
            if self.model is not None:
                self.model.free()
                self.model = None


class Handler(JsonHandler):
    server_version = ""
    server: Server

    @property
    def app(self) -> Ollama:
        return self.server.app  # type: ignore[attr-defined]

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/":
            self.send_body(200, b"Ollama is running", "text/plain; charset=utf-8")
        elif path == "/api/version":
            self.send_json(200, {"version": self.app.config.knobs.version or VERSION})
        elif path == "/api/ps":
            self.send_json(200, self.app.ps())
        elif path == "/api/tags":
            self.send_json(200, {"models": [{"name": self.app.config.knobs.model,
                                             "model": self.app.config.knobs.model,
                                             "size": self.app.config.knobs.weights_bytes}]})
        else:
            self.send_body(404, b"404 page not found", "text/plain")

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if path not in ("/api/generate", "/v1/completions"):
            self.send_body(404, b"404 page not found", "text/plain")
            return
        body = self.read_json()
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            self.send_json(400, {"error": "model is required"})
            return
        try:
            gen = openai_api.parse_generation(
                body, chat=False, served_names=(body["model"],),
                max_model_len=self.app.config.context)
            request = self.app.request(body["model"], gen.prompt_tokens, gen.output_tokens)
        except ApiError as error:
            self.send_json(error.status, {"error": error.message})
            return
        except ValueError as error:
            self.send_json(400, {"error": str(error)})
            return
        if path == "/v1/completions":
            self.send_json(200, openai_api.response_body(gen, request.request_id,
                                                         int(time.time()), request.generated,
                                                         request.finish_reason or "stop"))
            return
        self.send_json(200, {"model": body["model"], "created_at": go_time(datetime.now(UTC)),
                             "response": openai_api.filler_text(0, request.generated),
                             "done": True, "done_reason": request.finish_reason or "stop",
                             "prompt_eval_count": gen.prompt_tokens,
                             "eval_count": request.generated})


def run(config: OllamaConfig) -> int:
    log = SlogLog(sys.stdout)
    app = Ollama(config, log)
    try:
        server = Server((config.host, config.port), Handler)
    except OSError as error:
        sys.stderr.write(f"Error: listen tcp {config.host}:{config.port}: bind: "
                         f"{error.strerror}\n")
        return 1
    server.app = app  # type: ignore[attr-defined]
    install_stop_signals(app.stop)
    start_thread("http", server.serve_forever)
    log.log("INFO", "routes.go:2008",
            f"Listening on {config.host}:{config.port} (version {config.knobs.version or VERSION})")
    start_thread("expire", app.expire)
    try:
        if config.knobs.preload:
            app.ensure_loaded(config.knobs.model)
        load = config.knobs.load
        if load is not None:
            def one(n: int) -> None:
                try:
                    app.request(config.knobs.model, load.prompt_tokens, load.gen_tokens)
                except (ApiError, ValueError) as error:
                    log.api("loadgen", f"Emulator load generator: {error}", "WARNING")
            start_thread("load", steady_load, load.rps, one, app.stop)
        while not app.stop.wait(0.5):
            pass
        return 0
    except ApiError:
        while not app.stop.wait(0.5):  # a failed preload leaves the server up, as Ollama's
            pass
        return 0
    finally:
        server.shutdown()
        server.server_close()
        app.shutdown()


def main(argv: list[str]) -> int:
    if any(token in ("-h", "--help") for token in argv):
        sys.stdout.write(__doc__ or "")
        return 0
    try:
        config = parse_args(argv)
    except CliError as error:
        sys.stderr.write(f"Error: {error}\n")
        return 1
    return run(config)
