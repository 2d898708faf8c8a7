"""What a vLLM engine's KV pool holds: blocks, the tokens vLLM reports, concurrency per length.

From the pool's bytes, the model's attention layers (collectors.modelarch) and the launch flags,
this reproduces vLLM's own arithmetic (vllm/v1/kv_cache_interface.py and
vllm/v1/core/kv_cache_utils.py, split into kv_cache_planning.py in 0.33) for the release the
engine runs:

1. One :class:`LayerSpec` per attention layer: ``2 (K and V) x block_size x KV heads per rank
   x head size x bytes per value`` bytes per page (NVFP4 packs two values a byte plus a scale
   byte per 16; the per-token-head modes add a float32 scale per token and head).
2. The hybrid KV cache manager (on unless ``--disable-hybrid-kv-cache-manager``): pages are
   unified to the largest (smaller ones get a proportionally larger block size), layers of one
   kind are split into groups of the smallest kind's layer count (padding the rest), and one
   block pool is shared: ``blocks = pool // page // group size``. With the manager off, sliding
   layers are cached as full attention and every layer takes one block per block of context.
3. A request of ``L`` tokens takes ``cdiv(L, block)`` blocks in a full-attention group and
   ``cdiv(min(window - 1 + in-flight tokens, L), block) + 1`` in a sliding group; concurrency
   is ``blocks / blocks per request`` summed over groups.
4. The token count vLLM prints ("GPU KV cache size: N tokens") is ``concurrency x
   max_model_len`` from 0.20.1 on, ``blocks // groups x smallest block`` before: a derived
   figure, not the number of token slots stored.

Which rule a release follows is one table, :data:`RULE_CHANGES`, each entry naming the release
and file it was read from. Releases before 0.9.2 (the V1 engine's first hybrid manager) and
layouts the planner does not model (Mamba state, latent attention, speculative drafters,
pipeline or context parallelism) give "unknown" with the reason, never a number.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from collectors.modelarch import FULL, SLIDING, Architecture
from collectors.vllm.flag_history import REMOVED
from collectors.vllm.flags import EngineConfig, parse_human_int

EXACT = "exact"
ESTIMATE = "estimate"

OLDEST_MODELLED = "0.9.2"
NEWEST_READ = "0.33.0"
# Releases whose source these rules were read from: each minor's newest patch and the patch
# releases on either side of a rule change (0.15, published as a wheel only, was not read;
# 0.14.1 and 0.16.0 agree on every rule here).
RELEASES_READ = (
    "0.9.2", "0.10.0", "0.10.1", "0.10.2", "0.11.0", "0.11.1", "0.11.2", "0.12.0", "0.13.0",
    "0.14.0", "0.14.1", "0.16.0", "0.17.0", "0.17.1", "0.18.0", "0.18.1", "0.19.0", "0.19.1",
    "0.20.0", "0.20.1", "0.20.2", "0.21.0", "0.22.0", "0.22.1", "0.23.0", "0.24.0", "0.25.0",
    "0.25.1", "0.26.0", "0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0",
    "0.33.0",
)

# `vllm serve` on a GPU of 70 GiB or more that is not an A100 (a GB10's ~120 GiB):
# max_num_batched_tokens 8192 (vllm/engine/arg_utils.py get_batch_defaults, 0.8.5-0.33.0).
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
DEFAULT_BLOCK_SIZE = 16  # vllm/config/cache.py, every release read


class FlagRejected(ValueError):
    """A flag or value this vLLM release refuses; ``str(error)`` is one line naming it."""


class Unmodelled(ValueError):
    """Something the planner cannot predict; ``str(error)`` is the one-line reason."""


class WouldRefuse(Unmodelled):
    """vLLM would refuse to start the engine; ``str(error)`` says why, in its terms."""


# --- releases and their rules --------------------------------------------------------------------


def release(version: str | None) -> tuple[int, int, int] | None:
    """``(0, 20, 1)`` for "0.20.1", "v0.20.1+cu130" or "0.20.1rc2"; None when not a version."""
    match = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", (version or "").strip())
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def is_prerelease(version: str) -> bool:
    return bool(re.search(r"(rc|dev|a|b)\d*", version.split("+")[0].split(".", 2)[-1]))


@dataclass(frozen=True)
class Rules:
    """The KV arithmetic of one vLLM release (see :data:`RULE_CHANGES` for when each changed)."""

    version: str
    # Layers count as the same kind of cache when kind, window, block and page size agree
    # (the spec's type_id); later, only when every field of the spec agrees.
    identity_by_page: bool = True
    # Hybrid layers whose pages differ in size are unified by growing the smaller pages' block
    # size; before, vLLM refuses such models (NotImplementedError).
    unify_page_sizes: bool = False
    # With the hybrid manager off, full-attention layers of different sizes share one group.
    uniform_type_groups: bool = False
    # A group holds the smallest kind's layer count, or the largest when largest < slack x
    # smallest (slack 1.0: always the smallest).
    group_size_slack: float = 1.0
    # The printed token count is int(concurrency x max_model_len) instead of
    # blocks // groups x smallest block size.
    tokens_from_concurrency: bool = False
    # Sliding layers are charged for every in-flight batch (2 with async scheduling) instead of
    # one max_num_batched_tokens.
    sliding_in_flight: bool = False
    # The "one request must fit" check: "layers" (each layer's own need), "first group" (the
    # padded groups, counting the first group's blocks only), "groups" (every group's), and
    # from 0.29 it spares the null block.
    fit_check: str = "layers"
    fit_check_spares_null_block: bool = False
    # --kv-cache-dtype auto takes a ModelOpt checkpoint's kv_cache_quant_algo.
    kv_dtype_from_checkpoint: bool = False
    # A compressed-tensors checkpoint's kv_cache_scheme makes the cache fp8: "unknown" (not
    # read before 0.16), "forced" (whatever the flag says), "auto" (only when the flag is auto).
    kv_scheme_fp8: str = "unknown"
    # Async scheduling is on unless turned off (the in-flight rule above makes it matter).
    async_by_default: bool = False
    # Default --gpu-memory-utilization.
    default_utilization: float = 0.9
    # Free memory at boot on a unified-memory GPU is the host's MemAvailable (psutil) instead
    # of cudaMemGetInfo's free, which counts page cache as used.
    uma_free_is_available: bool = False
    # --gpu-memory-utilization x total is rounded up (math.ceil) before the refusal check.
    requested_rounded_up: bool = False
    # The CUDA graph memory estimate is taken out of a profiled pool: "measured" (estimated
    # but only subtracted with VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1), "subtracted"
    # (the default), or "none" (not estimated).
    cudagraph_estimate: str = "none"
    # --mm-ipc-gpu-memory-gb is carved out of the pool, pinned or profiled.
    mm_ipc_reservation: bool = False
    # NVFP4 pages of sliding-window layers are packed (before, only full attention's).
    nvfp4_sliding: bool = False
    # With the hybrid manager off, sliding layers turned full keep their KV quantisation mode
    # (0.20 rebuilt them without it: per-token-head scales dropped from their pages).
    hybrid_off_keeps_kv_mode: bool = False
    # A hybrid page that does not divide the largest: "never" padded (NotImplementedError),
    # "by backend" (padded when the attention backend indexes pages by block stride),
    # "always" (every non-MLA attention layer).
    pad_pages: str = "never"
    # Packed KV layouts (NVFP4, per-token-head scales) are published by the attention backend
    # instead of computed by the cache spec; the same sizes.
    kv_layout_from_backend: bool = False


@dataclass(frozen=True)
class RuleChange:
    since: str
    rule: str
    value: Any
    where: str


RULE_CHANGES: tuple[RuleChange, ...] = (
    RuleChange("0.10.1", "identity_by_page", False,
               "0.10.1 vllm/v1/kv_cache_interface.py: KVCacheSpec.type_id gone, layers grouped "
               "by the spec itself (kv_cache_utils.py same_type_layers[layer_spec])"),
    RuleChange("0.11.0", "uniform_type_groups", True,
               "0.11.0 vllm/v1/kv_cache_interface.py UniformTypeKVCacheSpecs (0.10.2 raises "
               "'failed to convert the KV cache specs to one unified type')"),
    RuleChange("0.12.0", "unify_page_sizes", True,
               "0.12.0 vllm/v1/core/kv_cache_utils.py unify_kv_cache_spec_page_size "
               "(0.11.2 raises NotImplementedError for hybrid layers of unequal pages)"),
    RuleChange("0.12.0", "group_size_slack", 1.25,
               "0.12.0 kv_cache_utils.py _get_kv_cache_groups_uniform_page_size: "
               "max_num_layers < min_num_layers * 1.25"),
    RuleChange("0.14.0", "fit_check", "first group",
               "0.14.0 kv_cache_utils.py _max_memory_usage_bytes_from_groups: "
               "blocks_needed of kv_cache_groups[0] only"),
    RuleChange("0.14.0", "kv_dtype_from_checkpoint", True,
               "0.14.0 vllm/utils/torch_utils.py resolve_kv_cache_dtype_string"),
    RuleChange("0.14.0", "async_by_default", True,
               "0.14.0 vllm/config/scheduler.py async_scheduling default None, which "
               "vllm/config/vllm.py turns on unless an incompatible option is set"),
    RuleChange("0.14.0", "requested_rounded_up", True,
               "0.14.0 vllm/v1/worker/utils.py request_memory: math.ceil(total * utilization)"),
    RuleChange("0.16.0", "kv_scheme_fp8", "forced",
               "0.16.0 vllm/model_executor/layers/attention/attention.py: 'llm-compressor mdls "
               "need to set cache_dtype to \"fp8\" manually'"),
    RuleChange("0.18.0", "group_size_slack", 1.5,
               "0.18.0 kv_cache_utils.py: max_num_layers < min_num_layers * 1.5"),
    RuleChange("0.18.0", "cudagraph_estimate", "measured",
               "0.18.0 vllm/v1/worker/gpu_worker.py determine_available_memory: "
               "profile_cudagraph_memory, applied only with "
               "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 (vllm/envs.py default '0')"),
    RuleChange("0.19.0", "fit_check", "groups",
               "0.19.0 kv_cache_utils.py _max_memory_usage_bytes_from_groups: blocks_needed "
               "summed over the groups"),
    RuleChange("0.20.0", "cudagraph_estimate", "subtracted",
               "0.20.0 vllm/envs.py VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS default '1'"),
    RuleChange("0.20.0", "default_utilization", 0.92,
               "0.20.0 vllm/config/cache.py gpu_memory_utilization default 0.92 (0.9 before)"),
    RuleChange("0.20.0", "uma_free_is_available", True,
               "0.20.0 vllm/utils/mem_utils.py MemorySnapshot.measure: on an integrated GPU "
               "free memory is psutil.virtual_memory().available"),
    RuleChange("0.20.1", "tokens_from_concurrency", True,
               "0.20.1 kv_cache_utils.py _report_kv_cache_config: "
               "num_tokens = int(max_concurrency * max_model_len)"),
    RuleChange("0.21.0", "nvfp4_sliding", True,
               "0.21.0 kv_cache_interface.py SlidingWindowSpec.real_page_size_bytes: "
               "'Mirror FullAttentionSpec.real_page_size_bytes for NVFP4 KV cache'"),
    RuleChange("0.21.0", "hybrid_off_keeps_kv_mode", True,
               "0.21.0 kv_cache_utils.py unify_hybrid_kv_cache_specs passes kv_quant_mode"),
    RuleChange("0.22.0", "kv_scheme_fp8", "auto",
               "0.22.0 attention.py: kv_cache_scheme is not None and kv_cache_dtype == 'auto'"),
    RuleChange("0.25.0", "mm_ipc_reservation", True,
               "0.25.0 gpu_worker.py _reserve_mm_ipc_gpu_memory"),
    RuleChange("0.26.0", "sliding_in_flight", True,
               "0.26.0 kv_cache_interface.py SlidingWindowSpec.max_admission_blocks_per_request"
               "(max_in_flight_tokens); vllm/config/vllm.py max_concurrent_batches"),
    RuleChange("0.26.0", "pad_pages", "by backend",
               "0.26.0 kv_cache_utils.py unify_kv_cache_spec_page_size: page_size_padded when "
               "indexes_kv_by_block_stride"),
    RuleChange("0.28.0", "kv_layout_from_backend", True,
               "0.28.0 kv_cache_interface.py AttentionSpec.state_content_bytes, set by "
               "vllm/v1/attention/backends/flashinfer.py / triton_attn.py customize_spec"),
    RuleChange("0.29.0", "pad_pages", "always",
               "0.29.0 kv_cache_utils.py unify_kv_cache_spec_page_size: any non-MLA "
               "AttentionSpec is padded to the largest page"),
    RuleChange("0.29.0", "fit_check_spares_null_block", True,
               "0.29.0 kv_cache_utils.py get_kv_cache_configs: 'Reserve the null block'"),
)

_RULE_FIELDS = {item.name for item in fields(Rules)} - {"version"}
assert all(change.rule in _RULE_FIELDS for change in RULE_CHANGES)


@dataclass(frozen=True)
class VersionRules:
    """The rules for an engine's version, and how sure the choice is."""

    rules: Rules
    basis: str
    confidence: str


def rules_for(version: str | None) -> VersionRules:
    """The rules of ``version``; raises :class:`Unmodelled` for a version that is not known
    or older than :data:`OLDEST_MODELLED`. A release newer than :data:`NEWEST_READ`, or a
    pre-release, gets the nearest rules read, as an estimate."""
    number = release(version)
    if number is None:
        raise Unmodelled(
            "the engine's vLLM version is not known (no version line in its log yet); vLLM's "
            "KV arithmetic changed in 0.12, 0.18, 0.20.1 and 0.26")
    assert version is not None
    if number < release(OLDEST_MODELLED):  # type: ignore[operator]
        raise Unmodelled(f"vLLM {version} is older than {OLDEST_MODELLED}, the first release "
                         "whose KV arithmetic is modelled")
    values: dict[str, Any] = {}
    for change in RULE_CHANGES:
        if number >= release(change.since):  # type: ignore[operator]
            values[change.rule] = change.value
    rules = Rules(version=version, **values)
    if number > release(NEWEST_READ):  # type: ignore[operator]
        return VersionRules(rules, f"the rules of vLLM {NEWEST_READ}, the newest release read; "
                            f"{version} may differ", ESTIMATE)
    if is_prerelease(version):
        return VersionRules(rules, f"the rules of the {'.'.join(map(str, number))} release; "
                            f"the pre-release {version} may predate some", ESTIMATE)
    return VersionRules(rules, f"vLLM {version}'s rules", EXACT)


# --- what the launch flags say -------------------------------------------------------------------

# Flags the planner reads that older releases do not declare (vllm/engine/arg_utils.py of the
# releases read): an engine given one of them on an older release refuses to start.
FLAG_FIRST_RELEASE = {
    "kv-cache-memory-bytes": "0.10.2",
    "async-scheduling": "0.10.0",
    "disable-hybrid-kv-cache-manager": "0.9.2",
    "mm-ipc-gpu-memory-gb": "0.25.0",
}

# --kv-cache-dtype choices (vllm/config/cache.py CacheDType) and the bytes per value of the
# ones modelled; None: the model's dtype.
KV_DTYPE_BYTES: dict[str, int | None] = {
    "auto": None, "bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1,
}
# Packed layouts the planner sizes (the other choices above are not modelled).
PACKED_KV_DTYPES = ("nvfp4", "fp8_per_token_head", "int8_per_token_head")
KV_DTYPE_FIRST_RELEASE = {
    "auto": OLDEST_MODELLED, "fp8": OLDEST_MODELLED, "fp8_e4m3": OLDEST_MODELLED,
    "fp8_e5m2": OLDEST_MODELLED,
    "fp8_inc": "0.10.0", "bfloat16": "0.11.0", "fp8_ds_mla": "0.11.1", "float16": "0.18.0",
    "turboquant_k8v4": "0.20.0", "turboquant_4bit_nc": "0.20.0", "turboquant_k3v4_nc": "0.20.0",
    "turboquant_3bit_nc": "0.20.0", "int8_per_token_head": "0.20.0",
    "fp8_per_token_head": "0.20.0", "nvfp4": "0.20.0", "int4_per_token_head": "0.25.0",
    "nvfp4_4over6": "0.28.0", "nvfp4_ds_mla": "0.30.0", "ultraquant_4bit": "0.32.0",
    "octave_k3v4": "0.33.0", "octave_k3v3": "0.33.0", "octave_k3v3_compact": "0.33.0",
}


@dataclass(frozen=True)
class EngineSettings:
    """The launch settings the KV arithmetic reads (``None``: not given, the release's default
    applies). Built from a parsed command by :func:`settings_from_config`."""

    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    max_model_len_auto: bool = False
    max_num_batched_tokens: int | None = None
    kv_cache_dtype: str | None = None
    block_size: int | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    context_parallel: bool = False
    async_scheduling: bool | None = None
    disable_hybrid_kv_cache_manager: bool | None = None
    disable_sliding_window: bool = False
    num_gpu_blocks_override: int | None = None
    enforce_eager: bool = False
    speculative: bool = False
    kv_transfer: bool = False
    mm_ipc_gpu_memory_gb: float | None = None
    flags: tuple[str, ...] = field(default=())


def settings_from_config(config: EngineConfig) -> EngineSettings:
    """The settings of a parsed vLLM command (collectors.vllm.flags). Raises
    :class:`FlagRejected` for a value vLLM would refuse."""
    flags = config.all_flags

    def count(name: str) -> int | None:
        raw = flags.get(name)
        if raw is None or isinstance(raw, bool):
            return None
        try:
            value = parse_human_int(str(raw if not isinstance(raw, tuple) else raw[-1]))
        except ValueError as error:
            raise FlagRejected(f"--{name}: {error}") from None
        if value <= 0:
            raise FlagRejected(f"--{name}: {raw!r} must be greater than 0")
        return value

    def switch(name: str) -> bool | None:
        raw = flags.get(name)
        return raw if isinstance(raw, bool) else None

    mm_ipc = flags.get("mm-ipc-gpu-memory-gb")
    try:
        mm_ipc_gb = float(mm_ipc) if isinstance(mm_ipc, str) else None
    except ValueError:
        raise FlagRejected(f"--mm-ipc-gpu-memory-gb: {mm_ipc!r} is not a number") from None
    return EngineSettings(
        kv_cache_memory_bytes=config.kv_cache_memory_bytes,
        gpu_memory_utilization=config.gpu_memory_utilization,
        max_model_len=config.max_model_len,
        max_model_len_auto=config.max_model_len_auto,
        max_num_batched_tokens=config.max_num_batched_tokens,
        kv_cache_dtype=config.kv_cache_dtype,
        block_size=config.block_size,
        tensor_parallel_size=count("tensor-parallel-size") or 1,
        pipeline_parallel_size=count("pipeline-parallel-size") or 1,
        context_parallel=(count("decode-context-parallel-size") or 1) > 1
        or (count("prefill-context-parallel-size") or 1) > 1,
        async_scheduling=switch("async-scheduling"),
        disable_hybrid_kv_cache_manager=switch("disable-hybrid-kv-cache-manager"),
        disable_sliding_window=bool(switch("disable-sliding-window")),
        num_gpu_blocks_override=count("num-gpu-blocks-override"),
        enforce_eager=config.enforce_eager,
        speculative=config.speculative_config is not None,
        kv_transfer="kv-transfer-config" in flags,
        mm_ipc_gpu_memory_gb=mm_ipc_gb,
        flags=tuple(flags),
    )


def check_flags(settings: EngineSettings, version: str) -> None:
    """Raise :class:`FlagRejected` for a flag or value this release refuses at launch."""
    number = release(version)
    if number is None:
        return
    for name in settings.flags:
        first = FLAG_FIRST_RELEASE.get(name)
        if first is not None and number < release(first):  # type: ignore[operator]
            raise FlagRejected(
                f"vLLM {version} has no --{name} (added in {first}): the engine refuses to "
                "start with it")
        removal = REMOVED.get(name)
        if removal is not None and number >= release(removal["removed_in"]):  # type: ignore
            raise FlagRejected(
                f"vLLM {version} has no --{name} (removed in {removal['removed_in']}, last in "
                f"{removal['last']}): the engine refuses to start with it")
    dtype = settings.kv_cache_dtype
    if dtype is not None:
        first = KV_DTYPE_FIRST_RELEASE.get(dtype)
        if first is None:
            raise FlagRejected(f"--kv-cache-dtype {dtype!r} is not a KV cache dtype vLLM knows")
        if number < release(first):  # type: ignore[operator]
            raise FlagRejected(
                f"vLLM {version} does not accept --kv-cache-dtype {dtype} (added in {first})")
    if settings.gpu_memory_utilization is not None and not 0 < settings.gpu_memory_utilization <= 1:
        raise FlagRejected("--gpu-memory-utilization must be in (0, 1]")


# --- layer specs ---------------------------------------------------------------------------------

NVFP4 = "nvfp4"
PER_TOKEN_HEAD = "per-token-head"


@dataclass(frozen=True)
class LayerSpec:
    """One attention layer's cache as vLLM specifies it (per tensor-parallel rank)."""

    kind: str  # FULL or SLIDING
    num_kv_heads: int
    head_size: int
    head_size_v: int
    value_bytes: int
    block_size: int
    window: int | None = None
    packing: str = ""  # "", NVFP4 or PER_TOKEN_HEAD (see KvDtype)
    page_padded: int | None = None  # the page padded to the pool's (from 0.29)

    @property
    def page_bytes(self) -> int:
        """Bytes of one block of this layer in the pool (K and V, padding included)."""
        return self.page_padded or self.real_page_bytes

    @property
    def real_page_bytes(self) -> int:
        if self.packing == NVFP4:
            # fp4 values two to a byte plus one fp8 scale per 16 values, for K and for V
            # (vllm/utils/torch_utils.py nvfp4_kv_cache_full_dim).
            per_head = (self.head_size // 2 + self.head_size // 16
                        + self.head_size_v // 2 + self.head_size_v // 16)
        else:
            per_head = (self.head_size + self.head_size_v) * self.value_bytes
            if self.packing == PER_TOKEN_HEAD:
                per_head += 2 * 4  # one float32 scale per token and head, for K and for V
        return self.block_size * self.num_kv_heads * per_head

    @property
    def bytes_per_token(self) -> int:
        return self.real_page_bytes // self.block_size

    def blocks_per_request(self, request_tokens: int, sliding_charge: int) -> int:
        """Blocks one request of ``request_tokens`` holds in this layer's group at most
        (FullAttentionSpec / SlidingWindowSpec.max_memory_usage_bytes)."""
        if self.kind == SLIDING:
            assert self.window is not None
            tokens = min(self.window - 1 + sliding_charge, request_tokens)
            return _cdiv(tokens, self.block_size) + 1
        return _cdiv(request_tokens, self.block_size)


def _cdiv(a: int, b: int) -> int:
    return -(a // -b)


@dataclass(frozen=True)
class KvDtype:
    name: str
    value_bytes: int
    basis: str
    packing: str = ""


def resolve_kv_dtype(settings: EngineSettings, arch: Architecture, rules: Rules) -> KvDtype:
    """The KV cache's value width: the flag, else (0.14+) a ModelOpt checkpoint's
    kv_cache_quant_algo, else the model's dtype. Raises :class:`Unmodelled` for layouts the
    planner does not size (TurboQuant, ...)."""
    name = settings.kv_cache_dtype or "auto"
    basis = f"--kv-cache-dtype {name}" if settings.kv_cache_dtype else "KV dtype auto"
    declared = arch.kv_cache_quant_algo
    method = arch.quant_method or ""
    if name == "auto" and method.startswith("modelopt") and not arch.kv_quant_known:
        raise Unmodelled("--kv-cache-dtype auto on a ModelOpt checkpoint takes the KV dtype "
                         "its config.json declares, and the seeded entry does not say it; pass "
                         "--kv-cache-dtype or let SparkOps read the checkpoint's config.json")
    if declared and method.startswith("modelopt") and name == "auto":
        if not rules.kv_dtype_from_checkpoint:
            raise Unmodelled(f"the checkpoint declares a {declared} KV cache; how vLLM "
                             f"{rules.version} reads that with --kv-cache-dtype auto is not "
                             "modelled")
        algo = {"fp8": "fp8_e4m3"}.get(declared, declared)
        name, basis = algo, f"KV dtype auto: the checkpoint's kv_cache_quant_algo {algo}"
    elif declared and method == "compressed-tensors":
        if rules.kv_scheme_fp8 == "unknown":
            raise Unmodelled(f"the checkpoint declares a KV cache scheme; how vLLM "
                             f"{rules.version} reads it is not modelled")
        if name == "auto" or rules.kv_scheme_fp8 == "forced":
            name, basis = "fp8", "the checkpoint's kv_cache_scheme makes the KV cache fp8"
    if name in PACKED_KV_DTYPES:
        return _packed_kv_dtype(name, basis, arch, rules)
    if name not in KV_DTYPE_BYTES:
        raise Unmodelled(f"the page layout of KV dtype {name} is not modelled")
    width = KV_DTYPE_BYTES[name]
    if width is None:
        dtype = arch.dtype or "bfloat16"
        if dtype not in ("bfloat16", "float16", "float32", "half", "float"):
            raise Unmodelled(f"the model's dtype {dtype!r} is not one the planner sizes")
        return KvDtype(dtype, 2, f"{basis}: the model's {dtype} (2 bytes a value)")
    return KvDtype(name, width, f"{basis} ({width} byte{'s' if width > 1 else ''} a value)")


def _packed_kv_dtype(name: str, basis: str, arch: Architecture, rules: Rules) -> KvDtype:
    """NVFP4 and the per-token-head modes: their page layout, where the release sizes it."""
    if name == NVFP4 and not rules.nvfp4_sliding and any(
            layer.kind == SLIDING for layer in arch.cache_layers):
        raise Unmodelled(f"vLLM {rules.version} does not pack NVFP4 pages of sliding-window "
                         "layers (it does from 0.21.0); that layout is not modelled")
    where = ("the attention backend's layout (FlashInfer for NVFP4, Triton for per-token-head "
             "scales)" if rules.kv_layout_from_backend else "kv_cache_interface.py's layout")
    if name == NVFP4:
        return KvDtype(name, 1, f"{basis}: packed fp4 values and fp8 scales per 16 values, "
                       f"{where}", NVFP4)
    return KvDtype(name, 1, f"{basis}: one byte a value plus a float32 scale per token and "
                   f"head, {where}", PER_TOKEN_HEAD)


def layer_specs(arch: Architecture, settings: EngineSettings, kv_dtype: KvDtype) -> list[LayerSpec]:
    """The cache layers of the model as vLLM specifies them on one rank."""
    if arch.has_state_layers:
        raise Unmodelled(
            "the model has Mamba / linear-attention layers: vLLM keeps one fixed-size state "
            "per request for each (not per token) and sizes the attention blocks to that "
            "state's page, which is not modelled")
    tp = settings.tensor_parallel_size
    block = settings.block_size or DEFAULT_BLOCK_SIZE
    specs = []
    for layer in arch.cache_layers:
        if layer.num_kv_heads % tp and tp % layer.num_kv_heads:
            raise FlagRejected(
                f"--tensor-parallel-size {tp} does not divide the model's {layer.num_kv_heads} "
                "KV heads (nor they it): vLLM refuses it")
        specs.append(LayerSpec(
            kind=layer.kind, num_kv_heads=max(1, layer.num_kv_heads // tp),
            head_size=layer.head_dim, head_size_v=layer.head_dim_v or layer.head_dim,
            value_bytes=kv_dtype.value_bytes, block_size=block, window=layer.window,
            packing=kv_dtype.packing))
    if not specs:
        raise Unmodelled("the model declares no attention layers that hold a KV cache")
    return specs


# --- grouping and the block pool -----------------------------------------------------------------


@dataclass(frozen=True)
class Group:
    """A KV cache group: ``layers`` layers (padding included) sharing one block table."""

    spec: LayerSpec
    layers: int
    # Page bytes of every layer of a single group whose layers differ in size (vLLM's
    # UniformTypeKVCacheSpecs); empty for an ordinary group.
    layer_pages: tuple[int, ...] = ()


@dataclass(frozen=True)
class Layout:
    groups: tuple[Group, ...]
    bytes_per_block: int  # pool bytes one block id costs across the shared tensors
    padding_layers: int
    hybrid: bool  # grouped by the hybrid manager (more than one kind of layer)


def group_layers(specs: list[LayerSpec], settings: EngineSettings, rules: Rules) -> Layout:
    """vLLM's get_kv_cache_groups and the bytes one block id takes in the pool."""
    disabled = bool(settings.disable_hybrid_kv_cache_manager)
    kinds = {(spec.kind, spec.window) for spec in specs}
    if len(kinds) > 1 and disabled:
        # unify_hybrid_kv_cache_specs: sliding layers become full attention (kept as full).
        specs = [replace(spec, kind=FULL, window=None,
                         packing=spec.packing if rules.hybrid_off_keeps_kv_mode
                         or spec.kind != SLIDING else "") for spec in specs]
    if len({_identity(spec, rules) for spec in specs}) == 1:
        spec = specs[0]
        return Layout((Group(spec, len(specs)),), spec.page_bytes * len(specs), 0, False)
    if len({(spec.kind, spec.window, spec.block_size) for spec in specs}) == 1:
        if rules.uniform_type_groups:
            # Same kind, different sizes: one group, each layer its own page.
            pages = tuple(spec.page_bytes for spec in specs)
            return Layout((Group(specs[0], len(specs), pages),), sum(pages), 0, False)
        if disabled:
            raise WouldRefuse(f"vLLM {rules.version} cannot put layers of different sizes in "
                              "one KV cache group (it can from 0.11.0)")
    return _hybrid_layout(specs, rules)


def _identity(spec: LayerSpec, rules: Rules) -> object:
    """What makes two layers the same kind of cache in this release."""
    if rules.identity_by_page:
        return spec.kind, spec.window, spec.block_size, spec.page_bytes
    return spec


def _hybrid_layout(specs: list[LayerSpec], rules: Rules) -> Layout:
    pages = {spec.page_bytes for spec in specs}
    if len(pages) > 1:
        if not rules.unify_page_sizes:
            raise WouldRefuse(
                f"vLLM {rules.version} cannot unify hybrid layers whose pages differ in size "
                "(NotImplementedError; it can from 0.12.0)")
        largest = max(pages)
        unified = []
        for spec in specs:
            if not largest % spec.page_bytes:
                unified.append(replace(spec,
                                       block_size=spec.block_size * largest // spec.page_bytes))
            elif rules.pad_pages == "always":
                unified.append(replace(spec, page_padded=largest))
            elif rules.pad_pages == "by backend":
                raise Unmodelled(
                    f"pages of {spec.page_bytes:,} and {largest:,} bytes do not divide; vLLM "
                    f"{rules.version} pads them only for attention backends that index pages "
                    "by block stride, which is not modelled")
            else:
                raise WouldRefuse(
                    f"vLLM {rules.version} cannot unify pages of {spec.page_bytes:,} and "
                    f"{largest:,} bytes (NotImplementedError: not divisible)")
        specs = unified
    # Layers of one kind, in the order their kind first appears; each kind's first layer
    # stands for it.
    by_kind: dict[object, tuple[LayerSpec, int]] = {}
    for spec in specs:
        first, count = by_kind.get(_identity(spec, rules), (spec, 0))
        by_kind[_identity(spec, rules)] = (first, count + 1)
    counts = [count for _, count in by_kind.values()]
    smallest, largest_count = min(counts), max(counts)
    group_size = largest_count if largest_count < smallest * rules.group_size_slack else smallest
    groups: list[Group] = []
    padding = 0
    for spec, count in by_kind.values():
        number = _cdiv(count, group_size)
        padding += number * group_size - count
        groups.extend(Group(spec, group_size) for _ in range(number))
    page = specs[0].page_bytes
    return Layout(tuple(groups), page * group_size, padding, True)


# --- the plan ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KvPlan:
    """What vLLM makes of a pool: ``None`` figures come with ``confidence`` "unknown — why"."""

    version: str | None
    pool_bytes: int | None
    num_blocks: int | None
    tokens: int | None  # as vLLM prints "GPU KV cache size: N tokens"
    concurrency: float | None  # "Maximum concurrency for max_model_len tokens per request"
    max_model_len: int | None
    kv_bytes_per_token: int | None  # every cache layer's K and V for one token of context
    groups: tuple[Group, ...]
    sliding_charge: int | None  # tokens a sliding group is charged beyond its window
    refusal: str | None
    basis: str
    confidence: str

    def concurrency_at(self, request_tokens: int) -> float | None:
        """Requests of ``request_tokens`` tokens the pool holds at once (at most
        ``max_model_len``); None when the plan is unknown."""
        if self.num_blocks is None or self.sliding_charge is None or not self.groups \
                or self.max_model_len is None or not 0 < request_tokens <= self.max_model_len:
            return None
        needed = sum(group.spec.blocks_per_request(request_tokens, self.sliding_charge)
                     for group in self.groups)
        return self.num_blocks / needed


def unknown_plan(version: str | None, why: str, pool_bytes: int | None = None) -> KvPlan:
    return KvPlan(version, pool_bytes, None, None, None, None, None, (), None, None,
                  f"not predicted: {why}", f"unknown — {why}")


def refused_plan(version: str | None, why: str, pool_bytes: int | None, basis: str) -> KvPlan:
    return KvPlan(version, pool_bytes, None, None, None, None, None, (), None, why,
                  f"{basis}; {why}", f"unknown — the engine would not start: {why}")


def plan_kv(arch: Architecture, settings: EngineSettings, version: str | None,
            pool_bytes: int | None, env: Mapping[str, str] | None = None) -> KvPlan:
    """The KV pool's blocks, reported tokens and concurrency for ``pool_bytes`` (the pool vLLM
    sizes, collectors.vllm.poolplan). Raises :class:`FlagRejected` for flags the release
    refuses; anything it cannot predict comes back as an unknown plan with the reason."""
    try:
        chosen = rules_for(version)
    except Unmodelled as why:
        return unknown_plan(version, str(why), pool_bytes)
    assert version is not None
    check_flags(settings, version)
    rules = chosen.rules
    if arch.min_vllm and release(version) < release(arch.min_vllm):  # type: ignore[operator]
        return refused_plan(version, f"vLLM {version} does not know this architecture "
                            f"(its model code first appears in {arch.min_vllm})", pool_bytes,
                            arch.source)
    why_not = _unmodelled_setting(settings)
    if why_not:
        return unknown_plan(version, why_not, pool_bytes)
    max_model_len = settings.max_model_len or arch.max_position_embeddings
    if max_model_len is None:
        return unknown_plan(version, "--max-model-len is not given and the model's "
                            "max_position_embeddings is not known", pool_bytes)
    env = env or {}
    if arch.max_position_embeddings and max_model_len > arch.max_position_embeddings \
            and env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") not in ("1", "true", "True"):
        raise FlagRejected(
            f"--max-model-len {max_model_len:,} is longer than the model's "
            f"{arch.max_position_embeddings:,} positions: vLLM refuses it unless "
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1")
    try:
        kv_dtype = resolve_kv_dtype(settings, arch, rules)
        specs = layer_specs(arch, settings, kv_dtype)
        layout = group_layers(specs, settings, rules)
    except WouldRefuse as why:
        return refused_plan(version, str(why), pool_bytes, chosen.basis)
    except Unmodelled as why:
        return unknown_plan(version, str(why), pool_bytes)
    mnbt = settings.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS
    async_on = settings.async_scheduling
    if async_on is None:
        async_on = rules.async_by_default
    batches = 2 if (async_on and rules.sliding_in_flight) else 1
    charge = batches * mnbt
    per_token = sum(spec.bytes_per_token for spec in specs)
    basis = _basis(arch, settings, chosen, kv_dtype, specs, layout, mnbt, async_on, rules,
                   max_model_len)
    confidence = chosen.confidence
    if settings.max_model_len is None and arch.rope_scaled:
        basis += ("; the model's positions are taken as its max_model_len, which vLLM may "
                  "stretch by the config's rope_scaling factor: pass --max-model-len")
        confidence = ESTIMATE
    if pool_bytes is None and settings.num_gpu_blocks_override is None:
        return KvPlan(version, None, None, None, None, max_model_len, per_token, layout.groups,
                      charge, None, basis + "; the pool's size is not known",
                      "unknown — the pool's size is not known")
    if settings.num_gpu_blocks_override is not None:
        blocks = settings.num_gpu_blocks_override
        pool_bytes = blocks * layout.bytes_per_block
        basis += f"; --num-gpu-blocks-override {blocks:,}"
    else:
        assert pool_bytes is not None
        if pool_bytes <= 0:
            return refused_plan(version, "no memory is left for the KV cache (vLLM: 'No "
                                "available memory for the cache blocks')", pool_bytes, basis)
        blocks = pool_bytes // layout.bytes_per_block
    refusal = _fit_refusal(specs, layout, rules, pool_bytes, max_model_len, charge)
    if refusal:
        return refused_plan(version, refusal, pool_bytes, basis)
    needed = sum(group.spec.blocks_per_request(max_model_len, charge) for group in layout.groups)
    concurrency = blocks / needed
    if rules.tokens_from_concurrency:
        tokens = int(concurrency * max_model_len)
    else:
        tokens = blocks // len(layout.groups) * min(g.spec.block_size for g in layout.groups)
    return KvPlan(version, pool_bytes, blocks, tokens, concurrency, max_model_len, per_token,
                  layout.groups, charge, None, basis, confidence)


def _unmodelled_setting(settings: EngineSettings) -> str | None:
    if settings.max_model_len_auto:
        return "--max-model-len auto: vLLM fits the length to the pool at start-up"
    if settings.pipeline_parallel_size > 1:
        return "pipeline parallelism splits the layers between pools, which is not modelled"
    if settings.context_parallel:
        return "context parallelism shards the KV cache, which is not modelled"
    if settings.speculative:
        return ("a speculative drafter adds its own attention layers and groups to the pool; "
                "its architecture is not known to the planner")
    if settings.disable_sliding_window:
        return ("--disable-sliding-window changes which layers vLLM caches as full attention "
                "model by model, which is not modelled")
    if settings.kv_transfer:
        return ("a KV connector (--kv-transfer-config) changes whether the hybrid KV cache "
                "manager is on, release by release")
    return None


def _fit_refusal(specs: list[LayerSpec], layout: Layout, rules: Rules, pool_bytes: int,
                 max_model_len: int, charge: int) -> str | None:
    """vLLM refuses to start when one request of max_model_len does not fit the pool
    (_check_enough_kv_cache_memory)."""
    first = layout.groups[0]
    if rules.fit_check != "layers" and first.layer_pages:
        needed = sum(first.layer_pages) * first.spec.blocks_per_request(max_model_len, charge)
    elif rules.fit_check != "layers":
        counted = layout.groups if rules.fit_check == "groups" else layout.groups[:1]
        blocks = sum(g.spec.blocks_per_request(max_model_len, charge) for g in counted)
        needed = layout.bytes_per_block * blocks
    else:
        needed = sum(spec.page_bytes * spec.blocks_per_request(max_model_len, charge)
                     for spec in specs)
    spared = layout.bytes_per_block if rules.fit_check_spares_null_block else 0
    if needed <= pool_bytes - spared:
        return None
    kept = " less the one block vLLM keeps back" if spared else ""
    return (f"one request of {max_model_len:,} tokens needs {needed:,} bytes "
            f"({needed / 2**30:.2f} GiB) of KV cache, more than the pool's {pool_bytes:,} "
            f"bytes{kept} (vLLM: 'To serve at least one request with the model's max seq len'); "
            "lower --max-model-len or enlarge the pool")


def _basis(arch: Architecture, settings: EngineSettings, chosen: VersionRules, kv_dtype: KvDtype,
           specs: list[LayerSpec], layout: Layout, mnbt: int, async_on: bool, rules: Rules,
           max_model_len: int) -> str:
    kinds: dict[tuple[str, int, int, int], int] = {}
    for spec in specs:
        key = (spec.kind, spec.num_kv_heads, spec.head_size, spec.bytes_per_token)
        kinds[key] = kinds.get(key, 0) + 1
    layers = ", ".join(
        f"{count} {kind} layer{'s' if count > 1 else ''} of {heads} KV heads x {size} "
        f"({per_token:,} B/token)" for (kind, heads, size, per_token), count in kinds.items())
    parts = [
        chosen.basis,
        f"architecture: {arch.source}",
        layers,
        kv_dtype.basis,
        f"block size {specs[0].block_size}"
        + ("" if settings.block_size else " (vLLM's default)"),
        f"max_model_len {max_model_len:,}" + ("" if settings.max_model_len
                                              else " (the model's positions)"),
        f"max_num_batched_tokens {mnbt:,}" + ("" if settings.max_num_batched_tokens
                                             else " (vLLM's default on a GB10)"),
    ]
    if settings.tensor_parallel_size > 1:
        parts.append(f"tensor parallel {settings.tensor_parallel_size} (KV heads split)")
    if layout.hybrid:
        parts.append(f"hybrid KV cache manager: {len(layout.groups)} groups of "
                     f"{layout.groups[0].layers} layers"
                     + (f" ({layout.padding_layers} padding)" if layout.padding_layers else ""))
    elif settings.disable_hybrid_kv_cache_manager:
        parts.append("hybrid KV cache manager off: sliding layers cached as full attention")
    if any(spec.kind == SLIDING for spec in specs) and rules.sliding_in_flight:
        parts.append("async scheduling " + ("on: sliding layers charged two batches in flight"
                                            if async_on else "off"))
    parts.append("tokens = " + ("concurrency x max_model_len (derived, not slots stored)"
                                if rules.tokens_from_concurrency
                                else "blocks // groups x smallest block size"))
    return "; ".join(parts)


def kv_bytes_per_token(arch: Architecture, settings: EngineSettings, version: str) -> int:
    """KV bytes one token of context takes across every cache layer (before windows)."""
    rules = rules_for(version).rules
    specs = layer_specs(arch, settings, resolve_kv_dtype(settings, arch, rules))
    return sum(spec.bytes_per_token for spec in specs)
