"""What differs between the vLLM releases the emulator can impersonate.

Two styles, chosen with `--emulator-style`:

* `0.33` — current vLLM (as in the 0.33.0 wheel): metric names after the renames of vLLM PRs
  #18354 and #29330, labels sorted by prometheus_client 0.26, the one-line KV capacity message,
  `(EngineCore pid=N)` prefixes, `Starting vLLM server on …`.
* `0.10` — a 2025 image (v0.10.1): the pre-rename metric names only (`gpu_cache_usage_perc`,
  `gpu_prefix_cache_*`, `time_per_output_token_seconds`), labels in declaration order, the
  two-line KV capacity message, `(EngineCore_DP0 pid=N)` prefixes and
  `Starting vLLM API server 0 on …`. Only the old names are exposed, so a collector is exercised
  on the old-only case: an adapter must accept either name of each renamed metric.

Everything version-dependent lives here so the other modules ask a question instead of comparing
version strings.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Style:
    """The observable traits of one vLLM release line."""

    key: str
    default_version: str
    # --gpu-memory-utilization: the default was 0.9 in older releases and 0.92 in current ones.
    default_gpu_memory_utilization: float
    engine_process: str
    modern: bool
    kv_usage_metric: str
    prefix_queries_metric: str
    prefix_hits_metric: str
    inter_token_metric: str
    sort_labels: bool
    # Flags that make argparse fail in this release: removed ones (vLLM PR #49244) and ones that
    # did not exist yet (`--moe-backend` arrived in v0.17.0, PR #33807).
    rejected_flags: frozenset[str]


CURRENT = Style(
    key="0.33",
    default_version="0.33.0",
    default_gpu_memory_utilization=0.92,
    engine_process="EngineCore",
    modern=True,
    kv_usage_metric="vllm:kv_cache_usage_perc",
    prefix_queries_metric="vllm:prefix_cache_queries",
    prefix_hits_metric="vllm:prefix_cache_hits",
    inter_token_metric="vllm:inter_token_latency_seconds",
    sort_labels=True,
    rejected_flags=frozenset({"--max-num-partial-prefills", "--max-long-partial-prefills"}),
)

LEGACY = Style(
    key="0.10",
    default_version="0.10.1",
    default_gpu_memory_utilization=0.9,
    engine_process="EngineCore_DP0",
    modern=False,
    kv_usage_metric="vllm:gpu_cache_usage_perc",
    prefix_queries_metric="vllm:gpu_prefix_cache_queries",
    prefix_hits_metric="vllm:gpu_prefix_cache_hits",
    inter_token_metric="vllm:time_per_output_token_seconds",
    sort_labels=False,
    rejected_flags=frozenset({"--moe-backend"}),
)

STYLES: dict[str, Style] = {CURRENT.key: CURRENT, LEGACY.key: LEGACY}
