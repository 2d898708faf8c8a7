"""``manage.py inspect``: read a vLLM startup log, a /metrics dump or a launch command by hand.

    manage.py inspect log FILE|-            what the last startup in a container log reported
    manage.py inspect metrics FILE|URL|-    one /metrics snapshot
    manage.py inspect flags "<command>"     a launch command's settings and findings (or -)

``--json`` prints one JSON object instead of the readable summary. Secrets in the input (API
keys, tokens, passwords in URLs) are masked in everything printed. Unusable input (a missing file,
empty stdin, a log without any vLLM line, a value vLLM would refuse) exits non-zero with a
one-line reason.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

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

    def handle(self, *args: Any, **options: Any) -> None:
        stdin: IO[str] = options.get("stdin") or sys.stdin
        kind: str = options["kind"]
        sources: list[str] = options["source"]
        if kind != "flags" and len(sources) != 1:
            raise CommandError(f"inspect {kind} takes one source, got {len(sources)}")
        handler: Callable[[list[str], IO[str]], tuple[dict[str, Any], list[str]]] = {
            "log": _inspect_log,
            "metrics": _inspect_metrics,
            "flags": _inspect_flags,
        }[kind]
        data, lines = handler(sources, stdin)
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


def _inspect_log(sources: list[str], stdin: IO[str]) -> tuple[dict[str, Any], list[str]]:
    source = sources[0]
    log = parse_startup_log(_read_source(source, stdin))
    if not log.recognised:
        shown = "stdin" if source == _STDIN else source
        raise CommandError(f"no vLLM startup line recognised in {shown}")
    return log.as_dict(), _log_lines(log)


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


def _inspect_flags(sources: list[str], stdin: IO[str]) -> tuple[dict[str, Any], list[str]]:
    command: str | list[str] = sources[0] if len(sources) == 1 else sources
    if command == _STDIN:
        command = _read_source(_STDIN, stdin)
    # What is printed comes from the masked command: no secret reaches the terminal or a log.
    command = mask_text(command) if isinstance(command, str) else mask_command(command)
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


def _flag_text(name: str, value: object) -> str:
    if value is True:
        return f"--{name}"
    if value is False:
        return f"--no-{name}"
    if isinstance(value, tuple):
        return f"--{name} {' '.join(value)}"
    return f"--{name} {value}"


# --- metrics --------------------------------------------------------------------------------------


def _inspect_metrics(sources: list[str], stdin: IO[str]) -> tuple[dict[str, Any], list[str]]:
    # Imported here so that log and flags inspection work without the metrics modules' imports.
    from collectors.vllm.metrics import MetricsParseError, parse_metrics_text
    from collectors.vllm.scrape import ScrapeError, scrape

    source = sources[0]
    try:
        if source.startswith(("http://", "https://")):
            snapshot = scrape(source)
        else:
            snapshot = parse_metrics_text(_read_source(source, stdin))
    except (MetricsParseError, ScrapeError) as error:
        raise CommandError(mask_text(_single_line(str(error)))) from None
    data = snapshot.as_dict()
    rows = [(key.replace("_", " "), _metric_text(key, value)) for key, value in data.items()]
    return data, _table(rows)


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
