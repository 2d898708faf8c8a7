"""A model's architecture as the KV-cache planner needs it: its attention layers, sizes, dtype.

vLLM sizes an engine's KV cache from the attention layers the model declares: how many, which
kind (full attention, sliding-window, no cache of their own), their KV heads and head size.
This module reads those from a Hugging Face ``config.json`` (:func:`architecture_from_config`;
multimodal configs keep the language model under ``text_config``). The config.json the engine
serves is read first (through its container, collectors.modelconfig); when it cannot be read,
the table of model architectures answers (:func:`seeded_architecture` over
``collectors.models.ModelArchitecture``): one row per model, found by its Hugging Face repo id,
one of its aliases or a local path's last two parts, holding a config.json (the fields this
module reads) or why the model cannot be planned, and where its figures come from. The table is
seeded with the models GB10 admins commonly serve (``collectors/seeds/model_architectures.json``,
copied into it by a data migration) and edited under Admin → Model architectures, where a
pasted config.json is read by :func:`architecture_from_config` before it is saved. A model in
neither gets :class:`ArchitectureUnknown` with the reason, never a guessed layout.

A table entry's config.json may list under ``sparkops_unknown`` the fields its source does not
give (:data:`UNKNOWN_FIELDS`: the hidden sizes, whether the checkpoint declares a quantised KV
cache): they become the architecture's ``gaps``, and a KV quantisation so listed is "not known"
(``kv_quant_known=False``) rather than "none".

How vLLM turns each layout into cache layers (vllm/model_executor/models/*.py):

* Llama, Qwen2/3, Mistral: every layer full attention with ``num_key_value_heads`` heads of
  ``head_dim`` (``hidden_size / num_attention_heads`` when absent); a global ``sliding_window``
  (Mistral) makes every layer sliding, ``use_sliding_window: false`` (Qwen) none.
* ``layer_types`` (Gemma 3/4, gpt-oss, newer configs) names each layer; Gemma 2 alternates
  sliding and full, older Gemma 3 configs give ``sliding_window_pattern`` instead.
* Gemma 4 (gemma4.py, 0.19+): full layers use ``global_head_dim`` and, with
  ``attention_k_eq_v``, ``num_global_key_value_heads``; vLLM still stores V for them (K is
  loaded into both). The last ``num_kv_shared_layers`` layers read an earlier layer's cache and
  hold none of their own.
* Mamba / linear-attention layers (NemotronH's ``hybrid_override_pattern`` ``M``, Qwen3-Next's
  ``linear_attention``) hold one fixed-size state per request, not per token; the planner says
  what it cannot size for them.

Weights: :func:`checkpoint_bytes` sums a model directory's ``*.safetensors`` (what is loaded,
give or take what vLLM skips or repacks), :func:`weights_from_architecture` estimates from the
parameter count and the quantisation; both are estimates and say so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from collectors.modelconfig import (
    read_container_model_config,
    read_model_config,
    read_small_json,
)
from collectors.procfs import process_root

FULL = "full"
SLIDING = "sliding"
SHARED = "shared"  # reads another layer's KV cache (Gemma's num_kv_shared_layers)
MAMBA = "mamba"  # one recurrent state per request (Mamba-2, gated delta net)

# The first vLLM release (of those read) whose model registry
# (vllm/model_executor/models/registry.py) has these architectures; older ones refuse them.
FIRST_VLLM_WITH = {
    "Gemma4ForCausalLM": "0.19.0",
    "Gemma4ForConditionalGeneration": "0.19.0",
    "GptOssForCausalLM": "0.10.1",
}

# Bytes per value of an unquantised checkpoint's dtype. vLLM serves float32 checkpoints in a
# 16-bit dtype by default, so they count 2 too (vllm/config/model.py, dtype "auto").
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 2, "float": 2}

# Not a Hugging Face key: a table entry's list of the fields its source does not give, each
# with the gap it leaves (Architecture.gaps). Only these may be listed.
UNKNOWN_KEY = "sparkops_unknown"
UNKNOWN_FIELDS = {
    "hidden_size": "hidden sizes (for the prefill estimate and weights from parameters)",
    "kv_cache_quant_algo": "whether the checkpoint declares an fp8 KV cache",
}


class ArchitectureUnknown(ValueError):
    """The architecture cannot be known; ``str(error)`` is one line saying why."""


@dataclass(frozen=True)
class LayerAttention:
    """One decoder layer's attention as vLLM builds its cache: ``kind`` is FULL, SLIDING,
    SHARED or MAMBA; heads and sizes are the whole model's (before tensor parallelism)."""

    kind: str
    num_kv_heads: int = 0
    head_dim: int = 0
    head_dim_v: int = 0
    window: int | None = None


@dataclass(frozen=True)
class Architecture:
    """What the planner reads of a model. ``source`` says where it came from; ``gaps`` name the
    figures that could not be read (``hidden_size`` for a seed entry without it, ...)."""

    model_type: str
    layers: tuple[LayerAttention, ...]
    source: str
    dtype: str | None = None
    hidden_size: int | None = None
    num_attention_heads: int | None = None
    intermediate_size: int | None = None
    moe_intermediate_size: int | None = None
    num_experts: int | None = None
    experts_per_token: int | None = None
    vocab_size: int | None = None
    tie_word_embeddings: bool = False
    max_position_embeddings: int | None = None
    quant_method: str | None = None
    quant_algo: str | None = None
    kv_cache_quant_algo: str | None = None
    # False when the source does not say whether the checkpoint declares a KV cache
    # quantisation (a seed entry of a quantised checkpoint).
    kv_quant_known: bool = True
    # The config scales RoPE (rope_scaling with a factor): vLLM may derive a longer default
    # max_model_len than max_position_embeddings.
    rope_scaled: bool = False
    architectures: tuple[str, ...] = ()
    min_vllm: str | None = None
    gaps: tuple[str, ...] = ()

    @property
    def cache_layers(self) -> tuple[LayerAttention, ...]:
        """The layers that hold KV of their own (full and sliding attention)."""
        return tuple(layer for layer in self.layers if layer.kind in (FULL, SLIDING))

    @property
    def has_state_layers(self) -> bool:
        return any(layer.kind == MAMBA for layer in self.layers)

    def config_fields(self) -> dict[str, Any]:
        """The fields :func:`collectors.modelconfig.activation_bytes_per_token` reads."""
        fields = {
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "moe_intermediate_size": self.moe_intermediate_size,
            "num_experts_per_tok": self.experts_per_token,
        }
        return {key: value for key, value in fields.items() if value is not None}


# --- reading a config.json -----------------------------------------------------------------------


def architecture_from_config(config: Mapping[str, Any], source: str,
                             hf_quant_config: Mapping[str, Any] | None = None) -> Architecture:
    """The architecture a Hugging Face ``config.json`` declares; raises
    :class:`ArchitectureUnknown` naming the missing or unreadable field. ``hf_quant_config`` is
    the checkpoint's ``hf_quant_config.json``, which older ModelOpt exports write instead of a
    ``quantization_config`` (vllm/transformers_utils/config.py reads it then)."""
    if not isinstance(config, Mapping):
        raise ArchitectureUnknown(f"{source} is not a JSON object")
    text = config.get("text_config")
    text = text if isinstance(text, Mapping) else config
    model_type = str(text.get("model_type") or config.get("model_type") or "unknown")
    num_layers = _int(text, "num_hidden_layers", source)
    heads = _int(text, "num_attention_heads", source, required=False)
    hidden = _int(text, "hidden_size", source, required=False)
    kinds = _layer_kinds(text, model_type, num_layers, source)
    layers = tuple(_layer(text, model_type, kind, heads, hidden, source) for kind in kinds)
    layers = _mark_shared(text, layers)
    quant = config.get("quantization_config")
    kv_quant_known = True
    if not isinstance(quant, Mapping) and isinstance(hf_quant_config, Mapping):
        # The separate file names no quant_method, so how vLLM picks the KV dtype from it
        # with --kv-cache-dtype auto is not modelled.
        quant = {"quant_method": "modelopt", **hf_quant_config}
        kv_quant_known = _kv_quant_algo(quant) is None
    quant = quant if isinstance(quant, Mapping) else {}
    unknown = _unknown_fields(config, text, quant, source)
    if "kv_cache_quant_algo" in unknown:
        kv_quant_known = False
    names = config.get("architectures")
    architectures = tuple(name for name in names if isinstance(name, str)) \
        if isinstance(names, list) else ()
    firsts = [FIRST_VLLM_WITH[name] for name in architectures if name in FIRST_VLLM_WITH]
    return Architecture(
        model_type=model_type,
        layers=layers,
        source=source,
        dtype=_dtype(text) or _dtype(config),
        hidden_size=hidden,
        num_attention_heads=heads,
        intermediate_size=_int(text, "intermediate_size", source, required=False),
        moe_intermediate_size=_int(text, "moe_intermediate_size", source, required=False)
        or (_int(text, "intermediate_size", source, required=False)
            if model_type == "gpt_oss" else None),
        num_experts=_first_int(text, ("num_experts", "num_local_experts", "n_routed_experts")),
        experts_per_token=_first_int(text, ("num_experts_per_tok", "experts_per_token",
                                            "top_k_experts")),
        vocab_size=_int(text, "vocab_size", source, required=False),
        tie_word_embeddings=bool(config.get("tie_word_embeddings",
                                            text.get("tie_word_embeddings", False))),
        max_position_embeddings=_int(text, "max_position_embeddings", source, required=False),
        quant_method=_text(quant.get("quant_method")),
        quant_algo=_quant_algo(quant),
        kv_cache_quant_algo=_kv_quant_algo(quant),
        kv_quant_known=kv_quant_known,
        architectures=architectures,
        min_vllm=firsts[0] if firsts else None,
        rope_scaled=_rope_scaled(text, model_type),
        gaps=tuple(UNKNOWN_FIELDS[name] for name in unknown),
    )


def _unknown_fields(config: Mapping[str, Any], text: Mapping[str, Any],
                    quant: Mapping[str, Any], source: str) -> list[str]:
    """The fields a table entry's config.json lists under ``sparkops_unknown``: each one of
    :data:`UNKNOWN_FIELDS` and one the config does not also give."""
    listed = config.get(UNKNOWN_KEY)
    if listed is None:
        return []
    if not isinstance(listed, list) or not all(isinstance(name, str) for name in listed):
        raise ArchitectureUnknown(f"{source}: {UNKNOWN_KEY} is not a list of field names")
    for name in listed:
        if name not in UNKNOWN_FIELDS:
            raise ArchitectureUnknown(
                f"{source}: {UNKNOWN_KEY} lists {name!r}; it may list only "
                f"{', '.join(UNKNOWN_FIELDS)}")
        given = _kv_quant_algo(quant) is not None if name == "kv_cache_quant_algo" \
            else text.get(name) is not None
        if given:
            raise ArchitectureUnknown(
                f"{source}: {UNKNOWN_KEY} lists {name} but the config gives it")
    return list(dict.fromkeys(listed))


def _rope_scaled(text: Mapping[str, Any], model_type: str) -> bool:
    """Whether vLLM multiplies the derived max_model_len by a RoPE factor (vllm/config/model.py
    _get_and_verify_max_len: every rope type but su, longrope and llama3; not Gemma 3)."""
    scaling = text.get("rope_parameters") or text.get("rope_scaling")
    if not isinstance(scaling, Mapping) or "gemma3" in model_type:
        return False
    nested = [value for value in scaling.values() if isinstance(value, Mapping)]
    for params in nested or [scaling]:
        kind = params.get("rope_type") or params.get("type")
        if kind not in ("su", "longrope", "llama3", "default") \
                and params.get("factor") not in (None, 1, 1.0):
            return True
    return False


def _layer_kinds(text: Mapping[str, Any], model_type: str, num_layers: int,
                 source: str) -> list[str]:
    pattern = text.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        if len(pattern) != num_layers:
            raise ArchitectureUnknown(
                f"{source}: hybrid_override_pattern has {len(pattern)} layers but "
                f"num_hidden_layers is {num_layers}")
        # NemotronH: one character per layer; only "*" (attention) and "M" (Mamba) hold state.
        return [{"*": FULL, "M": MAMBA}.get(char, "none") for char in pattern]
    types = text.get("layer_types")
    if isinstance(types, list) and types:
        if len(types) != num_layers:
            raise ArchitectureUnknown(
                f"{source}: layer_types lists {len(types)} layers but num_hidden_layers is "
                f"{num_layers}")
        kinds = []
        for name in types:
            kind = {"full_attention": FULL, "sliding_attention": SLIDING,
                    "linear_attention": MAMBA, "mamba": MAMBA, "attention": FULL}.get(name)
            if kind is None:
                raise ArchitectureUnknown(
                    f"{source}: layer type {name!r} is not one the planner knows how vLLM "
                    "caches")
            kinds.append(kind)
        return kinds
    window = text.get("sliding_window")
    if model_type.startswith("gemma2") and window:
        # Gemma 2: even layers slide, odd layers attend globally (vllm/.../gemma2.py).
        return [SLIDING if index % 2 == 0 else FULL for index in range(num_layers)]
    every = text.get("sliding_window_pattern")
    if model_type.startswith("gemma3") and window and isinstance(every, int) and every > 0:
        return [FULL if (index + 1) % every == 0 else SLIDING for index in range(num_layers)]
    if text.get("kv_lora_rank"):
        raise ArchitectureUnknown(
            f"{source}: multi-head latent attention (kv_lora_rank) is not modelled")
    if window and text.get("use_sliding_window", True) is not False:
        return [SLIDING] * num_layers
    return [FULL] * num_layers


def _layer(text: Mapping[str, Any], model_type: str, kind: str, heads: int | None,
           hidden: int | None, source: str) -> LayerAttention:
    if kind not in (FULL, SLIDING):
        return LayerAttention(kind)
    head_dim = _int(text, "head_dim", source, required=False)
    if head_dim is None and heads and hidden:
        head_dim = hidden // heads
    kv_heads = _int(text, "num_key_value_heads", source, required=False) or heads
    if model_type.startswith("gemma4") and kind == FULL:
        head_dim = _int(text, "global_head_dim", source, required=False) or head_dim
        if text.get("attention_k_eq_v"):
            kv_heads = _int(text, "num_global_key_value_heads", source,
                            required=False) or kv_heads
    if not kv_heads or not head_dim:
        raise ArchitectureUnknown(
            f"{source}: the attention's KV heads or head size are missing "
            "(num_key_value_heads / num_attention_heads, head_dim / hidden_size)")
    window = None
    if kind == SLIDING:
        window = _int(text, "sliding_window", source, required=False)
        if window is None:
            raise ArchitectureUnknown(f"{source}: sliding layers but no sliding_window")
    return LayerAttention(kind, kv_heads, head_dim, head_dim, window)


def _mark_shared(text: Mapping[str, Any], layers: tuple[LayerAttention, ...]
                 ) -> tuple[LayerAttention, ...]:
    shared = text.get("num_kv_shared_layers")
    if not isinstance(shared, int) or shared <= 0:
        return layers
    first = len(layers) - shared
    return tuple(replace(layer, kind=SHARED) if index >= first and layer.kind in (FULL, SLIDING)
                 else layer for index, layer in enumerate(layers))


def _int(data: Mapping[str, Any], key: str, source: str, required: bool = True) -> int | None:
    """A positive count; None when absent and not required; a present value that is not a
    count raises, so a garbled config is never read as a layout."""
    value = data.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if value is None:
        if required:
            raise ArchitectureUnknown(f"{source}: {key} is missing")
        return None
    raise ArchitectureUnknown(f"{source}: {key} is not a count ({value!r})")


def _first_int(data: Mapping[str, Any], keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = data.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _dtype(data: Mapping[str, Any]) -> str | None:
    value = data.get("torch_dtype") or data.get("dtype")
    return value if isinstance(value, str) else None


def _text(value: object) -> str | None:
    return value.lower() if isinstance(value, str) and value else None


def _quant_algo(quant: Mapping[str, Any]) -> str | None:
    inner = quant.get("quantization") if isinstance(quant.get("quantization"), Mapping) else quant
    return _text(inner.get("quant_algo")) or _text(quant.get("quant_algo"))


def _kv_quant_algo(quant: Mapping[str, Any]) -> str | None:
    """ModelOpt's ``kv_cache_quant_algo`` ("FP8", "NVFP4") or a compressed-tensors
    ``kv_cache_scheme`` (read as "fp8"), as vLLM's resolve_kv_cache_dtype_string reads them."""
    inner = quant.get("quantization") if isinstance(quant.get("quantization"), Mapping) else quant
    for container in (inner, quant):
        scheme = container.get("kv_cache_scheme")
        if isinstance(scheme, Mapping) and scheme:
            bits, kind = scheme.get("num_bits"), scheme.get("type")
            if bits == 8 and kind == "float":
                return "fp8"
            if bits == 4 and kind == "float":
                return "nvfp4"
            return "unrecognised"
        algo = container.get("kv_cache_quant_algo")
        if isinstance(algo, str) and algo:
            return algo.lower()
    return None


# --- the table of model architectures ------------------------------------------------------------

# Where an admin adds or corrects a model the table lacks.
TABLE_IN_ADMIN = "Admin → Model architectures"


class TableEntry(Protocol):
    """What is read of a row of the table (collectors.models.ModelArchitecture)."""

    repo_id: str
    config: Any
    hf_quant_config: Any
    unknown_reason: str
    source: str


def seeded_architecture(model: str | None) -> Architecture:
    """The architecture the table of model architectures holds for a model named by its
    Hugging Face repo id or one of its aliases (a local path's last two parts and a Hugging Face
    cache folder's name are tried too); raises :class:`ArchitectureUnknown` with the reason.
    One query."""
    if not model:
        raise ArchitectureUnknown("the engine names no model")
    entry = _table_entry(_candidate_keys(model))
    if entry is None:
        raise ArchitectureUnknown(
            f"{model} is not in the seeded table of model architectures and its config.json "
            f"was not read; add it under {TABLE_IN_ADMIN}")
    return architecture_from_table_entry(entry, model)


def architecture_from_table_entry(entry: TableEntry, model: str | None = None) -> Architecture:
    """The architecture of one table entry, its ``source`` the entry's; raises
    :class:`ArchitectureUnknown` with the entry's reason (``"<model> is <reason>"``) or with
    what its config.json lacks."""
    if entry.unknown_reason:
        raise ArchitectureUnknown(f"{model or entry.repo_id} is {entry.unknown_reason}")
    where = f"the config.json of {entry.repo_id} in the table of model architectures"
    arch = architecture_from_config(entry.config, where, entry.hf_quant_config)
    return replace(arch, source=entry.source)


def table_entry_problems(config: Any, hf_quant_config: Any, unknown_reason: str
                         ) -> dict[str, str]:
    """Why an entry could not be read by the planner, by field (empty when it can): exactly one
    of a config.json and a reason, and the config.json as :func:`architecture_from_config`
    reads it."""
    has_config, has_reason = config is not None, bool(unknown_reason.strip())
    if has_config and has_reason:
        return {"unknown_reason": "give either the model's config.json or why it cannot be "
                                  "planned, not both"}
    if not has_config and not has_reason:
        return {"config": "give the model's config.json, or say why it cannot be planned"}
    if hf_quant_config is not None and not has_config:
        return {"hf_quant_config": "an hf_quant_config.json is read only with its config.json"}
    if hf_quant_config is not None and not isinstance(hf_quant_config, Mapping):
        return {"hf_quant_config": "hf_quant_config.json is not a JSON object"}
    if has_config:
        try:
            architecture_from_config(config, "config.json", hf_quant_config)
        except ArchitectureUnknown as why:
            return {"config": str(why)}
    return {}


def _table_entry(keys: list[str]) -> TableEntry | None:
    """The row of the first key that is a repo id or an alias (repo ids before aliases)."""
    from django.db.models import Q

    from collectors.models import ModelArchitecture

    match = Q(repo_id__in=keys)
    for key in keys:
        match |= Q(aliases__contains=key)
    rows = list(ModelArchitecture.objects.filter(match))
    for key in keys:
        for row in rows:
            if row.repo_id == key:
                return row
        for row in rows:
            if key in row.alias_list:
                return row
    return None


def _candidate_keys(model: str) -> list[str]:
    name = model.strip().rstrip("/").lower()
    parts = name.split("/")
    keys = [name]
    if len(parts) > 2:
        keys.append("/".join(parts[-2:]))
    if name.startswith("models--"):
        keys.append(name[len("models--"):].replace("--", "/"))
    return keys


def read_hf_quant_config(model_dir: Path) -> dict[str, Any] | None:
    """A checkpoint's ``hf_quant_config.json`` (older ModelOpt exports), or None."""
    return read_small_json(model_dir / "hf_quant_config.json")


def architecture_from_model_dir(model_dir: Path) -> Architecture:
    """The architecture of a local model directory's config.json (and hf_quant_config.json);
    raises :class:`ArchitectureUnknown` when it cannot be read."""
    config = read_model_config(model_dir)
    if config is None:
        raise ArchitectureUnknown(f"no readable config.json in {model_dir}")
    return architecture_from_config(config, f"{model_dir}/config.json",
                                    read_hf_quant_config(model_dir))


def architecture_from_container(model: str | None, env: dict[str, str], pid: int | None,
                                proc_root: Path = Path("/proc")) -> Architecture:
    """The architecture of the model an engine's container serves, from the config.json it sees
    through ``/proc/<pid>/root`` (collectors.modelconfig), else the table of model
    architectures; raises
    :class:`ArchitectureUnknown` naming both reasons."""
    config, where = read_container_model_config(model, env, pid, proc_root)
    if config is not None and pid is not None:
        inside = where.removesuffix(" in the container").removesuffix("/config.json")
        quant = read_hf_quant_config(process_root(pid, proc_root) / inside.lstrip("/"))
        return architecture_from_config(config, where, quant)
    try:
        return seeded_architecture(model)
    except ArchitectureUnknown as why:
        raise ArchitectureUnknown(f"{where}; {why}") from None


def architecture_for(model: str | None, config: Mapping[str, Any] | None = None,
                     config_source: str | None = None) -> Architecture:
    """The model's architecture: from its config.json when one was read (through the engine's
    mounts or ``/proc/<pid>/root``, see collectors.modelconfig), else from the table of model
    architectures (:func:`seeded_architecture`)."""
    if config:
        return architecture_from_config(config, config_source or "the model's config.json")
    return seeded_architecture(model)


# --- weights -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WeightsEstimate:
    """Weight bytes, with what the figure rests on and how sure it is."""

    bytes: int | None
    basis: str
    confidence: str


def checkpoint_bytes(model_dir: Path) -> WeightsEstimate:
    """The sum of the ``*.safetensors`` files in ``model_dir`` (symlinks followed, as in a
    Hugging Face cache snapshot). vLLM loads about this much; it may skip parts (a vision tower
    under --language-model-only) or repack them, so it is an estimate. Cost: one listing."""
    try:
        files = sorted(model_dir.glob("*.safetensors"))
        total = sum(path.stat().st_size for path in files)
    except OSError as error:
        return WeightsEstimate(None, f"{model_dir}: {error.strerror or error}",
                               f"unknown — {model_dir} could not be read")
    if not files:
        return WeightsEstimate(None, f"no *.safetensors in {model_dir}",
                               f"unknown — no *.safetensors files in {model_dir}")
    return WeightsEstimate(
        total, f"{len(files)} safetensors files in {model_dir} ({total:,} bytes)", "estimate")


# Bytes per parameter of quantised linear layers: 4-bit values plus one 8-bit scale per block
# (16 values for NVFP4, 32 for MXFP4), 8-bit values for FP8.
_QUANT_BYTES = {"nvfp4": 0.5 + 1 / 16, "mxfp4": 0.5 + 1 / 32, "fp8": 1.0}


def weights_from_architecture(arch: Architecture) -> WeightsEstimate:
    """Weights from the parameter count of the architecture's sizes: embeddings and the output
    head in the model's dtype, each layer's attention and MLP (all experts) in the quantised
    width. Norms, biases and routers are left out. An estimate, for when no checkpoint can be
    listed."""
    missing = [name for name, value in (("hidden_size", arch.hidden_size),
                                        ("num_attention_heads", arch.num_attention_heads),
                                        ("vocab_size", arch.vocab_size)) if value is None]
    width = arch.moe_intermediate_size if arch.num_experts else arch.intermediate_size
    if width is None:
        missing.append("intermediate_size")
    if missing or arch.has_state_layers:
        why = (f"{', '.join(missing)} not known" if missing
               else "Mamba layers' parameters are not modelled")
        return WeightsEstimate(None, why, f"unknown — {why}")
    assert arch.hidden_size and arch.num_attention_heads and arch.vocab_size and width
    hidden = arch.hidden_size
    attention = 0
    for layer in arch.layers:
        if layer.kind in (FULL, SLIDING, SHARED):
            head_dim = layer.head_dim or hidden // arch.num_attention_heads
            q_and_o = 2 * hidden * arch.num_attention_heads * head_dim
            attention += q_and_o + hidden * 2 * layer.num_kv_heads * head_dim
    experts = arch.num_experts or 1
    mlp = len(arch.layers) * experts * 3 * hidden * width
    embeddings = arch.vocab_size * hidden * (1 if arch.tie_word_embeddings else 2)
    dense_bytes = DTYPE_BYTES.get(arch.dtype or "bfloat16", 2)
    quant = arch.quant_algo or arch.quant_method or ""
    per_param = _QUANT_BYTES.get(quant, float(dense_bytes))
    # gpt-oss's MXFP4 checkpoints quantise the experts only; others their linear layers.
    attention_width = dense_bytes if quant == "mxfp4" else per_param
    total = math.ceil(embeddings * dense_bytes + attention * attention_width + mlp * per_param)
    how = (f"{quant} {'experts' if quant == 'mxfp4' else 'layers'} at {per_param:g} bytes per "
           f"parameter" if quant in _QUANT_BYTES
           else f"{dense_bytes} bytes per parameter ({arch.dtype or 'bfloat16'})")
    return WeightsEstimate(
        total,
        f"parameter count from the architecture ({arch.source}): "
        f"{(embeddings + attention + mlp) / 1e9:.1f} B parameters, {how}",
        "estimate")
