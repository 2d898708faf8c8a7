"""The overview's memory-ledger bar: who holds the node's unified memory, as segments of it.

Segments, left to right: each engine (weights, KV pool, CUDA graphs — or what it actually holds
when its parts are not reported), other processes, reclaimable page cache, free memory, and the
rest (kernel, slab, shared memory: MemTotal minus everything named). The headroom (MemAvailable)
is the right-hand region; each engine's prefill need is marked from its start.
"""

from __future__ import annotations

from collectors.models import Node
from sparkops.units import gib


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
             "need_bytes": s["prefill_need"]}
            for s in ledger.get("engines", [])
        ],
        "processes": [{"name": p["name"], "gib": _gib(p["rss_bytes"]), "count": p["count"]}
                      for p in ledger.get("processes", [])],
        "at": ledger.get("at"),
    }


def _engine_segments(share: dict) -> list[dict]:
    parts = [("weights", share.get("weights")), ("KV pool", share.get("kv_pool")),
             ("CUDA graphs", share.get("cuda_graphs"))]
    if any(value is None for _, value in parts[:2]):
        actual = share.get("actual")
        return [{"kind": "engine", "label": f"{share['name']} (parts not reported)",
                 "bytes": actual}] if actual else []
    return [{"kind": f"engine-{i}", "label": f"{share['name']}: {name}", "bytes": value}
            for i, (name, value) in enumerate(parts) if value]
