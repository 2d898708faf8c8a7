"""The HTTP side: vLLM's endpoints on a standard-library `ThreadingHTTPServer`.

Unlike real vLLM, which only opens its port once the engine is ready, the emulator listens from
the first second so a collector can watch the start: `/health` answers 503 until the engine is
ready (and again once shutdown starts), 200 in between. `/metrics` shows the process metrics
during start-up and the engine families once the engine exists (vLLM emits
`cache_config_info` only after the KV cache is sized, in loggers.py:log_metrics_info).

Endpoints (those of vLLM 0.33): GET /health, /ping, /version, /load, /v1/models, /metrics;
POST /ping, /v1/completions, /v1/chat/completions (JSON or server-sent events with `stream`);
with `VLLM_SERVER_DEV_MODE=1` also sleep mode's POST /sleep, POST /wake_up and GET /is_sleeping
(`sleepmode`).
Each request is logged in uvicorn's access-log format unless --disable-uvicorn-access-log.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from . import openai_api
from .cli import EmulatorConfig
from .engine import Engine, Request
from .logs import VllmLog
from .metrics import EngineMetrics, render_process_metrics
from .openai_api import ApiError, Generation
from .sleepmode import PAUSE_MODES, SleepMode, dev_mode, sleep_answer, wake_up_answer

MAX_BODY_BYTES = 16 << 20
STREAM_POLL_SECONDS = 0.02
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class ServerState:
    """What the handlers read; written by the app as the engine starts and stops."""

    config: EmulatorConfig
    log: VllmLog
    stopping: threading.Event
    ready: bool = False
    engine: Engine | None = None
    metrics: EngineMetrics | None = None
    max_model_len: int | None = None
    sleep_mode: SleepMode | None = None

    @property
    def served_names(self) -> tuple[str, ...]:
        return self.config.served_model_names or (self.config.model,)

    @property
    def serving(self) -> bool:
        return self.ready and not self.stopping.is_set()


class EmulatorHTTPServer(ThreadingHTTPServer):
    """One thread per connection; threads never block process exit."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], state: ServerState) -> None:
        super().__init__(address, Handler)
        self.state = state


class Handler(BaseHTTPRequestHandler):
    """Routes one HTTP/1.1 request at a time on a keep-alive connection."""

    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""
    server: EmulatorHTTPServer

    # --- plumbing ------------------------------------------------------------------------------

    @property
    def state(self) -> ServerState:
        return self.server.state

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        if self.state.config.disable_access_log:
            return
        try:
            phrase = HTTPStatus(int(code)).phrase
        except ValueError:
            phrase = ""
        host, port = self.client_address[:2]
        self.state.log.uvicorn(f'{host}:{port} - "{self.requestline}" {code} {phrase}')

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the standard library's stderr logging; access lines go through log_request."""

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload: Any) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def _error(self, error: ApiError) -> None:
        self._json(error.status, openai_api.error_body(self.state.config.style, error))

    def _read_json(self) -> Any:
        length_header = self.headers.get("Content-Length")
        if length_header is None:
            raise ApiError(411, "Content-Length required", "BadRequestError")
        try:
            length = int(length_header)
        except ValueError:
            raise ApiError(400, "bad Content-Length", "BadRequestError") from None
        if length < 0 or length > MAX_BODY_BYTES:
            raise ApiError(413, "request body too large", "BadRequestError")
        raw = self.rfile.read(length)
        try:
            return json.loads(raw or b"null")
        except ValueError:
            raise ApiError(400, "the request body is not valid JSON", "BadRequestError") from None

    # --- routes --------------------------------------------------------------------------------

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        state = self.state
        if path in {"/health", "/ping"}:
            self._send(200 if state.serving else 503, b"", "application/json")
        elif path == "/version":
            self._json(200, {"version": state.config.version})
        elif path == "/load":
            load = state.engine.in_flight() if state.engine else 0
            self._json(200, {"server_load": load})
        elif path == "/metrics":
            self._send(200, self._metrics_text().encode(), METRICS_CONTENT_TYPE)
        elif path == "/is_sleeping" and dev_mode():
            if not state.config.style.modern:
                state.log.api("api_server.py:1097", "check whether the engine is sleeping")
            sleeping = state.sleep_mode.is_sleeping if state.sleep_mode else False
            self._json(200, {"is_sleeping": sleeping})
        elif path == "/v1/models":
            if not state.serving or state.max_model_len is None:
                self._error(ApiError(503, "The engine is not ready.", "ServiceUnavailableError"))
                return
            self._json(
                200,
                openai_api.models_body(state.served_names, state.config.model, state.max_model_len),
            )
        else:
            self._json(404, {"detail": "Not Found"})

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/ping":
            self._send(200 if self.state.serving else 503, b"", "application/json")
        elif path in {"/v1/completions", "/v1/chat/completions"}:
            try:
                self._generate(chat=path.endswith("chat/completions"))
            except ApiError as error:
                self._error(error)
        elif path in {"/sleep", "/wake_up"} and dev_mode():
            self._sleep_mode(path)
        else:
            self._json(404, {"detail": "Not Found"})

    def _sleep_mode(self, path: str) -> None:
        """POST /sleep?level=N&mode=… and POST /wake_up?tags=…, answered once done."""
        state = self.state
        self._read_body()
        sleep_mode = state.sleep_mode
        if sleep_mode is None:
            self._error(ApiError(503, "The engine is not ready.", "ServiceUnavailableError"))
            return
        query = urllib.parse.parse_qs(self.path.partition("?")[2])
        modern = state.config.style.modern
        if path == "/wake_up":
            tags = query.get("tags") or None
            awake = sleep_mode.wake_up(tags)
            self._answer(wake_up_answer(modern, awake, tags))
            return
        level_text = (query.get("level") or ["1"])[-1]
        mode = (query.get("mode") or ["abort"])[-1]
        level = int(level_text) if level_text.isdecimal() else None
        # FastAPI refuses a query parameter outside Query(ge=0, le=2) or the PauseMode literal
        # (api_router.py:26) with 422 and the parameter's place.
        if level is None or not 0 <= level <= 2:
            self._json(422, _invalid("level", "Input should be 0, 1 or 2", level_text))
            return
        if mode not in PAUSE_MODES:
            self._json(422, _invalid("mode", "Input should be 'abort', 'wait' or 'keep'", mode))
            return
        sleep_mode.sleep(level, mode)
        self._answer(sleep_answer(modern, level))

    def _read_body(self) -> None:
        length = self.headers.get("Content-Length")
        if length and length.isdecimal() and 0 < int(length) <= MAX_BODY_BYTES:
            self.rfile.read(int(length))

    def _answer(self, body: Any) -> None:
        if body is None:
            self._send(200, b"", "application/json")  # 2025: `Response(status_code=200)`
        else:
            self._json(200, body)

    def _metrics_text(self) -> str:
        state = self.state
        lines = render_process_metrics()
        if state.engine is not None and state.metrics is not None:
            lines += state.metrics.render(state.engine.gauges())
        return "\n".join(lines) + "\n"

    # --- generation ----------------------------------------------------------------------------

    def _generate(self, *, chat: bool) -> None:
        state = self.state
        if not state.serving or state.engine is None or state.max_model_len is None:
            raise ApiError(503, "The engine is not ready.", "ServiceUnavailableError")
        gen = openai_api.parse_generation(
            self._read_json(),
            chat=chat,
            served_names=state.served_names,
            max_model_len=state.max_model_len,
        )
        request_id = openai_api.new_request_id(chat)
        request = Request(
            request_id=request_id,
            prompt_tokens=gen.prompt_tokens,
            max_tokens=gen.max_tokens,
            output_tokens=gen.output_tokens,
        )
        try:
            state.engine.submit(request)
        except ValueError as exc:
            raise ApiError(400, str(exc), "BadRequestError") from None
        if gen.stream:
            self._stream(gen, request, request_id, state.engine)
            return
        while not request.done.wait(0.5):
            pass
        if request.finish_reason == "abort":
            raise ApiError(503, "The engine is shutting down.", "ServiceUnavailableError")
        body = openai_api.response_body(
            gen, request_id, int(time.time()), request.generated, request.finish_reason or "stop"
        )
        self._json(200, body)

    def _stream(self, gen: Generation, request: Request, request_id: str, engine: Engine) -> None:
        """Server-sent events, one per batch of new tokens; ends with `data: [DONE]`."""
        created = int(time.time())
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        sent = 0
        try:
            while True:
                finished = request.done.wait(STREAM_POLL_SECONDS)
                available = min(request.generated, gen.output_tokens)
                reason = request.finish_reason if finished else None
                if available > sent or finished:
                    chunk = openai_api.stream_chunk(
                        gen, request_id, created, sent, available - sent, reason
                    )
                    self._event(chunk)
                    sent = available
                if finished:
                    break
            if gen.include_usage:
                self._event(
                    {
                        "id": request_id,
                        "object": "chat.completion.chunk" if gen.chat else "text_completion",
                        "created": created,
                        "model": gen.model,
                        "choices": [],
                        "usage": openai_api.usage(gen.prompt_tokens, sent),
                    }
                )
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except OSError:
            engine.abort(request)  # the client went away: vLLM aborts the request too

    def _event(self, payload: dict[str, Any]) -> None:
        self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
        self.wfile.flush()


def _invalid(name: str, message: str, given: str) -> dict[str, Any]:
    """FastAPI's validation error body for one query parameter."""
    return {"detail": [{"type": "value_error", "loc": ["query", name], "msg": message,
                        "input": given}]}
