"""The bandwidth roofline of an engine: how fast one stream *could* decode, and how fast it does.

Decode is bandwidth-bound: every generated token reads every active weight once, so one stream
cannot decode faster than

    ceiling (tok/s) = node memory bandwidth (bytes/s) ÷ bytes read per token
    bytes read per token = active parameters × bytes per parameter

(GB10: 273 GB/s; Nemotron-3-Super-120B-A12B in NVFP4 reads 12e9 × 0.5625 B = 6.75 GB per token,
a ceiling of ≈ 40 tok/s). KV-cache reads are *not* in the ceiling: they grow with the context
(2 × layers × KV heads × head size × KV bytes per token of context) and are reported beside it,
so the ceiling is the short-context upper bound.

Inputs, each with where it came from (an unknown one is ``None`` with what to set, never 0):

* **Active parameters**: the container label ``sparkops.active-params`` (an admin's setting,
  e.g. ``12e9`` or ``12B``); else the model's ``config.json`` (see :func:`active_params_from_config`
  for the formula), read through ``/proc/<pid>/root`` like the collectors do; else the model's
  name (``…-120B-A12B`` → 12e9 active, ``…-26B-A4B`` → 4e9, a dense ``…-8B`` → 8e9).
* **Bytes per parameter**: the label ``sparkops.bytes-per-param``; else ``--quantization``; else
  the config's ``quantization_config``; else the name (NVFP4, FP8, AWQ …); else the config's
  dtype. NVFP4 stores 4-bit values plus one FP8 scale per 16 values: 0.5 + 1/16 = 0.5625 B.

**Measured single-stream decode**: the engine's decode tok/s at collections where exactly one
request ran, both at that collection and at the one before it (the rate covers the interval
between them), ignoring intervals without decoding; the median of the most recent ones.

Plain functions; only :func:`read_engine_model_config` touches the file system.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.core.cache import cache
from django.db.models import Max

from collectors.modelconfig import read_model_config
from collectors.models import Engine, EngineMetric, EngineSample, Metric, Sample
from dashboard.engines import UNKNOWN, tps_text

ACTIVE_PARAMS_LABEL = "sparkops.active-params"
BYTES_PER_PARAM_LABEL = "sparkops.bytes-per-param"

NVFP4_BYTES = 0.5 + 1 / 16  # 4-bit values + one FP8 scale per block of 16
MXFP4_BYTES = 0.5 + 1 / 32  # 4-bit values + one 8-bit scale per block of 32
INT4_GROUPED_BYTES = 0.5 + 4 / 128  # 4-bit values + 16-bit scale and zero per group of 128

# Quantization names (flag values, config quant methods/algorithms, name tokens) → bytes.
QUANT_BYTES: dict[str, float] = {
    "nvfp4": NVFP4_BYTES, "fp4": NVFP4_BYTES, "modelopt_fp4": NVFP4_BYTES,
    "mxfp4": MXFP4_BYTES,
    "awq": INT4_GROUPED_BYTES, "gptq": INT4_GROUPED_BYTES, "int4": INT4_GROUPED_BYTES,
    "w4a16": INT4_GROUPED_BYTES, "w4a8": INT4_GROUPED_BYTES, "4bit": INT4_GROUPED_BYTES,
    "awq_marlin": INT4_GROUPED_BYTES, "gptq_marlin": INT4_GROUPED_BYTES,
    "fp8": 1.0, "int8": 1.0, "w8a8": 1.0, "w8a16": 1.0, "8bit": 1.0, "modelopt_fp8": 1.0,
    "fbgemm_fp8": 1.0, "ptpc_fp8": 1.0,
    "bf16": 2.0, "fp16": 2.0, "bfloat16": 2.0, "float16": 2.0, "half": 2.0,
    # vLLM serves float32 checkpoints in 16 bits unless told otherwise.
    "float32": 2.0, "fp32": 2.0,
}
DTYPES = {"bf16", "fp16", "bfloat16", "float16", "half", "float32", "fp32"}

# Below this share of the ceiling the page explains what may hold the engine back.
LOW_RATIO = 0.4
# Above this the inputs overstate the bytes per token (or speculative decoding is on).
ABOVE_RATIO = 1.05
SINGLE_STREAM_LOOKBACK = timedelta(days=7)
SINGLE_STREAM_SAMPLES = 30
PSI_PRESSURE_PERCENT = 5.0
NOT_MEASURED = "not measured yet (needs a moment with exactly one request)"


@dataclass(frozen=True)
class Input:
    """One input of the roofline: its value, where it came from, and what to set if unknown."""

    value: float | None
    source: str = ""
    detail: str = ""
    missing: str = ""


@dataclass(frozen=True)
class Measured:
    """The measured single-stream decode (None: no qualifying moment yet)."""

    tps: float | None
    samples: int = 0
    first_at: datetime | None = None
    last_at: datetime | None = None
    moments: list[datetime] = field(default_factory=list)


# --- parameter counts and widths from names and labels ------------------------------------------

_COUNT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMbBtT]?)\s*$")
_SCALE = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}
_SIZE_TOKEN = re.compile(r"^(\d+(?:\.\d+)?)([mbt])$", re.IGNORECASE)
_ACTIVE_TOKEN = re.compile(r"^[ae](\d+(?:\.\d+)?)([mbt])$", re.IGNORECASE)
_TOKEN_SPLIT = re.compile(r"[-_/\s]+")


def parse_param_count(text: str | None) -> float | None:
    """``"12e9"``, ``"12B"``, ``"350M"``, ``"12000000000"`` → parameters; None if unreadable."""
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        match = _COUNT.match(text)
        if not match:
            return None
        value = float(match.group(1)) * _SCALE[match.group(2).lower()]
    return value if value > 0 else None


def _name_tokens(name: str) -> list[str]:
    return [t for t in _TOKEN_SPLIT.split(name.rsplit("/", 1)[-1]) if t]


def params_from_name(name: str) -> Input:
    """Active parameters from a model name: ``A12B`` (active) wins, else one size (dense)."""
    tokens = _name_tokens(name)
    for token in tokens:
        match = _ACTIVE_TOKEN.match(token)
        if match:
            active = float(match.group(1)) * _SCALE[match.group(2).lower()]
            return Input(active, "model name", f"“{token}” in {name}: active parameters")
    sizes = [(t, _SIZE_TOKEN.match(t)) for t in tokens]
    sizes = [(t, m) for t, m in sizes if m]
    if not sizes:
        return Input(None, missing=f"no parameter count in the name {name!r}")
    token, match = sizes[0]
    return Input(float(match.group(1)) * _SCALE[match.group(2).lower()], "model name",
                 f"“{token}” in {name}, read as a dense model (no A<n>B part)")


def bytes_from_name(name: str) -> Input:
    """Bytes per parameter from a quantization word in the name (NVFP4, FP8, AWQ, BF16 …)."""
    for token in _name_tokens(name):
        value = QUANT_BYTES.get(token.lower())
        if value is not None and token.lower() not in DTYPES:
            return Input(value, "model name", f"“{token}” in {name}")
    for token in _name_tokens(name):
        value = QUANT_BYTES.get(token.lower())
        if value is not None:
            return Input(value, "model name", f"“{token}” in {name}")
    return Input(None, missing=f"no quantization in the name {name!r}")


def _label_input(labels: dict[str, str], label: str, parse: Any) -> Input | None:
    text = (labels or {}).get(label)
    if text is None:
        return None
    value = parse(text)
    if value is None:
        return Input(None, missing=f"label {label}={text!r} is not a number")
    return Input(value, f"label {label}", f"{label}={text}")


def _positive_float(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value > 0 else None


# --- config.json ---------------------------------------------------------------------------------

def _int(config: dict[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    nested = config.get("text_config")
    return nested if isinstance(nested, dict) else config


def _hybrid(text: dict[str, Any]) -> bool:
    """Layers other than attention + MLP (Mamba, linear attention) are not modelled."""
    if text.get("hybrid_override_pattern") or text.get("layers_block_type"):
        return True
    kinds = text.get("layer_types")
    return isinstance(kinds, list) and any(
        isinstance(k, str) and ("mamba" in k or "linear" in k) for k in kinds)


def _attention_params(text: dict[str, Any], hidden: int) -> int | None:
    heads = _int(text, "num_attention_heads", "n_head")
    if heads is None:
        return None
    kv_rank = _int(text, "kv_lora_rank")
    if kv_rank:  # multi-head latent attention (DeepSeek-style)
        nope, rope = _int(text, "qk_nope_head_dim") or 0, _int(text, "qk_rope_head_dim") or 0
        v_dim = _int(text, "v_head_dim") or nope
        q_rank = _int(text, "q_lora_rank")
        q = hidden * q_rank + q_rank * heads * (nope + rope) if q_rank \
            else hidden * heads * (nope + rope)
        kv = hidden * (kv_rank + rope) + kv_rank * heads * (nope + v_dim)
        return q + kv + heads * v_dim * hidden
    kv_heads = _int(text, "num_key_value_heads", "num_kv_heads") or heads
    head_dim = _int(text, "head_dim") or hidden // heads
    return hidden * head_dim * (2 * heads + 2 * kv_heads)


def _moe_layers(text: dict[str, Any], layers: int) -> set[int]:
    """Indices of the layers whose MLP is a mixture of experts."""
    dense = set(text.get("mlp_only_layers") or [])
    first_dense = _int(text, "first_k_dense_replace") or 0
    sparse_step = _int(text, "decoder_sparse_step") or 1
    return {i for i in range(layers)
            if i not in dense and i >= first_dense and (i + 1) % sparse_step == 0}


def active_params_from_config(config: dict[str, Any] | None) -> Input:
    """Parameters read per generated token, from a Hugging Face ``config.json``.

    With h = hidden_size, L = num_hidden_layers, V = vocab_size, n heads of size d
    (head_dim, else h / n) and n_kv key-value heads::

        attention per layer = h·d·(2·n + 2·n_kv)            q, k, v and o projections
                              (latent attention: the low-rank q, kv and o projections)
        dense MLP per layer = 3·h·I                          gate, up, down (I: intermediate)
        MoE MLP per layer   = k·3·h·I_e + s·3·h·I_s + h·E    k routed experts of width I_e,
                                                             s shared ones, the router over E
        active              = Σ layers + V·h                 the LM head is read whole each
                                                             token; one embedding row is not

    MoE layers: all, minus ``mlp_only_layers`` and the first ``first_k_dense_replace``, every
    ``decoder_sparse_step``-th. Norms and biases are left out (well under 1 %). Hybrid models
    (Mamba or linear-attention layers) are not modelled: None, so the name decides.
    """
    if not config:
        return Input(None, missing="no config.json")
    text = _text_config(config)
    hidden, layers = _int(text, "hidden_size", "d_model"), _int(text, "num_hidden_layers")
    vocab = _int(text, "vocab_size") or _int(config, "vocab_size")
    if hidden is None or layers is None or vocab is None:
        return Input(None, missing="config.json lacks hidden_size, num_hidden_layers or "
                                   "vocab_size")
    if _hybrid(text):
        return Input(None, missing="config.json describes hybrid (Mamba) layers, which the "
                                   "formula does not model")
    attention = _attention_params(text, hidden)
    if attention is None:
        return Input(None, missing="config.json lacks num_attention_heads")
    dense_width = _int(text, "intermediate_size", "ffn_dim") or 4 * hidden
    per_token = _int(text, "num_experts_per_tok", "experts_per_token", "moe_topk",
                     "num_experts_per_token", "top_k_experts")
    experts = _int(text, "n_routed_experts", "num_experts", "num_local_experts") or 0
    expert_width = _int(text, "moe_intermediate_size", "expert_intermediate_size")
    if per_token and experts and expert_width is None:
        expert_width = dense_width  # Mixtral: intermediate_size is each expert's width
    moe = _moe_layers(text, layers) if per_token and expert_width else set()
    shared_width = _int(text, "shared_expert_intermediate_size")
    shared = shared_width * 3 * hidden if shared_width \
        else (_int(text, "n_shared_experts") or 0) * 3 * hidden * (expert_width or 0)
    moe_mlp = (per_token or 0) * 3 * hidden * (expert_width or 0) + shared + hidden * experts
    total = layers * attention + len(moe) * moe_mlp + (layers - len(moe)) * 3 * hidden * \
        dense_width + vocab * hidden
    kind = f"MoE, {per_token} of {experts} experts per token" if moe else "dense"
    return Input(float(total), "config.json",
                 f"{kind}: {layers} layers × (attention + MLP) + LM head {vocab}×{hidden}")


def bytes_from_config(config: dict[str, Any] | None) -> tuple[Input, Input]:
    """(from ``quantization_config``, from the dtype): bytes per parameter the config implies."""
    if not config:
        return Input(None), Input(None)
    quant = config.get("quantization_config")
    quantized = Input(None)
    if isinstance(quant, dict):
        quantized = _quantization_bytes(quant)
    text = _text_config(config)
    dtype = str(config.get("torch_dtype") or config.get("dtype") or text.get("torch_dtype") or "")
    plain = Input(QUANT_BYTES[dtype.lower()], "config.json", f"dtype {dtype}") \
        if dtype.lower() in DTYPES else Input(None)
    return quantized, plain


def _quantization_bytes(quant: dict[str, Any]) -> Input:
    method = str(quant.get("quant_method") or "").lower()
    nested = quant.get("quantization")  # ModelOpt's hf_quant_config.json layout
    algo = str(quant.get("quant_algo")
               or (nested.get("quant_algo") if isinstance(nested, dict) else None) or "")
    for word in (algo.lower(), method):
        if word in QUANT_BYTES:
            return Input(QUANT_BYTES[word], "config.json", f"quantization {algo or method}")
    bits = quant.get("bits") or quant.get("w_bit")
    groups = quant.get("config_groups")
    if bits is None and isinstance(groups, dict):
        weights = next((g.get("weights") for g in groups.values()
                        if isinstance(g, dict) and isinstance(g.get("weights"), dict)), None)
        if weights:
            bits = weights.get("num_bits")
            if bits == 4 and weights.get("type") == "float":
                return Input(NVFP4_BYTES, "config.json", "compressed-tensors FP4 weights")
    if bits == 4 or quant.get("load_in_4bit"):
        return Input(INT4_GROUPED_BYTES, "config.json", f"{method or 'quantized'} 4-bit")
    if bits == 8 or quant.get("load_in_8bit"):
        return Input(1.0, "config.json", f"{method or 'quantized'} 8-bit")
    return Input(None, missing=f"unrecognised quantization {method!r} in config.json")


def kv_bytes_per_context_token(config: dict[str, Any] | None, kv_cache_dtype: str | None
                               ) -> int | None:
    """KV bytes each generated token reads per token of context (2·L·n_kv·d·bytes; latent
    attention: L·(kv_lora_rank + rope dim)·bytes). None when the config lacks the sizes."""
    if not config:
        return None
    text = _text_config(config)
    layers, hidden = _int(text, "num_hidden_layers"), _int(text, "hidden_size")
    heads = _int(text, "num_attention_heads")
    if not (layers and hidden and heads) or _hybrid(text):
        return None
    width = 1 if (kv_cache_dtype or "").lower().startswith("fp8") else 2
    kv_rank = _int(text, "kv_lora_rank")
    if kv_rank:
        return layers * (kv_rank + (_int(text, "qk_rope_head_dim") or 0)) * width
    kv_heads = _int(text, "num_key_value_heads") or heads
    head_dim = _int(text, "head_dim") or hidden // heads
    return 2 * layers * kv_heads * head_dim * width


# --- choosing the inputs -------------------------------------------------------------------------

def model_names(engine: Engine) -> list[str]:
    """Names the engine's model goes by, most specific first (path or repo id, served name)."""
    config = engine.config or {}
    snapshot = (engine.metrics or {}).get("snapshot") or {}
    names = [config.get("model"), config.get("served_model_name"), snapshot.get("model_name")]
    return [n for i, n in enumerate(names) if n and n not in names[:i]]


def active_params(engine: Engine, config: dict[str, Any] | None) -> Input:
    """Label, then config.json, then the model's names; the first that knows wins."""
    label = _label_input(engine.labels or {}, ACTIVE_PARAMS_LABEL, parse_param_count)
    if label is not None and label.value is not None:
        return label
    reasons = [label.missing] if label else []
    found = active_params_from_config(config)
    if found.value is not None:
        return found
    reasons.append(found.missing)
    for name in model_names(engine):
        found = params_from_name(name)
        if found.value is not None:
            return found
        reasons.append(found.missing)
    return Input(None, missing="; ".join(r for r in reasons if r)
                 + f"; set the container label {ACTIVE_PARAMS_LABEL} (e.g. 12e9)")


def bytes_per_param(engine: Engine, config: dict[str, Any] | None) -> Input:
    """Label, ``--quantization``, the config's quantization, the name, the config's dtype."""
    label = _label_input(engine.labels or {}, BYTES_PER_PARAM_LABEL, _positive_float)
    if label is not None and label.value is not None:
        return label
    flag = str((engine.config or {}).get("quantization") or "").lower()
    if flag in QUANT_BYTES:
        return Input(QUANT_BYTES[flag], "--quantization", f"--quantization {flag}")
    quantized, plain = bytes_from_config(config)
    if quantized.value is not None:
        return quantized
    for name in model_names(engine):
        found = bytes_from_name(name)
        if found.value is not None:
            return found
    if plain.value is not None:
        return plain
    dtype = str((engine.config or {}).get("all_flags", {}).get("dtype") or "").lower()
    if dtype in DTYPES:
        return Input(QUANT_BYTES[dtype], "--dtype", f"--dtype {dtype}")
    return Input(None, missing="no quantization in the flags, config.json or the name; set the "
                               f"container label {BYTES_PER_PARAM_LABEL} (NVFP4 0.5625, FP8 1, "
                               "BF16 2)")


def decode_ceiling_tps(bandwidth_gbps: float, bytes_per_token: float | None) -> float | None:
    """Tokens per second one stream can decode at most: bandwidth ÷ bytes read per token."""
    if not bytes_per_token or bytes_per_token <= 0:
        return None
    return bandwidth_gbps * 1e9 / bytes_per_token


# --- the measurement -----------------------------------------------------------------------------

def single_stream_decode(engine: Engine, now: datetime, interval: float) -> Measured:
    """Median decode tok/s of the latest collections with exactly one request running.

    A collection counts when it and the one before (at most 1.5 collection intervals earlier)
    both saw one running request and the decode rate was above 0 (a lone request still in its
    prefill decodes nothing). Uses the latest :data:`SINGLE_STREAM_SAMPLES` within a week, as
    far back as raw samples are kept (``SPARKOPS_RAW_RETENTION_DAYS``, a day by default).
    """
    since = now - SINGLE_STREAM_LOOKBACK
    ones = list(EngineSample.objects.filter(
        engine=engine, metric=EngineMetric.REQUESTS_RUNNING, value=1, at__gte=since, at__lte=now,
    ).order_by("at").values_list("at", flat=True))
    most = timedelta(seconds=1.5 * interval)
    qualifying = [at for before, at in zip(ones, ones[1:], strict=False) if at - before <= most]
    if not qualifying:
        return Measured(None)
    decode = list(EngineSample.objects.filter(
        engine=engine, metric=EngineMetric.DECODE_TPS, value__gt=0,
        at__in=qualifying[-5 * SINGLE_STREAM_SAMPLES:],
    ).order_by("-at").values_list("at", "value")[:SINGLE_STREAM_SAMPLES])
    if not decode:
        return Measured(None)
    moments = sorted(at for at, _ in decode)
    return Measured(statistics.median(v for _, v in decode), len(decode), moments[0], moments[-1],
                    moments)


# --- explanations -------------------------------------------------------------------------------

def _finding_codes(engine: Engine) -> set[str]:
    return {f.get("code") for f in engine.findings or [] if isinstance(f, dict)}


def busy_neighbours(engine: Engine, moments: list[datetime]) -> dict[str, int]:
    """Other engines of the node generating (decode or prefill above 0) at the measured moments:
    name → how many of those moments. They read the same memory at the same time. (One
    collection scrapes every engine of a node and stamps their samples with the same instant.)"""
    if not moments:
        return {}
    rows = EngineSample.objects.filter(
        engine__node_id=engine.node_id, at__in=moments, value__gt=0,
        metric__in=[EngineMetric.DECODE_TPS, EngineMetric.PREFILL_TPS],
    ).exclude(engine=engine).values_list("engine__name", "at")
    seen: dict[str, set[datetime]] = {}
    for name, at in rows:
        seen.setdefault(name, set()).add(at)
    return {name: len(ats) for name, ats in sorted(seen.items())}


def peak_pressure(engine: Engine, measured: Measured) -> float | None:
    """The highest PSI (some, avg10, %) of the node while the measurement was taken."""
    if measured.first_at is None or measured.last_at is None:
        return None
    return Sample.objects.filter(
        node_id=engine.node_id, metric=Metric.PSI_SOME_AVG10,
        at__gte=measured.first_at - timedelta(seconds=30), at__lte=measured.last_at,
    ).aggregate(peak=Max("value"))["peak"]


def explain(engine: Engine, ratio: float | None, measured: Measured, bandwidth_gbps: float
            ) -> list[str]:
    """Plain reasons for a ratio below :data:`LOW_RATIO` (or above :data:`ABOVE_RATIO`)."""
    if ratio is None:
        return []
    if ratio > ABOVE_RATIO:
        return ["Measured faster than the ceiling: the inputs overstate the bytes read per token "
                "(a mixture-of-experts model counted as dense, or layers narrower than assumed), "
                "or speculative decoding produces several tokens per read. Set "
                f"{ACTIVE_PARAMS_LABEL} or {BYTES_PER_PARAM_LABEL} on the container."]
    if ratio >= LOW_RATIO:
        return []
    reasons = []
    codes = _finding_codes(engine)
    if "moe-backend-unset" in codes:
        reasons.append("Fallback kernel: --moe-backend is not set, so vLLM may pick slower MoE "
                       "kernels on this GPU without saying so (finding moe-backend-unset).")
    if "enforce-eager" in codes or (engine.config or {}).get("enforce_eager"):
        reasons.append("Eager mode: --enforce-eager turns CUDA graphs off, so every decode step "
                       "pays kernel-launch overhead (finding enforce-eager).")
    pressure = peak_pressure(engine, measured)
    if pressure is not None and pressure >= PSI_PRESSURE_PERCENT:
        reasons.append(f"Memory pressure: PSI (some, avg10) reached {pressure:.0f} % while this "
                       "was measured; tasks stalled waiting for memory.")
    neighbours = busy_neighbours(engine, measured.moments)
    if neighbours:
        busy = ", ".join(f"{name} ({count} of {measured.samples})"
                         for name, count in neighbours.items())
        reasons.append(f"A busy neighbour: {busy} generated at the same moments, sharing the "
                       f"node's {bandwidth_gbps:.0f} GB/s.")
    if not reasons:
        reasons.append("No known cause found (no fallback-kernel or eager-mode finding, no memory "
                       "pressure, no neighbour generating at the same time). Models with few "
                       "active parameters rarely get close: per-token work other than reading "
                       "weights (attention, sampling, scheduling) weighs more.")
    return reasons


# --- the whole figure ----------------------------------------------------------------------------

def engine_roofline(engine: Engine, now: datetime, *, bandwidth_gbps: float, interval: float,
                    model_config: dict[str, Any] | None, config_note: str = "") -> dict:
    """Everything the engine page shows about the roofline, as JSON-ready data.

    ``model_config`` is the model's parsed config.json (or None, with ``config_note`` saying
    why). Keys: ``ceiling_tps``, ``measured_tps``, ``ratio`` (None when unknown), their inputs,
    ``verdict`` ("unknown", "low", "fair", "good", "above"), ``explanations`` and ``missing``.
    """
    active = active_params(engine, model_config)
    width = bytes_per_param(engine, model_config)
    per_token = active.value * width.value if active.value and width.value else None
    ceiling = decode_ceiling_tps(bandwidth_gbps, per_token)
    measured = single_stream_decode(engine, now, interval)
    ratio = measured.tps / ceiling if ceiling and measured.tps else None
    kv_per_context = kv_bytes_per_context_token(model_config, (engine.config or {})
                                                .get("kv_cache_dtype"))
    missing = [text for text in (active.missing if active.value is None else "",
                                 width.missing if width.value is None else "") if text]
    if measured.tps is None:
        missing.append(NOT_MEASURED)
    return _with_texts({
        "bandwidth_gbps": bandwidth_gbps,
        "active_params": asdict(active),
        "bytes_per_param": asdict(width),
        "bytes_per_token": per_token,
        "ceiling_tps": ceiling,
        "measured_tps": measured.tps,
        "measured_samples": measured.samples,
        "measured_from": measured.first_at.isoformat() if measured.first_at else None,
        "measured_to": measured.last_at.isoformat() if measured.last_at else None,
        "ratio": ratio,
        "verdict": _verdict(ratio),
        "explanations": explain(engine, ratio, measured, bandwidth_gbps),
        "kv_bytes_per_context_token": kv_per_context,
        "kv_share_at_8k": (8192 * kv_per_context / per_token) if kv_per_context and per_token
        else None,
        "config_note": config_note,
        "missing": missing,
    })


def _with_texts(figure: dict) -> dict:
    """The figures formatted once for the page (``*_text``; numbers stay numbers for JSON)."""
    active, width = figure["active_params"]["value"], figure["bytes_per_param"]["value"]
    figure["active_text"] = UNKNOWN if active is None else f"{active / 1e9:.1f} B parameters"
    figure["bytes_per_param_text"] = UNKNOWN if width is None else f"{width:g} bytes"
    per_token = figure["bytes_per_token"]
    figure["bytes_per_token_text"] = UNKNOWN if per_token is None else f"{per_token / 1e9:.2f} GB"
    figure["ceiling_text"] = tps_text(figure["ceiling_tps"])
    figure["measured_text"] = tps_text(figure["measured_tps"]) \
        if figure["measured_tps"] is not None else NOT_MEASURED
    ratio = figure["ratio"]
    figure["ratio_text"] = UNKNOWN if ratio is None else f"{ratio:.2f}"
    figure["share_text"] = "" if ratio is None else f"{ratio:.0%} of the ceiling"
    figure["bar_pct"] = None if ratio is None else round(min(ratio, 1.0) * 100, 1)
    share = figure["kv_share_at_8k"]
    figure["kv_text"] = None if share is None else (
        f"KV reads are not in the ceiling: each token of context adds "
        f"{figure['kv_bytes_per_context_token'] / 1024:.0f} KiB per generated token, "
        f"+{share:.0%} at 8k tokens of context.")
    return figure


def _verdict(ratio: float | None) -> str:
    if ratio is None:
        return "unknown"
    if ratio > ABOVE_RATIO:
        return "above"
    if ratio < LOW_RATIO:
        return "low"
    return "fair" if ratio < 0.7 else "good"


# --- reading config.json -------------------------------------------------------------------------

HF_CACHE_DIRS = ("/root/.cache/huggingface/hub",)
CONFIG_CACHE_SECONDS = 600


def model_config_for(engine: Engine, local_node_name: str, proc_root: Path
                     ) -> tuple[dict[str, Any] | None, str]:
    """:func:`read_engine_model_config`, cached per container and model for ten minutes.

    Only on the node this process runs on: another node's containers are not visible here.
    """
    if engine.node.name != local_node_name:
        return None, (f"config.json is read only on the node SparkOps' web process runs on "
                      f"({local_node_name})")
    key = f"sparkops:model-config:{engine.container_id}:{(engine.config or {}).get('model')}"
    cached = cache.get(key)
    if cached is None:
        cached = read_engine_model_config(engine, proc_root)
        cache.set(key, cached, CONFIG_CACHE_SECONDS)
    return cached


def read_engine_model_config(engine: Engine, proc_root: Path) -> tuple[dict[str, Any] | None, str]:
    """The model's config.json as the engine's container sees it, and where it was found (or
    why not). Costs one read of ``/proc/<pid>/cgroup`` per process on the host to find the
    container's process, so callers cache the answer per container.

    Local model directories are read at their path inside the container; Hugging Face repo ids
    in the container's hub cache (``HF_HUB_CACHE``, ``HF_HOME``/hub, the default), newest
    snapshot first.
    """
    model = (engine.config or {}).get("model")
    if not model:
        return None, "the launch command names no model"
    if engine.container_state != "running":
        return None, "the container is not running (its files are read through its process)"
    pid = container_process(engine.container_id, proc_root)
    if pid is None:
        return None, "no process of the container is visible here (SparkOps' web process runs " \
                     "on another machine or without the right to look into it)"
    root = proc_root / str(pid) / "root"
    for directory in _model_dirs(root, model, engine.env or {}):
        config = read_model_config(directory)
        if config is not None:
            return config, f"{'/' + str(directory.relative_to(root))}/config.json in the container"
    return None, f"no readable config.json for {model} inside the container"


def container_process(container_id: str, proc_root: Path) -> int | None:
    """The lowest PID on the host that belongs to ``container_id`` (None when none is seen)."""
    # Imported here: collectors.nvml loads pynvml (about 2 MiB), which the web server needs for
    # this engine-page lookup only.
    from collectors.nvml import container_id_for_pid

    if not container_id:
        return None
    try:
        pids = sorted(int(p.name) for p in proc_root.iterdir() if p.name.isdigit())
    except OSError:
        return None
    for pid in pids:
        found = container_id_for_pid(pid, proc_root)
        if found and (found.startswith(container_id) or container_id.startswith(found)):
            return pid
    return None


def _model_dirs(root: Path, model: str, env: dict[str, str]) -> list[Path]:
    """Where the model's files may be, under the container's root; none for a name that would
    climb out of it."""
    if ".." in Path(model).parts:
        return []
    if model.startswith("/"):
        return [root / model.lstrip("/")]
    if "/" not in model:
        return []
    hubs = [env.get("HF_HUB_CACHE"), f"{env['HF_HOME']}/hub" if env.get("HF_HOME") else None,
            *HF_CACHE_DIRS]
    repo = "models--" + model.replace("/", "--")
    dirs: list[Path] = []
    for hub in filter(None, hubs):
        snapshots = root / hub.lstrip("/") / repo / "snapshots"
        try:
            found = sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
        except OSError:
            continue
        dirs += found
    return dirs
