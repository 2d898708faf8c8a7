"""A model's config.json: read inside its engine's container, and what the node derives from it.

:func:`read_container_model_config` finds the config.json an engine's container serves, through
the container's root (:func:`collectors.procfs.process_root` of the PID the container engine
reports); the collector stores it on the engine, so that pages describe the model from the
database and never look into a host's ``/proc`` themselves.

:func:`activation_bytes_per_token` estimates a model's transient prefill activation per batched
token. vLLM's prefill holds activations for a whole batch of ``--max-num-batched-tokens``
tokens at once. Per token that is roughly the residual stream and attention projections (a few
``hidden_size`` vectors) plus the MLP's intermediate activations (for a mixture of experts,
those of the experts each token is routed to), in the activation dtype. This is an *estimate*:
SparkOps raises it to what it actually observes while the engine prefills (collectors.ledger).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from collectors.procfs import process_root
from sparkops.units import MIB

# Bytes per activation value: bf16/fp16 activations, also for FP4/FP8 weights.
ACTIVATION_DTYPE_BYTES = 2
# Live hidden-size vectors per token during a layer's forward pass (residual, normed input,
# attention output and QKV projection), a conservative count.
HIDDEN_VECTORS = 4
# The MLP holds gate and up projections of the intermediate size at once.
INTERMEDIATE_VECTORS = 2
# Where vLLM's image keeps Hugging Face downloads when neither HF_HUB_CACHE nor HF_HOME is set.
HF_CACHE_DIRS = ("/root/.cache/huggingface/hub",)
# A config.json is a few KiB; anything far larger is not one and is not read (it is stored).
MAX_CONFIG_BYTES = MIB


def read_model_config(model_dir: Path) -> dict[str, Any] | None:
    """The model's config.json as a dict, or None when absent, unreadable or over
    :data:`MAX_CONFIG_BYTES`."""
    return read_small_json(model_dir / "config.json")


def read_small_json(path: Path) -> dict[str, Any] | None:
    """A model directory's small JSON file (config.json, hf_quant_config.json, ...) as a dict,
    or None when absent, unreadable, not an object or over :data:`MAX_CONFIG_BYTES`."""
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            return None
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_container_model_config(model: str | None, env: dict[str, str], pid: int | None,
                                proc_root: Path) -> tuple[dict[str, Any] | None, str]:
    """The model's config.json as the container of process ``pid`` sees it, and where it was
    found (or why not).

    Local model directories are read at their path inside the container; Hugging Face repo ids
    in the container's hub cache (``HF_HUB_CACHE``, ``HF_HOME``/hub, the default), newest
    snapshot first. Cost: a directory listing per hub and one small file read.
    """
    if not model:
        return None, "the launch command names no model"
    if pid is None:
        return None, ("no process of the container is visible (it is not running, or the "
                      "container engine reports no PID)")
    root = process_root(pid, proc_root)
    for directory in _model_dirs(root, model, env):
        config = read_model_config(directory)
        if config is not None:
            return config, f"{'/' + str(directory.relative_to(root))}/config.json in the container"
    return None, f"no readable config.json for {model} inside the container"


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
