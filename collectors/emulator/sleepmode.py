"""vLLM's sleep mode, emulated: `POST /sleep` really gives memory back, `POST /wake_up` takes it.

What vLLM does (0.33 unless said; the emulated 0.10 differs only in its answers and texts):

* `POST /sleep?level=N&mode=abort|wait|keep` (vllm/entrypoints/serve/dev/sleep/api_router.py:26)
  pauses the scheduler (vllm/v1/engine/core.py `EngineCore.sleep`: running requests aborted by
  default) and, from level 1, has the workers release what the sleep-mode allocator holds
  (vllm/v1/worker/gpu_worker.py `Worker.sleep`): level 1 offloads the weights to host memory
  and discards the KV cache, level 2 discards both. Only what was allocated through that
  allocator is released, which is everything only with `--enable-sleep-mode`; without it a
  sleep frees nothing. The worker logs "Sleep mode freed %s GiB memory, %s GiB memory is still
  in use." (its own measurement of free device memory before and after), the executor "It took
  %.6f seconds to fall asleep." (vllm/v1/executor/abstract.py:408), and the metric
  `vllm:engine_sleep_state` turns to the level (vllm/v1/engine/async_llm.py:1204).
* `POST /wake_up[?tags=weights&tags=kv_cache]` restores the tags asked for (all by default),
  logging "wake up the engine with tags: %s" and "It took %.6f seconds to wake up tags %s.";
  the scheduler resumes and the metric says awake once every tag is back.
* `GET /is_sleeping` answers `{"is_sleeping": …}`.

The three exist only with `VLLM_SERVER_DEV_MODE=1` (vllm/entrypoints/launchers/api_server/
routers.py:46). Here the memory is real: on a GB10 the weights offloaded to host memory stay in
the same unified memory, so level 1 keeps the weights' reservation and frees the KV pool's;
level 2 frees both; waking allocates them again (every page touched), so MemFree and the
container's cgroup move by exactly what vLLM would give back and take.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from . import messages
from .engine import Engine
from .logs import VllmLog
from .memory import Reservation, host_memory
from .metrics import EngineMetrics
from .startup import Resources

# vllm/v1/executor/abstract.py:36 (``SLEEP_TAGS``); the order vLLM's set prints them in varies.
SLEEP_TAGS = ("weights", "kv_cache")
PAUSE_MODES = ("abort", "wait", "keep")


def dev_mode() -> bool:
    """vLLM's ``VLLM_SERVER_DEV_MODE`` (vllm/envs.py: ``bool(int(os.getenv(..., "0")))``)."""
    try:
        return bool(int(os.environ.get("VLLM_SERVER_DEV_MODE", "0")))
    except ValueError:
        return False


class SleepMode:
    """One engine's sleep state and the memory it gives back and takes. Thread-safe."""

    def __init__(self, *, enabled: bool, engine: Engine, metrics: EngineMetrics,
                 resources: Resources, log: VllmLog) -> None:
        self._enabled = enabled
        self._engine = engine
        self._metrics = metrics
        self._resources = resources
        self._log = log
        self._lock = threading.Lock()
        self._sizes = {
            "weights": resources.weights.nbytes if resources.weights else 0,
            "kv_cache": resources.kv.nbytes if resources.kv else 0,
        }
        self._released: set[str] = set()  # tags whose reservation was freed
        self.sleeping_tags: set[str] = set()  # the executor's: asleep until all are back

    @property
    def is_sleeping(self) -> bool:
        """vLLM's ``EngineCore.is_sleeping``: the scheduler paused or the executor asleep."""
        return self._engine.paused or bool(self.sleeping_tags)

    def sleep(self, level: int, mode: str = "abort") -> None:
        with self._lock:
            self._engine.pause(mode)
            if level >= 1:
                self._executor_sleep(level)
            self._metrics.record_sleep_state(1, level)

    def _executor_sleep(self, level: int) -> None:
        if "weights" in self.sleeping_tags:
            self._log.core("abstract.py:402", "Executor is already sleeping.", "WARNING")
            return
        started = time.perf_counter()
        _, free_before = host_memory()
        if self._enabled:
            # Level 1 copies the weights to pinned host memory: on unified memory they are held
            # just the same, so only the KV pool (and at level 2 the weights) is given back.
            self._release("kv_cache")
            if level == 2:
                self._release("weights")
        total, free_after = host_memory()
        self._log.core(*messages.sleep_freed(self._log.style, max(free_after - free_before, 0),
                                             total - free_after))
        self.sleeping_tags |= set(SLEEP_TAGS)
        self._log.core(*messages.fell_asleep(time.perf_counter() - started))

    def wake_up(self, tags: list[str] | None) -> bool:
        """Restore ``tags`` (all when None); True when fully awake again."""
        with self._lock:
            self._log.api(*messages.wake_up_request(self._log.style, tags))
            self._executor_wake_up(tags)
            awake = not self.sleeping_tags
            if awake:
                self._engine.resume()
                self._metrics.record_sleep_state(0, 0)
            return awake

    def _executor_wake_up(self, tags: list[str] | None) -> None:
        if not self.sleeping_tags:
            self._log.core("abstract.py:414", "Executor is not sleeping.", "WARNING")
            return
        for tag in tags or []:
            if tag not in self.sleeping_tags:
                self._log.core("abstract.py:420", f"Tag {tag} is not in sleeping tags "
                               f"{_set_text(self.sleeping_tags)}", "WARNING")
                return
        started = time.perf_counter()
        woken = set(tags) if tags else set(self.sleeping_tags)
        for tag in sorted(woken):
            self._restore(tag)
        shown = repr(tags) if tags is not None else _set_text(self.sleeping_tags)
        self._log.core(*messages.woke_up(time.perf_counter() - started, shown))
        self.sleeping_tags -= woken

    def _release(self, tag: str) -> None:
        reservation = self._resources.weights if tag == "weights" else self._resources.kv
        if reservation is not None:
            reservation.free()
        self._released.add(tag)

    def _restore(self, tag: str) -> None:
        if tag not in self._released:
            return
        restored = Reservation(self._sizes[tag], populate=True)
        if tag == "weights":
            self._resources.weights = restored
        else:
            self._resources.kv = restored
        self._released.discard(tag)


def _set_text(tags: set[str]) -> str:
    """A Python set of tags as vLLM's log prints it (``{'weights', 'kv_cache'}``)."""
    return "{" + ", ".join(repr(tag) for tag in SLEEP_TAGS if tag in tags) + "}"


def sleep_answer(modern: bool, level: int) -> Any:
    """`/sleep`'s JSON body (0.33), or None for the empty 200 of 2025 releases."""
    return {"status": "sleeping", "level": level} if modern else None


def wake_up_answer(modern: bool, awake: bool, tags: list[str] | None) -> Any:
    return {"status": "awake" if awake else "sleeping", "tags": tags} if modern else None
