"""Ollama as an engine kind: ``ollama serve``, configured by its environment, read from
``/api/ps`` and ``/api/version``.

Source: github.com/ollama/ollama at v0.33.0-rc2 (commit fb307609, 2026-08-21).

* **Settings** come from the environment (envconfig/config.go): ``OLLAMA_HOST`` (default
  ``127.0.0.1:11434``; ``Host()``), ``OLLAMA_KEEP_ALIVE`` (how long an idle model stays
  loaded, default 5m), ``OLLAMA_CONTEXT_LENGTH`` (0: chosen by Ollama), ``OLLAMA_NUM_PARALLEL``
  (default 1), ``OLLAMA_MAX_LOADED_MODELS``. A model's prompt batch is ``num_batch``, 512 by
  default (api/types.go ``DefaultOptions``).
* **``GET /api/ps``** (server/routes.go ``PsHandler``) lists the loaded models
  (api/types.go ``ProcessModelResponse``): ``name``, ``model``, ``size`` (bytes the model is
  expected to take whole: weights, KV cache and compute graph together), ``size_vram`` (the
  part of it on the GPU), ``digest``, ``details`` (``parameter_size``,
  ``quantization_level``, …), ``expires_at`` (RFC 3339, when an idle model is unloaded) and
  ``context_length``; longest-lived first. An empty list means nothing is loaded.
* **``GET /api/version``** answers ``{"version": "…"}``.
* **No ``/metrics``**: Ollama keeps no token counters, running or waiting counts or KV usage;
  those parts are "unknown" with that reason, never 0.
* **Log** (slog text, logutil/logutil.go): ``time=… level=INFO source=routes.go:… msg="Listening
  on 127.0.0.1:11434 (version 0.33.0)"`` once it serves; models load later, on demand, each in a
  ``llama-server`` child whose own lines are copied into the log (llm/llama_server.go).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from collectors.kinds.base import KindStartup, Launch, LaunchError, ModuleKind, Reading
from collectors.kinds.discovery import runs
from collectors.kinds.http import Clock, get_json, parse_error
from collectors.vllm.logs import LogError
from collectors.vllm.metrics import MetricsSnapshot

DEFAULT_PORT = 11434
# api/types.go DefaultOptions: NumBatch 512.
DEFAULT_NUM_BATCH = 512
_SETTINGS = ("OLLAMA_HOST", "OLLAMA_KEEP_ALIVE", "OLLAMA_CONTEXT_LENGTH", "OLLAMA_NUM_PARALLEL",
             "OLLAMA_MAX_LOADED_MODELS", "OLLAMA_FLASH_ATTENTION", "OLLAMA_KV_CACHE_TYPE")


def host_and_port(value: str | None) -> tuple[str, int]:
    """``OLLAMA_HOST`` as Ollama reads it (envconfig ``Host()``): ``[scheme://]host[:port]``,
    port 11434 without a scheme, 80 or 443 with one."""
    text = (value or "").strip()
    scheme, has_scheme, rest = text.partition("://")
    if not has_scheme:
        scheme, rest = "http", text
    default = DEFAULT_PORT if not has_scheme else (443 if scheme == "https" else 80)
    hostport = rest.split("/", 1)[0]
    match = re.fullmatch(r"\[?([^\]]*?)\]?:(\d+)", hostport)
    if match and int(match.group(2)) <= 65535:
        return match.group(1) or "127.0.0.1", int(match.group(2))
    return hostport.strip("[]") or "127.0.0.1", default


def parse_launch(command: Sequence[str], env: Mapping[str, str]) -> Launch:
    """``ollama serve`` and its environment as a :class:`Launch`."""
    words = [part for word in command for part in word.split()]
    serving = any(runs("ollama", [word]) and words[index + 1:index + 2] == ["serve"]
                  for index, word in enumerate(words))
    if not serving:
        raise LaunchError("not an `ollama serve` command line")
    host, port = host_and_port(env.get("OLLAMA_HOST"))
    parallel = _number(env.get("OLLAMA_NUM_PARALLEL"))
    config: dict[str, Any] = {
        "launcher": "ollama serve",
        "model": None,  # models are loaded on demand: see /api/ps
        "served_model_name": None,
        "host": host,
        "port": port,
        "port_explicit": "OLLAMA_HOST" in env,
        "keep_alive": env.get("OLLAMA_KEEP_ALIVE"),
        "context_length": _number(env.get("OLLAMA_CONTEXT_LENGTH")),
        "max_loaded_models": _number(env.get("OLLAMA_MAX_LOADED_MODELS")),
        "max_num_seqs": parallel or 1,
        "max_num_batched_tokens": DEFAULT_NUM_BATCH,
        "kv_cache_memory_bytes": None,
        "settings": {name: env[name] for name in _SETTINGS if name in env},
        "all_flags": {},
        "unknown_flags": {},
    }
    return Launch(model=None, port=port, config=config)


def _number(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def check_launch(config: Mapping[str, Any]) -> list[dict[str, str]]:
    findings = []
    keep_alive = (config.get("keep_alive") or "").strip()
    if keep_alive in ("0", "0s", "0m"):
        findings.append({"code": "keep-alive-zero", "severity": "warning", "message":
                         "OLLAMA_KEEP_ALIVE=0 unloads every model as soon as its request ends: "
                         "each request loads the weights again and the memory comes and goes."})
    return findings


# --- log ------------------------------------------------------------------------------------------

_LISTENING = re.compile(r'msg="Listening on (\S+) \(version ([^)]+)\)"')
_FAILED = re.compile(r"(Error: listen tcp \S+: bind: .*|Error: .*address already in use.*)")


class OllamaLogParser:
    """``ollama serve``'s log: ready once it listens; a failed bind is a failed start."""

    def __init__(self) -> None:
        self.startup = KindStartup()
        self._startups = 0

    def feed(self, text: str) -> None:
        for line in text.splitlines():
            if match := _LISTENING.search(line):
                self.startup = KindStartup(phase="ready", version=match.group(2),
                                           listening_on=match.group(1))
                self._startups += 1
            elif match := _FAILED.search(line):
                self.startup.errors.append(LogError("bind-failed", match.group(0)[:500]))
                self.startup.reach("failed")

    def result(self) -> KindStartup:
        startup = KindStartup.from_dict(self.startup.as_dict())
        startup.startup_count = self._startups
        return startup


# --- endpoints ------------------------------------------------------------------------------------

_GO_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$")


def parse_go_time(value: Any) -> datetime | None:
    """An RFC 3339 time as Go's ``time.Time`` marshals it (nanoseconds, ``Z`` or an offset)."""
    match = _GO_TIME.match(value) if isinstance(value, str) else None
    if match is None:
        return None
    fraction = (match.group(2) or ".0")[:7]
    zone = "+00:00" if match.group(3) == "Z" else match.group(3)
    return datetime.fromisoformat(f"{match.group(1)}{fraction}{zone}").astimezone(UTC)


def loaded_models(data: Any) -> list[dict[str, Any]]:
    """``/api/ps``'s models, checked: each needs a name and whole, non-negative sizes."""
    if not isinstance(data, dict) or not isinstance(data.get("models"), list):
        raise parse_error("GET /api/ps: not an Ollama /api/ps: no models list")
    models = []
    for item in data["models"]:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise parse_error("GET /api/ps: invalid model entry: no name")
        size, vram = item.get("size"), item.get("size_vram")
        if not _count(size) or not _count(vram) or vram > size:
            raise parse_error(f"GET /api/ps: invalid sizes for {item['name'][:80]!r}: size "
                               f"{size!r}, size_vram {vram!r}")
        details = item.get("details") if isinstance(item.get("details"), dict) else {}
        expires = parse_go_time(item.get("expires_at"))
        models.append({
            "name": item["name"],
            "size_bytes": size,
            "size_vram_bytes": vram,
            "expires_at": expires.isoformat() if expires else None,
            "context_length": item.get("context_length") if _count(item.get("context_length"))
            else None,
            "parameter_size": details.get("parameter_size") or None,
            "quantization_level": details.get("quantization_level") or None,
        })
    return models


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# Far beyond any keep-alive an admin would type: a model kept "forever" (OLLAMA_KEEP_ALIVE=-1).
_FOREVER = timedelta(days=365 * 10)


def models_state(models: list[dict[str, Any]], now: datetime) -> str:
    """The loaded models in words: what is held and until when."""
    if not models:
        return "no model loaded"
    parts = []
    for model in models:
        expires = datetime.fromisoformat(model["expires_at"]) if model["expires_at"] else None
        if expires is None:
            until = "unload time unknown"
        elif expires - now > _FOREVER:
            until = "kept loaded"
        elif expires <= now:
            until = "unloading"
        else:
            until = f"unloads in {_minutes(expires - now)} if idle"
        parts.append(f"{model['name']} ({until})")
    return f"{len(models)} loaded: " + ", ".join(parts)


def _minutes(left: timedelta) -> str:
    seconds = int(left.total_seconds())
    return f"{seconds} s" if seconds < 90 else f"{round(seconds / 60)} min"


def read_endpoints(base_url: str, *, deadline: float) -> Reading:
    """``/api/version`` then ``/api/ps``, within one ``deadline``."""
    clock = Clock(deadline)
    _, version = get_json(base_url, "/api/version", clock)
    if not isinstance(version, dict) or not isinstance(version.get("version"), str):
        raise parse_error("GET /api/version: not an Ollama /api/version: no version")
    _, ps = get_json(base_url, "/api/ps", clock)
    models = loaded_models(ps)
    snapshot = MetricsSnapshot(model_name=models[0]["name"] if models else None, engine=None,
                               kv_cache_size_tokens=None)
    details = {
        "version": version["version"],
        "models": models,
        "size_bytes": sum(m["size_bytes"] for m in models),
        "size_vram_bytes": sum(m["size_vram_bytes"] for m in models),
        "state": models_state(models, datetime.now(UTC)),
    }
    return Reading(snapshot=snapshot, details=details)


class OllamaReader(ModuleKind):
    kind = "ollama"
    title = "Ollama"
    endpoints = "Ollama API"
    default_port = DEFAULT_PORT
    health_path = "/api/version"  # Ollama has no /health
    never_reported: Mapping[str, str] = {
        "rates": "Ollama has no /metrics: it keeps no token counters, so no prefill or decode "
                 "rates",
        "requests": "Ollama reports no running or waiting requests",
        "kv_usage": "Ollama reports no KV-cache usage",
        "kv_pool": "Ollama's /api/ps gives each loaded model's whole size (weights, KV cache and "
                   "graph together), not its KV pool",
        "weights": "Ollama's /api/ps gives each loaded model's whole size, not its weights",
        "cuda_graphs": "Ollama reports no CUDA-graph memory",
        "ttft": "Ollama has no /metrics: no latency histograms",
    }
    log_parser = OllamaLogParser
    launch_parser = staticmethod(parse_launch)
    launch_checks = staticmethod(check_launch)
    endpoint_reader = staticmethod(read_endpoints)
