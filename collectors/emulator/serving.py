"""What the non-vLLM dialects (llama.cpp, Ollama) share: an HTTP handler base, blocking
generation through the emulated scheduler, a token-counting metrics sink, and the process's
stop signals.

The scheduler (`engine.Engine`) is the vLLM one, configured with each engine's own limits: its
slots (`--parallel`, `OLLAMA_NUM_PARALLEL`), its batch (`--ubatch-size`, `num_batch`) and its
context. Unlike vLLM, llama.cpp reserves the activation (compute) buffer once at start for one
batch and holds it, so these dialects run the scheduler without a transient prefill buffer and
hold the compute buffer for their whole life instead.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any

from .engine import Engine, EngineSettings, Request
from .memory import TransientBuffer
from .metrics import FinishedRequest

MAX_BODY_BYTES = 16 << 20


class Counters:
    """The scheduler's metrics sink for engines that only count (llama.cpp's `/metrics`):
    prompt tokens computed and cached, tokens generated, decode calls, time spent in each."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.prompt_tokens = 0  # computed, cached ones excluded (llama.cpp's way)
        self.prompt_cached = 0
        self.predicted_tokens = 0
        self.decode_calls = 0
        self.tokens_max = 0
        self.prompt_seconds = 0.0
        self.predicted_seconds = 0.0
        self.started = time.time()

    def record_prefix(self, queries: int, hits: int) -> None:
        """The scheduler's prefix-cache lookup (counted at the prompt's end instead)."""

    def record_prompt(self, prompt_tokens: int, cached_tokens: int) -> None:
        with self._lock:
            self.prompt_tokens += prompt_tokens - cached_tokens
            self.prompt_cached += cached_tokens

    def record_step(self, scheduled_tokens: int, generated_tokens: int) -> None:
        with self._lock:
            self.decode_calls += 1
            self.predicted_tokens += generated_tokens

    def record_first_token(self, ttft_seconds: float) -> None:
        """No latency histograms in these dialects."""

    def record_inter_token(self, seconds: float, tokens: int = 1) -> None:
        """No latency histograms in these dialects."""

    def record_preemption(self) -> None:
        """llama.cpp does not preempt: a full context fails the request instead."""

    def record_finished(self, done: FinishedRequest) -> None:
        with self._lock:
            self.tokens_max = max(self.tokens_max, done.prompt_tokens + done.generation_tokens)
            self.prompt_seconds += done.prefill_seconds
            self.predicted_seconds += done.decode_seconds

    def snapshot(self) -> dict[str, float]:
        """Every count at one instant."""
        with self._lock:
            return {"prompt_tokens": self.prompt_tokens, "prompt_cached": self.prompt_cached,
                    "predicted_tokens": self.predicted_tokens,
                    "decode_calls": self.decode_calls, "tokens_max": self.tokens_max,
                    "prompt_seconds": self.prompt_seconds,
                    "predicted_seconds": self.predicted_seconds}


def new_engine(*, slots: int, batch: int, context_tokens: int, per_request_tokens: int,
               prefill_tps: float, decode_tps: float, counters: Counters) -> Engine:
    """The scheduler for one loaded model: `context_tokens` of KV in blocks of one token."""
    settings = EngineSettings(
        max_num_seqs=slots, max_num_batched_tokens=batch, block_size=1,
        num_gpu_blocks=context_tokens, max_model_len=per_request_tokens,
        prefill_tps=prefill_tps, decode_tps=decode_tps, activation_bytes_per_token=0,
        prefix_hit_rate=0.0,
    )
    return Engine(settings, counters, TransientBuffer())  # type: ignore[arg-type]


def generate(engine: Engine, prompt_tokens: int, output_tokens: int, request_id: str) -> Request:
    """Run one request to its end through the scheduler (ValueError if it can never fit)."""
    request = Request(request_id=request_id, prompt_tokens=prompt_tokens,
                      max_tokens=output_tokens, output_tokens=output_tokens)
    engine.submit(request)
    while not request.done.wait(0.5):
        pass
    return request


class JsonHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 with a length on every answer; access lines are not logged."""

    protocol_version = "HTTP/1.1"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: llama.cpp and Ollama do not log their polling endpoints."""

    def send_body(self, status: int, body: bytes, content_type: str,
                  headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_json(self, status: int, payload: Any) -> None:
        self.send_body(status, json.dumps(payload).encode(), "application/json; charset=utf-8")

    def read_json(self) -> Any:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY_BYTES:
            return None
        try:
            return json.loads(self.rfile.read(length) or b"null")
        except ValueError:
            return None


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def install_stop_signals(stop: threading.Event) -> None:
    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def start_thread(name: str, target: Any, *args: Any) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    thread.start()
    return thread


def steady_load(rps: float, submit: Any, stop: threading.Event) -> None:
    """Call ``submit(n)`` ``rps`` times a second on a fixed schedule, each on its own thread
    (a client waiting for its answer), until ``stop``."""
    interval = 1.0 / rps
    start = time.monotonic()
    n = 0
    while not stop.is_set():
        delay = start + n * interval - time.monotonic()
        if delay > 0 and stop.wait(delay):
            return
        start_thread(f"load-{n}", submit, n)
        n += 1
