"""How big a vLLM engine's KV pool will be, whether it will start at all, and what else it takes.

Two ways a pool is sized (vllm/v1/worker/gpu_worker.py determine_available_memory):

* **pinned** by ``--kv-cache-memory-bytes``: exactly that many bytes (less the frontend's
  multimodal reservation, ``--mm-ipc-gpu-memory-gb``, from 0.25);
* **profiled** by ``--gpu-memory-utilization`` (0.9 before 0.20, 0.92 since): the engine may use
  ``utilization x total`` and keeps for the KV cache what its start-up did not take::

      pool = utilization x total - (weights + activation peak + non-torch memory)
             - CUDA graph estimate (taken out by default from 0.20; measured only in 0.18-0.19)

  vLLM measures everything but the weights as the fall of free memory from its boot snapshot
  (non_torch_increase, or total_consumed from 0.27), so memory another process hands back
  during the start is credited to the pool and memory it takes is charged to it. The pool
  therefore depends on free memory at boot, not only on the utilization: an engine booted while
  memory was still being released gets a bigger pool than the same flags on a settled node.

Either way the engine first checks ``free at boot >= utilization x total`` (vllm/v1/worker/
utils.py request_memory; gpu_worker.py init_device before 0.14) and refuses to start otherwise,
also when the pool is pinned. On a GB10 "free at boot" is the host's MemAvailable from 0.20
(psutil, vllm/utils/mem_utils.py) but cudaMemGetInfo's free before, which counts the page cache
as used: dropping the page cache before a start is what lets an older engine start.

:func:`predict` puts it together for one engine: the pool, its KV plan
(collectors.vllm.kvplan), the weights and the transient prefill need, each with what it rests on
(``basis``) and how sure it is (``confidence``: "exact", "estimate" or "unknown — why").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from collectors.meminfo import MemInfo
from collectors.modelarch import (
    Architecture,
    ArchitectureUnknown,
    WeightsEstimate,
    checkpoint_bytes,
    weights_from_architecture,
)
from collectors.modelconfig import activation_bytes_per_token
from collectors.vllm.flags import EngineConfig
from collectors.vllm.kvplan import (
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    ESTIMATE,
    EXACT,
    EngineSettings,
    KvPlan,
    Rules,
    Unmodelled,
    check_flags,
    plan_kv,
    rules_for,
    settings_from_config,
    unknown_plan,
)

GIB = 1024**3


def _gib(value: float) -> str:
    return f"{value / GIB:.2f} GiB"


@dataclass(frozen=True)
class BootMemory:
    """The device's memory as the engine's boot snapshot sees it.

    ``total_bytes`` is what CUDA reports as total (a GB10's MemTotal); ``free_at_boot_bytes``
    what vLLM reads as free then (:func:`free_at_boot_from_meminfo` picks the right figure for
    the release); ``free_settled_bytes`` the free memory the node settles at during the start
    without this engine, when something was still releasing (or taking) memory at boot. None
    means a quiet node (the same as at boot).
    """

    total_bytes: int
    free_at_boot_bytes: int | None = None
    free_settled_bytes: int | None = None


@dataclass(frozen=True)
class Usage:
    """What the engine takes at start-up outside its KV pool; None: not known."""

    weights_bytes: int | None = None
    activation_peak_bytes: int | None = None
    non_torch_bytes: int | None = None
    cudagraph_bytes: int | None = None
    basis: str = ""


@dataclass(frozen=True)
class Estimate:
    bytes: int | None
    basis: str
    confidence: str


@dataclass(frozen=True)
class PoolPlan:
    """The KV pool vLLM will allocate: ``bytes`` None when unknown or when it refuses."""

    mode: str  # "pinned" or "profiled"
    bytes: int | None
    utilization: float
    requested_bytes: int
    refusal: str | None
    basis: str
    confidence: str


def free_at_boot_from_meminfo(meminfo: MemInfo, version: str | None) -> Estimate:
    """The free memory a vLLM release's boot snapshot reads on a GB10 (unified memory):
    MemAvailable from 0.20, MemFree (what cudaMemGetInfo follows there) before."""
    try:
        rules = rules_for(version).rules
    except Unmodelled as why:
        return Estimate(None, str(why), f"unknown — {why}")
    name = "MemAvailable" if rules.uma_free_is_available else "MemFree"
    value = meminfo.get(name)
    if value is None:
        why = meminfo.unknown.get(name, "not reported")
        return Estimate(None, f"{name}: {why}", f"unknown — {name} is not known ({why})")
    how = ("psutil's available memory on a unified-memory GPU" if rules.uma_free_is_available
           else "cudaMemGetInfo, which counts the page cache as used on a GB10")
    return Estimate(value, f"{name} {_gib(value)} (vLLM {version} reads {how})", EXACT)


def utilization_of(settings: EngineSettings, rules: Rules) -> tuple[float, str]:
    if settings.gpu_memory_utilization is not None:
        return settings.gpu_memory_utilization, (
            f"--gpu-memory-utilization {settings.gpu_memory_utilization:g}")
    return rules.default_utilization, (
        f"--gpu-memory-utilization {rules.default_utilization:g} (vLLM {rules.version}'s "
        "default)")


def _request(total_bytes: int, utilization: float, rules: Rules) -> float:
    """``utilization x total`` as vLLM compares it with free memory: rounded up from 0.14,
    the product itself before."""
    product = total_bytes * utilization
    return math.ceil(product) if rules.requested_rounded_up else product


def requested_bytes(total_bytes: int, utilization: float, rules: Rules) -> int:
    """The bytes a profiled engine may use in all (the pool is what its start-up leaves)."""
    return int(_request(total_bytes, utilization, rules))


def startup_refusal(memory: BootMemory, utilization: float, rules: Rules) -> str | None:
    """vLLM's refusal when free memory at boot is below ``utilization x total``, or None."""
    if memory.free_at_boot_bytes is None:
        return None
    requested = _request(memory.total_bytes, utilization, rules)
    if memory.free_at_boot_bytes >= requested:
        return None
    return (f"free memory at boot ({_gib(memory.free_at_boot_bytes)} of "
            f"{_gib(memory.total_bytes)}) is less than --gpu-memory-utilization {utilization:g} "
            f"x total ({_gib(requested)}): vLLM {rules.version} refuses to start (\"Free memory "
            "on device ... is less than desired GPU memory utilization\")")


def plan_pool(settings: EngineSettings, version: str | None, memory: BootMemory,
              usage: Usage | None = None, env: Mapping[str, str] | None = None) -> PoolPlan:
    """The pool an engine of ``version`` launched with ``settings`` will allocate. Raises
    collectors.vllm.kvplan.FlagRejected for flags the release refuses."""
    usage = usage or Usage()
    env = env or {}
    try:
        chosen = rules_for(version)
    except Unmodelled as why:
        return PoolPlan("pinned" if settings.kv_cache_memory_bytes else "profiled", None, 0.0,
                        0, None, f"not predicted: {why}", f"unknown — {why}")
    assert version is not None
    check_flags(settings, version)
    rules = chosen.rules
    utilization, util_basis = utilization_of(settings, rules)
    requested = requested_bytes(memory.total_bytes, utilization, rules)
    refusal = startup_refusal(memory, utilization, rules)
    boot = (f"free at boot {_gib(memory.free_at_boot_bytes)} >= {_gib(requested)}"
            if memory.free_at_boot_bytes is not None and refusal is None
            else "free memory at boot not known: the start-up check is not evaluated"
            if memory.free_at_boot_bytes is None else "")
    reservation, reservation_basis = _mm_reservation(settings, rules)
    pool: int | None
    if settings.kv_cache_memory_bytes is not None:
        mode = "pinned"
        basis = [chosen.basis, f"--kv-cache-memory-bytes {settings.kv_cache_memory_bytes:,} "
                 "(pinned: exactly this many bytes)", util_basis + " for the start-up check"]
        pool, confidence = settings.kv_cache_memory_bytes, chosen.confidence
    else:
        mode = "profiled"
        pool, basis, confidence = _profiled(requested, memory, usage, settings, rules, env)
        basis = [chosen.basis, util_basis, *basis]
    if reservation_basis:
        basis.append(reservation_basis)
        pool = None if pool is None else pool - reservation
    if boot:
        basis.append(boot)
    if refusal:
        return PoolPlan(mode, None, utilization, requested, refusal,
                        "; ".join([*basis, refusal]),
                        f"unknown — the engine would not start: {refusal}")
    if pool is not None and pool <= 0:
        why = (f"nothing is left for the KV cache ({_gib(pool)}): vLLM refuses to start "
               "(\"No available memory for the cache blocks\")")
        return PoolPlan(mode, None, utilization, requested, why, "; ".join([*basis, why]),
                        f"unknown — the engine would not start: {why}")
    return PoolPlan(mode, pool, utilization, requested, None, "; ".join(basis), confidence)


def _mm_reservation(settings: EngineSettings, rules: Rules) -> tuple[int, str]:
    gb = settings.mm_ipc_gpu_memory_gb
    if not gb or not rules.mm_ipc_reservation:
        return 0, ""
    reserved = int(gb * GIB)
    return reserved, (f"less --mm-ipc-gpu-memory-gb {gb:g} ({_gib(reserved)}) for the "
                      "frontend's multimodal decoding")


def _profiled(requested: int, memory: BootMemory, usage: Usage, settings: EngineSettings,
              rules: Rules, env: Mapping[str, str]) -> tuple[int | None, list[str], str]:
    basis = [f"requested {_gib(requested)} of {_gib(memory.total_bytes)} total"]
    if usage.weights_bytes is None:
        return None, [*basis, "the weights are not known"], \
            "unknown — a profiled pool needs the weights' size"
    taken = usage.weights_bytes
    parts = [f"weights {_gib(usage.weights_bytes)}"]
    assumed = []
    for name, value in (("activation peak", usage.activation_peak_bytes),
                        ("non-torch memory", usage.non_torch_bytes)):
        if value is None:
            assumed.append(name)
        else:
            taken += value
            parts.append(f"{name} {_gib(value)}")
    graphs = _cudagraph_applies(settings, rules, env)
    if graphs:
        if usage.cudagraph_bytes is None:
            assumed.append("the CUDA graph estimate")
        else:
            taken += usage.cudagraph_bytes
            parts.append(f"CUDA graph estimate {_gib(usage.cudagraph_bytes)}")
    basis.append("less " + ", ".join(parts))
    if usage.basis:
        basis.append(usage.basis)
    if assumed:
        basis.append(f"{' and '.join(assumed)} not known, counted as 0: the real pool is "
                     "smaller by them")
    released = 0
    if memory.free_settled_bytes is not None and memory.free_at_boot_bytes is not None:
        released = memory.free_settled_bytes - memory.free_at_boot_bytes
        if released:
            what = "handed back" if released > 0 else "taken"
            basis.append(f"{_gib(abs(released))} {what} by others during the start "
                         f"(free {_gib(memory.free_at_boot_bytes)} at boot, settling at "
                         f"{_gib(memory.free_settled_bytes)}), "
                         f"{'credited to' if released > 0 else 'charged to'} the pool")
    return requested - taken + released, basis, ESTIMATE


def _cudagraph_applies(settings: EngineSettings, rules: Rules, env: Mapping[str, str]) -> bool:
    if settings.enforce_eager or rules.cudagraph_estimate == "none":
        return False
    flag = env.get("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS")
    if flag is not None:
        return flag.strip().lower() in ("1", "true")
    return rules.cudagraph_estimate == "subtracted"


def prefill_need(settings: EngineSettings, arch: Architecture | None) -> Estimate:
    """The transient activation buffer of one prefill batch: ``--max-num-batched-tokens`` x
    activation bytes per token (collectors.modelconfig's estimate from the model's sizes)."""
    tokens = settings.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS
    per_token = activation_bytes_per_token(arch.config_fields()) if arch else None
    if per_token is None:
        why = "the model's hidden sizes are not known"
        return Estimate(None, why, f"unknown — {why}")
    need = tokens * per_token
    default = "" if settings.max_num_batched_tokens else " (vLLM's default on a GB10)"
    return Estimate(need, f"{tokens:,} batched tokens{default} x {per_token:,} activation bytes "
                    "per token (residual stream and MLP activations in 16 bits)", ESTIMATE)


# --- one engine ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class EnginePrediction:
    """What an engine will reserve, each figure with its basis and confidence."""

    kind: str
    version: str | None
    pool: PoolPlan | None
    kv: KvPlan
    weights: Estimate
    prefill: Estimate
    architecture: str  # where the architecture came from, or why it is unknown


def predict(kind: str, version: str | None, config: EngineConfig | EngineSettings,
            architecture: Architecture | ArchitectureUnknown, memory: BootMemory,
            usage: Usage | None = None, model_dir: Path | None = None,
            env: Mapping[str, str] | None = None) -> EnginePrediction:
    """Predict one engine's reservation. ``architecture`` is what
    collectors.modelarch.architecture_for gave, or the ArchitectureUnknown it raised; the
    weights come from ``usage``, else the checkpoint in ``model_dir``, else the architecture's
    parameter count. Raises collectors.vllm.kvplan.FlagRejected for flags the release
    refuses."""
    if kind != "vllm":
        why = f"only vLLM's KV arithmetic is modelled, not {kind}'s"
        return EnginePrediction(kind, version, None, unknown_plan(version, why),
                                Estimate(None, why, f"unknown — {why}"),
                                Estimate(None, why, f"unknown — {why}"), why)
    settings = config if isinstance(config, EngineSettings) else settings_from_config(config)
    usage = usage or Usage()
    arch = architecture if isinstance(architecture, Architecture) else None
    weights = _weights(usage, arch, model_dir)
    prefill = prefill_need(settings, arch)
    filled = Usage(
        weights_bytes=usage.weights_bytes if usage.weights_bytes is not None else weights.bytes,
        activation_peak_bytes=usage.activation_peak_bytes
        if usage.activation_peak_bytes is not None else prefill.bytes,
        non_torch_bytes=usage.non_torch_bytes, cudagraph_bytes=usage.cudagraph_bytes,
        basis="; ".join(part for part in (
            usage.basis,
            "" if usage.weights_bytes is not None or weights.bytes is None
            else f"weights: {weights.basis}",
            "" if usage.activation_peak_bytes is not None or prefill.bytes is None
            else f"activation peak: the prefill estimate ({prefill.basis})") if part))
    pool = plan_pool(settings, version, memory, filled, env)
    if arch is None:
        why = str(architecture)
        kv = unknown_plan(version, f"the architecture is not known: {why}", pool.bytes)
        return EnginePrediction(kind, version, pool, kv, weights, prefill, why)
    if pool.refusal:
        kv = unknown_plan(version, f"the engine would not start: {pool.refusal}")
    else:
        kv = plan_kv(arch, settings, version, pool.bytes, env)
        if pool.confidence != EXACT and kv.confidence == EXACT:
            kv = _downgraded(kv, pool)
    return EnginePrediction(kind, version, pool, kv, weights, prefill, arch.source)


def _weights(usage: Usage, arch: Architecture | None, model_dir: Path | None) -> Estimate:
    if usage.weights_bytes is not None:
        return Estimate(usage.weights_bytes, usage.basis or "given", ESTIMATE)
    found: WeightsEstimate | None = checkpoint_bytes(model_dir) if model_dir else None
    if (found is None or found.bytes is None) and arch is not None:
        found = weights_from_architecture(arch)
    if found is None:
        why = "no checkpoint to list and no architecture to count"
        return Estimate(None, why, f"unknown — {why}")
    return Estimate(found.bytes, found.basis, found.confidence)


def _downgraded(kv: KvPlan, pool: PoolPlan) -> KvPlan:
    return replace(kv, confidence=pool.confidence,
                   basis=f"{kv.basis}; the pool itself is {pool.confidence}")

