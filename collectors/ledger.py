"""The memory ledger of a node: who holds the unified memory, and how much room is left.

Built after every host-memory collection from what each engine reports about itself (startup
log, ``cache_config_info``, flags), the page cache, every other process by name, and the
headroom (MemAvailable with the interval's minimum). A figure nobody reported stays None. A
vLLM engine asleep (sleep mode) is counted for what it still holds, each part with the reason
(:attr:`EngineShare.notes`, from ``collectors.vllm.sleep``).

When the engines are confined to a memory budget (a memory cgroup,
``SPARKOPS_MEMORY_BUDGET_CGROUP``), the room a prefill can really get is the smaller of the
host's headroom and the budget's room (its limit less its working set, with the interval's
minimum): :attr:`Ledger.headroom` is that smaller figure, and :attr:`Ledger.headroom_source`
says which one bounds it. While the budget bounds it, only what runs inside the budget can take
that room, so only the parts of engines inside it are causes (:func:`budget_components`); and
prefill dips are read from the budget's room, which other programs' memory does not move.

Components whose size moves by more than the node's change threshold are recorded as
:class:`LedgerChange` rows: the causes an alert can name. They are each engine's KV pool and
non-KV memory, and, for an engine that loads whole models on demand and reports no KV pool
(Ollama), its loaded models (a model loaded or unloaded moves it), the page cache and every
other process by name.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
from django.conf import settings

from collectors.docker_api import memory_cgroup
from collectors.models import Engine, LedgerChange, Node
from collectors.processes import ProcessGroup, memory_by_process_name
from collectors.procfs import (
    cgroup_entries,
    cgroup_path_in_hierarchy,
    container_id_in_cgroup_path,
    container_ids_for_pids,
    in_memory_cgroup,
    read_bytes,
)
from collectors.reads import present_engines
from collectors.vllm.sleep import held_while_asleep
from sparkops.rowwrites import save_fields
from sparkops.units import GIB

# On GB10 (compute capability 12.1) vLLM 0.33 keeps the small scheduler tier of
# EngineArgs.get_batch_defaults: 2048 batched tokens unless the flag says otherwise.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
PREFILL_LABEL = "sparkops.prefill-bytes-per-token"
TOP_PROCESSES = 8


@dataclass
class EngineShare:
    """One engine's part of the ledger, in bytes (None: not reported)."""

    engine_id: int
    name: str
    weights: int | None
    kv_pool: int | None
    cuda_graphs: int | None
    actual: int | None  # what the engine really holds (NVML per-process or its cgroup)
    prefill_estimate: int | None
    prefill_observed: int | None
    prefill_need: int | None
    prefill_need_source: str | None  # "observed" or "estimate"
    in_budget: bool | None = None  # runs inside the node's memory budget (None: no budget)
    # What an engine that loads whole models on demand (Ollama) holds in them: each loaded
    # model's whole size (weights, KV cache and compute graph together) summed, 0 with none
    # loaded or the container stopped; None for a kind that reports no such sizes, or when
    # its last read failed (the sizes it holds now are not known).
    loaded_models: int | None = None
    loaded_model_names: list[str] = field(default_factory=list)
    # A vLLM engine asleep (its phase, e.g. "sleeping_level_1"; None when awake) holds less than
    # it reported at startup: ``weights`` and ``kv_pool`` are what it still holds
    # (collectors.vllm.sleep), and ``notes`` says why for each part (part -> words).
    sleeping: str | None = None
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def reserved(self) -> int | None:
        parts = (self.weights, self.kv_pool, self.cuda_graphs)
        return None if any(p is None for p in parts) else sum(parts)  # type: ignore[arg-type]

    @property
    def non_kv(self) -> int | None:
        if self.actual is None or self.kv_pool is None:
            return None
        return max(self.actual - self.kv_pool, 0)


@dataclass
class Ledger:
    at: str
    mem_total: int | None
    mem_available: int | None
    mem_available_min: int | None
    page_cache_reclaimable: int | None
    swap_used: int | None
    engines: list[EngineShare] = field(default_factory=list)
    processes: list[dict] = field(default_factory=list)  # top processes: name, rss_bytes, count
    others_total: int | None = None
    # The memory budget's figures (collectors.hostmemory.budget_figures); None without one.
    budget: dict[str, Any] | None = None

    @property
    def host_headroom(self) -> int | None:
        """The host's room for a transient buffer: the interval's lowest MemAvailable."""
        return self.mem_available_min if self.mem_available_min is not None \
            else self.mem_available

    @property
    def budget_headroom(self) -> int | None:
        """The memory budget's room, its interval minimum first; None without a budget, and
        for an unlimited or unreadable one (then it has no room figure of its own)."""
        if not self.budget:
            return None
        lowest = self.budget.get("room_min")
        return lowest if lowest is not None else self.budget.get("room")

    @property
    def headroom(self) -> int | None:
        """Room left for a transient buffer: the smaller of the host's and the budget's."""
        known = [v for v in (self.host_headroom, self.budget_headroom) if v is not None]
        return min(known) if known else None

    @property
    def headroom_source(self) -> str | None:
        """What bounds :attr:`headroom`: "budget" (the memory budget's room) or "host"
        (MemAvailable); None when neither is known."""
        budget, host = self.budget_headroom, self.host_headroom
        if budget is not None and (host is None or budget <= host):
            return "budget"
        return "host" if host is not None else None

    @property
    def headroom_now(self) -> int | None:
        """The room at the end of the interval, without its minimum: the smaller of
        MemAvailable and the budget's room then. An engine whose own prefill made the
        interval's dip is judged by this."""
        budget_room = (self.budget or {}).get("room")
        known = [v for v in (self.mem_available, budget_room) if v is not None]
        return min(known) if known else None

    def as_dict(self) -> dict:
        data = asdict(self)
        for share, engine in zip(data["engines"], self.engines, strict=True):
            share["reserved"] = engine.reserved
            share["non_kv"] = engine.non_kv
        data["headroom"] = self.headroom
        data["headroom_source"] = self.headroom_source
        data["host_headroom"] = self.host_headroom
        data["budget_headroom"] = self.budget_headroom
        data["headroom_now"] = self.headroom_now
        return data


# The parts of an engine that are ledger components (``engine:<id>:<part>``): what can move
# and be named as an alert's cause.
ENGINE_COMPONENTS = ("kv_pool", "non_kv", "loaded_models")


def budget_components(ledger: dict) -> set[str] | None:
    """The ledger components that can have taken the headroom, when the memory budget bounds
    it: the KV pools, non-KV memory and loaded models of the engines running inside the budget
    (the host's
    page cache and processes outside the engines' containers take none of the budget's room;
    processes are counted by name across the host, so none of them is named). None when the
    budget does not bound the headroom: then every component counts."""
    if ledger.get("headroom_source") != "budget":
        return None
    return {f"engine:{share['engine_id']}:{part}"
            for share in ledger.get("engines", []) if share.get("in_budget")
            for part in ENGINE_COMPONENTS
            if part != "loaded_models" or share.get("loaded_models") is not None}


def _gib_to_bytes(value: float | None) -> int | None:
    return None if value is None else int(value * GIB)


def prefill_estimate(engine: Engine) -> int | None:
    """``--max-num-batched-tokens`` × activation bytes per token (admin setting, container label
    ``sparkops.prefill-bytes-per-token``, or the model's config.json, in that order)."""
    per_token = engine.prefill_bytes_per_token
    if per_token is None and (engine.labels or {}).get(PREFILL_LABEL, "").isdigit():
        per_token = int(engine.labels[PREFILL_LABEL])
    per_token = per_token or engine.model_bytes_per_token
    if per_token is None:
        return None
    tokens = (engine.config or {}).get("max_num_batched_tokens") or DEFAULT_MAX_NUM_BATCHED_TOKENS
    return tokens * per_token


# An engine in these phases has not allocated its KV pool yet (vLLM loads its weights and
# profiles first).
LOADING_PHASES = ("starting", "loading", "profiling")
# vLLM prints its memory figures in GiB with two decimals.
LOG_GIB_PRECISION = 0.005


def current_snapshot(engine: Engine) -> dict[str, Any]:
    """The engine's last metrics snapshot when it was read from the container start the engine
    runs now; empty otherwise: a container recreated under the same name holds nothing of the
    pool its predecessor reported until it reports its own (a start still loading weights
    would otherwise be shown holding the old pool). A model adopted from a router was read
    under the router's start followed by its own part."""
    metrics = engine.metrics or {}
    read_for = str(metrics.get("identity") or "")
    if read_for and not read_for.startswith(engine.start_identity):
        return {}
    return metrics.get("snapshot") or {}


def _logged_pool(engine: Engine, startup: dict[str, Any]) -> int | None:
    """The pool as the start-up log prints it (two decimals of GiB), or as pinned by its flag
    where the log confirms the flag to those decimals (exact) or says nothing (a log not read).
    An engine still loading has not allocated it yet, whatever its flag says
    (collectors.starts predicts it meanwhile)."""
    pinned = (engine.config or {}).get("kv_cache_memory_bytes")
    logged = startup.get("kv_cache_gib")
    if logged is not None:
        if pinned and abs(pinned / GIB - logged) <= LOG_GIB_PRECISION:
            return pinned
        return _gib_to_bytes(logged)
    return None if engine.phase in LOADING_PHASES else pinned


def engine_share(engine: Engine, in_budget: bool | None = None) -> EngineShare:
    startup = engine.startup or {}
    snapshot = current_snapshot(engine)
    kv_pool = snapshot.get("kv_cache_memory_bytes") or _logged_pool(engine, startup)
    graphs = startup.get("cuda_graph_gib")
    # On GB10 vLLM's profiler can report negative CUDA-graph memory (`Estimated CUDA graph
    # memory` a few GiB below zero): the graphs hold none then.
    cuda_graphs = None if graphs is None else max(_gib_to_bytes(graphs) or 0, 0)
    actual_candidates = [v for v in (engine.gpu_memory_bytes, engine.memory_usage_bytes)
                         if v is not None]
    estimate = prefill_estimate(engine)
    observed = engine.prefill_observed_bytes
    need, source = None, None
    if estimate is not None or observed is not None:
        if observed is not None and (estimate is None or observed > estimate):
            need, source = observed, "observed"
        else:
            need, source = estimate, "estimate"
    loaded, names = loaded_models(engine)
    weights = _gib_to_bytes(startup.get("weights_gib"))
    asleep = held_while_asleep(engine.phase, weights, kv_pool, engine.config or {},
                               startup.get("version"))
    if asleep is not None:
        weights, kv_pool = asleep.weights, asleep.kv_pool
    return EngineShare(
        engine_id=engine.pk,
        name=engine.name,
        weights=weights,
        kv_pool=kv_pool,
        cuda_graphs=cuda_graphs,
        actual=max(actual_candidates) if actual_candidates else None,
        prefill_estimate=estimate,
        prefill_observed=observed,
        prefill_need=need,
        prefill_need_source=source,
        in_budget=in_budget,
        loaded_models=loaded,
        loaded_model_names=names,
        sleeping=engine.phase if asleep is not None else None,
        notes=dict(asleep.notes) if asleep is not None else {},
    )


def loaded_models(engine: Engine) -> tuple[int | None, list[str]]:
    """``(bytes, names)`` of the whole models an engine that loads them on demand holds now
    (Ollama's ``/api/ps``, stored by its reader as ``metrics["details"]``: ``size_bytes``, the
    sum of every loaded model's ``size``, and ``models``). ``(None, [])`` for a kind that
    reports no such sizes and while the last read failed (what it held then may have been
    unloaded since); ``(0, [])`` once its container stopped, which frees them all."""
    details = (engine.metrics or {}).get("details") or {}
    size = details.get("size_bytes")
    if not isinstance(size, int) or not isinstance(details.get("models"), list):
        return None, []
    if engine.container_state != "running":
        return 0, []
    if engine.last_scrape_error:
        return None, []
    return size, [str(model.get("name")) for model in details["models"]
                  if isinstance(model, dict) and model.get("name")]


def build_ledger(node: Node, now: datetime, figures: dict[str, Any],
                 engines: list[Engine], processes: list[ProcessGroup],
                 in_budget: set[int] | None = None) -> Ledger:
    """Assemble the ledger; ``figures`` holds this collection's host numbers in bytes and the
    memory budget's (``"budget"``, when one is watched); ``in_budget`` the ids of the engines
    running inside that budget."""
    budget = figures.get("budget")
    return Ledger(
        at=now.isoformat(),
        mem_total=figures.get("mem_total") or node.mem_total_bytes,
        mem_available=figures.get("mem_available"),
        mem_available_min=figures.get("mem_available_min"),
        page_cache_reclaimable=figures.get("page_cache_reclaimable"),
        swap_used=figures.get("swap_used"),
        engines=[engine_share(e, None if budget is None else e.pk in (in_budget or set()))
                 for e in engines],
        processes=[{"name": p.name, "rss_bytes": p.rss_bytes, "count": p.count}
                   for p in processes[:TOP_PROCESSES]],
        others_total=sum(p.rss_bytes for p in processes) if processes else None,
        budget=budget,
    )


def change_threshold(mem_total: int | None) -> int:
    """Smallest move worth a ledger row: a fraction of the node's memory (0.5 % ≈ 0.6 GiB on a
    GB10), so that one rule fits both a GB10 and a small test machine."""
    fraction = settings.SPARKOPS_LEDGER_CHANGE_FRACTION
    return int((mem_total or 128 * GIB) * fraction)


def _components(ledger: Ledger) -> dict[str, tuple[int | None, int | None, str]]:
    """component key -> (bytes, engine id, label for people)."""
    parts: dict[str, tuple[int | None, int | None, str]] = {
        "page_cache": (ledger.page_cache_reclaimable, None, "page cache"),
    }
    for share in ledger.engines:
        parts[f"engine:{share.engine_id}:kv_pool"] = (share.kv_pool, share.engine_id,
                                                      f"{share.name}'s KV pool")
        parts[f"engine:{share.engine_id}:non_kv"] = _beyond_pool(share)
        if share.loaded_models is not None:
            held = ", ".join(share.loaded_model_names) or "none loaded"
            parts[f"engine:{share.engine_id}:loaded_models"] = (
                share.loaded_models, share.engine_id, f"{share.name}'s loaded models ({held})")
    for process in ledger.processes:
        parts[f"process:{process['name']}"] = (process["rss_bytes"], None,
                                               f"process {process['name']}")
    return parts


def _beyond_pool(share: EngineShare) -> tuple[int | None, int | None, str]:
    """What an engine holds beyond its KV pool, as a ledger component.

    While its pool is not reported (an engine still loading weights and allocating it, or a
    kind that never reports one), everything it holds is told as this one part: a neighbour's
    start that takes the room is then a cause before its pool is known, not invisible. Once the
    pool is reported the part falls back to what lies beyond it, and over a look-back the two
    moves net out (``dashboard.alerting.rules.prefill_squeeze.causes``). Not for an engine that
    reports whole loaded models instead (Ollama): those are its own part.
    """
    if share.kv_pool is None and share.loaded_models is None and share.actual is not None:
        return share.actual, share.engine_id, f"{share.name}'s memory (KV pool not reported)"
    return share.non_kv, share.engine_id, f"{share.name}'s non-KV memory"


def record_changes(node: Node, ledger: Ledger, now: datetime) -> list[LedgerChange]:
    """Write a LedgerChange for each component that moved past the threshold since its last
    recorded size, and keep the new sizes as the node's baseline. Unknown sizes are skipped."""
    threshold = change_threshold(ledger.mem_total)
    baseline = dict(node.ledger_baseline or {})
    changes = []
    for key, (size, engine_id, label) in _components(ledger).items():
        if size is None:
            continue
        before = baseline.get(key)
        if before is None:
            baseline[key] = size
            if key.startswith("engine:") and key.rsplit(":", 1)[1] in ENGINE_COMPONENTS:
                # A new engine's pool appearing is itself a change: the room it took. "Before"
                # is unknown (NULL): it did not exist.
                changes.append(LedgerChange(node=node, engine_id=engine_id, component=key,
                                            label=label, at=now, before_bytes=None,
                                            after_bytes=size))
            continue
        if abs(size - before) >= threshold:
            changes.append(LedgerChange(node=node, engine_id=engine_id, component=key,
                                        label=label, at=now, before_bytes=before,
                                        after_bytes=size))
            baseline[key] = size
    LedgerChange.objects.bulk_create(changes)
    node.ledger = ledger.as_dict()
    node.ledger_baseline = baseline
    save_fields(node, ["ledger", "ledger_baseline"])
    return changes


def record_prefill_observation(engines: list[Engine], previous_available: int | None,
                               window_last: int | None, window_min: int | None,
                               now: datetime) -> Engine | None:
    """Attribute this interval's transient dip to the one engine that prefilled in it.

    Only the *transient* part counts: the dip below both the previous collection's MemAvailable
    and this interval's last one, so a lasting drop (a neighbour restarting with a bigger pool)
    is never mistaken for a prefill buffer. Nothing is attributed when several engines
    prefilled. An engine's observed need only rises. Returns the engine updated, if any.
    """
    prefilling = [e for e in engines if ((e.rates or {}).get("prefill_tokens_per_s") or 0) > 0]
    if len(prefilling) != 1 or None in (previous_available, window_last, window_min):
        return None
    engine = prefilling[0]
    dip = min(previous_available, window_last) - window_min  # type: ignore[type-var,operator]
    if dip <= 0 or (engine.prefill_observed_bytes or 0) >= dip:
        return None
    engine.prefill_observed_bytes = dip
    engine.prefill_observed_at = now
    engine.save(update_fields=["prefill_observed_bytes", "prefill_observed_at"])
    return engine


def update_ledger(node: Node, figures: dict[str, Any], now: datetime) -> Ledger:
    """After a collection: rebuild the node's ledger, record what changed, and learn prefill
    needs from the interval's dip. Engine processes are left out of "everything else"."""
    engines = present_engines(node)
    container_ids = {e.container_id for e in engines if e.container_state == "running"}
    processes = engine_processes(container_ids)
    engine_pids = {pid for pids in processes.values() for pid in pids}
    budget = figures.get("budget")
    inside = engines_in_budget(engines, processes, budget) if budget else None
    ledger = build_ledger(node, now, figures, engines, memory_by_process_name(engine_pids),
                          in_budget=inside)
    record_prefill_observation(engines, *dip_figures(node.ledger or {}, figures), now)
    record_changes(node, ledger, now)
    return ledger


def dip_figures(previous: dict, figures: dict[str, Any]
                ) -> tuple[int | None, int | None, int | None]:
    """``(previous, last, lowest)`` of the figure a prefill's dip is read from: the memory
    budget's room when it is known in both collections (the engines run inside it, and other
    programs' memory does not move it), else MemAvailable."""
    budget, before = figures.get("budget") or {}, previous.get("budget") or {}
    if None not in (budget.get("room"), budget.get("room_min"), before.get("room")):
        return before["room"], budget["room"], budget["room_min"]
    return (previous.get("mem_available"), figures.get("mem_available"),
            figures.get("mem_available_min"))


def engine_processes(container_ids: set[str]) -> dict[str, list[int]]:
    """container id -> the PIDs that belong to it, lowest first: the processes whose cgroup
    file names the container.

    Each container's processes are listed from its own memory cgroup (``cgroup.procs`` there
    and below, as the discovery found it, :func:`collectors.docker_api.memory_cgroup`), each
    one's cgroup file confirming it: a few reads per engine. Where a container's cgroup is not
    known or not readable, every process of the host is read instead (its cgroup file each).
    """
    if not container_ids:
        return {}
    found: dict[str, list[int]] = {}
    for cid in container_ids:
        pids = _pids_in_container_cgroup(cid)
        if pids is None:
            return _engine_processes_by_walk(container_ids)
        if pids:
            found[cid] = pids
    return found


def _pids_in_container_cgroup(container_id: str) -> list[int] | None:
    """The container's PIDs from its memory cgroup and those below it; None when that cgroup
    is not known, not the container's own, or not readable, or a PID in it is not confirmed
    by its cgroup file as the container's."""
    directory = memory_cgroup(container_id)
    if directory is None or container_id_in_cgroup_path(str(directory)) != container_id:
        return None
    pids: set[int] = set()
    try:
        for folder, _, _ in os.walk(directory, onerror=_raise):
            pids.update(int(line) for line in read_bytes(f"{folder}/cgroup.procs").split())
    except (OSError, ValueError):
        return None
    owners = container_ids_for_pids(pids)
    # A PID that exited since the listing has no cgroup file left (None); one whose cgroup file
    # names another container first (a nested one) is counted for that one by the host walk.
    if any(cid not in (None, container_id) for cid in owners.values()):
        return None
    return sorted(pid for pid, cid in owners.items() if cid == container_id)


def _raise(error: OSError) -> None:
    raise error


def _engine_processes_by_walk(container_ids: set[str]) -> dict[str, list[int]]:
    """:func:`engine_processes` from every process's cgroup file (one pass over /proc)."""
    found: dict[str, list[int]] = {}
    for pid, cid in container_ids_for_pids(psutil.pids()).items():
        if cid in container_ids:
            found.setdefault(cid, []).append(pid)
    return found


def engines_in_budget(engines: list[Engine], processes: dict[str, list[int]],
                      budget: dict[str, Any]) -> set[int]:
    """Ids of the engines whose container's processes sit at or below the budget's cgroup."""
    path = cgroup_path_in_hierarchy(Path(budget["cgroup"]))
    if path is None or budget.get("version") not in (1, 2):
        return set()
    inside = set()
    for engine in engines:
        # One process tells: a container's processes share its cgroup or sit below it.
        pid = next(iter(processes.get(engine.container_id, [])), None)
        entries = None if pid is None else cgroup_entries(pid)
        if entries is not None and in_memory_cgroup(entries, path, budget["version"]):
            inside.add(engine.pk)
    return inside
