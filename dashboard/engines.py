"""What the pages show about engines: cards for the overview (each one
``collectors.enginecard.engine_card``, which the JSON API shares), series for the engine page, its
restart history, and durations as people read them (GiB and tok/s are written by
``sparkops.units``).

Every figure is None when unknown; templates and JSON show "unknown", never 0.
"""

from __future__ import annotations

from datetime import datetime

from collectors.enginecard import engine_card
from collectors.models import Engine, EngineMetric, EngineStart, Event, Node
from collectors.reads import present_engines
from collectors.starts import figure_errors
from dashboard.downsample import break_long_gaps, downsample
from dashboard.memory import RANGES, gap_step_seconds
from dashboard.restarts.models import Restart
from dashboard.series import chart_bucket_seconds, engine_points, resolution_for, source_label
from sparkops.units import UNKNOWN, gib_text, size_text

NOT_OBSERVED = "not observed yet"


def duration_text(seconds: float | None) -> str:
    """A duration as "45 s", "8 min 12 s" or "2 h 5 min"."""
    if seconds is None:
        return UNKNOWN
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        minutes, rest = divmod(whole, 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    hours, rest = divmod(whole, 3600)
    return f"{hours} h {rest // 60} min" if rest // 60 else f"{hours} h"


def node_engine_cards(node: Node) -> list[dict]:
    return [engine_card(e) for e in present_engines(node)]


ENGINE_SERIES = [
    ("prefill_tps", EngineMetric.PREFILL_TPS, "Prefill tok/s", "tok/s"),
    ("decode_tps", EngineMetric.DECODE_TPS, "Decode tok/s", "tok/s"),
    ("ttft_p50", EngineMetric.TTFT_P50, "TTFT p50", "s"),
    ("ttft_p95", EngineMetric.TTFT_P95, "TTFT p95", "s"),
    ("itl_p50", EngineMetric.ITL_P50, "Inter-token p50", "s"),
    ("itl_p95", EngineMetric.ITL_P95, "Inter-token p95", "s"),
    ("kv_usage", EngineMetric.KV_CACHE_USAGE, "KV cache usage", "fraction"),
    ("running", EngineMetric.REQUESTS_RUNNING, "Running", "requests"),
    ("waiting", EngineMetric.REQUESTS_WAITING, "Waiting", "requests"),
    # Speculative decoding; drawn only for an engine that decodes speculatively.
    ("spec_acceptance", EngineMetric.SPEC_ACCEPTANCE, "Draft acceptance", "fraction"),
    ("spec_tokens_per_step", EngineMetric.SPEC_TOKENS_PER_STEP, "Tokens per step", "tokens"),
]
SPEC_SERIES = {"spec_acceptance", "spec_tokens_per_step"}


def engine_series(engine: Engine, range_key: str, now: datetime, max_points: int,
                  interval: float) -> dict:
    """The engine page's series over ``range_key``; a failed scrape is simply absent (a gap).
    ``speculative`` says whether the engine decodes speculatively: then its acceptance rate and
    tokens per step are drawn, otherwise they are left out (never drawn as 0)."""
    span = RANGES[range_key]
    start = now - span
    resolution = resolution_for(span, interval)
    step = gap_step_seconds(span, max_points, interval, resolution)
    series = []
    summary = engine_card(engine)["spec_decode"]
    speculative = bool(summary and summary["speculative"])
    specs = [spec for spec in ENGINE_SERIES if speculative or spec[0] not in SPEC_SERIES]
    found = engine_points([engine], [spec[1] for spec in specs], start, None,
                          resolution, chart_bucket_seconds(span, max_points))
    for key, metric, label, unit in specs:
        points = found[engine.pk, metric]
        reduced = break_long_gaps(downsample(points, max_points) if points else [], step)
        series.append({"key": key, "label": label, "unit": unit,
                       "x": [at for at, _ in reduced],
                       "y": [value for _, value in reduced]})
    events = Event.objects.filter(engine=engine, at__gte=start).order_by("at")
    return {
        "engine": engine.name,
        "range": range_key,
        "start": start.isoformat(),
        "end": now.isoformat(),
        "source": source_label(resolution),
        "max_num_seqs": (engine.config or {}).get("max_num_seqs"),
        "speculative": speculative,
        "series": series,
        "events": [{"at": e.at.isoformat(), "kind": e.kind, "message": e.message}
                   for e in events],
    }


def recent_events(engine: Engine, limit: int = 20) -> list[Event]:
    return list(Event.objects.filter(engine=engine).order_by("-at")[:limit])


RESTART_HISTORY_LIMIT = 20


def restart_history(engine: Engine, limit: int = RESTART_HISTORY_LIMIT) -> list[dict]:
    """The engine's latest restarts, planned and unplanned, newest first, for its page."""
    rows = Restart.objects.filter(engine=engine).order_by("-requested_at", "-pk")[:limit]
    return [{
        "pk": r.pk,
        "kind": r.kind,
        "status": r.status,
        "requested_at": r.requested_at,
        "started_at": r.started_at,
        "finished_at": r.finished_at,
        "startup_seconds": r.startup_seconds,
        "startup_text": duration_text(r.startup_seconds) if r.startup_seconds is not None
        else ("not measured" if r.finished_at else "—"),
        "expected_text": duration_text(r.expected_startup_seconds),
        "outcome": r.outcome,
        "reason": r.reason,
    } for r in rows]


def humanise_ledger(ledger: dict | None) -> dict | None:
    """The overview's ledger bar (``dashboard.ledger.ledger_bar``) with ``*_text`` figures."""
    if ledger is None:
        return None
    for key in ("total", "available", "headroom"):
        ledger[f"{key}_text"] = gib_text(ledger.get(f"{key}_gib"))
    for segment in ledger["segments"]:
        segment["text"] = gib_text(segment["gib"])
    for marker in ledger["markers"]:
        marker["text"] = gib_text(marker["gib"])
    for row in ledger["engines"]:
        for key in ("weights", "kv", "graphs", "actual"):
            row[f"{key}_text"] = gib_text(row.get(f"{key}_gib"))
        # An engine asleep: each part it reports differently says why (collectors.vllm.sleep).
        for key, part in (("weights", "weights"), ("kv", "kv_pool"), ("actual", "actual")):
            note = (row.get("notes") or {}).get(part)
            if note:
                row[f"{key}_text"] = note if note.startswith(UNKNOWN) \
                    else f"{row[f'{key}_text']} — {note}"
        for key in ("estimate", "observed", "need"):
            row[f"{key}_text"] = size_text(row.get(f"{key}_bytes"))
        if row.get("observed_bytes") is None:
            # No dip was attributed to this engine yet: nothing was measured, not 0.
            row["observed_text"] = NOT_OBSERVED
    for process in ledger["processes"]:
        process["text"] = gib_text(process["gib"])
    return ledger


# Starts shown on the engine page, latest first.
STARTS_SHOWN = 5


def start_predictions(engine: Engine) -> list[dict]:
    """The engine's latest starts, each with what was predicted, what it reported and the
    error of each figure (``collectors.starts``); one query."""
    starts = EngineStart.objects.filter(engine=engine).order_by("-seen_at", "-pk")[:STARTS_SHOWN]
    return [{"start": start, "figures": figure_errors(start),
             "corrections": start.corrections or []} for start in starts]


def engine_span(engine: Engine) -> dict | None:
    """An engine spread over nodes as one engine: every row of its span (``Engine.span_key``,
    ``collectors.spanning``) on every node, head first, each with its node, its place, its
    container's state and the memory it holds (from its node's ledger, else its container's
    or GPU memory). None for an engine on one node. One query."""
    if not engine.span:
        return None
    rows = [engine] if not engine.span_key else list(
        Engine.objects.filter(span_key=engine.span_key).select_related("node"))
    parts = sorted((_span_row(row, row.pk == engine.pk) for row in rows),
                   key=lambda part: (part["role"] != "head", part["sort"], part["node"]))
    span = engine.span
    return {
        "key": engine.span_key,
        "backend": span.get("backend"),
        "basis": span.get("basis") or "",
        "ranks": span.get("ranks"),
        "ranks_text": str(span["ranks"]) if span.get("ranks") is not None
        else f"{UNKNOWN} — its flags do not say",
        "rendezvous": span.get("rendezvous") or f"{UNKNOWN} — its flags do not say",
        "matched": bool(engine.span_key),
        "parts": parts,
    }


def _span_row(row: Engine, this: bool) -> dict:
    span = row.span or {}
    rank, local = span.get("rank"), span.get("local") or 1
    if rank is None:
        place = "Ray worker" if span.get("backend") == "ray" else f"rank {UNKNOWN}"
    else:
        place = f"rank {rank}" if local <= 1 else f"ranks {rank}–{rank + local - 1}"
    running = row.present and row.container_state == "running"
    return {
        "node": row.node.name, "name": row.name, "this": this,
        "role": span.get("role") or "rank", "place": place, "sort": rank if rank is not None
        else 1_000_000, "serves_api": span.get("serves_api", True),
        "state": row.container_state if row.present else "gone", "phase": row.phase,
        "held_text": _held_text(row) if running
        else f"none (container {row.container_state if row.present else 'gone'})",
        "last_seen": row.last_seen,
    }


def _held_text(row: Engine) -> str:
    share = next((s for s in (row.node.ledger or {}).get("engines") or []
                  if s.get("engine_id") == row.pk), {})
    known = [v for v in (share.get("actual"), share.get("reserved"), row.memory_usage_bytes,
                         row.gpu_memory_bytes) if isinstance(v, int | float)]
    return size_text(max(known)) if known else f"{UNKNOWN} — not read"
