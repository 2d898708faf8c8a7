"""Command line of the emulator: `python3 -m collectors.emulator serve MODEL [flags]`.

Real command lines must work unchanged, so the parser is deliberately forgiving in the way a
container operator needs and strict in the way vLLM is:

* the vLLM flags below are honoured; any other flag is accepted and ignored (its value too), so a
  compose file written for real vLLM starts the emulator;
* flags that the impersonated release rejects (`Style.rejected_flags`: removed in 0.33, or not yet
  existing in 0.10) fail like argparse does in vLLM: usage, `vllm serve: error: unrecognized
  arguments: …`, exit status 2;
* `--max_model_len` is read as `--max-model-len` (vLLM's FlexibleArgumentParser does this) and a
  unique prefix such as `--kv-cache-memory=…` is accepted (argparse's abbreviations: the
  `--kv-cache-memory=…` form that vLLM's own sizing advice prints works only through them);
* flags starting with `--emulator-` configure the emulator itself.

The standard library is all this package may import: containers run it with the system python3.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from .styles import STYLES, Style
from .units import human_readable_int

PROG = "vllm serve"

# fmt: off
# `--kv-cache-dtype` values of vLLM 0.33.0 (vllm/config/cache.py); platforms can register more,
# we only know these.
KV_CACHE_DTYPES = frozenset({
    "auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla",
    "nvfp4_ds_mla", "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc",
    "turboquant_3bit_nc", "octave_k3v4", "octave_k3v3", "octave_k3v3_compact", "ultraquant_4bit",
    "int4_per_token_head", "int8_per_token_head", "fp8_per_token_head", "nvfp4", "nvfp4_4over6",
})

# `--moe-backend` values of vLLM 0.33.0 (vllm/config/kernel.py:MoEBackend, added in v0.17.0 by
# PR #33807); `aiter*` (ROCm) is a family.
MOE_BACKENDS = frozenset({
    "auto", "triton", "batched_triton", "deep_gemm", "deep_gemm_mega_moe", "cutlass",
    "flashinfer_trtllm", "flashinfer_cutlass", "flashinfer_cutedsl", "flashinfer_moe_ep_cutedsl",
    "flashinfer_b12x", "b12x", "flashinfer_moe_ep_mega_deep_gemm", "marlin", "humming",
    "triton_unfused", "flydsl", "hpc", "emulation", "rdna3",
})
# fmt: on

FAIL_MODES = ("none", "free-memory", "profiling", "max-seq-len")

# Real vLLM flags the emulator ignores but whose arity it knows, so that `--trust-remote-code
# MODEL` does not swallow the model and prefixes stay unambiguous. True = takes a value.
IGNORED_VLLM_FLAGS: dict[str, bool] = {
    "--trust-remote-code": False,
    "--enable-auto-tool-choice": False,
    "--async-scheduling": False,
    "--no-async-scheduling": False,
    "--enable-chunked-prefill": False,
    "--no-enable-chunked-prefill": False,
    "--enable-log-requests": False,
    "--disable-log-requests": False,
    "--enable-expert-parallel": False,
    "--disable-custom-all-reduce": False,
    "--kv-cache-metrics": False,
    "--cudagraph-metrics": False,
    "--enable-mfu-metrics": False,
    "--data-parallel-size": True,
    "--dtype": True,
    "--load-format": True,
    "--tokenizer": True,
    "--revision": True,
    "--download-dir": True,
    "--seed": True,
    "--swap-space": True,
    "--api-key": True,
    "--chat-template": True,
    "--tool-call-parser": True,
    "--reasoning-parser": True,
    "--limit-mm-per-prompt": True,
    "--compilation-config": True,
    "--hf-overrides": True,
    "--generation-config": True,
    "--override-generation-config": True,
    "--long-prefill-token-threshold": True,
    "--max-num-queued-reqs": True,
    "--max-num-queued-tokens": True,
    "--num-gpu-blocks-override": True,
    "--linear-backend": True,
    "--attention-backend": True,
    "--kv-cache-metrics-sample": True,
    "--show-hidden-metrics-for-version": True,
    "--otlp-traces-endpoint": True,
    "--uvicorn-log-level": True,
    "--api-server-count": True,
    "--distributed-executor-backend": True,
    "--max-num-partial-prefills": True,
    "--max-long-partial-prefills": True,
}


@dataclass(frozen=True)
class SpeculativeSpec:
    """`--speculative-config`: vLLM's SpeculativeConfig keys the emulator uses
    (vllm/config/speculative.py of 0.33: `method`, `model`, `num_speculative_tokens`)."""

    method: str | None
    model: str | None
    num_speculative_tokens: int


class CliError(Exception):
    """A command line vLLM's argparse would refuse; the message is argparse's error text."""


@dataclass(frozen=True)
class LoadSpec:
    """The built-in request generator: `rps` arrivals per second, each PROMPT in, GEN out."""

    rps: float
    prompt_tokens: int
    gen_tokens: int


@dataclass(frozen=True)
class RankSpec:
    """Where this process sits in an engine spread over nodes; the defaults are vLLM's
    (vllm/config/parallel.py:159-161, 317-326 of 0.33.0): one node, rank 0, 127.0.0.1:29501
    for torch.distributed, port 29550 for data-parallel RPC."""

    headless: bool = False
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29501
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size_local: int | None = None
    data_parallel_address: str | None = None
    data_parallel_rpc_port: int = 29550


@dataclass(frozen=True)
class EmulatorConfig:
    """Everything one emulator process needs, validated; sizes in bytes, rates per second."""

    style: Style
    version: str
    model: str
    served_model_names: tuple[str, ...]
    host: str | None
    port: int
    kv_cache_memory_bytes: int | None
    gpu_memory_utilization: float
    max_model_len: int | None  # None: `auto`, the largest that fits the KV pool
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    user_specified_block_size: bool
    moe_backend: str
    quantization: str | None
    enforce_eager: bool
    kv_cache_dtype: str
    enable_prefix_caching: bool
    disable_log_stats: bool
    disable_access_log: bool
    weights_bytes: int
    kv_cap_bytes: int
    kv_bytes_per_token: int
    activation_bytes_per_token: int
    graph_bytes: int
    load_seconds: float
    profile_seconds: float
    graph_seconds: float
    prefill_tps: float
    decode_tps: float
    load: LoadSpec | None
    prefix_hit_rate: float
    fail: str
    strict_memory: bool
    stats_interval: float
    non_default_args: dict[str, Any] = field(default_factory=dict)
    # vLLM's sleep mode (--enable-sleep-mode): what POST /sleep can give back.
    enable_sleep_mode: bool = False
    # Speculative decoding (--speculative-config) and the share of drafted tokens accepted.
    speculative: SpeculativeSpec | None = None
    spec_acceptance: float = 0.7
    # Memory not returned (--emulator-leak-on-stop): this much of the weights lives in a file
    # under `leak_dir` (a host tmpfs bind-mounted into the container) that the emulator never
    # removes, so its pages stay held after the container stopped.
    leak_on_stop_bytes: int = 0
    leak_dir: str | None = None
    # A rank of an engine spread over nodes (`headless`): vLLM's multi-node and data-parallel
    # flags (vllm/engine/arg_utils.py:1170-1277 of 0.33.0), read for the rank's log lines.
    rank: RankSpec = field(default_factory=RankSpec)

    @property
    def model_name(self) -> str:
        """The `model_name` label: the first served name, else the model (vLLM's
        vllm/config/model.py:get_served_model_name)."""
        return self.served_model_names[0] if self.served_model_names else self.model


@dataclass(frozen=True)
class _Flag:
    """One flag the emulator understands: where it goes and how its value is converted."""

    dest: str
    convert: Callable[[str], Any] | None  # None: a boolean switch
    const: Any = True
    many: bool = False  # nargs="+"
    vllm: bool = True  # shown in `non-default args`


def _float(text: str) -> float:
    return float(text)


def _max_model_len(text: str) -> int | None:
    if text.strip().lower() in {"auto", "-1"}:
        return None
    return human_readable_int(text)


def _lower_choice(choices: frozenset[str], name: str) -> Callable[[str], str]:
    def convert(text: str) -> str:
        value = text.lower().replace("-", "_")
        if value in choices or (name == "moe" and value.startswith("aiter")):
            return value
        raise ValueError(f"invalid choice: {text!r}")

    return convert


def _choice(choices: Sequence[str]) -> Callable[[str], str]:
    def convert(text: str) -> str:
        if text in choices:
            return text
        raise ValueError(f"invalid choice: {text!r} (choose from {', '.join(choices)})")

    return convert


def _json_object(text: str) -> dict[str, Any]:
    """A JSON flag as vLLM's argparse reads it (`type=json.loads` in vllm/engine/arg_utils.py)."""
    try:
        value = json.loads(text)
    except ValueError:
        raise ValueError(f"invalid loads value: {text!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"invalid loads value: {text!r}")
    return value


def _load_spec(text: str) -> LoadSpec:
    parts = text.split(":")
    if len(parts) != 3:
        raise ValueError("expected RPS:PROMPT_TOKENS:GEN_TOKENS, e.g. 2:512:64")
    return LoadSpec(float(parts[0]), human_readable_int(parts[1]), human_readable_int(parts[2]))


_FLAGS: dict[str, _Flag] = {
    "--model": _Flag("model", str),
    "--port": _Flag("port", int),
    "--host": _Flag("host", str),
    "--served-model-name": _Flag("served_model_name", str, many=True),
    "--kv-cache-memory-bytes": _Flag("kv_cache_memory_bytes", human_readable_int),
    "--gpu-memory-utilization": _Flag("gpu_memory_utilization", _float),
    "--device-memory-utilization": _Flag("gpu_memory_utilization", _float),
    "--max-model-len": _Flag("max_model_len", _max_model_len),
    "--max-num-seqs": _Flag("max_num_seqs", human_readable_int),
    "--max-num-batched-tokens": _Flag("max_num_batched_tokens", human_readable_int),
    "--block-size": _Flag("block_size", int),
    "--moe-backend": _Flag("moe_backend", _lower_choice(MOE_BACKENDS, "moe")),
    "--quantization": _Flag("quantization", str),
    "-q": _Flag("quantization", str),
    "--enforce-eager": _Flag("enforce_eager", None, True),
    "--no-enforce-eager": _Flag("enforce_eager", None, False),
    "--kv-cache-dtype": _Flag("kv_cache_dtype", _lower_choice(KV_CACHE_DTYPES, "kv")),
    "--enable-prefix-caching": _Flag("enable_prefix_caching", None, True),
    "--no-enable-prefix-caching": _Flag("enable_prefix_caching", None, False),
    "--disable-log-stats": _Flag("disable_log_stats", None, True),
    "--enable-sleep-mode": _Flag("enable_sleep_mode", None, True),
    "--no-enable-sleep-mode": _Flag("enable_sleep_mode", None, False),
    "--speculative-config": _Flag("speculative_config", _json_object),
    "-sc": _Flag("speculative_config", _json_object),
    "--disable-uvicorn-access-log": _Flag("disable_uvicorn_access_log", None, True),
    "--headless": _Flag("headless", None, True),
    "--nnodes": _Flag("nnodes", int),
    "-n": _Flag("nnodes", int),
    "--node-rank": _Flag("node_rank", int),
    "-r": _Flag("node_rank", int),
    "--master-addr": _Flag("master_addr", str),
    "--master-port": _Flag("master_port", int),
    "--tensor-parallel-size": _Flag("tensor_parallel_size", int),
    "-tp": _Flag("tensor_parallel_size", int),
    "--pipeline-parallel-size": _Flag("pipeline_parallel_size", int),
    "-pp": _Flag("pipeline_parallel_size", int),
    "--data-parallel-size-local": _Flag("data_parallel_size_local", int),
    "-dpl": _Flag("data_parallel_size_local", int),
    "--data-parallel-address": _Flag("data_parallel_address", str),
    "-dpa": _Flag("data_parallel_address", str),
    "--data-parallel-rpc-port": _Flag("data_parallel_rpc_port", int),
    "-dpp": _Flag("data_parallel_rpc_port", int),
    "--emulator-style": _Flag("emulator_style", _choice(tuple(STYLES)), vllm=False),
    "--emulator-version": _Flag("emulator_version", str, vllm=False),
    "--emulator-weights-bytes": _Flag("emulator_weights_bytes", human_readable_int, vllm=False),
    "--emulator-kv-cap-bytes": _Flag("emulator_kv_cap_bytes", human_readable_int, vllm=False),
    "--emulator-kv-bytes-per-token": _Flag(
        "emulator_kv_bytes_per_token", human_readable_int, vllm=False
    ),
    "--emulator-activation-bytes-per-token": _Flag(
        "emulator_activation_bytes_per_token", human_readable_int, vllm=False
    ),
    "--emulator-graph-bytes": _Flag("emulator_graph_bytes", human_readable_int, vllm=False),
    "--emulator-load-seconds": _Flag("emulator_load_seconds", _float, vllm=False),
    "--emulator-profile-seconds": _Flag("emulator_profile_seconds", _float, vllm=False),
    "--emulator-graph-seconds": _Flag("emulator_graph_seconds", _float, vllm=False),
    "--emulator-prefill-tps": _Flag("emulator_prefill_tps", _float, vllm=False),
    "--emulator-decode-tps": _Flag("emulator_decode_tps", _float, vllm=False),
    "--emulator-load": _Flag("emulator_load", _load_spec, vllm=False),
    "--emulator-load-rps": _Flag("emulator_load_rps", _float, vllm=False),
    "--emulator-load-prompt-tokens": _Flag(
        "emulator_load_prompt_tokens", human_readable_int, vllm=False
    ),
    "--emulator-load-gen-tokens": _Flag("emulator_load_gen_tokens", human_readable_int, vllm=False),
    "--emulator-prefix-hit-rate": _Flag("emulator_prefix_hit_rate", _float, vllm=False),
    "--emulator-fail": _Flag("emulator_fail", _choice(FAIL_MODES), vllm=False),
    "--emulator-strict-memory": _Flag("emulator_strict_memory", None, True, vllm=False),
    "--emulator-stats-interval": _Flag("emulator_stats_interval", _float, vllm=False),
    "--emulator-spec-acceptance": _Flag("emulator_spec_acceptance", _float, vllm=False),
    "--emulator-leak-on-stop": _Flag("emulator_leak_on_stop", human_readable_int, vllm=False),
    "--emulator-leak-dir": _Flag("emulator_leak_dir", str, vllm=False),
}

USAGE = f"usage: {PROG} [model_tag] [options]"

HELP = f"""{USAGE}

A vLLM engine emulator: vLLM's command line, logs, /health, /v1/models, /version, /metrics and
completions, with memory really reserved (scaled down: MiB where vLLM has GiB).

honoured vLLM flags:
  --model, --port (8000), --host, --served-model-name NAME [NAME ...],
  --kv-cache-memory-bytes (8G = 8*2^30, 8g = 8*10^9), --gpu-memory-utilization,
  --max-model-len (131k, auto), --max-num-seqs (256), --max-num-batched-tokens (2048),
  --block-size (16), --moe-backend, --quantization/-q, --[no-]enforce-eager, --kv-cache-dtype,
  --[no-]enable-prefix-caching, --disable-log-stats, --disable-uvicorn-access-log,
  --[no-]enable-sleep-mode (POST /sleep?level=1|2, /wake_up, GET /is_sleeping with
  VLLM_SERVER_DEV_MODE=1), --speculative-config/-sc JSON (method, num_speculative_tokens),
  --headless with --nnodes/-n, --node-rank/-r, --master-addr, --master-port,
  --tensor-parallel-size/-tp, --pipeline-parallel-size/-pp, --data-parallel-size-local/-dpl,
  --data-parallel-address/-dpa, --data-parallel-rpc-port/-dpp: a rank of an engine spread over
  nodes, which reserves what its flags say (its share) and serves no HTTP at all
  Other flags are accepted and ignored, except those the emulated release rejects.

emulator flags:
  --emulator-engine {{vllm,llamacpp,ollama}}  the engine spoken (default vllm; the others take
                                         their own command line, see `knobs`)
  --emulator-style {{0.33,0.10}}          log/metric dialect (default 0.33)
  --emulator-version V                   version it claims (0.33.0 / 0.10.1)
  --emulator-weights-bytes N             memory held as weights (64M)
  --emulator-kv-cap-bytes N              ceiling of an unpinned KV pool (256M)
  --emulator-kv-bytes-per-token N        bf16 KV bytes per token (16: a ~16 KiB/token model
                                         scaled by 1/1024 like all memory)
  --emulator-activation-bytes-per-token N  transient prefill buffer per batched token (1K)
  --emulator-graph-bytes N               memory held as CUDA graphs (0)
  --emulator-load-seconds S, --emulator-profile-seconds S, --emulator-graph-seconds S  (1 each)
  --emulator-prefill-tps R (2000), --emulator-decode-tps R (40 per sequence)
  --emulator-load RPS:PROMPT:GEN         built-in request generator (or the three
                                         --emulator-load-rps/-prompt-tokens/-gen-tokens flags)
  --emulator-prefix-hit-rate F           share of each prompt served from the prefix cache (0)
  --emulator-fail {{{",".join(FAIL_MODES)}}}
  --emulator-strict-memory               apply vLLM's free-memory pre-check and profiling
                                         consistency check against the host's real MemFree
  --emulator-stats-interval S            periodic stats line (VLLM_LOG_STATS_INTERVAL or 10)
  --emulator-spec-acceptance F           share of drafted tokens accepted with
                                         --speculative-config (0.7)
  --emulator-leak-on-stop N              N bytes of the weights are held in a file under
                                         --emulator-leak-dir DIR (a tmpfs), never removed: they
                                         stay held after the process (and its container) ended
"""


def _normalise(token: str) -> tuple[str, str | None]:
    """Split `--a_b=v` into (`--a-b`, `v`), as FlexibleArgumentParser does."""
    name, sep, value = token.partition("=")
    if name.startswith("--"):
        name = "--" + name[2:].replace("_", "-")
    return name, (value if sep else None)


def _resolve(name: str) -> str | None:
    """The known flag `name` denotes, exactly or as a unique prefix; None when unknown."""
    if name in _FLAGS or name in IGNORED_VLLM_FLAGS:
        return name
    if not name.startswith("--"):
        return None
    candidates = [f for f in (*_FLAGS, *IGNORED_VLLM_FLAGS) if f.startswith(name)]
    return candidates[0] if len(candidates) == 1 else None


def _literal(text: str) -> int | float | str:
    """An ignored flag's value as vLLM's argparse would type it, as far as we can tell."""
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def _looks_like_value(token: str) -> bool:
    if not token.startswith("-"):
        return True
    try:
        float(token)
    except ValueError:
        return False
    return True


def _parse_tokens(argv: Sequence[str], style: Style) -> tuple[dict[str, Any], dict[str, Any]]:
    """Walk argv; return (honoured values by dest, non-default args as vLLM would print them)."""
    values: dict[str, Any] = {}
    shown: dict[str, Any] = {}
    positionals: list[str] = []
    tokens = list(argv)
    if tokens and tokens[0] == "serve":
        tokens.pop(0)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if not token.startswith("-") or token == "-":
            positionals.append(token)
            continue
        name, inline = _normalise(token)
        if name in style.rejected_flags:
            _reject(name, inline, tokens, i)
        known = _resolve(name)
        if known is None or known in IGNORED_VLLM_FLAGS:
            i = _read_ignored(name, known, inline, tokens, i, shown)
            continue
        flag = _FLAGS[known]
        i = _read_honoured(flag, known, inline, tokens, i, values)
        if flag.vllm:
            shown[flag.dest] = values[flag.dest]
    if len(positionals) > 1:
        raise CliError("unrecognized arguments: " + " ".join(positionals[1:]))
    if positionals:
        values["model_tag"] = positionals[0]
        shown = {"model_tag": positionals[0], **shown}
    return values, shown


def _reject(name: str, inline: str | None, tokens: list[str], i: int) -> NoReturn:
    """A flag the impersonated release rejects: argparse's "unrecognized arguments", naming
    the flag and the value that follows it, if any."""
    rest = [inline] if inline is not None else []
    if inline is None and i < len(tokens) and _looks_like_value(tokens[i]):
        rest.append(tokens[i])
    raise CliError("unrecognized arguments: " + " ".join([name, *rest]))


def _read_ignored(name: str, known: str | None, inline: str | None, tokens: list[str], i: int,
                  shown: dict[str, Any]) -> int:
    """An ignored or unknown flag (``tokens[i - 1]``): record it in ``shown`` the way vLLM
    prints it and return the index after it and its value."""
    takes_value = IGNORED_VLLM_FLAGS.get(known) if known else None
    if takes_value is None:  # unknown: a following non-flag token is its value
        takes_value = i < len(tokens) and _looks_like_value(tokens[i])
    value: Any = True
    if inline is not None:
        value = _literal(inline)
    elif takes_value and i < len(tokens):
        value = _literal(tokens[i])
        i += 1
    if name.startswith("--no-") and value is True:
        shown[name[5:].replace("-", "_")] = False
    else:
        shown[(known or name).lstrip("-").replace("-", "_")] = value
    return i


def _read_honoured(flag: _Flag, known: str, inline: str | None, tokens: list[str], i: int,
                   values: dict[str, Any]) -> int:
    """A flag the emulator honours (``tokens[i - 1]``): convert its value(s) into
    ``values[flag.dest]`` and return the index after them; CliError as argparse words it."""
    if flag.convert is None:
        if inline is not None:
            raise CliError(f"argument {known}: ignored explicit argument {inline!r}")
        values[flag.dest] = flag.const
        return i
    raw: list[str] = [inline] if inline is not None else []
    while i < len(tokens) and _looks_like_value(tokens[i]) and (flag.many or not raw):
        raw.append(tokens[i])
        i += 1
    if not raw:
        raise CliError(f"argument {known}: expected one argument")
    try:
        converted = [flag.convert(r) for r in raw]
    except ValueError as exc:
        raise CliError(f"argument {known}: {exc}") from None
    values[flag.dest] = converted if flag.many else converted[0]
    return i


def _style_of(argv: Sequence[str]) -> Style:
    """The style decides which flags are rejected, so it is read before the full parse."""
    for i, token in enumerate(argv):
        name, inline = _normalise(token)
        if name == "--emulator-style":
            value = inline if inline is not None else (argv[i + 1] if i + 1 < len(argv) else "")
            if value not in STYLES:
                raise CliError(
                    f"argument --emulator-style: invalid choice: {value!r} "
                    f"(choose from {', '.join(STYLES)})"
                )
            return STYLES[value]
    return STYLES["0.33"]


def _stats_interval_default() -> float:
    # vLLM's VLLM_LOG_STATS_INTERVAL (vllm/envs.py), default 10 s.
    try:
        return float(os.environ.get("VLLM_LOG_STATS_INTERVAL", "10"))
    except ValueError:
        return 10.0


def _load_from(values: dict[str, Any]) -> LoadSpec | None:
    spec: LoadSpec | None = values.get("emulator_load")
    rps = values.get("emulator_load_rps", spec.rps if spec else None)
    if rps is None or rps <= 0:
        return None
    prompt = values.get("emulator_load_prompt_tokens", spec.prompt_tokens if spec else 256)
    gen = values.get("emulator_load_gen_tokens", spec.gen_tokens if spec else 32)
    if prompt < 1 or gen < 1:
        raise CliError("argument --emulator-load: prompt and generation tokens must be >= 1")
    return LoadSpec(rps, prompt, gen)


def parse_args(argv: Sequence[str]) -> EmulatorConfig:
    """Build the configuration from argv (without the program name); raise CliError if refused.

    Checks run in a fixed order (model, the ranged vLLM flags, then each default-bearing flag
    in field order), so a line with several bad values always names the same one.
    """
    style = _style_of(argv)
    values, shown = _parse_tokens(argv, style)
    model = values.get("model") or values.get("model_tag")
    if not model:
        raise CliError("the following arguments are required: model_tag (or --model)")
    if "model" in values and "model_tag" in values and values["model"] != values["model_tag"]:
        raise CliError("model_tag and --model disagree")
    shown.setdefault("model", model)
    checked = _ranged(values, style)
    bounded = _Bounded(values)
    return EmulatorConfig(
        style=style,
        version=values.get("emulator_version", style.default_version),
        model=model,
        served_model_names=tuple(values.get("served_model_name", ())),
        host=values.get("host"),
        **checked,
        **_vllm_fields(values, bounded),
        **_emulator_fields(values, bounded),
        non_default_args=shown,
        enable_sleep_mode=values.get("enable_sleep_mode", False),
        speculative=_speculative(values.get("speculative_config")),
        spec_acceptance=_spec_acceptance(bounded),
        **_leak(values, bounded),
        rank=_rank(values, bounded),
    )


def _rank(values: dict[str, Any], bounded: _Bounded) -> RankSpec:
    """vLLM's multi-node flags, with its bounds (ParallelConfig: nnodes >= 1, node_rank >= 0,
    the sizes >= 1)."""
    defaults = RankSpec()
    return RankSpec(
        headless=values.get("headless", False),
        nnodes=bounded.positive("nnodes", defaults.nnodes),
        node_rank=bounded.not_negative("node_rank", defaults.node_rank),
        master_addr=values.get("master_addr", defaults.master_addr),
        master_port=bounded.positive("master_port", defaults.master_port),
        tensor_parallel_size=bounded.positive("tensor_parallel_size", 1),
        pipeline_parallel_size=bounded.positive("pipeline_parallel_size", 1),
        data_parallel_size_local=values.get("data_parallel_size_local"),
        data_parallel_address=values.get("data_parallel_address"),
        data_parallel_rpc_port=bounded.positive("data_parallel_rpc_port",
                                                defaults.data_parallel_rpc_port),
    )


def _leak(values: dict[str, Any], bounded: _Bounded) -> dict[str, Any]:
    """``--emulator-leak-on-stop`` (part of the weights, so at most them) and its folder."""
    leak = bounded.not_negative("emulator_leak_on_stop", 0)
    folder = values.get("emulator_leak_dir")
    if leak > bounded.not_negative("emulator_weights_bytes", 64 << 20):
        raise CliError("argument --emulator-leak-on-stop: part of the weights: at most "
                       "--emulator-weights-bytes")
    if leak and not folder:
        raise CliError("argument --emulator-leak-on-stop: needs --emulator-leak-dir (a tmpfs "
                       "folder that outlives the container)")
    return {"leak_on_stop_bytes": leak, "leak_dir": folder}


def _speculative(config: dict[str, Any] | None) -> SpeculativeSpec | None:
    """vLLM's checks of the keys used here (vllm/config/speculative.py: num_speculative_tokens
    > 0, and a method or a draft model)."""
    if config is None:
        return None
    # Without it vLLM takes the draft model config's number (an MTP head's n_predict, usually
    # 1); the emulated model has no config, so 1.
    tokens = config.get("num_speculative_tokens", 1)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens <= 0:
        raise CliError("argument --speculative-config: num_speculative_tokens must be an "
                       "integer > 0")
    method, model = config.get("method"), config.get("model")
    if not method and not model:
        raise CliError("argument --speculative-config: a method or a draft model is required")
    return SpeculativeSpec(method=str(method) if method else None,
                           model=str(model) if model else None, num_speculative_tokens=tokens)


def _spec_acceptance(bounded: _Bounded) -> float:
    value = bounded.not_negative("emulator_spec_acceptance", 0.7)
    if value > 1:
        raise CliError("argument --emulator-spec-acceptance: must be in [0, 1]")
    return value


class _Bounded:
    """Reads a flag's value or its default, refusing one out of range as argparse words it."""

    def __init__(self, values: dict[str, Any]) -> None:
        self._values = values

    def positive(self, dest: str, default: float) -> Any:
        value = self._values.get(dest, default)
        if value <= 0:
            raise CliError(f"argument --{dest.replace('_', '-')}: must be > 0")
        return value

    def not_negative(self, dest: str, default: float) -> Any:
        value = self._values.get(dest, default)
        if value < 0:
            raise CliError(f"argument --{dest.replace('_', '-')}: must be >= 0")
        return value


def _ranged(values: dict[str, Any], style: Style) -> dict[str, Any]:
    """The fields whose flags have a range of their own, checked first and in this order."""
    util = values.get("gpu_memory_utilization", style.default_gpu_memory_utilization)
    if not 0 < util <= 1:
        raise CliError("argument --gpu-memory-utilization: must be in (0, 1]")
    port = values.get("port", 8000)
    if not 0 <= port <= 65535:
        raise CliError("argument --port: must be in 0..65535")
    hit_rate = _Bounded(values).not_negative("emulator_prefix_hit_rate", 0.0)
    if hit_rate > 1:
        raise CliError("argument --emulator-prefix-hit-rate: must be in [0, 1]")
    kv_bytes = values.get("kv_cache_memory_bytes")
    if kv_bytes is not None and kv_bytes <= 0:
        raise CliError("argument --kv-cache-memory-bytes: must be > 0")
    max_model_len = values.get("max_model_len", 8192)
    if max_model_len is not None and max_model_len <= 0:
        raise CliError("argument --max-model-len: must be > 0, -1 or auto")
    return {"gpu_memory_utilization": util, "port": port, "prefix_hit_rate": hit_rate,
            "kv_cache_memory_bytes": kv_bytes, "max_model_len": max_model_len}


def _vllm_fields(values: dict[str, Any], bounded: _Bounded) -> dict[str, Any]:
    """The remaining fields that real vLLM flags set, with vLLM's defaults."""
    return {
        # vLLM 0.33 detects GB10 (compute capability 12.1) and keeps it on the small scheduler
        # tier of EngineArgs.get_batch_defaults: 256 seqs, 2048 batched tokens (API server).
        "max_num_seqs": bounded.positive("max_num_seqs", 256),
        "max_num_batched_tokens": bounded.positive("max_num_batched_tokens", 2048),
        "block_size": bounded.positive("block_size", 16),
        "user_specified_block_size": "block_size" in values,
        "moe_backend": values.get("moe_backend", "auto"),
        "quantization": values.get("quantization"),
        "enforce_eager": values.get("enforce_eager", False),
        "kv_cache_dtype": values.get("kv_cache_dtype", "auto"),
        "enable_prefix_caching": values.get("enable_prefix_caching", True),
        "disable_log_stats": values.get("disable_log_stats", False),
        "disable_access_log": values.get("disable_uvicorn_access_log", False),
    }


def _emulator_fields(values: dict[str, Any], bounded: _Bounded) -> dict[str, Any]:
    """The fields that `--emulator-*` flags set: sizes, durations, rates, load and faults."""
    return {
        "weights_bytes": bounded.not_negative("emulator_weights_bytes", 64 << 20),
        "kv_cap_bytes": bounded.positive("emulator_kv_cap_bytes", 256 << 20),
        "kv_bytes_per_token": bounded.positive("emulator_kv_bytes_per_token", 16),
        "activation_bytes_per_token": bounded.not_negative(
            "emulator_activation_bytes_per_token", 1024),
        "graph_bytes": bounded.not_negative("emulator_graph_bytes", 0),
        "load_seconds": bounded.not_negative("emulator_load_seconds", 1.0),
        "profile_seconds": bounded.not_negative("emulator_profile_seconds", 1.0),
        "graph_seconds": bounded.not_negative("emulator_graph_seconds", 1.0),
        "prefill_tps": bounded.positive("emulator_prefill_tps", 2000.0),
        "decode_tps": bounded.positive("emulator_decode_tps", 40.0),
        "load": _load_from(values),
        "fail": values.get("emulator_fail", "none"),
        "strict_memory": values.get("emulator_strict_memory", False),
        "stats_interval": bounded.positive("emulator_stats_interval", _stats_interval_default()),
    }


def parse_or_exit(argv: Sequence[str]) -> EmulatorConfig:
    """`parse_args`, or argparse's behaviour on a refused line: usage and error, exit status 2."""
    if any(token in {"-h", "--help"} for token in argv):
        sys.stdout.write(HELP)
        raise SystemExit(0)
    try:
        return parse_args(argv)
    except CliError as exc:
        sys.stderr.write(f"{USAGE}\n{PROG}: error: {exc}\n")
        sys.stderr.flush()
        raise SystemExit(2) from None
