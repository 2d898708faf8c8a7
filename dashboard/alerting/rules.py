"""The six alert rules: each turns the node's ledger and engine state into Conditions.

Plain functions over stored state (the ledger written after each collection, engine rows and
samples, ledger changes); the lifecycle decides what fires. Thresholds come from
``dashboard.alerting.settings.rule_settings`` (defaults documented there, editable by admins).
All sizes are compared in GiB.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from collectors.models import (
    Engine,
    EngineMetric,
    EngineSample,
    LedgerChange,
    Metric,
    Node,
    Sample,
)
from dashboard.alerting.conditions import Condition
from dashboard.alerting.settings import all_rule_settings, rule_settings

GIB = 1024**3
STARTING_PHASES = {"starting", "loading", "profiling", "kv_allocated"}

Rule = Callable[[Node, dict, list[Engine], dict[str, Any], datetime], list[Condition]]


def _gib(value: int | float | None) -> float | None:
    return None if value is None else value / GIB


def _fmt(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.2f} GiB"


def prefill_squeeze(node: Node, ledger: dict, engines: list[Engine], t: dict[str, Any],
                    now: datetime) -> list[Condition]:
    """Headroom (interval minimum) minus a margin below an engine's transient prefill need."""
    by_id = {e.pk: e for e in engines}
    conditions = []
    for share in ledger.get("engines", []):
        engine = by_id.get(share["engine_id"])
        if engine is None or engine.phase != "ready" or share.get("prefill_need") is None:
            continue
        # Its own prefill dips the minimum: judge an engine that prefilled by MemAvailable now.
        own_prefill = ((engine.rates or {}).get("prefill_tokens_per_s") or 0) > 0
        headroom = ledger.get("mem_available") if own_prefill else ledger.get("headroom")
        need = _gib(share["prefill_need"])
        value = None if headroom is None else _gib(headroom) - t["margin_gib"]
        causes = _causes(node, engine, now, t["lookback_minutes"])
        summary = (f"{engine.name} may not fit its next prefill: headroom {_fmt(_gib(headroom))}"
                   f" − margin {t['margin_gib']:.2f} GiB < prefill need {_fmt(need)}"
                   f" ({share['prefill_need_source']})")
        if causes:
            summary += f"; cause: {causes[0]['text']}"
        conditions.append(Condition(
            rule="prefill-squeeze", node_id=node.pk, engine_id=engine.pk, value=value,
            threshold=need, clear=need + t["hysteresis_gib"], direction="below",
            severity="critical", summary=summary,
            details={"engine": engine.name, "headroom_bytes": headroom,
                     "margin_gib": t["margin_gib"], "prefill_need_bytes": share["prefill_need"],
                     "prefill_need_source": share["prefill_need_source"],
                     "prefill_estimate_bytes": share.get("prefill_estimate"),
                     "prefill_observed_bytes": share.get("prefill_observed"),
                     "causes": causes},
        ))
    return conditions


def _causes(node: Node, engine: Engine, now: datetime, lookback_minutes: float) -> list[dict]:
    """Net ledger growth per component in the look-back window, largest first, excluding the
    engine at risk.

    Netting matters: a neighbour that is recreated shows its non-KV memory climbing step by step
    while its weights load; several small steps must not outrank one real move, and a component
    that went up and back down took no room.
    """
    changes = LedgerChange.objects.filter(
        node=node, at__gte=now - timedelta(minutes=lookback_minutes), at__lte=now
    ).exclude(engine=engine).order_by("at")
    net: dict[str, dict] = {}
    for change in changes:
        entry = net.setdefault(change.component, {"first": change, "last": change})
        entry["last"] = change
    causes = []
    for component, entry in net.items():
        first, last = entry["first"], entry["last"]
        appeared = first.before_bytes is None
        # A component that appeared and then moved is told by its move ("8 → 24 GiB"); one that
        # only appeared took all of its size.
        before = (first.after_bytes if first is not last else 0) if appeared \
            else first.before_bytes
        after = last.after_bytes or 0
        if after <= (before or 0):
            continue
        text = (f"{last.label} appeared with {_gib(after):.2f} GiB" if appeared and first is last
                else f"{last.label} went {_gib(before or 0):.2f} → {_gib(after):.2f} GiB")
        causes.append({
            "component": component,
            "label": last.label,
            "before_bytes": before,
            "after_bytes": after,
            "growth_bytes": after - (before or 0),
            "at": last.at.isoformat(),
            "text": f"{text} at {last.at:%H:%M:%S} UTC",
        })
    return sorted(causes, key=lambda cause: -cause["growth_bytes"])[:3]


def headroom_floor(node: Node, ledger: dict, engines: list[Engine], t: dict[str, Any],
                   now: datetime) -> list[Condition]:
    """MemAvailable below the floor: on GB10 running out wedges the host instead of an OOM."""
    total = ledger.get("mem_total") or node.mem_total_bytes
    floor = min(t["floor_gib"], t["floor_percent"] / 100 * _gib(total)) if total \
        else t["floor_gib"]
    available = _gib(ledger.get("mem_available"))
    swap = _gib(ledger.get("swap_used"))
    growth = _swap_growth_mib_per_min(node, ledger, now)
    swapping = growth is not None and growth > t["swap_growth_mib_per_min"]
    # Growing swap counts as below the floor whatever MemAvailable says: it is how running short
    # shows before the host wedges.
    value = floor - 0.001 if swapping else available
    reason = (f"swap in use grows {growth:.0f} MiB/min" if swapping
              else f"MemAvailable {_fmt(available)} is below the floor of {floor:.2f} GiB")
    return [Condition(
        rule="headroom-floor", node_id=node.pk, engine_id=None, value=value,
        threshold=floor, clear=floor + t["hysteresis_gib"], direction="below",
        severity="critical",
        summary=f"{node.name}: {reason} (swap in use {_fmt(swap)}); the host may wedge",
        details={"mem_available_bytes": ledger.get("mem_available"), "floor_gib": floor,
                 "swap_used_bytes": ledger.get("swap_used"),
                 "swap_growth_mib_per_min": growth},
    )]


def _swap_growth_mib_per_min(node: Node, ledger: dict, now: datetime) -> float | None:
    """Swap-in-use growth over about the last minute, from the host samples."""
    current = ledger.get("swap_used")
    earlier = Sample.objects.filter(
        node=node, metric=Metric.SWAP_USED, at__lte=now - timedelta(seconds=50),
        at__gte=now - timedelta(minutes=5), value__isnull=False,
    ).order_by("-at").values_list("at", "value").first()
    if current is None or earlier is None:
        return None
    minutes = max((now - earlier[0]).total_seconds() / 60, 1 / 60)
    return (current - earlier[1]) / (1024**2) / minutes


def queue_backlog(node: Node, ledger: dict, engines: list[Engine], t: dict[str, Any],
                  now: datetime) -> list[Condition]:
    """Requests waiting for longer than a threshold: every slot is taken."""
    conditions = []
    for engine in engines:
        if engine.phase != "ready":
            continue
        waited = _seconds_waiting(engine, now)
        slots = (engine.config or {}).get("max_num_seqs")
        conditions.append(Condition(
            rule="queue-backlog", node_id=node.pk, engine_id=engine.pk, value=waited,
            threshold=t["waiting_seconds"], clear=t["waiting_seconds"] / 2, direction="above",
            severity="warning",
            summary=(f"{engine.name}: requests have waited for {waited or 0:.0f} s "
                     f"(slots: {slots or 'vLLM default'}); new users see a long first token"),
            details={"engine": engine.name, "waiting_seconds": waited, "max_num_seqs": slots},
        ))
    return conditions


def _seconds_waiting(engine: Engine, now: datetime) -> float | None:
    rows = list(EngineSample.objects.filter(
        engine=engine, metric=EngineMetric.REQUESTS_WAITING, at__gte=now - timedelta(minutes=30),
    ).order_by("-at").values_list("at", "value")[:400])
    if not rows:
        return None
    if rows[0][1] <= 0:
        return 0.0
    since = rows[0][0]
    for at, value in rows:
        if value <= 0:
            break
        since = at
    return (now - since).total_seconds()


def prefill_stall(node: Node, ledger: dict, engines: list[Engine], t: dict[str, Any],
                  now: datetime) -> list[Condition]:
    """Decode throughput collapses while a long prompt prefills on the same engine."""
    conditions = []
    for engine in engines:
        rates = engine.rates or {}
        if engine.phase != "ready" or rates.get("restarted"):
            continue
        baseline = _decode_baseline(engine, now)
        decode = _recent_decode_peak(engine, now, t["min_duration_seconds"])
        prefilling = (rates.get("prefill_tokens_per_s") or 0) > 0
        if baseline is None or decode is None:
            ratio = None
        else:
            # The best decode rate of the last min_duration seconds: a stall is a collapse that
            # lasted, not one slow scrape.
            ratio = decode / baseline if prefilling else 1.0
        fraction = t["decode_collapse_fraction"]
        conditions.append(Condition(
            rule="prefill-stall", node_id=node.pk, engine_id=engine.pk, value=ratio,
            threshold=fraction, clear=min(1.0, fraction * 2),
            direction="below", severity="warning",
            summary=(f"{engine.name}: decode fell to {decode or 0:.1f} tok/s (usually "
                     f"{baseline or 0:.1f}) while a prompt prefills; everyone on it stalls"),
            details={"engine": engine.name, "decode_tps": decode, "baseline_decode_tps": baseline,
                     "prefill_tps": rates.get("prefill_tokens_per_s")},
        ))
    return conditions


def _recent_decode_peak(engine: Engine, now: datetime, seconds: float) -> float | None:
    values = list(EngineSample.objects.filter(
        engine=engine, metric=EngineMetric.DECODE_TPS, at__gte=now - timedelta(seconds=seconds),
    ).values_list("value", flat=True))
    return max(values) if values else None


def _decode_baseline(engine: Engine, now: datetime) -> float | None:
    values = list(EngineSample.objects.filter(
        engine=engine, metric=EngineMetric.DECODE_TPS, at__gte=now - timedelta(minutes=10),
        value__gt=0,
    ).values_list("value", flat=True)[:500])
    return statistics.median(values) if len(values) >= 3 else None


def engine_down(node: Node, ledger: dict, engines: list[Engine], t: dict[str, Any],
                now: datetime) -> list[Condition]:
    """An engine that stopped, failed, or stopped answering /metrics (not while starting).

    During a planned restart the engine is down on purpose: held until the restart's deadline,
    after which a still-down engine alerts as usual.
    """
    in_restart = _planned_restarts_in_progress(node, now)
    conditions = []
    for engine in engines:
        reason = "" if engine.pk in in_restart else _down_reason(engine)
        conditions.append(Condition(
            rule="engine-down", node_id=node.pk, engine_id=engine.pk,
            value=1.0 if reason else 0.0, threshold=0.5, clear=0.5, direction="above",
            severity="critical",
            summary=f"{engine.name} is down: {reason}" if reason else f"{engine.name} is up",
            details={"engine": engine.name, "reason": reason, "phase": engine.phase,
                     "container_state": engine.container_state},
        ))
    return conditions


def _planned_restarts_in_progress(node: Node, now: datetime) -> set[int]:
    from dashboard.restarts.models import Restart

    running = Restart.objects.filter(node=node, kind="planned", status="running")
    return {r.engine_id for r in running if r.deadline is None or r.deadline > now}


def _down_reason(engine: Engine) -> str:
    if engine.container_state != "running":
        return f"container {engine.container_state} (exit code {engine.exit_code})"
    if engine.phase == "failed":
        errors = (engine.startup or {}).get("errors") or []
        return f"startup failed: {errors[0]['message']}" if errors else "startup failed"
    if engine.last_scrape_error and engine.phase not in STARTING_PHASES:
        return f"/metrics: {engine.last_scrape_error}"
    return ""


def overcommit(node: Node, ledger: dict, engines: list[Engine], t: dict[str, Any],
               now: datetime) -> list[Condition]:
    """The engines' reservations add up to more than the node holds.

    A pinned engine reserves weights + KV pool + graphs; an unpinned one needs
    ``--gpu-memory-utilization`` × MemTotal free when it starts. Unknown parts make the sum a
    lower bound: over the total is certain, under it is unknown.
    """
    total = ledger.get("mem_total") or node.mem_total_bytes
    if not total:
        return []
    by_id = {e.pk: e for e in engines}
    known, unknown = 0, []
    for share in ledger.get("engines", []):
        engine = by_id.get(share["engine_id"])
        if engine is None:
            continue
        utilization = (engine.config or {}).get("gpu_memory_utilization")
        pinned = (engine.config or {}).get("kv_cache_memory_bytes") is not None
        if share.get("reserved") is not None:
            known += share["reserved"]
        elif utilization is not None and not pinned:
            known += int(utilization * total)
        else:
            unknown.append(engine.name)
    excess = _gib(known - total)
    value = excess if (excess > t["margin_gib"] or not unknown) else None
    return [Condition(
        rule="overcommit", node_id=node.pk, engine_id=None, value=value,
        threshold=t["margin_gib"], clear=t["margin_gib"] - t["hysteresis_gib"],
        direction="above", severity="warning",
        summary=(f"{node.name}: engines reserve {_fmt(_gib(known))} of {_fmt(_gib(total))}"
                 + (f" (unknown: {', '.join(unknown)})" if unknown else "")),
        details={"reserved_bytes": known, "mem_total_bytes": total, "unknown": unknown},
    )]


def unplanned_restart(node: Node, ledger: dict, engines: list[Engine], t: dict[str, Any],
                      now: datetime) -> list[Condition]:
    """An engine restarted behind SparkOps' back recently (one condition per engine)."""
    return _recent_restarts(node, now, t["recent_minutes"], "unplanned-restart",
                            {"kind": "unplanned"}, "critical")


def restart_failed(node: Node, ledger: dict, engines: list[Engine], t: dict[str, Any],
                   now: datetime) -> list[Condition]:
    """A planned restart that failed, was interrupted, or was aborted leaving the engine down."""
    return _recent_restarts(node, now, t["recent_minutes"], "restart-failed",
                            {"kind": "planned",
                             "status__in": ["failed", "interrupted", "aborted"]}, "critical")


def _recent_restarts(node: Node, now: datetime, minutes: float, rule: str,
                     match: dict[str, Any], severity: str) -> list[Condition]:
    from dashboard.restarts.models import Restart

    since = now - timedelta(minutes=minutes)
    latest: dict[int, Restart] = {}
    for restart in Restart.objects.filter(node=node, **match).select_related("engine") \
            .order_by("requested_at"):
        latest[restart.engine_id] = restart
    conditions = []
    for engine_id, restart in latest.items():
        at = restart.finished_at or restart.requested_at
        if rule == "restart-failed" and restart.status == "aborted" \
                and (restart.container_state or {}).get("running", True):
            continue  # aborted before touching it: the engine still serves
        recent = at >= since
        conditions.append(Condition(
            rule=rule, node_id=node.pk, engine_id=engine_id, value=1.0 if recent else 0.0,
            threshold=0.5, clear=0.5, direction="above", severity=severity,
            summary=f"{restart.engine.name}: {restart.kind} restart {restart.status} at "
                    f"{at:%Y-%m-%d %H:%M:%S} UTC: {restart.outcome or restart.reason}",
            details={"restart_id": restart.pk, "status": restart.status,
                     "container_state": restart.container_state,
                     "outcome": restart.outcome},
        ))
    return conditions


RULES: dict[str, Rule] = {
    "prefill-squeeze": prefill_squeeze,
    "headroom-floor": headroom_floor,
    "queue-backlog": queue_backlog,
    "prefill-stall": prefill_stall,
    "engine-down": engine_down,
    "overcommit": overcommit,
    "unplanned-restart": unplanned_restart,
    "restart-failed": restart_failed,
}


def evaluate_rules(node: Node, now: datetime) -> tuple[list[Condition], set[str]]:
    """Every enabled rule's conditions for ``node``, and the set of rules evaluated."""
    ledger = node.ledger or {}
    engines = list(Engine.objects.filter(node=node, present=True))
    settings = all_rule_settings()  # one query for every rule
    conditions: list[Condition] = []
    evaluated: set[str] = set()
    for name, rule in RULES.items():
        setting = settings[name] if name in settings else rule_settings(name)
        if not setting.enabled:
            continue
        evaluated.add(name)
        conditions += rule(node, ledger, engines, dict(setting.thresholds), now)
    return conditions, evaluated
