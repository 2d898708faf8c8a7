"""The arithmetic of a restart: will the engine fit after the stop, how long may it start, did
its memory come back when it stopped, and how low MemFree may fall while it starts.

Plain functions over an engine's ledger share (:class:`collectors.ledger.EngineShare`) and byte
counts; no database, no node I/O. The runbook calls them with what it measured at each check;
the unplanned-restart pass and the memory-not-returned alert with what the collectors stored.

**Memory that must come back.** A stopped engine should hand back what it held: the room
(MemAvailable, or the memory budget's room where the engine runs in one) just before the stop
plus what it held (:func:`returned_by_stop`) is what the room should reach
(:class:`MemoryReturn`). On a GB10 it sometimes does not (memory the driver or a leaked
shared-memory segment keeps after the container exited, reported as "needs a reboot"). What
other processes move meanwhile is allowed for by a tolerance (:func:`return_tolerance`).

**The guarded start.** While an engine loads, MemFree (what CUDA counts as free on a GB10) must
stay above what it still has to allocate plus the margin (:func:`guard_floor`), or the page
cache its weights bring in leaves it short.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from collectors.ledger import EngineShare, engine_share
from collectors.models import Engine
from sparkops.units import size_text

__all__ = ["BUDGET", "HOST", "PRECHECK_MARGIN_FRACTION", "RETURN_TOLERANCE_FRACTION", "ROOM_WORDS",
           "Fit", "MemoryReturn", "engine_holds", "engine_need", "engines_held", "guard_floor",
           "missing_now",
           "not_returned", "planned_need", "precheck_fit", "recheck_fit", "return_tolerance",
           "returned_by_stop", "startup_deadline_seconds", "with_need"]

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


# --- memory that must come back when an engine stops -------------------------------------------

# What a stop may leave missing without it counting: the larger of this share of what the engine
# held and PRECHECK_MARGIN_FRACTION of the room's total (MemTotal, or the memory budget's limit):
# 1.2 GiB on a GB10: room for what other processes move MemAvailable by meanwhile.
RETURN_TOLERANCE_FRACTION = 0.05
# The rooms a return is measured in: the host's MemAvailable, or the memory budget's room
# (limit less its working set).
HOST, BUDGET = "host", "budget"
ROOM_WORDS = {HOST: "MemAvailable", BUDGET: "the memory budget's room"}
# The verdict on a stop whose memory did not come back (``after["memory_return"]["verdict"]``).
NOT_RETURNED = "not returned"


def returned_by_stop(share: EngineShare, *, gpu_seen: int | None
                     ) -> tuple[int | None, dict[str, int | None]]:
    """``(bytes, parts)``: what stopping the running engine should hand back to MemAvailable,
    the larger of what it reports reserving (weights + KV pool + CUDA graphs, or its loaded
    models' sizes) and what NVML sees its processes hold (``gpu_seen``); None when neither is
    known.

    Unlike :func:`engine_holds`, the container's cgroup figure is left out: it counts the page
    cache of the files the container read (its weights among them), which MemAvailable counts
    as available already and a stop does not hand back, so counting it would report memory as
    missing after every stop (on GB10 it does not see GPU allocations either). What the
    engine's process holds besides its reservations (the CUDA context, the interpreter) comes
    back too and is not expected, so what is then found missing is at most what really is.
    """
    reported = share.loaded_models
    if share.weights is not None and share.kv_pool is not None:
        reported = share.weights + share.kv_pool + (share.cuda_graphs or 0)
    parts = {"reported": reported, "gpu_seen": gpu_seen}
    known = [value for value in parts.values() if value is not None]
    return (max(known) if known else None), parts


def engines_held(engines: Iterable[Engine]) -> dict[str, int]:
    """:func:`returned_by_stop` of each engine row, by id (a string, as JSON keys are): 0 for
    one whose container is not running, and for one whose holding is unknown (counted the same
    way each time, it moves no comparison)."""
    held = {}
    for engine in engines:
        value = None
        if engine.container_state == "running":
            value, _ = returned_by_stop(engine_share(engine), gpu_seen=engine.gpu_memory_bytes)
        held[str(engine.pk)] = value or 0
    return held


def return_tolerance(held: int, total: int | None) -> int:
    """How much of ``held`` may stay missing without counting: 5 % of it, at least 1 % of
    ``total`` (MemTotal, or the budget's limit; unknown: no floor)."""
    return int(max(held * RETURN_TOLERANCE_FRACTION, (total or 0) * PRECHECK_MARGIN_FRACTION))


@dataclass(frozen=True)
class MemoryReturn:
    """One room's account of a stop: ``before`` (the room just before it), ``held`` (what the
    engine held: :func:`returned_by_stop`), ``tolerance``, and ``best``, the highest room read
    since (None: not read yet). Bytes. ``source`` is :data:`HOST` or :data:`BUDGET`."""

    source: str
    before: int
    held: int
    tolerance: int
    best: int | None = None

    @property
    def expected(self) -> int:
        """What the room should reach once the engine's memory is back."""
        return self.before + self.held

    @property
    def missing(self) -> int | None:
        """What is still missing of ``held`` at the best reading (None: no reading)."""
        return None if self.best is None else max(self.expected - self.best, 0)

    @property
    def returned(self) -> bool | None:
        """Came back within the tolerance; None before any reading."""
        missing = self.missing
        return None if missing is None else missing <= self.tolerance

    def reading(self, room: int | None) -> MemoryReturn:
        """This account with one more reading of the room (None: not readable, no change)."""
        if room is None or (self.best is not None and room <= self.best):
            return self
        return MemoryReturn(self.source, self.before, self.held, self.tolerance, room)

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "before_bytes": self.before, "held_bytes": self.held,
                "expected_bytes": self.expected, "tolerance_bytes": self.tolerance,
                "best_bytes": self.best, "missing_bytes": self.missing,
                "returned": self.returned}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MemoryReturn:
        return cls(data["source"], data["before_bytes"], data["held_bytes"],
                   data["tolerance_bytes"], data.get("best_bytes"))


def not_returned(accounts: list[MemoryReturn]) -> MemoryReturn | None:
    """The account that says least is missing, when every one of ``accounts`` says something
    is (beyond its tolerance); None when any says it came back, or none has a reading. Each
    room can be moved by what it does not see (other processes on the host; for the budget, an
    engine that did not run in it), so only what every room misses counts."""
    read = [account for account in accounts if account.returned is not None]
    if not read or any(account.returned for account in read):
        return None
    return min(read, key=lambda account: account.missing or 0)


def missing_now(account: MemoryReturn, room_now: int | None, *, held_then: dict[str, int],
                held_now: dict[str, int]) -> int | None:
    """What is still missing of what the engine held, reading the room now (None: unknown):
    the expected room less what the node's engines took since the judgement (the sum of their
    :func:`returned_by_stop` now against then, by engine id: the stopped engine started again,
    or a neighbour grew, took room that is not missing; one that stopped since gave some back),
    less the room now."""
    if room_now is None:
        return None
    taken_since = sum(held_now.values()) - sum(held_then.values())
    return max(account.expected - taken_since - room_now, 0)


# --- the guarded start --------------------------------------------------------------------------


def guard_floor(need: int, *, available_at_start: int | None, available_now: int | None,
                margin: int, fixed: int | None = None) -> tuple[int, int | None]:
    """``(floor, still_to_allocate)``: how low MemFree (or the budget's free room) may fall
    while the engine loads. ``fixed`` (a configured floor) when given; else what the engine
    still has to allocate plus ``margin``. What it has allocated since its start is read as
    the fall of MemAvailable (or the budget's room) since then, which page cache does not move,
    all counted as the engine's (so a neighbour's growth lowers the floor: fewer drops, never
    more); unknown: the whole need is still to come."""
    allocated = 0
    if available_at_start is not None and available_now is not None:
        allocated = max(available_at_start - available_now, 0)
    still = max(need - allocated, 0)
    if fixed is not None:
        return fixed, still
    return still + margin, still
