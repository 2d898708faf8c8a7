"""vLLM's sleep mode: which phase a sleeping engine is in, and what it still holds.

vLLM puts an engine to sleep on ``POST /sleep?level=N`` and wakes it on ``POST /wake_up``
(``GET /is_sleeping`` says whether it sleeps); the three exist only with
``VLLM_SERVER_DEV_MODE=1`` (vllm/entrypoints/serve/dev/sleep/api_router.py:26-58 of 0.33;
entrypoints/openai/api_server.py from 0.7). What it gives back is what its sleep-mode allocator
holds (vllm/device_allocator/cumem.py, ``CuMemAllocator``): the weights and the KV cache (tags
``weights`` and ``kv_cache``), allocated through it only with ``--enable-sleep-mode``. By level
(vllm/v1/engine/core.py ``EngineCore.sleep``, vllm/v1/worker/gpu_worker.py ``Worker.sleep``):

* level 1 copies the weights to pinned host memory and releases both from the device. On a
  GB10 the device's memory *is* the host's, so the weights are still held: only the KV pool
  is given back;
* level 2 releases both (the weights are reloaded after waking);
* level 0 only pauses scheduling; from 0.31 ``POST /release_kv_cache_memory`` releases the KV
  cache of a paused engine, and vLLM reports both the same way (``record_sleep_state(1, 0)``,
  vllm/v1/engine/async_llm.py:1211 of 0.33);
* without ``--enable-sleep-mode`` nothing went through that allocator, so a sleep frees
  nothing (the worker logs "Sleep mode freed 0.0 GiB memory").

CUDA graphs and what the process needs to run (CUDA context, the runtime's own buffers) are not
allocated through it (0.33's ``--sleep-mode-offload-cudagraph`` backs the graphs up to host
memory, which on unified memory holds them just the same), so a sleeping engine still holds
them; its cgroup or NVML figure (the ledger's ``actual``) says how much it holds in all.

The level comes from ``vllm:engine_sleep_state`` (0.11-0.33, ``collectors.vllm.metrics``); an
older release says only in its log that it sleeps (``collectors.vllm.logs``), and its level is
then unknown. Pure functions; the phase is one of ``collectors.vllm.logs.PHASES``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from collectors.vllm.logs import SLEEP_PHASE_BY_LEVEL, SLEEPING_PHASES
from collectors.vllm.metrics import MetricsSnapshot

__all__ = ["SleepHolding", "held_while_asleep", "phase_with_sleep", "sleep_mode_enabled"]

# Phases in which an engine can be asleep: it serves (the sleep endpoints and the metric exist
# only once its API server is up), so a log still at "kv_allocated" is only behind.
_CAN_SLEEP = frozenset({"kv_allocated", "ready", *SLEEPING_PHASES})
# From this release a paused engine's KV cache can be released and is reported as level 0
# (vLLM PR adding /release_kv_cache_memory; vllm/v1/engine/async_llm.py of 0.31.0).
_KV_RELEASE_REPORTED_AS_LEVEL_0 = (0, 31)

WEIGHTS_OFFLOADED = "weights offloaded to host memory: still held on unified memory"


def phase_with_sleep(phase: str, snapshot: MetricsSnapshot | None, previous: str) -> str:
    """The phase of an engine whose container and log say ``phase`` (``previous`` the one it had),
    given this read's sleep state.

    Asleep according to ``vllm:engine_sleep_state``: its sleeping phase by level. Awake: no
    sleeping phase any more (its log may not have been read since it woke). Not reported (a
    release before 0.11, another kind, or a failed read): ``phase`` as the log says it, keeping
    the level an earlier read told when the log knows only that it sleeps.
    """
    if phase not in _CAN_SLEEP:
        return phase
    asleep = snapshot.asleep if snapshot is not None else None
    if asleep is None:
        if phase == SLEEP_PHASE_BY_LEVEL[None] and previous in SLEEPING_PHASES:
            return previous
        return phase
    if asleep:
        return SLEEP_PHASE_BY_LEVEL[snapshot.sleep_level]  # type: ignore[union-attr]
    return "ready" if phase in SLEEPING_PHASES else phase


def sleep_mode_enabled(config: Mapping[str, Any]) -> bool | None:
    """Was the engine started with ``--enable-sleep-mode``? None when its flags are unknown."""
    flags = config.get("all_flags")
    if not isinstance(flags, Mapping):
        return None
    return flags.get("enable-sleep-mode") is True


@dataclass(frozen=True)
class SleepHolding:
    """What a sleeping engine holds of its weights and KV pool (bytes; None: unknown), with
    the reason for each in words (``notes``: part -> words, parts ``weights``, ``kv_pool`` and
    ``actual``)."""

    weights: int | None
    kv_pool: int | None
    notes: dict[str, str] = field(default_factory=dict)


def held_while_asleep(phase: str, weights: int | None, kv_pool: int | None,
                      config: Mapping[str, Any], version: str | None) -> SleepHolding | None:
    """What an engine in ``phase`` holds of the ``weights`` and ``kv_pool`` it reported at
    startup; None when it is not asleep (it holds them as reported)."""
    if phase not in SLEEPING_PHASES:
        return None
    enabled = sleep_mode_enabled(config)
    if enabled is False:
        return SleepHolding(weights, kv_pool, {
            "kv_pool": "asleep, but started without --enable-sleep-mode: vLLM's sleep frees "
                       "nothing then, so its KV pool is still held",
        })
    if enabled is None:
        return SleepHolding(weights, None, {
            "kv_pool": "unknown: asleep, and its launch flags could not be read, so whether "
                       "--enable-sleep-mode let the sleep free its KV pool is unknown",
        })
    if phase == "sleeping_level_1":
        return SleepHolding(weights, 0, {
            "weights": WEIGHTS_OFFLOADED,
            "kv_pool": "freed by sleep mode (level 1), allocated again when it wakes",
        })
    if phase == "sleeping_level_2":
        return SleepHolding(0, 0, {
            "weights": "discarded by sleep mode (level 2), loaded again when it wakes",
            "kv_pool": "discarded by sleep mode (level 2), allocated again when it wakes",
            "actual": "what its process still holds asleep (CUDA context, CUDA graphs, runtime), "
                      "from its cgroup or NVML",
        })
    if phase == "paused":
        if _version(version) < _KV_RELEASE_REPORTED_AS_LEVEL_0:
            return SleepHolding(weights, kv_pool, {
                "kv_pool": "kept: paused (sleep level 0) only stops scheduling",
            })
        return SleepHolding(weights, None, {
            "kv_pool": "unknown: paused (sleep level 0), which vLLM also reports for a released "
                       "KV cache (/release_kv_cache_memory), so whether the pool is held is "
                       "unknown",
        })
    return SleepHolding(None, 0, {
        "weights": "unknown: asleep at a level this release does not report (level 1 keeps "
                   "the weights in host memory, still held on unified memory, level 2 "
                   "discards them; vllm:engine_sleep_state came in 0.11)",
        "kv_pool": "freed by sleep mode (levels 1 and 2 both free it)",
    })


def _version(text: str | None) -> tuple[int, ...]:
    """A vLLM version as numbers ("0.33.0" -> (0, 33, 0)); an unknown one reads as the newest
    behaviour (infinitely new), so nothing is claimed kept that a newer vLLM frees."""
    if not text:
        return (999,)
    numbers = tuple(int(part) for part in re.findall(r"\d+", text.split("+")[0])[:3])
    return numbers or (999,)
