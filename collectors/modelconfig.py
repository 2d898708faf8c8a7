"""Estimate a model's transient prefill activation per batched token from its config.json.

vLLM's prefill holds activations for a whole batch of ``--max-num-batched-tokens`` tokens at once.
Per token that is roughly the residual stream and attention projections (a few ``hidden_size``
vectors) plus the MLP's intermediate activations (for a mixture of experts, those of the experts
each token is routed to), in the activation dtype. This is an *estimate*: SparkOps raises it to
what it actually observes while the engine prefills (collectors.ledger).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# Bytes per activation value: bf16/fp16 activations, also for FP4/FP8 weights.
ACTIVATION_DTYPE_BYTES = 2
# Live hidden-size vectors per token during a layer's forward pass (residual, normed input,
# attention output and QKV projection), a conservative count.
HIDDEN_VECTORS = 4
# The MLP holds gate and up projections of the intermediate size at once.
INTERMEDIATE_VECTORS = 2


def read_model_config(model_dir: Path) -> dict[str, Any] | None:
    """The model's config.json as a dict, or None when absent or unreadable."""
    try:
        data = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def activation_bytes_per_token(config: dict[str, Any] | None) -> int | None:
    """Estimated activation bytes per batched token; None when the config lacks the sizes."""
    if not config:
        return None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    hidden = _positive_int(text.get("hidden_size"))
    if hidden is None:
        return None
    expert_width = _positive_int(text.get("moe_intermediate_size"))
    experts_per_token = _positive_int(text.get("num_experts_per_tok"))
    if expert_width and experts_per_token:
        intermediate = expert_width * experts_per_token
    else:
        intermediate = _positive_int(text.get("intermediate_size")) or 4 * hidden
    values = HIDDEN_VECTORS * hidden + INTERMEDIATE_VECTORS * intermediate
    return values * ACTIVATION_DTYPE_BYTES


def _positive_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
