"""llama.cpp's ``llama-server`` as an engine kind: its flags, its startup log, its endpoints.

Source: llama.cpp commit 0c1e5709 (2026-10-01), as vendored by the llama-cpp-python 0.3.36
sdist on PyPI (``vendor/llama.cpp``); files below are inside that tree.

**Flags** (common/arg.cpp): ``-m/--model``, ``-hf/--hf-repo``, ``-a/--alias``, ``--host``,
``--port`` (8080, common/common.h), ``-c/--ctx-size`` (0 = the model's own), ``-np/--parallel``
(slots), ``-ngl/--gpu-layers/--n-gpu-layers`` (a number, ``auto`` or ``all``),
``-ctk/--cache-type-k``, ``-ctv/--cache-type-v``, ``-b/--batch-size`` (2048),
``-ub/--ubatch-size`` (512: the tokens one decode step computes, so the width of the compute
buffer), ``-fa/--flash-attn``, ``-kvu/--kv-unified``, ``--metrics`` (off by default),
``--slots``/``--no-slots`` (on by default), ``-lm/--load-mode`` (newer; older builds had
``--mlock`` and ``--no-mmap``), ``--models-dir``/``--models-preset`` (router mode). Every flag
also reads an environment variable ``LLAMA_ARG_*`` (``.set_env(...)`` in arg.cpp), which the
official images use; a flag on the command line wins.

**Startup log** (src/, tools/server/): ``load_tensors: offloaded N/M layers to GPU`` and
``load_tensors: <buffer> model buffer size = X MiB`` (src/llama-model.cpp) — the weights, one
line per buffer; ``llama_kv_cache: size = X MiB (N cells, L layers, S/T seqs), K (f16): …``
(src/llama-kv-cache.cpp; ``llama_kv_cache_unified``/``_iswa`` in 2025 builds and ``KV self
size = X MiB`` before them) — the KV pool, fixed at start by ``-c``; ``sched_reserve: <buffer>
compute buffer size = X MiB`` (src/llama-context.cpp; ``llama_context:`` or
``llama_new_context_with_model:`` in older builds) — activations for one ``--ubatch-size``
step, reserved at start and held; ``srv  llama_server: model loaded`` (tools/server/server.cpp;
``main: server is listening on …`` in 2025 builds) — ready. Lines may carry
common/log.cpp's prefix ``M.SS.mmm.uuu I `` (time since start), which dates the ready line.

**Endpoints** (tools/server/server-context.cpp ``init_routes``): ``GET /props`` (``total_slots``,
``default_generation_settings.n_ctx`` per slot, ``model_path``, ``model_alias``, ``build_info``,
``endpoint_metrics``, ``endpoint_slots``, ``is_sleeping``); ``GET /metrics`` with ``--metrics``
(tools/server/server-task.cpp ``to_metrics``: counters ``llamacpp:prompt_tokens_total``
(*excluding* cached tokens, unlike vLLM's), ``prompt_tokens_cached_total``,
``tokens_predicted_total``, ``n_decode_total``, ``spec_decode_*``; gauges
``requests_processing``, ``requests_deferred``; no labels, no histograms; the process start in
the ``Process-Start-Time-Unix`` header); ``GET /slots`` (per slot ``id``, ``n_ctx``,
``is_processing``, ``n_prompt_tokens``, ``next_token[0].n_decoded``, and the prompt text, which
SparkOps never keeps). While the model loads every endpoint but ``/health`` answers 503
``{"error": {"message": "Loading model", …}}`` (server-http.cpp); a disabled endpoint answers
501 ``not_supported_error``.

**Router mode** (``--models-dir``/``--models-preset`` without ``-m``; tools/server/
server-models.cpp): ``/props`` answers ``{"role": "router", …}``; ``GET /models`` lists every
model with ``status.value`` ``unloaded``, ``loading``, ``loaded``, ``sleeping`` or
``downloading`` (``failed`` and ``exit_code`` after a failed load); a model runs in a child
process of its own, and ``/metrics`` and ``/slots`` need ``?model=NAME``, which *loads* the
model unless ``autoload=false`` is passed (``is_autoload``: ``--models-autoload`` is on by
default). So SparkOps asks only loaded models, always with ``autoload=false``: a scrape never
loads a model. The server's counters are the sum of its loaded models'; a model that unloads
takes its counters with it, and that interval has no rate.

Counter values are written with C++'s default stream precision (six significant digits:
``1.23457e+06``), so above a million tokens a counter moves in steps of ten or more and a 5 s
rate carries that rounding.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from collectors import promtext
from collectors.kinds.base import (
    KindStartup,
    Launch,
    LaunchError,
    LineLogParser,
    ModuleKind,
    Reading,
    gib_from_mib,
)
from collectors.kinds.http import Clock, get, get_json, one_line, parse_error
from collectors.vllm.metrics import MetricsSnapshot
from collectors.vllm.scrape import ScrapeError

DEFAULT_PORT = 8080
# common/common.h: n_ubatch = 512, the physical batch one llama_decode() computes.
DEFAULT_UBATCH = 512

# --- flags --------------------------------------------------------------------------------------

# Every spelling -> (long name, takes a value, LLAMA_ARG_* variable). Long names key
# ``all_flags``.
_FLAGS: dict[str, tuple[str, bool, str | None]] = {}


def _flag(names: Sequence[str], long: str, takes_value: bool, env: str | None = None) -> None:
    for name in names:
        _FLAGS[name] = (long, takes_value, env)


_flag(("-m", "--model"), "model", True, "LLAMA_ARG_MODEL")
_flag(("-hf", "-hfr", "--hf-repo"), "hf-repo", True, "LLAMA_ARG_HF_REPO")
_flag(("-a", "--alias"), "alias", True, "LLAMA_ARG_ALIAS")
_flag(("--host",), "host", True, "LLAMA_ARG_HOST")
_flag(("--port",), "port", True, "LLAMA_ARG_PORT")
_flag(("-c", "--ctx-size"), "ctx-size", True, "LLAMA_ARG_CTX_SIZE")
_flag(("-np", "--parallel"), "parallel", True, "LLAMA_ARG_N_PARALLEL")
_flag(("-ngl", "--gpu-layers", "--n-gpu-layers"), "n-gpu-layers", True, "LLAMA_ARG_N_GPU_LAYERS")
_flag(("-ctk", "--cache-type-k"), "cache-type-k", True, "LLAMA_ARG_CACHE_TYPE_K")
_flag(("-ctv", "--cache-type-v"), "cache-type-v", True, "LLAMA_ARG_CACHE_TYPE_V")
_flag(("-b", "--batch-size"), "batch-size", True, "LLAMA_ARG_BATCH")
_flag(("-ub", "--ubatch-size"), "ubatch-size", True, "LLAMA_ARG_UBATCH")
_flag(("-fa", "--flash-attn"), "flash-attn", True, "LLAMA_ARG_FLASH_ATTN")
_flag(("-kvu", "--kv-unified"), "kv-unified", False, "LLAMA_ARG_KV_UNIFIED")
_flag(("-lm", "--load-mode"), "load-mode", True, "LLAMA_ARG_LOAD_MODE")
_flag(("--mlock",), "mlock", False, "LLAMA_ARG_MLOCK")
_flag(("--no-mmap",), "no-mmap", False, "LLAMA_ARG_NO_MMAP")
_flag(("--metrics",), "metrics", False, "LLAMA_ARG_ENDPOINT_METRICS")
_flag(("--slots",), "slots", False, "LLAMA_ARG_ENDPOINT_SLOTS")
_flag(("--no-slots",), "no-slots", False, None)
_flag(("--models-dir",), "models-dir", True, "LLAMA_ARG_MODELS_DIR")
_flag(("--models-preset",), "models-preset", True, "LLAMA_ARG_MODELS_PRESET")
_flag(("--models-max",), "models-max", True, "LLAMA_ARG_MODELS_MAX")
_flag(("--sleep-idle-seconds",), "sleep-idle-seconds", True, "LLAMA_ARG_SLEEP_IDLE_SECONDS")
_flag(("--api-key",), "api-key", True, "LLAMA_API_KEY")
_flag(("-t", "--threads"), "threads", True, "LLAMA_ARG_THREADS")

_ENV_TRUE = {"1", "true", "on", "yes", "enabled"}


def _tokens(command: Sequence[str]) -> list[str]:
    """The words of the ``llama-server`` invocation: after the program, also inside
    ``sh -c "…"``; a command of flags only (an image whose entrypoint is llama-server) is
    taken as its arguments."""
    words = list(command)
    for index, word in enumerate(words):
        if " " in word and "llama-server" in word:  # sh -c "exec llama-server -m …"
            return _tokens(shlex.split(word))
        if word.rsplit("/", 1)[-1] == "llama-server":
            return words[index + 1:]
    if words and all(w.startswith("-") or i and words[i - 1].startswith("-")
                     for i, w in enumerate(words)):
        return words
    raise LaunchError("no llama-server invocation found in the command line")


def _scan(args: list[str]) -> dict[str, str | bool]:
    """Flags by long name: a value, or True for a switch; unknown flags kept by their own name."""
    found: dict[str, str | bool] = {}
    index = 0
    while index < len(args):
        word = args[index]
        index += 1
        if not word.startswith("-"):
            continue  # a stray positional: llama-server takes none
        name, has_inline, inline = word.partition("=")
        long, takes_value, _ = _FLAGS.get(name, (name.lstrip("-"), None, None))
        if takes_value is None:  # unknown: a following word that is not a flag is its value
            takes_value = index < len(args) and not args[index].startswith("-")
        if not takes_value:
            found[long] = True
            continue
        if has_inline:
            found[long] = inline
        elif index < len(args):
            found[long] = args[index]
            index += 1
        else:
            raise LaunchError(f"{name} expects a value")
    return found


def _from_env(found: dict[str, str | bool], env: Mapping[str, str]) -> None:
    """LLAMA_ARG_* values for flags the command line did not give."""
    for long, _takes_value, variable in {v for v in _FLAGS.values() if v[2]}:
        if long in found or variable not in env:
            continue
        value = env[variable]
        if _takes_value:
            found[long] = value
        elif value.strip().lower() in _ENV_TRUE:
            found[long] = True


def _int(found: Mapping[str, str | bool], name: str) -> int | None:
    value = found.get(name)
    if value is None or value is True:
        return None
    try:
        return int(str(value))
    except ValueError:
        raise LaunchError(f"--{name} expects a whole number, not {value!r}") from None


def parse_launch(command: Sequence[str], env: Mapping[str, str]) -> Launch:
    """A ``llama-server`` command line (and its LLAMA_ARG_* environment) as a :class:`Launch`.

    ``config`` holds the settings under the keys the ledger and rules read: ``max_num_seqs``
    (``--parallel``), ``max_num_batched_tokens`` (``--ubatch-size``, else llama.cpp's default
    512, as ``ubatch_default`` says), ``served_model_name`` (``--alias``).
    """
    found = _scan(_tokens(command))
    _from_env(found, env)
    port = _int(found, "port") or DEFAULT_PORT
    ubatch = _int(found, "ubatch-size")
    parallel = _int(found, "parallel")
    model = found.get("model") or found.get("hf-repo")
    router = model is None and ("models-dir" in found or "models-preset" in found)
    layers = found.get("n-gpu-layers")
    config: dict[str, Any] = {
        "launcher": "llama-server",
        "model": model if isinstance(model, str) else None,
        "served_model_name": found.get("alias") if isinstance(found.get("alias"), str) else None,
        "host": found.get("host") if isinstance(found.get("host"), str) else None,
        "port": port,
        "port_explicit": "port" in found,
        "ctx_size": _int(found, "ctx-size"),
        "parallel": parallel,
        "max_num_seqs": parallel if parallel and parallel > 0 else None,
        "n_gpu_layers": layers if isinstance(layers, str) else None,
        "cache_type_k": found.get("cache-type-k"),
        "cache_type_v": found.get("cache-type-v"),
        "ubatch_size": ubatch,
        "batch_size": _int(found, "batch-size"),
        "max_num_batched_tokens": ubatch or DEFAULT_UBATCH,
        "ubatch_default": ubatch is None,
        "metrics_endpoint": bool(found.get("metrics")),
        "slots_endpoint": not found.get("no-slots"),
        "mlock": bool(found.get("mlock")) or found.get("load-mode") in ("mlock", "mmap+mlock"),
        "router": router,
        "kv_cache_memory_bytes": None,
        "all_flags": {name: value for name, value in found.items()},
        "unknown_flags": {name: value for name, value in found.items()
                          if f"--{name}" not in _FLAGS and f"-{name}" not in _FLAGS},
    }
    return Launch(model=config["model"], port=port, config=config)


def check_launch(config: Mapping[str, Any]) -> list[dict[str, str]]:
    """What an admin should know about a llama-server launch, most severe first."""
    findings = []
    if not config.get("metrics_endpoint"):
        findings.append({"code": "metrics-disabled", "severity": "warning", "message":
                         "llama-server was started without --metrics: it keeps no token "
                         "counters, so SparkOps shows no prefill or decode rates for it. Add "
                         "--metrics (or LLAMA_ARG_ENDPOINT_METRICS=1)."})
    if str(config.get("n_gpu_layers")) == "0":
        findings.append({"code": "cpu-only", "severity": "warning", "message":
                         "-ngl 0 keeps every layer on the CPU: on a GB10 decode then runs on "
                         "the Grace cores instead of the GPU, although the memory is shared."})
    ctx, parallel = config.get("ctx_size"), config.get("parallel")
    if ctx and parallel and parallel > 1 and not config.get("all_flags", {}).get("kv-unified"):
        findings.append({"code": "context-split-across-slots", "severity": "info", "message":
                         f"-c {ctx} is shared by {parallel} slots: each request gets at most "
                         f"{ctx // parallel:,} tokens of context (llama.cpp divides n_ctx by "
                         "--parallel unless --kv-unified)."})
    if not config.get("slots_endpoint", True):
        findings.append({"code": "slots-disabled", "severity": "info", "message":
                         "--no-slots hides /slots: SparkOps cannot tell how much of each "
                         "slot's context is in use."})
    return findings


# --- startup log ----------------------------------------------------------------------------------

_STAMP = re.compile(r"(?:^|\s)(\d+)\.(\d\d)\.(\d{3})\.(\d{3}) [IWED] ")
_LOADING = re.compile(r"load_model: loading model '([^']*)'|llama_model_loader: loaded meta data")
_OFFLOADED = re.compile(r"load_tensors: offloaded (\d+/\d+) layers to GPU")
_MODEL_BUFFER = re.compile(r"load_tensors:\s+(\S+) model buffer size =\s*([\d.]+) MiB")
_KV_SIZE = re.compile(r"llama_kv_cache\w*: size =\s*([\d.]+) MiB \(\s*(\d+) cells")
_KV_SELF = re.compile(r"KV self size\s*=\s*([\d.]+) MiB")
_KV_BUFFER = re.compile(r"llama_kv_cache\w*:\s+(\S+) KV buffer size =\s*([\d.]+) MiB")
_COMPUTE = re.compile(r"(?:sched_reserve|llama_context|llama_new_context_with_model):\s+(\S+) "
                      r"compute buffer size =\s*([\d.]+) MiB")
# "model loaded" by llama_server() (tools/server/server.cpp; main() in older builds), else the
# 2025 builds' "server is listening on … - starting the main loop" or the idle-slots line.
# Router mode (tools/server/server.cpp): the router serves once it listens; each model's child
# process writes its own lines, which the router copies as "[ PORT] <line>" (server-models.cpp).
_ROUTER = re.compile(r"starting server in router mode")
_CHILD_LINE = re.compile(r"^\[\s*\d+\] ")
_READY = re.compile(r"(?:llama_server|main): model loaded|server is listening on|"
                    r"all slots are idle")
_LISTENING = re.compile(r"listening on (\S+)")
_ERRORS = (
    ("out-of-memory", re.compile(r"(cudaMalloc failed: out of memory|failed to allocate .*buffer"
                                 r"|unable to allocate .* buffer).*")),
    ("model-load-failed", re.compile(r"(failed to load model|error loading model|exiting due to "
                                     r"model loading error).*")),
    ("bind-failed", re.compile(r"(couldn't bind HTTP server socket|exiting due to HTTP server "
                               r"error).*")),
)


class LlamaCppLogParser(LineLogParser):
    """llama-server's startup log, fed in complete lines; the last startup wins."""

    ERRORS = _ERRORS

    def __init__(self) -> None:
        super().__init__()
        self._new()

    def _new(self) -> None:
        self.startup = KindStartup()
        self._router = False
        self._weights: dict[str, float] = {}
        self._kv_sizes: list[tuple[float, int]] = []
        self._kv_self: float | None = None
        self._kv_buffers: dict[str, float] = {}
        self._compute: dict[str, float] = {}

    def _line(self, line: str) -> None:
        if self._router and _CHILD_LINE.search(line):
            return  # a model's child process: its memory is its own, not the router's startup
        if _ROUTER.search(line):
            self._new()
            self._router = True
            self._startups += 1
            self.startup.reach("loading")
            return
        if self._router and (match := _LISTENING.search(line)):
            self.startup.listening_on = match.group(1)
            self.startup.reach("ready")
            self.startup.startup_seconds = _since_start(line)
            return
        if _LOADING.search(line):
            if self.startup.phase != "unknown" and (self.startup.phase != "loading"
                                                    or self._weights):
                self._new()  # the container started again: a new startup in the same log
            if self.startup.phase == "unknown":
                self._startups += 1
            self.startup.reach("loading")
            return
        if match := _OFFLOADED.search(line):
            self.startup.layers_offloaded = match.group(1)
        elif match := _MODEL_BUFFER.search(line):
            self._weights[match.group(1)] = float(match.group(2))
            self.startup.backends = sorted(set(self.startup.backends) | {match.group(1)})
            self.startup.reach("loading")
        elif match := _KV_SIZE.search(line):
            self._kv_sizes.append((float(match.group(1)), int(match.group(2))))
            self.startup.reach("kv_allocated")
        elif match := _KV_SELF.search(line):
            self._kv_self = float(match.group(1))
            self.startup.reach("kv_allocated")
        elif match := _KV_BUFFER.search(line):
            self._kv_buffers[match.group(1)] = float(match.group(2))
        elif match := _COMPUTE.search(line):
            self._compute[match.group(1)] = float(match.group(2))
        elif _READY.search(line):
            if self.startup.phase != "failed":
                self.startup.reach("ready")
                self.startup.startup_seconds = _since_start(line)
            if match := _LISTENING.search(line):  # 2025: "server is listening on URL - …"
                self.startup.listening_on = match.group(1)
        elif match := _LISTENING.search(line):
            self.startup.listening_on = match.group(1)
        else:
            self._error(line)

    def result(self) -> KindStartup:
        startup = super().result()
        if self._weights:
            startup.weights_gib = gib_from_mib(sum(self._weights.values()))
        kv_mib, cells = _kv_pool(self._kv_sizes, self._kv_self, self._kv_buffers)
        if kv_mib is not None:
            startup.kv_cache_gib = gib_from_mib(kv_mib)
            startup.kv_cache_pinned = True  # fixed at start by -c, whatever is free
            startup.kv_cache_tokens = cells
            startup.kv_sized_by = (f"-c: {cells:,} cells reserved at start" if cells
                                   else "-c, reserved at start")
        if self._compute:
            startup.compute_buffer_gib = gib_from_mib(sum(self._compute.values()))
        return startup


def _kv_pool(sizes: list[tuple[float, int]], kv_self: float | None,
             buffers: dict[str, float]) -> tuple[float | None, int | None]:
    """The KV pool in MiB and its cells: the ``size =`` lines (one per cache: an SWA model has
    two), else the older ``KV self size``, else the per-device ``KV buffer size`` lines."""
    if sizes:
        return sum(mib for mib, _ in sizes), max(cells for _, cells in sizes)
    if kv_self is not None:
        return kv_self, None
    if buffers:
        return sum(buffers.values()), None
    return None, None


def _since_start(line: str) -> float | None:
    """Seconds since the process started, from common/log.cpp's ``M.SS.mmm.uuu`` prefix."""
    match = _STAMP.search(line)
    if match is None:
        return None
    minutes, seconds, millis, micros = (int(group) for group in match.groups())
    return round(minutes * 60 + seconds + millis / 1e3 + micros / 1e6, 3)


# --- endpoints -----------------------------------------------------------------------------------

_COUNTERS = {
    "prompt_tokens_total": "llamacpp:prompt_tokens_total",
    "prompt_tokens_cached_total": "llamacpp:prompt_tokens_cached_total",
    "generation_tokens_total": "llamacpp:tokens_predicted_total",
    "spec_decode_drafts_total": "llamacpp:spec_decode_num_drafts_total",
    "spec_decode_draft_tokens_total": "llamacpp:spec_decode_num_draft_tokens_total",
    "spec_decode_accepted_tokens_total": "llamacpp:spec_decode_num_accepted_tokens_total",
}
_GAUGES = {
    "requests_running": "llamacpp:requests_processing",
    "requests_waiting": "llamacpp:requests_deferred",
}
_USED = frozenset({*_COUNTERS.values(), *_GAUGES.values()})


@dataclass(frozen=True)
class LlamaCppMetrics:
    """``/metrics`` of one llama-server, parsed: counters and gauges by SparkOps' field name."""

    counters: dict[str, int]
    gauges: dict[str, int]
    process_start: float | None


def parse_metrics(text: str, process_start_header: str | None = None) -> LlamaCppMetrics:
    """Parse llama-server's ``/metrics`` text, all or nothing (ScrapeError, kind "parse")."""
    if not text.strip():
        raise parse_error("GET /metrics: not a llama.cpp /metrics endpoint: the body is empty")
    if not text.endswith("\n"):
        raise parse_error("GET /metrics: not Prometheus text: the last line does not end with a "
                           "line feed (the body was cut off?)")
    try:
        found = promtext.samples(text, _USED)
    except ValueError as error:
        raise parse_error(f"GET /metrics: not Prometheus text: {one_line(str(error))}") from None
    values: dict[str, float] = {}
    for name, _, value in found:
        if name in values:
            raise parse_error(f"GET /metrics: invalid llama.cpp metrics: {name} appears twice")
        values[name] = value
    if "llamacpp:prompt_tokens_total" not in values \
            or "llamacpp:tokens_predicted_total" not in values:
        raise parse_error("GET /metrics: not a llama.cpp /metrics endpoint: no "
                           "llamacpp:prompt_tokens_total or llamacpp:tokens_predicted_total")
    counts = {}
    for field_name, metric in {**_COUNTERS, **_GAUGES}.items():
        if metric in values:
            counts[field_name] = _count(metric, values[metric])
    gauges = {name: counts.pop(name) for name in _GAUGES if name in counts}
    return LlamaCppMetrics(counters=counts, gauges=gauges,
                           process_start=_start_header(process_start_header))


def _count(name: str, value: float) -> int:
    if not math.isfinite(value) or value < 0:
        raise parse_error(f"GET /metrics: invalid llama.cpp metrics: {name} is {value!r}")
    return int(round(value))


def _start_header(value: str | None) -> float | None:
    try:
        start = float(value) if value is not None else None
    except ValueError:
        return None
    return start if start is not None and math.isfinite(start) and start > 0 else None


def _props(data: Any) -> dict[str, Any]:
    """The parts of ``/props`` SparkOps reads, checked (a reply of another server is refused)."""
    if not isinstance(data, dict) or "total_slots" not in data:
        raise parse_error("GET /props: not a llama-server /props: no total_slots")
    slots = data["total_slots"]
    settings = data.get("default_generation_settings")
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    if not _whole(slots) or slots < 1 or (n_ctx is not None and (not _whole(n_ctx) or n_ctx < 0)):
        raise parse_error(f"GET /props: invalid llama-server props: total_slots {slots!r}, "
                           f"n_ctx {n_ctx!r}")
    return {
        "total_slots": slots,
        "n_ctx_per_slot": n_ctx,
        "model_path": _text(data.get("model_path")),
        "model_alias": _text(data.get("model_alias")),
        "build_info": _text(data.get("build_info")),
        "is_sleeping": bool(data.get("is_sleeping")),
        "endpoint_metrics": data.get("endpoint_metrics"),
        "endpoint_slots": data.get("endpoint_slots"),
    }


def _slots(data: Any) -> list[dict[str, Any]]:
    """Each slot's numbers from ``/slots`` (never its prompt or generated text)."""
    if not isinstance(data, list):
        raise parse_error("GET /slots: not a llama-server /slots: not a list")
    slots = []
    for item in data:
        if not isinstance(item, dict) or not _whole(item.get("id")) \
                or not _whole(item.get("n_ctx")) or not isinstance(item.get("is_processing"), bool):
            raise parse_error("GET /slots: invalid slot: needs a whole id and n_ctx and a "
                               "boolean is_processing")
        next_token = item.get("next_token")
        decoded = next_token[0].get("n_decoded") if isinstance(next_token, list) and next_token \
            and isinstance(next_token[0], dict) else None
        slots.append({
            "id": item["id"], "n_ctx": item["n_ctx"], "is_processing": item["is_processing"],
            "n_prompt_tokens": item.get("n_prompt_tokens") if _whole(item.get("n_prompt_tokens"))
            else None,
            "n_decoded": decoded if _whole(decoded) else None,
        })
    return slots


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def kv_usage(slots: list[dict[str, Any]]) -> float | None:
    """Share of the slots' context held by the requests being processed (prompt plus tokens
    generated so far); None without slots or context."""
    total = sum(slot["n_ctx"] for slot in slots)
    if not slots or total <= 0:
        return None
    used = sum((slot["n_prompt_tokens"] or 0) + (slot["n_decoded"] or 0)
               for slot in slots if slot["is_processing"])
    return min(used / total, 1.0)


def read_endpoints(base_url: str, *, deadline: float) -> Reading:
    """``/props``, then ``/metrics`` and ``/slots`` where enabled, within one ``deadline``."""
    clock = Clock(deadline)
    _, raw_props = get_json(base_url, "/props", clock)
    if isinstance(raw_props, dict) and raw_props.get("role") == "router":
        return read_router(base_url, raw_props, clock)
    props = _props(raw_props)
    unknown: dict[str, str] = {}
    metrics: LlamaCppMetrics | None = None
    if props["endpoint_metrics"] is False:
        unknown["rates"] = ("llama-server runs without --metrics: it keeps no token counters, "
                            "so no prefill or decode rates")
    else:
        status, headers, body = get(base_url, "/metrics", clock, accept=(200, 501))
        if status == 501:
            unknown["rates"] = ("llama-server runs without --metrics: it keeps no token "
                                "counters, so no prefill or decode rates")
        else:
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError as error:
                raise parse_error(f"GET /metrics: not Prometheus text: byte at offset "
                                   f"{error.start} is not UTF-8") from None
            metrics = parse_metrics(text, headers.get("process-start-time-unix"))
    slots: list[dict[str, Any]] | None = None
    if props["endpoint_slots"] is False:
        unknown["kv_usage"] = "llama-server runs with --no-slots: context use is not reported"
    else:
        status, data = get_json(base_url, "/slots", clock, accept=(200, 501))
        if status == 501:
            unknown["kv_usage"] = "llama-server runs with --no-slots: context use is not reported"
        else:
            slots = _slots(data)
    snapshot = _snapshot(props, metrics, slots)
    return Reading(snapshot=snapshot, unknown=unknown, details={
        "props": props, "slots": slots, "state": _state(props, snapshot)})


ROUTER_STATES = ("unloaded", "loading", "loaded", "sleeping", "downloading", "unknown")


def router_models(data: Any) -> list[dict[str, Any]]:
    """``GET /models`` of a router: each model's name and state, checked."""
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise parse_error("GET /models: not a llama-server router's /models: no data list")
    models = []
    for item in data["data"]:
        status = item.get("status") if isinstance(item, dict) else None
        if not isinstance(item, dict) or not isinstance(item.get("id"), str) \
                or not isinstance(status, dict) or status.get("value") not in ROUTER_STATES:
            raise parse_error("GET /models: invalid model entry: needs an id and a known "
                              "status.value")
        models.append({"name": item["id"], "status": status["value"],
                       "failed": bool(status.get("failed")),
                       "exit_code": status.get("exit_code") if _whole(status.get("exit_code"))
                       else None})
    return models


def read_router(base_url: str, raw_props: dict[str, Any], clock: Clock) -> Reading:
    """A router: its models' states, and the counters of the loaded ones, summed."""
    _, data = get_json(base_url, "/models", clock)
    models = router_models(data)
    counters: dict[str, int] = {}
    gauges: dict[str, int] = {}
    metrics_off = False
    for model in models:
        if model["status"] != "loaded":
            continue
        path = f"/metrics?model={quote(model['name'], safe='')}&autoload=false"
        status, _, body = get(base_url, path, clock, accept=(200, 400, 501))
        if status == 400:  # unloaded since /models answered: it has no counters now
            continue
        if status == 501:
            metrics_off = True
            continue
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as error:
            raise parse_error(f"GET {path}: not Prometheus text: byte at offset {error.start} is "
                              "not UTF-8") from None
        try:
            parsed = parse_metrics(text)
        except ScrapeError as error:
            raise ScrapeError(error.reason.replace("GET /metrics", f"GET {path}", 1),
                              kind=error.kind) from None
        model["requests_running"] = parsed.gauges.get("requests_running")
        for name, value in parsed.counters.items():
            counters[name] = counters.get(name, 0) + value
        for name, value in parsed.gauges.items():
            gauges[name] = gauges.get(name, 0) + value
    loaded = [m for m in models if m["status"] == "loaded"]
    unknown = {"kv_usage": "llama-server in router mode: each model's context use is its own "
                          "(/slots?model=…); it is not summed",
               "weights": "llama-server in router mode: each model's weights are held by its "
                          "own child process; SparkOps reads the models' states, not their parts",
               "kv_pool": "llama-server in router mode: each model's KV cache is its own child "
                          "process's; the container's memory holds them all"}
    if metrics_off:
        unknown["rates"] = ("llama-server runs without --metrics: it keeps no token counters, "
                            "so no prefill or decode rates")
    snapshot = MetricsSnapshot(
        model_name=None, engine=None,
        requests_running=gauges.get("requests_running", 0 if not metrics_off else None),
        requests_waiting=gauges.get("requests_waiting", 0 if not metrics_off else None),
        prompt_tokens_total=counters.get("prompt_tokens_total", 0 if not metrics_off else None),
        generation_tokens_total=counters.get("generation_tokens_total",
                                             0 if not metrics_off else None),
    )
    props = {"role": "router", "build_info": _text(raw_props.get("build_info")),
             "max_instances": raw_props.get("max_instances"),
             "models_autoload": raw_props.get("models_autoload")}
    listed = ", ".join(f"{m['name']}: {m['status']}" + (" (failed)" if m["failed"] else "")
                       for m in models)
    state = f"router: {len(loaded)} of {len(models)} models loaded" + \
        (f" ({listed})" if models else "")
    return Reading(snapshot=snapshot, unknown=unknown,
                   details={"props": props, "models": models, "state": state})


def _state(props: dict[str, Any], snapshot: MetricsSnapshot) -> str:
    """The server in words: asleep (its model unloaded until a request comes) or how many of
    its slots are busy."""
    if props["is_sleeping"]:
        return "sleeping: the model is unloaded until a request comes"
    if snapshot.requests_running is None:
        return f"{props['total_slots']} slots"
    return f"{snapshot.requests_running} of {props['total_slots']} slots busy"


def _snapshot(props: dict[str, Any], metrics: LlamaCppMetrics | None,
              slots: list[dict[str, Any]] | None) -> MetricsSnapshot:
    counters = metrics.counters if metrics else {}
    gauges = metrics.gauges if metrics else {}
    running = gauges.get("requests_running")
    if running is None and slots is not None:
        running = sum(1 for slot in slots if slot["is_processing"])
    prompt, cached = counters.get("prompt_tokens_total"), counters.get("prompt_tokens_cached_total")
    model = props["model_alias"] or (props["model_path"] or "").rsplit("/", 1)[-1] or None
    return MetricsSnapshot(
        model_name=model,
        engine=None,
        requests_running=running,
        requests_waiting=gauges.get("requests_waiting"),
        kv_cache_usage=kv_usage(slots) if slots is not None else None,
        prompt_tokens_total=prompt,
        generation_tokens_total=counters.get("generation_tokens_total"),
        # llama.cpp counts computed prompt tokens and cached ones apart: queried = both.
        prefix_cache_queries_total=prompt + cached if None not in (prompt, cached) else None,
        prefix_cache_hits_total=cached,
        spec_decode_drafts_total=counters.get("spec_decode_drafts_total"),
        spec_decode_draft_tokens_total=counters.get("spec_decode_draft_tokens_total"),
        spec_decode_accepted_tokens_total=counters.get("spec_decode_accepted_tokens_total"),
        kv_cache_size_tokens=sum(slot["n_ctx"] for slot in slots) if slots else None,
        kv_cache_size_source="/slots n_ctx" if slots else None,
        process_start_time_seconds=metrics.process_start if metrics else None,
    )


class LlamaCppReader(ModuleKind):
    kind = "llamacpp"
    title = "llama.cpp server"
    endpoints = "llama-server API"
    default_port = DEFAULT_PORT
    health_path = "/health"  # 503 "Loading model" until the model is loaded
    never_reported: Mapping[str, str] = {
        "cuda_graphs": "llama.cpp does not log CUDA-graph memory (its compute buffer, reserved "
                       "at start, is shown apart)",
        "ttft": "llama-server's /metrics has no latency histograms",
    }
    log_parser = LlamaCppLogParser
    launch_parser = staticmethod(parse_launch)
    launch_checks = staticmethod(check_launch)
    endpoint_reader = staticmethod(read_endpoints)
