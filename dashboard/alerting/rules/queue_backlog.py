"""Queue backlog: requests wait in an engine's queue before their first token.

vLLM queues a request when every slot (``--max-num-seqs``) or the KV cache is taken; the
``vllm:num_requests_waiting`` gauge, sampled at each scrape, tells how long the queue has been
non-empty.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from collectors.models import Engine, EngineMetric, EngineSample, Node
from dashboard.alerting.conditions import Condition
from dashboard.alerting.rules.base import Rule, ThresholdSpec


def evaluate(node: Node, ledger: dict, engines: list[Engine], t: dict[str, Any],
             now: datetime) -> list[Condition]:
    """Requests waiting for longer than a threshold: every slot is taken."""
    conditions = []
    for engine in engines:
        if engine.phase != "ready":
            continue
        waited = _seconds_waiting(engine, now)
        slots = (engine.config or {}).get("max_num_seqs")
        conditions.append(Condition(
            rule=RULE.name, node_id=node.pk, engine_id=engine.pk, value=waited,
            threshold=t["waiting_seconds"], clear=t["waiting_seconds"] / 2, direction="above",
            severity="warning",
            summary=(f"{engine.name}: requests have waited for {waited or 0:.0f} s "
                     f"(slots: {slots or 'vLLM default'}); new users see a long first token"),
            details={"engine": engine.name, "waiting_seconds": waited, "max_num_seqs": slots},
        ))
    return conditions


def _seconds_waiting(engine: Engine, now: datetime) -> float | None:
    """How long requests have waited without a break, from the last 30 min of samples (one
    query, at most 400 rows); None without samples, 0 when none waits now."""
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


RULE = Rule(
    name="queue-backlog",
    title="Queue backlog",
    description=(
        "Requests wait in an engine's queue longer than the limit before their first "
        "token: the engine is out of slots (--max-num-seqs) or KV cache."
    ),
    for_seconds=30,
    evaluate=evaluate,
    value_unit="s",
    thresholds=(
        ThresholdSpec("waiting_seconds", "Waiting time", 15.0, "s",
                      "Longest acceptable wait in the queue (the seed's 17th of 20 "
                      "concurrent requests waited 15 s).", maximum=86_400.0),
    ),
)
