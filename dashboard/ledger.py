"""The overview's memory-ledger bar: who holds the node's unified memory, as segments of it.

Segments, left to right: each engine (weights, KV pool, CUDA graphs — or what it actually holds
when its parts are not reported), other processes, reclaimable page cache, free memory, and the
rest (kernel, slab, shared memory: MemTotal minus everything named). The headroom (MemAvailable)
is the right-hand region; each engine's prefill need is marked from its start. When the engines
run in a memory budget whose room is smaller, where that room ends is marked too, and the
headroom is told in words within the budget (:func:`headroom_words`).
"""

from __future__ import annotations

from collectors.models import Node
from sparkops.units import bytes_text, gib


def _pct(value: int, total: int) -> float:
    return round(100 * value / total, 2) if total else 0.0


def _gib(value: int | None) -> float | None:
    # Two decimals: the bar's hover texts and the ledger table show hundredths of a GiB.
    return gib(value, 2)


def ledger_bar(node: Node) -> dict | None:
    """Segments and markers for the bar, or None before the first ledger."""
    ledger = node.ledger or {}
    total = ledger.get("mem_total") or node.mem_total_bytes
    if not ledger or not total:
        return None
    available = ledger.get("mem_available")
    cache = ledger.get("page_cache_reclaimable") or 0
    free = max(available - cache, 0) if available is not None else 0
    held: list[dict] = []
    for share in ledger.get("engines", []):
        held += _engine_segments(share)
    if ledger.get("others_total"):
        held.append({"kind": "others", "label": "other processes",
                     "bytes": ledger["others_total"]})
    rest = total - sum(s["bytes"] for s in held) - cache - free
    tail = [
        {"kind": "rest", "label": "kernel and unattributed", "bytes": rest},
        {"kind": "cache", "label": "reclaimable page cache", "bytes": cache},
        {"kind": "free", "label": "free", "bytes": free},
    ]
    segments = held + [segment for segment in tail if segment["bytes"] > 0]
    for segment in segments:
        segment["pct"] = _pct(segment["bytes"], total)
        segment["gib"] = _gib(segment["bytes"])
    headroom = ledger.get("headroom")
    start = total - available if available is not None else None
    budget_room = _bounding_budget_room(ledger)
    markers = [
        {"engine": share["name"], "gib": _gib(share["prefill_need"]),
         "source": share["prefill_need_source"],
         "pct": min(_pct(start + share["prefill_need"], total), 100.0)}
        for share in ledger.get("engines", [])
        if share.get("prefill_need") is not None and start is not None
    ]
    return {
        "total_gib": _gib(total),
        "available_gib": _gib(available),
        "headroom_gib": _gib(headroom),
        "headroom_start_pct": _pct(start, total) if start is not None else None,
        "budget_end_pct": min(_pct(start + budget_room, total), 100.0)
        if start is not None and budget_room is not None else None,
        "headroom_source": ledger.get("headroom_source"),
        "headroom_words": headroom_words(ledger, total),
        "segments": segments,
        "markers": markers,
        "engines": [
            {"name": s["name"], "weights_gib": _gib(s["weights"]), "kv_gib": _gib(s["kv_pool"]),
             "graphs_gib": _gib(s["cuda_graphs"]), "actual_gib": _gib(s["actual"]),
             "estimate_gib": _gib(s["prefill_estimate"]),
             "observed_gib": _gib(s["prefill_observed"]), "need_gib": _gib(s["prefill_need"]),
             "need_source": s["prefill_need_source"],
             # Bytes too: a prefill buffer can be a few MiB, which two decimals of GiB show as 0.
             "estimate_bytes": s["prefill_estimate"], "observed_bytes": s["prefill_observed"],
             "need_bytes": s["prefill_need"],
             # Why a part of an engine asleep reads as it does (collectors.vllm.sleep).
             "sleeping": s.get("sleeping"), "notes": s.get("notes") or {},
             # Ollama sizes each loaded model with the compute buffer its prefills use.
             "need_in_model_size": s.get("loaded_models") is not None}
            for s in ledger.get("engines", [])
        ],
        "processes": [{"name": p["name"], "gib": _gib(p["rss_bytes"]), "count": p["count"]}
                      for p in ledger.get("processes", [])],
        "at": ledger.get("at"),
    }


def _engine_segments(share: dict) -> list[dict]:
    parts = [("weights", share.get("weights")), ("KV pool", share.get("kv_pool")),
             ("CUDA graphs", share.get("cuda_graphs"))]
    asleep = (share.get("notes") or {}).get("actual")
    if any(value is None for _, value in parts[:2]) or asleep:
        # Parts not reported, or gone (asleep at level 2): what its process holds is the segment.
        actual = share.get("actual")
        what = ": process memory while asleep" if asleep else " (parts not reported)"
        return [{"kind": "engine", "label": f"{share['name']}{what}",
                 "bytes": actual}] if actual else []
    return [{"kind": f"engine-{i}", "label": f"{share['name']}: {name}", "bytes": value}
            for i, (name, value) in enumerate(parts) if value]


def _bounding_budget_room(ledger: dict) -> int | None:
    """The memory budget's room when it bounds the headroom, else None."""
    return ledger.get("budget_headroom") if ledger.get("headroom_source") == "budget" else None


def headroom_words(ledger: dict, total: int | None) -> str:
    """The ledger's headroom in words: MemAvailable and its interval minimum of MemTotal and,
    when the engines run in a memory budget, the budget's room and limit, saying which of the
    two bounds the headroom (an unlimited or unreadable budget says so)."""
    host_lowest = ledger.get("host_headroom", ledger.get("headroom"))
    host = (f"MemAvailable {bytes_text(ledger.get('mem_available'))}, lowest in the interval "
            f"{bytes_text(host_lowest)}, of {bytes_text(total)}")
    budget = ledger.get("budget")
    if not budget:
        return host
    where = f"the memory budget {budget.get('cgroup')}"
    if budget.get("limit") is None:
        if budget.get("unlimited"):
            return f"{host}; {where} has no limit, so MemAvailable bounds the headroom"
        return f"{host}; {where} could not be read ({budget.get('note')})"
    within = f"within {where} (limit {bytes_text(budget['limit'])})"
    room = ledger.get("budget_headroom")  # its interval minimum, else its room at the end
    if room is None:
        return f"{host}; the room {within} is unknown ({budget.get('note')})"
    if ledger.get("headroom_source") == "budget":
        return (f"{bytes_text(room)} {within}, its lowest room in the interval; the host has "
                f"{host}")
    return f"{host}; the room {within} is {bytes_text(room)}, more than that"
