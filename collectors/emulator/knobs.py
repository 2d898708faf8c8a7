"""The ``--emulator-*`` flags of the non-vLLM dialects (llama.cpp, Ollama, SGLang,
TensorRT-LLM): sizes, speeds, load.

vLLM's dialect reads its own ``--emulator-*`` flags in ``cli`` (unchanged); the other dialects
take the engine's real command line plus these, with the same meanings and defaults:

  --emulator-engine {vllm,llamacpp,ollama,sglang,trtllm}  which engine to speak (default vllm)
  --emulator-weights-bytes N              memory held as weights (64M)
  --emulator-kv-bytes-per-token N         f16 KV bytes per token (16: scaled by 1/1024 like all
                                          memory, so token counts keep their real magnitude)
  --emulator-activation-bytes-per-token N compute buffer per batched token (1K); SGLang and
                                          TensorRT-LLM: a prefill step's transient buffer
  --emulator-kv-cap-bytes N               SGLang, TensorRT-LLM: the largest KV pool a memory
                                          fraction may size (256M)
  --emulator-graph-bytes N                SGLang: memory held as CUDA graphs (0)
  --emulator-load-seconds S               how long loading the weights takes (1)
  --emulator-prefill-tps R (2000), --emulator-decode-tps R (40 per sequence)
  --emulator-load RPS:PROMPT:GEN          built-in request generator
  --emulator-model NAME                   Ollama: the model a client asks for (llama3.2:3b)
  --emulator-preload                      Ollama: load that model at start, as a first
                                          request would
  --emulator-router-models A,B,…          llama.cpp router mode: the models it offers
  --emulator-fail {none,load}             the model fails to load (out of memory)
  --emulator-version V                    the version it claims

Standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from .cli import CliError, LoadSpec, _load_spec
from .units import human_readable_int

ENGINES = ("vllm", "llamacpp", "ollama", "sglang", "trtllm", "llamaswap")


@dataclass(frozen=True)
class Knobs:
    weights_bytes: int = 64 << 20
    kv_bytes_per_token: int = 16
    activation_bytes_per_token: int = 1024
    load_seconds: float = 1.0
    prefill_tps: float = 2000.0
    decode_tps: float = 40.0
    load: LoadSpec | None = None
    model: str = "llama3.2:3b"
    preload: bool = False
    fail: str = "none"
    version: str | None = None
    router_models: tuple[str, ...] = ("qwen3-8b", "gemma-3-12b")
    kv_cap_bytes: int = 256 << 20
    graph_bytes: int = 0


_CONVERT: dict[str, tuple[str, Any]] = {
    "--emulator-weights-bytes": ("weights_bytes", human_readable_int),
    "--emulator-kv-bytes-per-token": ("kv_bytes_per_token", human_readable_int),
    "--emulator-activation-bytes-per-token": ("activation_bytes_per_token", human_readable_int),
    "--emulator-kv-cap-bytes": ("kv_cap_bytes", human_readable_int),
    "--emulator-graph-bytes": ("graph_bytes", human_readable_int),
    "--emulator-load-seconds": ("load_seconds", float),
    "--emulator-prefill-tps": ("prefill_tps", float),
    "--emulator-decode-tps": ("decode_tps", float),
    "--emulator-load": ("load", _load_spec),
    "--emulator-model": ("model", str),
    "--emulator-fail": ("fail", str),
    "--emulator-version": ("version", str),
    "--emulator-router-models": ("router_models",
                                 lambda text: tuple(n for n in text.split(",") if n)),
}
_SWITCHES = {"--emulator-preload": "preload"}


def engine_of(argv: Sequence[str]) -> tuple[str, list[str]]:
    """``--emulator-engine`` (default vllm) and the command line without it."""
    rest, engine = [], "vllm"
    tokens = list(argv)
    index = 0
    while index < len(tokens):
        name, has_inline, inline = tokens[index].partition("=")
        if name == "--emulator-engine":
            if has_inline:
                engine = inline
            elif index + 1 < len(tokens):
                engine = tokens[index + 1]
                index += 1
            else:
                raise CliError("argument --emulator-engine: expected one argument")
            index += 1
            continue
        rest.append(tokens[index])
        index += 1
    if engine not in ENGINES:
        raise CliError(f"argument --emulator-engine: invalid choice: {engine!r} "
                       f"(choose from {', '.join(ENGINES)})")
    return engine, rest


def split_knobs(argv: Sequence[str]) -> tuple[Knobs, list[str]]:
    """The ``--emulator-*`` flags as :class:`Knobs`, and the engine's own flags."""
    knobs, rest = Knobs(), []
    tokens = list(argv)
    index = 0
    while index < len(tokens):
        name, has_inline, inline = tokens[index].partition("=")
        index += 1
        if name in _SWITCHES:
            knobs = replace(knobs, **{_SWITCHES[name]: True})
            continue
        if name not in _CONVERT:
            rest.append(tokens[index - 1])
            continue
        if not has_inline:
            if index >= len(tokens):
                raise CliError(f"argument {name}: expected one argument")
            inline, index = tokens[index], index + 1
        field, convert = _CONVERT[name]
        try:
            value = convert(inline)
        except ValueError as error:
            raise CliError(f"argument {name}: {error}") from None
        knobs = replace(knobs, **{field: value})
    if knobs.fail not in ("none", "load"):
        raise CliError("argument --emulator-fail: choose from none, load")
    if knobs.prefill_tps <= 0 or knobs.decode_tps <= 0 or knobs.kv_bytes_per_token <= 0:
        raise CliError("--emulator-prefill-tps, --emulator-decode-tps and "
                       "--emulator-kv-bytes-per-token must be > 0")
    return knobs, rest
