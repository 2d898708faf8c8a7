"""The roofline's inputs: parameter counts and bytes per parameter, from labels, launch flags,
the model's config.json and its names. Pure functions, no database and no I/O."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from collectors.models import Engine

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

@dataclass(frozen=True)
class Input:
    """One input of the roofline: its value, where it came from, and what to set if unknown."""

    value: float | None
    source: str = ""
    detail: str = ""
    missing: str = ""


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
