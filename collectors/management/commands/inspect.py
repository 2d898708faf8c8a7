"""``manage.py inspect``: read an engine's startup log, a /metrics dump or a launch command by
hand, with the same readers the collector uses (``collectors.kinds``).

    manage.py inspect log FILE|-            what the last startup in a container log reported
    manage.py inspect metrics FILE|URL|-    one /metrics snapshot (llama.cpp: its endpoints;
                                            Ollama: /api/ps; SGLang: /server_info and
                                            /metrics; trtllm-serve: /prometheus/metrics or
                                            /metrics' iteration stats)
    manage.py inspect flags "<command>"     a launch command's settings and findings (or -)

``--engine vllm|llamacpp|ollama|sglang|trtllm`` says which engine wrote the input; without it
the kind is detected (a command's words as discovery reads them, the log lines or text each kind
writes, an address's answers to ``/api/version``, ``/props``, ``/server_info`` and
``/version``), and vLLM is assumed when nothing matches. ``--json`` prints one JSON object
instead of the readable summary. Secrets in the input (API keys, tokens, passwords in URLs) are
masked in everything printed. Unusable input (a missing file, empty stdin, a log without any
line of its engine, a value the engine would refuse) exits non-zero with a one-line reason.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from collectors.kinds.base import KindStartup, LaunchError
from collectors.kinds.discovery import kind_of
from collectors.kinds.registry import READERS, reader_for
from collectors.redaction import mask_command, mask_text
from collectors.vllm.findings import Finding, check_config
from collectors.vllm.flags import EngineConfig, FlagError, parse_command_line
from collectors.vllm.logs import StartupLog, parse_startup_log
from sparkops.units import fixed_gib_text

_STDIN = "-"


class Command(BaseCommand):
    help = "Summarise a vLLM startup log, a /metrics snapshot or a vLLM launch command."
    # An offline inspection tool: it must work before the site (URLs, database) is set up.
    requires_system_checks: list[str] = []
    stealth_options = ("stdin",)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("kind", choices=("log", "metrics", "flags"), help="what to read")
        parser.add_argument(
            "source",
            nargs="+",
            help="a file, '-' for stdin, a URL (metrics), or the command line (flags)",
        )
        parser.add_argument("--json", action="store_true", help="print one JSON object")
        parser.add_argument("--engine", choices=tuple(READERS),
                            help="the engine kind that wrote the input (default: detected)")

    def handle(self, *args: Any, **options: Any) -> None:
        stdin: IO[str] = options.get("stdin") or sys.stdin
        kind: str = options["kind"]
        sources: list[str] = options["source"]
        if kind != "flags" and len(sources) != 1:
            raise CommandError(f"inspect {kind} takes one source, got {len(sources)}")
        handler: Callable[[list[str], IO[str], str | None],
                          tuple[dict[str, Any], list[str]]] = {
            "log": _inspect_log,
            "metrics": _inspect_metrics,
            "flags": _inspect_flags,
        }[kind]
        data, lines = handler(sources, stdin, options.get("engine"))
        if options["json"]:
            self.stdout.write(json.dumps(data, ensure_ascii=False))
        else:
            self.stdout.write("\n".join(lines))


# --- reading input --------------------------------------------------------------------------------


def _read_source(source: str, stdin: IO[str]) -> str:
    if source == _STDIN:
        text = stdin.read()
        if not text.strip():
            raise CommandError("stdin is empty")
        return text
    path = Path(source)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as error:
        raise CommandError(f"cannot read {source}: {error.strerror or error}") from None
    if not text.strip():
        raise CommandError(f"{source} is empty")
    return text


# --- log ------------------------------------------------------------------------------------------


def _inspect_log(sources: list[str], stdin: IO[str],
                 engine: str | None) -> tuple[dict[str, Any], list[str]]:
    source = sources[0]
    text = _read_source(source, stdin)
    shown = "stdin" if source == _STDIN else source
    if engine is None:
        engine = _log_kind(text)
    if engine != "vllm":
        parser = reader_for(engine).new_log_parser()
        parser.feed(text)
        startup = parser.result()
        if not startup.recognised:
            raise CommandError(f"no {reader_for(engine).title} startup line recognised in {shown}")
        return {"kind": engine, **startup.as_dict()}, _kind_log_lines(engine, startup)
    log = parse_startup_log(text)
    if not log.recognised:
        raise CommandError(f"no vLLM startup line recognised in {shown}")
    return log.as_dict(), _log_lines(log)


# Ollama before llama.cpp: Ollama's log carries its llama-server children's lines too.
_LOG_DETECTION_ORDER = ("ollama", "llamacpp")
_DISTINCT_LOGS = ("sglang", "trtllm")


def _log_kind(text: str) -> str:
    """The kind whose startup a log shows: SGLang's and trtllm-serve's (whose own lines are
    distinctive, though their logs carry uvicorn's lines as vLLM's does), then vLLM's, then
    each other kind's parser."""
    for kind in _DISTINCT_LOGS:
        parser = READERS[kind].new_log_parser()
        parser.feed(text)
        if parser.result().recognised:
            return kind
    if parse_startup_log(text).recognised:
        return "vllm"
    for kind in _LOG_DETECTION_ORDER:
        parser = READERS[kind].new_log_parser()
        parser.feed(text)
        if parser.result().recognised:
            return kind
    return "vllm"


def _kind_log_lines(kind: str, log: KindStartup) -> list[str]:
    rows = [
        ("engine", reader_for(kind).title),
        ("phase", log.phase),
        ("version", _text(log.version)),
        ("startups in log", f"{log.startup_count}"),
        ("weights", _num(log.weights_gib, "GiB")),
        ("layers on the GPU", _text(log.layers_offloaded)),
        ("KV cache", f"{_num(log.kv_cache_gib, 'GiB')}"
                     + (f" ({log.kv_sized_by})" if log.kv_sized_by else "")),
        ("KV capacity", _num(log.kv_cache_tokens, "tokens")),
        ("compute buffer", _num(log.compute_buffer_gib, "GiB")),
        ("startup took", _num(log.startup_seconds, "s")),
        ("listening on", _text(log.listening_on)),
        ("errors", "none" if not log.errors else f"{len(log.errors)}"),
    ]
    lines = _table(rows)
    lines.extend(f"  [{error.kind}] {error.message}" for error in log.errors)
    return lines


def _log_lines(log: StartupLog) -> list[str]:
    startups = f"{log.startup_count}" + (" (showing the last)" if log.startup_count > 1 else "")
    pinned = {True: "pinned by --kv-cache-memory-bytes", False: "profiled"}.get(
        log.kv_cache_pinned, "how sized: unknown"
    )
    weights = f"{_num(log.weights_gib, 'GiB')}, loaded in {_num(log.weights_load_seconds, 's')}"
    graphs = (
        f"{_num(log.cuda_graph_gib, 'GiB')} measured, "
        f"{_num(log.cuda_graph_estimate_gib, 'GiB')} estimated"
    )
    rows = [
        ("phase", log.phase),
        ("vLLM version", _text(log.version)),
        ("startups in log", startups),
        ("weights", weights),
        ("KV cache", f"{_num(log.kv_cache_gib, 'GiB')} ({pinned})"),
        ("KV capacity", _num(log.kv_cache_tokens, "tokens")),
        ("max concurrency", _concurrency(log)),
        ("GPU blocks", _num(log.num_gpu_blocks, "blocks")),
        ("CUDA graphs", graphs),
        ("free memory at start", _free_memory(log)),
        ("engine init", _num(log.init_engine_seconds, "s")),
        ("startup took", _num(log.startup_seconds, "s")),
        ("ready at", _text(log.ready_at)),
        ("backends", "; ".join(log.backends) or "none logged"),
        ("errors", "none" if not log.errors else f"{len(log.errors)}"),
    ]
    lines = _table(rows)
    lines.extend(f"  [{error.kind}] {error.message}" for error in log.errors)
    return lines


def _concurrency(log: StartupLog) -> str:
    if log.max_concurrency is None:
        return "unknown"
    return f"{log.max_concurrency:g}x at {_num(log.concurrency_for_tokens, 'tokens')} per request"


def _free_memory(log: StartupLog) -> str:
    free = _num(log.startup_free_gib, "GiB")
    if log.device_total_gib is None:
        return free
    return f"{free} (device total {_num(log.device_total_gib, 'GiB')})"


# --- flags ----------------------------------------------------------------------------------------


def _inspect_flags(sources: list[str], stdin: IO[str],
                   engine: str | None) -> tuple[dict[str, Any], list[str]]:
    command: str | list[str] = sources[0] if len(sources) == 1 else sources
    if command == _STDIN:
        command = _read_source(_STDIN, stdin)
    # What is printed comes from the masked command: no secret reaches the terminal or a log.
    command = mask_text(command) if isinstance(command, str) else mask_command(command)
    words = shlex.split(command) if isinstance(command, str) else list(command)
    engine = engine or kind_of({}, words, "") or "vllm"
    if engine != "vllm":
        return _kind_flags(engine, words)
    try:
        config = parse_command_line(command)
    except FlagError as error:
        raise CommandError(str(error)) from None
    findings = check_config(config)
    data = _flags_json(config, findings)
    return data, _flags_lines(config, findings)


def _flags_json(config: EngineConfig, findings: list[Finding]) -> dict[str, Any]:
    full = config.as_dict()
    keys = (
        "model",
        "served_model_name",
        "port",
        "kv_cache_memory_bytes",
        "gpu_memory_utilization",
        "max_model_len",
        "max_num_seqs",
        "max_num_batched_tokens",
        "kv_cache_dtype",
        "block_size",
        "moe_backend",
        "quantization",
        "speculative_config",
        "enforce_eager",
        "unknown_flags",
    )
    data = {key: full[key] for key in keys}
    data["findings"] = [finding.as_dict() for finding in findings]
    return data


def _flags_lines(config: EngineConfig, findings: list[Finding]) -> list[str]:
    kv_bytes = config.kv_cache_memory_bytes
    kv_size = _setting(kv_bytes, "bytes")
    if kv_bytes is not None:
        kv_size += f" ({fixed_gib_text(kv_bytes)}, pinned)"
    max_len = _setting(config.max_model_len, "tokens")
    if config.max_model_len_auto:
        max_len = "auto (the largest that fits)"
    quantization = _setting(config.quantization)
    if config.quantization is None:
        quantization = "not set (read from the checkpoint)"
    port = f"{config.port}" + ("" if config.port_explicit else " (vLLM default)")
    other = " ".join(_flag_text(name, value) for name, value in config.unknown_flags.items())
    rows = [
        ("model", _setting(config.model)),
        ("served model name", _setting(config.served_model_name)),
        ("port", port),
        ("KV cache size", kv_size),
        ("GPU memory utilization", _setting(config.gpu_memory_utilization, "of total")),
        ("max model len", max_len),
        ("max num seqs", _setting(config.max_num_seqs, "sequences")),
        ("max batched tokens", _setting(config.max_num_batched_tokens, "tokens")),
        ("KV cache dtype", _setting(config.kv_cache_dtype)),
        ("block size", _setting(config.block_size, "tokens")),
        ("MoE backend", _setting(config.moe_backend)),
        ("quantization", quantization),
        ("speculative decoding", _setting(config.speculative_config)),
        ("enforce eager", "yes" if config.enforce_eager else "no"),
        ("other flags", other or "none"),
        ("findings", "none" if not findings else f"{len(findings)}"),
    ]
    lines = _table(rows)
    lines.extend(f"  [{f.severity}] {f.code}: {f.message}" for f in findings)
    return lines


def _kind_flags(kind: str, words: list[str]) -> tuple[dict[str, Any], list[str]]:
    """A llama.cpp or Ollama launch: its settings under SparkOps' keys, and its findings.
    Ollama takes its settings from the environment, which a command line alone does not show."""
    reader = reader_for(kind)
    try:
        launch = reader.parse_launch(words, {})
    except LaunchError as error:
        raise CommandError(str(error)) from None
    findings = reader.findings(launch, None, [])
    data = {"kind": kind, **launch.config, "findings": findings}
    shown = ("model", "served_model_name", "port", "ctx_size", "parallel", "n_gpu_layers",
             "cache_type_k", "cache_type_v", "ubatch_size", "max_num_batched_tokens",
             "metrics_endpoint", "slots_endpoint", "keep_alive", "context_length",
             "mem_fraction_static", "max_running_requests", "chunked_prefill_size",
             "max_batch_size", "max_num_tokens", "kv_cache_free_gpu_memory_fraction",
             "extra_llm_api_options")
    rows = [("engine", reader.title)]
    rows += [(key.replace("_", " "), _setting(launch.config[key]).replace("vLLM", reader.title))
             for key in shown if key in launch.config]
    other = " ".join(_flag_text(name, value) for name, value in launch.config.get(
        "unknown_flags", {}).items())
    rows += [("other flags", other or "none"),
             ("findings", "none" if not findings else f"{len(findings)}")]
    lines = _table(rows)
    lines.extend(f"  [{f['severity']}] {f['code']}: {f['message']}" for f in findings)
    return data, lines


def _flag_text(name: str, value: object) -> str:
    if value is True:
        return f"--{name}"
    if value is False:
        return f"--no-{name}"
    if isinstance(value, tuple):
        return f"--{name} {' '.join(value)}"
    return f"--{name} {value}"


# --- metrics --------------------------------------------------------------------------------------


def _inspect_metrics(sources: list[str], stdin: IO[str],
                     engine: str | None) -> tuple[dict[str, Any], list[str]]:
    # Imported here so that log and flags inspection work without the metrics modules' imports.
    from collectors.vllm.metrics import MetricsParseError, parse_metrics_text
    from collectors.vllm.scrape import ScrapeError, scrape

    source = sources[0]
    url = source.startswith(("http://", "https://"))
    text = None if url else _read_source(source, stdin)
    engine = engine or (_url_kind(source) if url else _text_kind(text or ""))
    if engine != "vllm":
        try:
            return _kind_metrics(engine, source if url else None, text)
        except ScrapeError as error:
            raise CommandError(mask_text(_single_line(str(error)))) from None
    try:
        snapshot = scrape(source) if url else parse_metrics_text(text or "")
    except (MetricsParseError, ScrapeError) as error:
        raise CommandError(mask_text(_single_line(str(error)))) from None
    data = snapshot.as_dict()
    rows = [(key.replace("_", " "), _metric_text(key, value)) for key, value in data.items()]
    return data, _table(rows)


def _text_kind(text: str) -> str:
    """The kind whose dump ``text`` is: llama.cpp's, SGLang's or trtllm-serve's exposition,
    Ollama's ``/api/ps`` JSON, SGLang's ``/server_info``, trtllm-serve's iteration stats, else
    vLLM's exposition."""
    for prefix, kind in (("llamacpp:", "llamacpp"), ("sglang:", "sglang"),
                         ("trtllm_", "trtllm")):
        if prefix in text:
            return kind
    try:
        data = json.loads(text)
    except ValueError:
        return "vllm"
    if isinstance(data, list):
        return "trtllm"
    if isinstance(data, dict) and "max_total_num_tokens" in data:
        return "sglang"
    return "ollama" if isinstance(data, dict) and "models" in data else "vllm"


def _url_kind(url: str) -> str:
    """The kind answering at ``url``'s address: llama-swap answers ``/running``, Ollama
    ``/api/version``, llama-server ``/props``; vLLM otherwise (each probe bounded to a second)."""
    from collectors.kinds.http import Clock, get_json
    from collectors.vllm.scrape import ScrapeError

    base = _base_url(url)
    for kind, path, key in (("llamaswap", "/running", "running"),
                            ("ollama", "/api/version", "version"),
                            ("llamacpp", "/props", "total_slots"),
                            ("sglang", "/server_info", "max_total_num_tokens"),
                            ("sglang", "/get_server_info", "max_total_num_tokens"),
                            ("trtllm", "/version", "version")):
        try:
            _, data = get_json(base, path, Clock(1.0))
        except ScrapeError:
            continue
        if isinstance(data, dict) and key in data:
            return kind
    return "vllm"


def _base_url(url: str) -> str:
    for suffix in ("/running", "/prometheus/metrics", "/metrics", "/api/ps", "/api/version",
                   "/props", "/slots", "/server_info", "/get_server_info", "/version"):
        if url.rstrip("/").endswith(suffix):
            return url.rstrip("/")[: -len(suffix)]
    return url.rstrip("/")


def _kind_metrics(kind: str, url: str | None, text: str | None
                  ) -> tuple[dict[str, Any], list[str]]:
    """A llama.cpp or Ollama read: the whole read from an address, or one dump's parse."""
    from collectors.kinds.llamacpp import parse_metrics
    from collectors.kinds.ollama import loaded_models

    reader = reader_for(kind)
    if url is None and kind in ("sglang", "trtllm"):
        data = {"kind": kind, **_pooled_dump(kind, text or ""),
                "unknown": dict(reader.never_reported)}
    elif url is not None:
        reading = reader.read(_base_url(url), deadline=5.0)
        data = {"kind": kind, "snapshot": reading.snapshot.as_dict(), "details": reading.details,
                "unknown": {**reader.never_reported, **reading.unknown}}
    elif kind == "llamacpp":
        parsed = parse_metrics(text or "")
        data = {"kind": kind, "counters": parsed.counters, "gauges": parsed.gauges,
                "unknown": dict(reader.never_reported)}
    else:
        try:
            models = loaded_models(json.loads(text or ""))
        except ValueError:
            raise CommandError("not an Ollama /api/ps answer: not JSON") from None
        data = {"kind": kind, "models": models, "unknown": dict(reader.never_reported)}
    rows = [("engine", reader.title)]
    for key, value in data.items():
        if key in ("kind", "unknown"):
            continue
        if isinstance(value, dict):
            rows += [(f"{name.replace('_', ' ')}", _metric_text(name, item))
                     for name, item in value.items() if not isinstance(item, dict | list)]
        elif isinstance(value, list):
            rows += [(f"model {model['name']}", f"{model['size_bytes']:,} bytes "
                      f"({fixed_gib_text(model['size_bytes'])}), "
                      f"{model['size_vram_bytes']:,} on the GPU, context "
                      f"{_num(model['context_length'], 'tokens')}, unloads "
                      f"{model['expires_at'] or 'unknown'}") for model in value]
    rows += [(f"{part.replace('_', ' ')}", f"unknown — {why}")
             for part, why in data["unknown"].items()]
    return data, _table(rows)


def _pooled_dump(kind: str, text: str) -> dict[str, Any]:
    """One saved SGLang or trtllm-serve answer: an exposition, SGLang's ``/server_info`` or
    trtllm-serve's iteration stats."""
    from collectors.kinds import sglang, trtllm

    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if kind == "sglang":
        if data is not None:
            return {"server_info": sglang.server_info(data)}
        snapshot, details = sglang.parse_metrics(text)
    elif data is not None:
        snapshot, details = trtllm.parse_iteration_stats(data)
    else:
        snapshot, details = trtllm.parse_prometheus(text)
    return {"snapshot": snapshot.as_dict(), "details": details}


def _metric_text(key: str, value: object) -> str:
    """One snapshot field for people: units where the name implies one, maps summarised."""
    if value is None:
        return "unknown"
    if isinstance(value, dict) and {"count", "sum"} <= value.keys():
        return _histogram_text(value)
    if isinstance(value, dict):
        return f"{len(value)} entries (see --json)" if value else "none"
    if isinstance(value, list):
        return ", ".join(str(item) for item in value) or "none"
    if key == "kv_cache_usage" and isinstance(value, float):
        return f"{value * 100:.1f} % of KV blocks in use"
    if key.endswith("_bytes") and isinstance(value, int):
        return f"{value:,} bytes ({fixed_gib_text(value)})"
    if key == "process_start_time_seconds" and isinstance(value, float):
        return datetime.fromtimestamp(value, UTC).isoformat(timespec="seconds")
    if isinstance(value, int) and not isinstance(value, bool):
        unit = " tokens" if key.endswith(("_tokens", "_tokens_total")) else ""
        return f"{value:,}{unit}"
    return str(value)


def _histogram_text(histogram: dict[str, Any]) -> str:
    count, total = histogram["count"], histogram["sum"]
    if not count or total is None:
        return f"{count} observations"
    return f"{count:,} observations, mean {total / count:.3f} s"


def _single_line(text: str) -> str:
    return " ".join(text.split()) or "unusable metrics input"


# --- formatting -----------------------------------------------------------------------------------


def _table(rows: list[tuple[str, str]]) -> list[str]:
    """``label:  value`` lines, values aligned one column after the longest label."""
    width = max((len(label) for label, _ in rows), default=0) + 2
    return [f"{label + ':':<{width}}{value}" for label, value in rows]


def _text(value: str | None) -> str:
    return "unknown" if value is None else value


def _num(value: float | None, unit: str) -> str:
    """A logged number with its unit, or "unknown" — never 0 for a missing value."""
    if value is None:
        return "unknown"
    if isinstance(value, int):
        return f"{value:,} {unit}"
    return f"{value:g} {unit}"


def _setting(value: object, unit: str = "") -> str:
    """A launch setting, or "not set (vLLM default)" when the flag was not given."""
    if value is None:
        return "not set (vLLM default)"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,} {unit}".strip()
    return f"{value} {unit}".strip()
