"""Prefill squeeze: an engine's next prefill would not fit in the memory left on the node.

A prefill grabs a transient buffer (as wide as the tokens one step computes: vLLM's
``--max-num-batched-tokens``, llama-server's ``--ubatch-size``, Ollama's ``num_batch``) on top of
what the engine holds; the ledger estimates or observes that need per engine. The alert names as
its cause the ledger component that grew most in the look-back window (a neighbour's bigger KV
pool, a model an Ollama server loaded, page cache, a process).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from collectors.ledger import budget_components
from collectors.models import Engine, LedgerChange, Node
from dashboard.alerting.conditions import Condition
from dashboard.alerting.rules.base import Rule, ThresholdSpec
from sparkops.units import fixed_gib_text, gib


def evaluate(node: Node, ledger: dict, engines: list[Engine], t: dict[str, Any],
             now: datetime) -> list[Condition]:
    """Headroom (interval minimum) minus a margin below an engine's transient prefill need."""
    by_id = {e.pk: e for e in engines}
    conditions = []
    for share in ledger.get("engines", []):
        engine = by_id.get(share["engine_id"])
        if engine is None or engine.phase != "ready" or share.get("prefill_need") is None:
            continue
        # Its own prefill dips the minimum: judge an engine that prefilled by the room now
        # (MemAvailable, or the memory budget's room when that is smaller).
        own_prefill = ((engine.rates or {}).get("prefill_tokens_per_s") or 0) > 0
        headroom = ledger.get("headroom_now", ledger.get("mem_available")) if own_prefill \
            else ledger.get("headroom")
        need = gib(share["prefill_need"])
        value = None if headroom is None else gib(headroom) - t["margin_gib"]
        found = causes(node, engine, now, t["lookback_minutes"],
                       within=budget_components(ledger))
        summary = (f"{engine.name} may not fit its next prefill: headroom "
                   f"{fixed_gib_text(headroom)} − margin {t['margin_gib']:.2f} GiB < prefill "
                   f"need {fixed_gib_text(share['prefill_need'])}"
                   f" ({share['prefill_need_source']})")
        conditions.append(Condition(
            rule=RULE.name, node_id=node.pk, engine_id=engine.pk, value=value,
            threshold=need, clear=need + t["hysteresis_gib"], direction="below",
            severity="critical", summary=summary,
            details={"engine": engine.name, "headroom_bytes": headroom,
                     "margin_gib": t["margin_gib"], "prefill_need_bytes": share["prefill_need"],
                     "prefill_need_source": share["prefill_need_source"],
                     "prefill_estimate_bytes": share.get("prefill_estimate"),
                     "prefill_observed_bytes": share.get("prefill_observed"),
                     "causes": found,
                     # The largest mover is the cause; the alert keeps the one it fired for.
                     "cause": found[0]["text"] if found else ""},
        ))
    return conditions


def causes(node: Node, engine: Engine, now: datetime, lookback_minutes: float,
           within: set[str] | None = None) -> list[dict]:
    """Net ledger growth per component in the look-back window, largest first (at most three),
    excluding the engine at risk, and only components in ``within`` when it is given (those
    inside the memory budget that bounds the headroom). One query.

    Netting matters: a neighbour that is recreated shows its non-KV memory climbing step by step
    while its weights load; several small steps must not outrank one real move, and a component
    that went up and back down took no room.
    """
    changes = LedgerChange.objects.filter(
        node=node, at__gte=now - timedelta(minutes=lookback_minutes), at__lte=now
    ).exclude(engine=engine).order_by("at")
    net: dict[str, dict] = {}
    for change in changes:
        if within is not None and change.component not in within:
            continue
        entry = net.setdefault(change.component, {"first": change, "last": change})
        entry["last"] = change
    grown = [_net_growth(component, entry["first"], entry["last"])
             for component, entry in net.items()]
    return sorted((cause for cause in grown if cause is not None),
                  key=lambda cause: -cause["growth_bytes"])[:3]


def _net_growth(component: str, first: LedgerChange, last: LedgerChange) -> dict | None:
    """One component's move from its first to its last change, or None when it did not grow."""
    appeared = first.before_bytes is None
    # A component that appeared and then moved is told by its move ("8 → 24 GiB"); one that
    # only appeared took all of its size.
    before = (first.after_bytes if first is not last else 0) if appeared else first.before_bytes
    after = last.after_bytes or 0
    if after <= (before or 0):
        return None
    text = (f"{last.label} appeared with {fixed_gib_text(after)}" if appeared and first is last
            else f"{last.label} went {gib(before or 0):.2f} → {fixed_gib_text(after)}")
    return {
        "component": component,
        "label": last.label,
        "before_bytes": before,
        "after_bytes": after,
        "growth_bytes": after - (before or 0),
        "at": last.at.isoformat(),
        "text": f"{text} at {last.at:%H:%M:%S} UTC",
    }


RULE = Rule(
    name="prefill-squeeze",
    title="Prefill squeeze",
    description=(
        "An engine's next prefill would not fit: MemAvailable (or the room in the engines' "
        "memory budget, when that is smaller) minus the transient buffer a prefill grabs "
        "(as wide as the tokens one step computes: --max-num-batched-tokens on vLLM) is "
        "below the margin. The "
        "idle neighbour's prefill and concurrency slow down first, decode does not."
    ),
    for_seconds=10,
    evaluate=evaluate,
    thresholds=(
        ThresholdSpec("margin_gib", "Margin", 2.0, "GiB",
                      "Room that must remain after a prefill buffer is allocated.",
                      maximum=1024.0),
        ThresholdSpec("hysteresis_gib", "Hysteresis", 0.5, "GiB",
                      "A firing alert resolves only once headroom is back this far "
                      "above the need, so a value hovering at the edge does not flap.",
                      maximum=1024.0),
        ThresholdSpec("lookback_minutes", "Cause look-back", 30.0, "min",
                      "How far back a ledger change (a neighbour's bigger KV pool, a model "
                      "an Ollama server loaded, page cache growth, a process) is named as "
                      "the cause.",
                      minimum=1.0, maximum=1440.0),
    ),
)
