"""KV-cache sizing: how big the pool is and how many tokens and requests it holds.

Pure functions, so the arithmetic behind the log lines and `cache_config_info` can be tested
without starting anything.

Scale. The emulator reserves MiB where a GB10 engine reserves GiB. To keep token counts (and so
max concurrency) at their real magnitude, the default KV size per token is scaled the same way:
16 bytes stands for a ~16 KiB/token model. The seed's 20 GiB pool held 1.23 M tokens (9.39
requests of 131,072); here a 20 MiB pool holds 1.31 M tokens (10.0 such requests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# The emulated model's own context limit, used when `--max-model-len auto` (or -1) asks for "the
# largest that fits", as vLLM's --max-model-len does.
NATIVE_MAX_MODEL_LEN = 131_072


@dataclass(frozen=True)
class KvPlan:
    """A KV pool once sized: bytes reserved and the capacity vLLM reports for it."""

    pool_bytes: int
    pinned: bool
    bytes_per_token: int
    block_size: int
    num_gpu_blocks: int
    max_model_len: int

    @property
    def tokens(self) -> int:
        """GPU KV cache size in tokens (`num_gpu_blocks × block_size` for a plain model)."""
        return self.num_gpu_blocks * self.block_size

    @property
    def max_concurrency(self) -> float:
        """Requests of `max_model_len` tokens that fit at once (`Maximum concurrency … x`)."""
        return self.tokens / self.max_model_len


def kv_bytes_per_token(bf16_bytes: int, kv_cache_dtype: str) -> int:
    """KV bytes per token for a `--kv-cache-dtype`, from the bf16 size.

    8-bit caches halve it, 4- and 3-bit families quarter it (scale factors ignored); that is why a
    quantised KV cache multiplies capacity in the seed measurements.
    """
    dtype = kv_cache_dtype.lower()
    if dtype in {"auto", "float16", "bfloat16"}:
        factor = 1.0
    elif "fp8" in dtype or "int8" in dtype or "k8v4" in dtype:
        factor = 0.5
    else:
        factor = 0.25
    return max(1, math.ceil(bf16_bytes * factor))


def unpinned_pool_bytes(
    *,
    gpu_memory_utilization: float,
    mem_total: int,
    mem_free: int,
    non_kv_bytes: int,
    cap_bytes: int,
) -> int:
    """The pool an engine without `--kv-cache-memory-bytes` gets (may be <= 0: no room).

    vLLM V1 budgets `util × total` minus weights, activation peak and CUDA graphs. The emulator
    also bounds the budget by MemFree at boot, which is what makes the unpinned pool depend on the
    neighbours as it does on a GB10 (seen there: util 0.35 gave a 40.5 GiB pool one boot, 0.30
    gave 13.8 GiB another),
    then clamps it to `cap_bytes` so a test cannot take the machine.
    """
    budget = min(gpu_memory_utilization * mem_total, mem_free)
    return min(int(budget) - non_kv_bytes, cap_bytes)


def plan_kv(
    *,
    pool_bytes: int,
    pinned: bool,
    bytes_per_token: int,
    block_size: int,
    max_model_len: int | None,
) -> KvPlan:
    """Blocks and capacity for a pool of `pool_bytes`; `max_model_len=None` means `auto`."""
    block_bytes = bytes_per_token * block_size
    num_blocks = max(0, pool_bytes // block_bytes)
    if max_model_len is None:
        fitting = num_blocks * block_size
        max_model_len = max(block_size, min(NATIVE_MAX_MODEL_LEN, fitting))
    return KvPlan(
        pool_bytes=pool_bytes,
        pinned=pinned,
        bytes_per_token=bytes_per_token,
        block_size=block_size,
        num_gpu_blocks=num_blocks,
        max_model_len=max_model_len,
    )


def estimated_max_model_len(plan: KvPlan) -> int:
    """What vLLM suggests when one full-length request does not fit: whole blocks of the pool."""
    return plan.num_gpu_blocks * plan.block_size
