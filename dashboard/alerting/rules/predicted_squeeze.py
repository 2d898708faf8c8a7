"""Predicted squeeze: an engine still loading will leave a neighbour's prefill, or the host,
without room once it has allocated its pool.

A vLLM engine loads its weights and profiles before it allocates its KV pool, which takes
minutes on a GB10. The collectors predict every start's reservation while it loads
(``collectors.starts``: weights, KV pool and CUDA graphs from its own flags, by the fit
planner). The room it will leave is today's headroom plus what it holds now less what it will
hold (``collectors.fitplan.headroom_after``, the planner page's arithmetic). When that leaves
less than a neighbour's prefill need plus the prefill-squeeze alert's margin (the one rule a
prefill fits by), or less than the headroom-floor alert's floor, this alert fires at once, naming
the starting engine, the predicted figures and the engine at risk, while the memory is still
free.

One alert per engine at risk (the scope of prefill-squeeze, which reports the real squeeze if it
comes), and one per starting engine for the host floor. When several engines load at once, the
one that leaves the least room is named. The alert resolves ("settled") when the start ends:
once the engine is ready, saying how close the prediction came (``collectors.starts``), or when it
failed or went away. A start that no longer threatens (the room grew meanwhile) clears it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q, prefetch_related_objects

from collectors.fitplan import Figure, headroom_after, held_now
from collectors.models import Engine, EngineStart, Node
from collectors.starts import accuracy_text
from dashboard.alerting.conditions import Condition
from dashboard.alerting.rules.base import Rule, ThresholdSpec
from dashboard.alerting.rules.headroom_floor import floor_gib
from sparkops.prepared import PreparedRead
from sparkops.units import fixed_gib_text, gib

# A start that ended this long ago still settles an alert it raised (evaluations can lag).
SETTLE_WITHIN = timedelta(minutes=30)
FLOOR_SCOPE = "host floor"


@dataclass(frozen=True)
class Threat:
    """One loading engine's predicted effect on the node."""

    start: EngineStart
    engine: Engine
    held_now: Figure
    held_after: int
    room_after: Figure
    host_after: int | None

    @property
    def cause(self) -> str:
        return start_cause(self.start, self.engine.name)


def start_cause(start: EngineStart, name: str) -> str:
    """The starting engine and what it is predicted to take, as the alert names its cause."""
    predicted = start.predicted
    parts = [f"KV pool {_figure_words(predicted.get('kv_pool'))}",
             f"weights {_figure_words(predicted.get('weights'))}"]
    graphs = predicted.get("cuda_graphs") or {}
    if graphs.get("value"):
        parts.append(f"CUDA graphs {_figure_words(graphs)}")
    return (f"{name} is starting and will hold {_figure_words(predicted.get('held'))} "
            f"({', '.join(parts)})")


def _figure_words(figure: dict | None) -> str:
    if not figure or figure.get("value") is None:
        return (figure or {}).get("confidence") or "unknown"
    return f"{fixed_gib_text(figure['value'])} ({figure.get('confidence')})"


def evaluate(node: Node, ledger: dict, engines: list[Engine], t: dict[str, Any],
             now: datetime) -> list[Condition]:
    """A neighbour's prefill, or the host floor, against the room each loading engine leaves."""
    # The other rules' numbers in force: a prefill fits by prefill-squeeze's margin, the host
    # by headroom-floor's floor (read here, not copied, so each rule has one place).
    from dashboard.alerting.settings import prefill_margin_bytes, rule_settings

    margin = prefill_margin_bytes()
    floor = floor_gib(rule_settings("headroom-floor").thresholds,
                      ledger.get("mem_total") or node.mem_total_bytes)
    by_id = {engine.pk: engine for engine in engines}
    shares = {share["engine_id"]: share for share in ledger.get("engines", [])}
    open_starts, settled = _starts(node, now, by_id)
    threats = _threats(ledger, open_starts, shares, by_id)
    starting = {threat.engine.pk for threat in threats}
    conditions: list[Condition] = []
    for share in ledger.get("engines", []):
        engine = by_id.get(share["engine_id"])
        if engine is None or engine.phase != "ready" or engine.pk in starting \
                or share.get("prefill_need") is None:
            continue
        against = [threat for threat in threats if threat.engine.pk != engine.pk
                   and threat.room_after.known]
        if against:
            worst = min(against, key=lambda threat: threat.room_after.value)
            conditions.append(_prefill_condition(node, engine, share, worst, margin, t))
        elif settled is not None and settled.engine_id != engine.pk:
            conditions.append(_settled_condition(node, engine.pk, settled, t))
    for threat in threats:
        conditions.append(_floor_condition(node, threat, floor, t))
    # The settled start's own scope (its floor alert), unless this round already judged that
    # engine: as a neighbour of another start, or as one starting again.
    judged = {condition.engine_id for condition in conditions}
    if settled is not None and settled.engine_id not in judged:
        conditions.append(_settled_condition(node, settled.engine_id, settled, t))
    return conditions


# The node's predicted starts still loading or finished since a time (a prepared read: every
# round reads them).
_PREDICTED_STARTS = PreparedRead(lambda node_id, finished_since: EngineStart.objects.filter(
    Q(outcome=EngineStart.Outcome.STARTING) | Q(finished_at__gte=finished_since),
    node_id=node_id,
).exclude(predicted={}))


def _starts(node: Node, now: datetime,
            engines: dict[int, Engine]) -> tuple[list[EngineStart], EngineStart | None]:
    """The node's predicted starts still loading (latest seen first), and the one that settled
    last within ``SETTLE_WITHIN`` (None without one), with their engines: those of ``engines``
    (the round's, by id) given from it. One query, and one more for the engines not given, if
    any (joined in, the engines' columns would cost every round more than the starts)."""
    starts = _PREDICTED_STARTS(node.pk, now - SETTLE_WITHIN)
    for start in starts:
        if start.engine_id in engines:
            start.engine = engines[start.engine_id]
    prefetch_related_objects(starts, "engine")  # skips the starts given their engine
    loading = [start for start in starts if start.outcome == EngineStart.Outcome.STARTING]
    settled = max((start for start in starts if start.outcome != EngineStart.Outcome.STARTING
                   and start.finished_at is not None and start.finished_at >= now - SETTLE_WITHIN),
                  key=lambda start: (start.finished_at, start.pk), default=None)
    return loading, settled


def _threats(ledger: dict, open_starts: list[EngineStart], shares: dict[int, dict],
             by_id: dict[int, Engine]) -> list[Threat]:
    threats = []
    for start in open_starts:
        engine = by_id.get(start.engine_id)
        held = (start.predicted.get("held") or {}).get("value")
        if engine is None or held is None:
            continue  # a prediction without the memory it will hold says nothing of the room
        share = shares.get(engine.pk)
        now_held = held_now(share)
        after = Figure(held, (start.predicted.get("held") or {}).get("confidence", ""), "")
        room = headroom_after(ledger, share, now_held, after)
        host = ledger.get("host_headroom")
        host_after = None if host is None or not now_held.known \
            else host + now_held.value - held  # type: ignore[operator]
        threats.append(Threat(start, engine, now_held, held, room, host_after))
    return threats


def _prefill_condition(node: Node, engine: Engine, share: dict, threat: Threat, margin: int,
                       t: dict[str, Any]) -> Condition:
    need = share["prefill_need"]
    room = threat.room_after.value
    margin_gib = gib(margin)
    value = gib(room) - margin_gib  # type: ignore[arg-type]
    summary = (f"{engine.name}'s next prefill will not fit once {threat.engine.name} has loaded: "
               f"predicted headroom {fixed_gib_text(room)} − margin {margin_gib:.2f} GiB < "
               f"prefill need {fixed_gib_text(need)} ({share['prefill_need_source']})")
    return Condition(
        rule=RULE.name, node_id=node.pk, engine_id=engine.pk, value=value,
        threshold=gib(need), clear=gib(need) + t["hysteresis_gib"], direction="below",
        severity="warning", summary=summary,
        details=_details(threat, {"engine": engine.name, "at_risk": engine.name,
                                  "prefill_need_bytes": need,
                                  "prefill_need_source": share["prefill_need_source"],
                                  "margin_gib": margin_gib}))


def _floor_condition(node: Node, threat: Threat, floor: float,
                     t: dict[str, Any]) -> Condition:
    after = threat.host_after
    summary = (f"{node.name}: MemAvailable will fall to {fixed_gib_text(after)} once "
               f"{threat.engine.name} has loaded, below the floor of {floor:.2f} GiB; the host "
               "may wedge")
    return Condition(
        rule=RULE.name, node_id=node.pk, engine_id=threat.engine.pk,
        value=None if after is None else gib(after), threshold=floor,
        clear=floor + t["hysteresis_gib"], direction="below", severity="warning",
        summary=summary,
        details=_details(threat, {"at_risk": FLOOR_SCOPE, "floor_gib": floor,
                                  "mem_available_after_bytes": after}))


def _details(threat: Threat, extra: dict[str, Any]) -> dict[str, Any]:
    cause = threat.cause
    return {
        **extra,
        "starting_engine": threat.engine.name,
        "start_id": threat.start.pk,
        "predicted_held_bytes": threat.held_after,
        "held_now_bytes": threat.held_now.value,
        "headroom_after_bytes": threat.room_after.value,
        "predicted": threat.start.predicted,
        "corrections": threat.start.corrections,
        "causes": [{"component": f"start:{threat.start.pk}", "label": threat.engine.name,
                    "text": cause}],
        # The starting engine is the cause; the alert keeps the one it fired for.
        "cause": cause,
    }


def _settled_condition(node: Node, engine_id: int, start: EngineStart,
                       t: dict[str, Any]) -> Condition:
    name = start.engine.name
    if start.outcome == EngineStart.Outcome.READY:
        words = f"{name} is ready: {accuracy_text(start)}"
    else:
        words = f"{name}'s start ended {start.outcome} before it was ready: nothing to compare"
    cause = start_cause(start, name)
    return Condition(
        rule=RULE.name, node_id=node.pk, engine_id=engine_id, value=None, threshold=0.0,
        clear=t["hysteresis_gib"], direction="below", severity="warning",
        summary=f"{words} (the real room is prefill-squeeze's to judge)",
        details={"starting_engine": name, "start_id": start.pk, "outcome": start.outcome,
                 "predicted": start.predicted, "actual": start.actual,
                 "accuracy": words, "cause": cause,
                 "causes": [{"component": f"start:{start.pk}", "label": name, "text": cause}]},
        settled=words)


RULE = Rule(
    name="predicted-squeeze",
    title="Predicted squeeze",
    description=(
        "An engine that is still loading will, once its KV pool is allocated, leave less room "
        "than a neighbour's next prefill needs (with the prefill-squeeze margin) or than the "
        "headroom floor. Predicted from its launch flags and the node's ledger while it loads "
        "weights, minutes before the memory is taken; resolved when it is ready, with how "
        "close the prediction came."
    ),
    for_seconds=0,
    evaluate=evaluate,
    thresholds=(
        ThresholdSpec("hysteresis_gib", "Hysteresis", 0.5, "GiB",
                      "A firing alert clears only once the predicted room is back this far "
                      "above the need, so a prediction hovering at the edge does not flap.",
                      maximum=1024.0),
    ),
)
