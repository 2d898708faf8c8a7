"""Prefill stall: a long prompt's prefill stalls every other stream on the same engine.

vLLM V1 has no concurrent partial prefill, so while a long prompt prefills the other streams'
decode rate collapses; the rule compares it with the engine's recent rate. An engine whose kind
keeps no token counters (Ollama; llama-server without ``--metrics``) has no rates: its value is
unknown, with that reason, never "no stall".
"""

from __future__ import annotations

import statistics
from datetime import datetime, timedelta
from typing import Any

from collectors.models import Engine, EngineMetric, Node
from dashboard.alerting.conditions import Condition
from dashboard.alerting.recent import peak_value, values_since
from dashboard.alerting.rules.base import Rule, ThresholdSpec, unknown_reason


def evaluate(node: Node, ledger: dict, engines: list[Engine], t: dict[str, Any],
             now: datetime) -> list[Condition]:
    """Decode throughput collapses while a long prompt prefills on the same engine."""
    conditions = []
    for engine in engines:
        rates = engine.rates or {}
        if engine.phase != "ready" or rates.get("restarted"):
            continue
        why = unknown_reason(engine, "rates")
        baseline = None if why else _decode_baseline(engine, now)
        decode = None if why else _recent_decode_peak(engine, now, t["min_duration_seconds"])
        prefilling = (rates.get("prefill_tokens_per_s") or 0) > 0
        if baseline is None or decode is None:
            ratio = None
        else:
            # The best decode rate of the last min_duration seconds: a stall is a collapse that
            # lasted, not one slow scrape.
            ratio = decode / baseline if prefilling else 1.0
        fraction = t["decode_collapse_fraction"]
        if why:
            summary = f"{engine.name}: whether a prefill stalls decode is unknown — {why}"
        elif ratio is None:
            missing = ("too few decode samples in the last 10 min for a usual rate"
                       if baseline is None else "no decode rate sampled in the last "
                       f"{t['min_duration_seconds']:.0f} s")
            summary = f"{engine.name}: whether a prefill stalls decode is unknown: {missing}"
        else:
            summary = (f"{engine.name}: decode fell to {decode:.1f} tok/s (usually "
                       f"{baseline:.1f}) while a prompt prefills; everyone on it stalls")
        conditions.append(Condition(
            rule=RULE.name, node_id=node.pk, engine_id=engine.pk, value=ratio,
            threshold=fraction, clear=min(1.0, fraction * 2),
            direction="below", severity="warning", summary=summary,
            details={"engine": engine.name, "decode_tps": decode, "baseline_decode_tps": baseline,
                     "prefill_tps": rates.get("prefill_tokens_per_s"),
                     **({"unknown_because": why} if why else {})},
        ))
    return conditions


def _recent_decode_peak(engine: Engine, now: datetime, seconds: float) -> float | None:
    """The highest decode rate sampled in the last ``seconds``; None without one. Cost: one
    grouped query a round for every engine (``dashboard.alerting.recent``)."""
    return peak_value(engine, EngineMetric.DECODE_TPS, now - timedelta(seconds=seconds))


def _decode_baseline(engine: Engine, now: datetime) -> float | None:
    """The median non-zero decode rate of the last 10 min (at most 500 samples, the oldest);
    None with fewer than three samples, too few to call a rate usual. Cost: one query a round
    for every engine's rates, without their times (``dashboard.alerting.recent``)."""
    values = values_since(engine, EngineMetric.DECODE_TPS, now - timedelta(minutes=10),
                          above=0.0)[:500]
    return statistics.median(values) if len(values) >= 3 else None


RULE = Rule(
    name="prefill-stall",
    title="Prefill stall",
    description=(
        "A long prompt's prefill stalls everyone on the same engine: the other streams' "
        "decode rate collapses below a fraction of its recent rate for a while (vLLM V1 "
        "has no concurrent partial prefill)."
    ),
    for_seconds=0,
    evaluate=evaluate,
    value_unit="fraction",
    thresholds=(
        ThresholdSpec("decode_collapse_fraction", "Decode collapse", 0.25,
                      "of recent rate",
                      "Decode rate below this fraction of its recent rate counts as "
                      "collapsed.", maximum=1.0),
        ThresholdSpec("min_duration_seconds", "Minimum duration", 10.0, "s",
                      "How long the collapse must last to count as a stall.",
                      maximum=86_400.0),
    ),
)
