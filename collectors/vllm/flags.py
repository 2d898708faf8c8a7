"""vLLM launch flags: turn a container's command line into an :class:`EngineConfig`.

The parser mirrors how vLLM's own argument parser reads the flags that matter for memory and speed
(vllm/engine/arg_utils.py of vLLM 0.33.0): ``--flag value`` and ``--flag=value``, underscores
or dashes (``--max_model_len``), unambiguous prefixes (``--kv-cache-memory=…``, the spelling vLLM
prints in its sizing advice), ``--no-<switch>`` for boolean switches, and vLLM's human-readable
integers. A value vLLM would refuse raises :class:`FlagError`; nothing is silently read as 0.
Flags the parser does not interpret are kept verbatim in ``all_flags`` / ``unknown_flags`` so
checks can see them. Which flags take no value, and which names exist at all (for prefix
abbreviations), comes from every minor release 0.6-0.33 (``collectors.vllm.flag_history``,
generated from vLLM's own argument parsers), so a switch never swallows the model that follows
it, whatever the release.
A command whose secrets were masked (``collectors.redaction``) parses to the same settings, with
the masked values in place of the secret ones.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from collectors.redaction import mask_command
from collectors.vllm.flag_history import ALL_FLAGS, SWITCHES

DEFAULT_PORT = 8000

FlagValue = str | bool | tuple[str, ...]


class FlagError(ValueError):
    """A command line vLLM would refuse; ``str(error)`` is one line naming the flag."""


@dataclass(frozen=True)
class EngineConfig:
    """What one vLLM engine was told at launch.

    ``None`` means "not given": vLLM then uses its own default, which depends on the version and
    the hardware (e.g. ``--gpu-memory-utilization`` 0.92 now, 0.9 in older releases), so no
    default is filled in here. ``port`` is the exception: it is always known (8000 unless
    ``port_explicit``). ``max_model_len`` is ``None`` with ``max_model_len_auto`` set for
    ``auto`` / ``-1`` (vLLM picks the largest length that fits).
    """

    launcher: str
    model: str | None
    served_model_name: str | None
    served_model_names: tuple[str, ...]
    host: str | None
    port: int
    port_explicit: bool
    kv_cache_memory_bytes: int | None
    gpu_memory_utilization: float | None
    max_model_len: int | None
    max_model_len_auto: bool
    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    kv_cache_dtype: str | None
    block_size: int | None
    moe_backend: str | None
    quantization: str | None
    speculative_config: str | None
    speculative_config_json: dict[str, Any] | None
    enforce_eager: bool
    all_flags: Mapping[str, FlagValue]
    unknown_flags: Mapping[str, FlagValue]

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field (flag mappings as plain dicts, tuples as lists)."""
        return {
            "launcher": self.launcher,
            "model": self.model,
            "served_model_name": self.served_model_name,
            "served_model_names": list(self.served_model_names),
            "host": self.host,
            "port": self.port,
            "port_explicit": self.port_explicit,
            "kv_cache_memory_bytes": self.kv_cache_memory_bytes,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "max_model_len": self.max_model_len,
            "max_model_len_auto": self.max_model_len_auto,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "kv_cache_dtype": self.kv_cache_dtype,
            "block_size": self.block_size,
            "moe_backend": self.moe_backend,
            "quantization": self.quantization,
            "speculative_config": self.speculative_config,
            "speculative_config_json": self.speculative_config_json,
            "enforce_eager": self.enforce_eager,
            "all_flags": _json_flags(self.all_flags),
            "unknown_flags": _json_flags(self.unknown_flags),
        }


def _json_flags(flags: Mapping[str, FlagValue]) -> dict[str, str | bool | list[str]]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in flags.items()}


# --- value converters: each raises ValueError with a reason (the flag name is added later) ------

_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_DECIMAL_SUFFIX = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY_SUFFIX = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_UNIT_SPELLING = re.compile(r"(\d+(?:\.\d+)?)\s*([kKmMgGtT])i?[bB]")


def parse_human_int(text: str) -> int:
    """Read an integer the way vLLM's ``human_readable_int`` does.

    Lower-case suffixes are decimal and may carry decimals (``1.5g`` = 1_500_000_000, ``25.6k`` =
    25_600); upper-case suffixes are binary and must be whole (``8G`` = 8 × 2^30, ``1K`` = 1024)
    (vllm/engine/arg_utils.py). vLLM refuses ``1.5G`` and ``8GiB`` at launch, so they raise here
    too.
    """
    value = text.strip()
    match = _HUMAN_INT.fullmatch(value)
    if match is None:
        return _plain_int(value, hint=_unit_hint(value))
    number, suffix = match.groups()
    if suffix in _DECIMAL_SUFFIX:
        return int(float(number) * _DECIMAL_SUFFIX[suffix])
    if "." in number:
        raise ValueError(
            f"{text!r}: vLLM refuses decimals with the binary suffix {suffix} "
            f"(write {number}{suffix.lower()} for decimal units, or a whole number of {suffix})"
        )
    return int(number) * _BINARY_SUFFIX[suffix]


def _unit_hint(value: str) -> str:
    match = _UNIT_SPELLING.fullmatch(value)
    if match is None:
        return ""
    number, letter = match.groups()
    return f" (vLLM does not read unit names; write {number}{letter.upper()} for binary units)"


def _plain_int(value: str, hint: str = "") -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an integer{hint}") from None


def _positive(convert: Callable[[str], int]) -> Callable[[str], int]:
    def checked(value: str) -> int:
        number = convert(value)
        if number <= 0:
            raise ValueError(f"{value!r} must be greater than 0")
        return number

    return checked


def _port(value: str) -> int:
    number = _plain_int(value)
    if not 1 <= number <= 65535:
        raise ValueError(f"{value!r} is not a TCP port (1-65535)")
    return number


def _fraction(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a number") from None
    # vLLM's CacheConfig declares gpu_memory_utilization with gt=0, le=1.
    if not 0 < number <= 1:
        raise ValueError(f"{value!r} must be a fraction of total device memory in (0, 1]")
    return number


def _max_model_len(value: str) -> int:
    """-1 means "auto" (vLLM's human_readable_int_or_auto); other values must be positive."""
    if value.strip().lower() in {"auto", "-1"}:
        return -1
    return _positive(parse_human_int)(value)


def _moe_backend(value: str) -> str:
    # vLLM lower-cases the value and turns '-' into '_' (vllm/config/kernel.py:MoEBackend).
    return value.strip().lower().replace("-", "_")


# --- the flags the parser interprets --------------------------------------------------------------


@dataclass(frozen=True)
class _Flag:
    field: str
    convert: Callable[[str], Any] | None = None  # None: a boolean switch that takes no value
    multi: bool = False  # nargs='+' in vLLM


_FLAGS: dict[str, _Flag] = {
    "model": _Flag("model", str),
    "served-model-name": _Flag("served_model_names", str, multi=True),
    "host": _Flag("host", str),
    "port": _Flag("port", _port),
    "kv-cache-memory-bytes": _Flag("kv_cache_memory_bytes", _positive(parse_human_int)),
    "gpu-memory-utilization": _Flag("gpu_memory_utilization", _fraction),
    "max-model-len": _Flag("max_model_len", _max_model_len),
    "max-num-seqs": _Flag("max_num_seqs", _positive(_plain_int)),
    "max-num-batched-tokens": _Flag("max_num_batched_tokens", _positive(parse_human_int)),
    "kv-cache-dtype": _Flag("kv_cache_dtype", str),
    "block-size": _Flag("block_size", _positive(_plain_int)),
    "moe-backend": _Flag("moe_backend", _moe_backend),
    "quantization": _Flag("quantization", str),
    "speculative-config": _Flag("speculative_config", str),
    "enforce-eager": _Flag("enforce_eager"),
}

# Boolean switches vLLM declares (BooleanOptionalAction or store_true) that have no field here:
# every one of releases 0.6-0.33 (flag_history.SWITCHES) plus a few that the extraction reads as
# something else in some release (e.g. enable-chunked-prefill, declared without a type in 0.6).
# Knowing them matters: a switch never swallows the next token as its value.
_SWITCHES = SWITCHES | frozenset(
    {
        "enable-prefix-caching",
        "enable-chunked-prefill",
        "trust-remote-code",
        "disable-log-stats",
        "disable-log-requests",
        "enable-log-requests",
        "async-scheduling",
        "kv-cache-metrics",
        "cudagraph-metrics",
        "enable-mfu-metrics",
        "enable-auto-tool-choice",
        "enable-expert-parallel",
        "disable-custom-all-reduce",
        "enable-sleep-mode",
        "enable-lora",
        "skip-tokenizer-init",
        "headless",
        "disable-uvicorn-access-log",
        "disable-frontend-multiprocessing",
        "enable-prompt-tokens-details",
        "enable-server-load-tracking",
        "enable-force-include-usage",
    }
)
_BOOLEANS = _SWITCHES | {name for name, flag in _FLAGS.items() if flag.convert is None}
_ALIASES = {
    "device-memory-utilization": "gpu-memory-utilization",
    "q": "quantization",
    "sc": "speculative-config",
    "tp": "tensor-parallel-size",
    "pp": "pipeline-parallel-size",
    "dp": "data-parallel-size",
    # The short names of the flags that place an engine spread over nodes (collectors.spanning):
    # vllm/engine/arg_utils.py:1177-1178, 1240-1277 of vLLM 0.33.0.
    "n": "nnodes",
    "r": "node-rank",
    "dpn": "data-parallel-rank",
    "dpr": "data-parallel-start-rank",
    "dpl": "data-parallel-size-local",
    "dpa": "data-parallel-address",
    "dpp": "data-parallel-rpc-port",
    "dpb": "data-parallel-backend",
}
# Every name some release declares: argparse expands an abbreviation only when it is unambiguous.
_KNOWN_NAMES = tuple(sorted(set(_FLAGS) | _BOOLEANS | ALL_FLAGS))
_NEGATIVE_NUMBER = re.compile(r"-\d+(?:\.\d+)?")


# --- finding the vLLM invocation in a container command ------------------------------------------

_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ash"})
_SHELL_OPERATOR_CHARS = "();<>|&\n"
_API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
_CLI_MODULE = "vllm.entrypoints.cli.main"
_FD_REDIRECT = re.compile(r"(?<!\S)\d+(?=[<>])")


def parse_command_line(argv: Sequence[str] | str) -> EngineConfig:
    """Parse a vLLM launch command into an :class:`EngineConfig`.

    ``argv`` is the container's full command (entrypoint + cmd) as a list, or a shell string. The
    vLLM invocation is found inside it: ``vllm serve MODEL …``, ``python3 -m
    vllm.entrypoints.openai.api_server --model …``, also behind ``sh -c "…"``, ``exec``,
    environment assignments, or before ``&&`` / ``|``. A command made only of flags (an image
    whose entrypoint is ``vllm serve``) is read as vLLM's arguments. Raises :class:`FlagError`
    when no vLLM invocation is found or a value is one vLLM would refuse. Pure and cheap.
    """
    tokens = _split_shell(argv) if isinstance(argv, str) else list(argv)
    launcher, args = _find_invocation(tokens)
    flags, positionals = _scan_args(args)
    return _build_config(launcher, flags, positionals)


def _split_shell(text: str) -> list[str]:
    # A backslash-newline is a line continuation in sh; a bare newline separates commands. The
    # number in "2>&1" belongs to the redirection; it is dropped here, where adjacency is visible.
    script = _FD_REDIRECT.sub("", text.replace("\\\n", ""))
    lexer = shlex.shlex(script, posix=True, punctuation_chars=_SHELL_OPERATOR_CHARS)
    lexer.whitespace_split = True
    lexer.whitespace = " \t\r"
    lexer.commenters = ""  # '#' starts a comment only at the start of a word; handled below
    return list(lexer)


def _find_invocation(tokens: list[str]) -> tuple[str, list[str]]:
    tokens = _unwrap_shell(tokens)
    for index, token in enumerate(tokens):
        rest = tokens[index + 1 :]
        if os.path.basename(token) == "vllm" and rest[:1] == ["serve"]:
            return "vllm serve", _until_shell_operator(rest[1:])
        if token == "-m" and rest[:2] == [_CLI_MODULE, "serve"]:
            return "vllm serve", _until_shell_operator(rest[2:])
        if token == "-m" and rest[:1] == [_API_SERVER_MODULE]:
            return "api_server", _until_shell_operator(rest[1:])
    if tokens and tokens[0].startswith("-"):
        return "arguments only", _until_shell_operator(tokens)
    # The refusal is stored and shown: it must not quote a secret from the command.
    shown = shlex.join(mask_command(tokens))[:120] or "(empty)"
    raise FlagError(
        "no vLLM launch found (expected `vllm serve MODEL …` or "
        f"`python3 -m {_API_SERVER_MODULE} --model …`): {shown}"
    )


def _unwrap_shell(tokens: list[str]) -> list[str]:
    """``sh -c "script"`` → the script's words; anything else unchanged."""
    if not tokens or os.path.basename(tokens[0]) not in _SHELLS:
        return tokens
    for index, token in enumerate(tokens[1:-1], start=1):
        if token.startswith("-") and not token.startswith("--") and "c" in token[1:]:
            return _split_shell(tokens[index + 1])
    return tokens


def _until_shell_operator(tokens: list[str]) -> list[str]:
    for index, token in enumerate(tokens):
        if token.startswith("#") or (token and all(ch in _SHELL_OPERATOR_CHARS for ch in token)):
            return tokens[:index]
    return tokens


# --- scanning vLLM's own arguments ---------------------------------------------------------------


def _scan_args(args: list[str]) -> tuple[dict[str, FlagValue], list[str]]:
    """Flags by canonical name (last one wins, as in argparse) and the positional arguments."""
    flags: dict[str, FlagValue] = {}
    positionals: list[str] = []
    index = 0
    while index < len(args):
        token = args[index]
        index += 1
        if token == "--":
            positionals.extend(args[index:])
            break
        if token == "-" or not token.startswith("-") or _NEGATIVE_NUMBER.fullmatch(token):
            positionals.append(token)
            continue
        raw_name, inline = token.split("=", 1) if "=" in token else (token, None)
        name = _canonical_name(raw_name)
        if name in _BOOLEANS or _negated_switch(name):
            _reject_inline_value(raw_name, inline)
            negated = _negated_switch(name)
            flags[negated or name] = negated is None
            continue
        value, index = _take_value(name, raw_name, inline, args, index)
        flags[name] = value
    return flags, positionals


def _canonical_name(raw_name: str) -> str:
    name = raw_name.lstrip("-").replace("_", "-")
    name = _ALIASES.get(name, name)
    if name in _FLAGS or name in _BOOLEANS or _negated_switch(name):
        return name
    # argparse accepts an unambiguous prefix of a long option: vLLM's own sizing advice prints
    # --kv-cache-memory=…, which works only through that.
    matches = [known for known in _KNOWN_NAMES if known.startswith(name)]
    return matches[0] if len(matches) == 1 and raw_name.startswith("--") else name


def _negated_switch(name: str) -> str | None:
    if name.startswith("no-") and name[3:] in _BOOLEANS:
        return name[3:]
    return None


def _reject_inline_value(raw_name: str, inline: str | None) -> None:
    if inline is not None:
        raise FlagError(f"{raw_name} is a switch and takes no value (got {inline!r})")


def _take_value(
    name: str, raw_name: str, inline: str | None, args: list[str], index: int
) -> tuple[FlagValue, int]:
    """The flag's value and the index after it; an unknown flag takes the next word unless it is
    a flag itself, and is a bare switch (True) otherwise."""
    spec = _FLAGS.get(name)
    if inline is not None:
        return ((inline,) if spec is not None and spec.multi else inline), index
    if spec is not None and spec.multi:
        end = index
        while end < len(args) and not args[end].startswith("-"):
            end += 1
        if end == index:
            raise FlagError(f"{raw_name} needs at least one value")
        return tuple(args[index:end]), end
    has_next = index < len(args)
    next_is_value = has_next and (
        not args[index].startswith("-") or bool(_NEGATIVE_NUMBER.fullmatch(args[index]))
    )
    if next_is_value:
        return args[index], index + 1
    if spec is not None:
        raise FlagError(f"{raw_name} needs a value")
    return True, index


def _build_config(
    launcher: str, flags: dict[str, FlagValue], positionals: list[str]
) -> EngineConfig:
    values: dict[str, Any] = {
        spec.field: _convert(name, spec, flags[name])
        for name, spec in _FLAGS.items()
        if name in flags
    }
    model = _model(launcher, values.get("model"), positionals)
    names = tuple(values.get("served_model_names", ()))
    max_model_len = values.get("max_model_len")
    speculative = values.get("speculative_config")
    return EngineConfig(
        launcher=launcher,
        model=model,
        served_model_name=names[0] if names else None,
        served_model_names=names,
        host=values.get("host"),
        port=values.get("port", DEFAULT_PORT),
        port_explicit="port" in values,
        kv_cache_memory_bytes=values.get("kv_cache_memory_bytes"),
        gpu_memory_utilization=values.get("gpu_memory_utilization"),
        max_model_len=None if max_model_len == -1 else max_model_len,
        max_model_len_auto=max_model_len == -1,
        max_num_seqs=values.get("max_num_seqs"),
        max_num_batched_tokens=values.get("max_num_batched_tokens"),
        kv_cache_dtype=values.get("kv_cache_dtype"),
        block_size=values.get("block_size"),
        moe_backend=values.get("moe_backend"),
        quantization=values.get("quantization"),
        speculative_config=speculative,
        speculative_config_json=_json_object(speculative),
        enforce_eager=bool(values.get("enforce_eager", False)),
        all_flags=MappingProxyType(dict(flags)),
        unknown_flags=MappingProxyType({k: v for k, v in flags.items() if k not in _FLAGS}),
    )


def _convert(name: str, spec: _Flag, raw: FlagValue) -> Any:
    if spec.convert is None or isinstance(raw, bool):
        return raw
    try:
        if isinstance(raw, tuple):
            return tuple(spec.convert(item) for item in raw)
        return spec.convert(raw)
    except ValueError as error:
        raise FlagError(f"--{name}: {error}") from None


def _model(launcher: str, flag_model: str | None, positionals: list[str]) -> str | None:
    """``vllm serve`` takes the model as its one positional, which wins over ``--model``."""
    allowed = 0 if launcher == "api_server" else 1
    if len(positionals) > allowed:
        extra = positionals[allowed]
        raise FlagError(f"unexpected argument {extra!r}: vLLM would refuse it")
    return positionals[0] if positionals else flag_model


def _json_object(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        parsed = json.loads(text)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None
