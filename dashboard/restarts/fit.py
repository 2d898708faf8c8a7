"""The arithmetic of a restart: will the engine fit after the stop, and how long may it start.

Plain functions over an engine's ledger share (:class:`collectors.ledger.EngineShare`) and byte
counts; no database, no node I/O. The runbook calls them with what it measured at each check.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from collectors.ledger import EngineShare
from sparkops.units import size_text

__all__ = ["PRECHECK_MARGIN_FRACTION", "Fit", "engine_holds", "engine_need", "planned_need",
           "precheck_fit", "recheck_fit", "startup_deadline_seconds", "with_need"]

# Room kept free on top of the need: 1 % of MemTotal (≈ 1.2 GiB on a GB10), for what no report
# covers (the CUDA context, allocator slack, a neighbour's small growth meanwhile).
PRECHECK_MARGIN_FRACTION = 0.01


@dataclass(frozen=True)
class Fit:
    """Does ``need`` fit in ``room`` less ``margin``? Bytes; None means unknown, never 0.

    ``parts`` holds the figures the sum came from (for the step's data), ``missing`` what was
    needed but unknown. ``fits`` is None when the answer is unknown.
    """

    need: int | None
    room: int | None
    margin: int
    parts: dict[str, int | None] = field(default_factory=dict)
    missing: tuple[str, ...] = ()

    @property
    def fits(self) -> bool | None:
        if self.need is None or self.room is None:
            return None
        return self.need + self.margin <= self.room

    def describe(self, room_words: str) -> str:
        """E.g. "needs 31.2 GiB (+ 1.2 GiB margin), 24.0 GiB would be free"."""
        if self.fits is None:
            return f"{' and '.join(self.missing) or 'a figure'} unknown"
        return (f"needs {size_text(self.need)} (+ {size_text(self.margin)} margin), "
                f"{size_text(self.room)} {room_words}")

    def as_dict(self) -> dict[str, Any]:
        return {"need_bytes": self.need, "room_bytes": self.room, "margin_bytes": self.margin,
                "fits": self.fits, "parts": dict(self.parts), "missing": list(self.missing)}


def engine_need(share: EngineShare) -> tuple[int | None, dict[str, int | None], tuple[str, ...]]:
    """``(need, parts, missing)``: weights + KV pool, plus CUDA graphs and the transient prefill
    need when known. Weights and KV pool are required: without them there is no need to compare
    (an engine that never reported them cannot be pre-checked).

    An engine that reports whole loaded models instead (Ollama: no weights or KV pool apart)
    needs what its models hold now, which its next requests load again. Their size already
    holds each model's compute graph, the buffer a prefill uses, so no prefill need is added.
    """
    if share.loaded_models is not None and (share.weights is None or share.kv_pool is None):
        return share.loaded_models, {"loaded_models": share.loaded_models}, ()
    parts = {"weights": share.weights, "kv_pool": share.kv_pool,
             "cuda_graphs": share.cuda_graphs, "prefill": share.prefill_need}
    missing = tuple(f"its {name.replace('_', ' ')}" for name in ("weights", "kv_pool")
                    if parts[name] is None)
    if missing:
        return None, parts, missing
    return sum(value for value in parts.values() if value is not None), parts, ()


def planned_need(weights: int | None, kv_pool: int | None, cuda_graphs: int | None,
                 prefill: int | None) -> tuple[int | None, dict[str, int | None], tuple[str, ...]]:
    """:func:`engine_need` for the flags a plan changes to, from the fit planner's figures of
    the engine after the change (weights and KV pool required; CUDA graphs and the prefill need
    added when known)."""
    parts = {"weights": weights, "kv_pool": kv_pool, "cuda_graphs": cuda_graphs,
             "prefill": prefill}
    missing = tuple(f"its {name.replace('_', ' ')} with the new flags"
                    for name in ("weights", "kv_pool") if parts[name] is None)
    if missing:
        return None, parts, missing
    return sum(value for value in parts.values() if value is not None), parts, ()


def with_need(fit: Fit, need: tuple[int | None, dict[str, int | None], tuple[str, ...]]) -> Fit:
    """``fit`` with another need (a :func:`planned_need`) against the same room."""
    value, parts, missing = need
    room_parts = {key: fit.parts.get(key) for key in ("mem_available", "engine_holds")}
    absent = tuple(m for m in fit.missing if m in ("MemAvailable", "what it holds now"))
    return Fit(need=value, room=fit.room, margin=fit.margin, parts={**parts, **room_parts},
               missing=missing + absent)


def engine_holds(share: EngineShare, *, running: bool) -> int | None:
    """What stopping the engine gives back: 0 when it is not running; else the larger of what it
    reports reserving (weights + KV pool + graphs, as known; or its loaded models' sizes) and
    what it is seen holding (NVML per-process or cgroup). Each view misses something: on GB10
    the cgroup does not see GPU allocations, and the reports leave out the CUDA context and
    activations."""
    if not running:
        return 0
    reported = share.loaded_models
    if share.weights is not None and share.kv_pool is not None:
        reported = share.weights + share.kv_pool + (share.cuda_graphs or 0)
    known = [value for value in (reported, share.actual) if value is not None]
    return max(known) if known else None


def precheck_fit(share: EngineShare, *, mem_available: int | None, running: bool,
                 margin: int) -> Fit:
    """Before touching anything: the need against MemAvailable + what the engine holds.

    MemAvailable already counts the reclaimable page cache the drop will hand back (as free
    pages), so it is not added a second time; after the stop and the drop, MemFree is about
    this sum.
    """
    need, parts, missing = engine_need(share)
    holds = engine_holds(share, running=running)
    room = None if mem_available is None or holds is None else mem_available + holds
    absent = list(missing)
    if mem_available is None:
        absent.append("MemAvailable")
    if holds is None:
        absent.append("what it holds now")
    return Fit(need=need, room=room, margin=margin,
               parts={**parts, "mem_available": mem_available, "engine_holds": holds},
               missing=tuple(absent))


def recheck_fit(need: int, *, mem_free: int | None, margin: int) -> Fit:
    """After the stop and the drop: the need against MemFree, what CUDA sees on GB10."""
    return Fit(need=need, room=mem_free, margin=margin, parts={"mem_free": mem_free},
               missing=() if mem_free is not None else ("MemFree",))


def startup_deadline_seconds(expected_startup_seconds: float) -> float:
    """How long a start may take: expected × factor, never less than the minimum (15 min)."""
    return max(expected_startup_seconds * settings.SPARKOPS_RESTART_DEADLINE_FACTOR,
               settings.SPARKOPS_RESTART_MIN_DEADLINE_SECONDS)
