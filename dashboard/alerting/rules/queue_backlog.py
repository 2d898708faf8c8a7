"""Queue backlog: requests wait in an engine's queue before their first token.

vLLM queues a request when every slot (``--max-num-seqs``) or the KV cache is taken; the
``vllm:num_requests_waiting`` gauge, sampled at each scrape, tells how long the queue has been
non-empty. llama.cpp's ``llama-server`` defers a request when every slot (``--parallel``) is
busy (``llamacpp:requests_deferred``, read as the same waiting count). Ollama reports no queue
at all: for it the wait is unknown, with that reason, never 0.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from collectors.models import Engine, EngineMetric, Node
from dashboard.alerting.conditions import Condition
from dashboard.alerting.recent import latest_value, newest_samples
from dashboard.alerting.rules.base import Rule, ThresholdSpec, unknown_reason


def evaluate(node: Node, ledger: dict, engines: list[Engine], t: dict[str, Any],
             now: datetime) -> list[Condition]:
    """Requests waiting for longer than a threshold: every slot is taken."""
    waiting = _seconds_waiting([engine for engine in engines if engine.phase == "ready"
                                and not unknown_reason(engine, "requests")], now)
    conditions = []
    for engine in engines:
        if engine.phase != "ready":
            continue
        why = unknown_reason(engine, "requests")
        waited = None if why else waiting[engine.pk]
        slots = _slots(engine)
        if why:
            summary = f"{engine.name}: how long requests wait is unknown — {why}"
        else:
            summary = (f"{engine.name}: requests have waited for {waited or 0:.0f} s "
                       f"(slots: {_slots_text(engine, slots)}); new users see a long first "
                       "token")
        # vLLM's slot count is its --max-num-seqs (its default when unset); other kinds say
        # theirs in their own words.
        slot_figure = {"max_num_seqs": slots} if engine.kind == "vllm" else {"slots": slots}
        conditions.append(Condition(
            rule=RULE.name, node_id=node.pk, engine_id=engine.pk, value=waited,
            threshold=t["waiting_seconds"], clear=t["waiting_seconds"] / 2, direction="above",
            severity="warning", summary=summary,
            details={"engine": engine.name, "waiting_seconds": waited, **slot_figure,
                     **({"unknown_because": why} if why else {})},
        ))
    return conditions


def _slots(engine: Engine) -> int | None:
    """The engine's slots: its launch setting, else what it reports (llama-server's
    ``total_slots``); None when neither says."""
    configured = (engine.config or {}).get("max_num_seqs")
    if configured:
        return configured
    props = ((engine.metrics or {}).get("details") or {}).get("props") or {}
    reported = props.get("total_slots")
    return reported if isinstance(reported, int) and not isinstance(reported, bool) else None


def _slots_text(engine: Engine, slots: int | None) -> str:
    if slots:
        return str(slots)
    return "vLLM default" if engine.kind == "vllm" else "unknown"


def _seconds_waiting(engines: list[Engine], now: datetime) -> dict[int, float | None]:
    """How long requests have waited without a break on each of ``engines``, by id, from the
    last 30 min of samples (the latest 400 at most); None without samples, 0 when none waits
    now.

    Cost: the engines' newest samples, read once a round (``dashboard.alerting.recent``), and
    one query for the last 30 min of the engines whose newest says someone waits, if any."""
    since = now - timedelta(minutes=30)
    waited: dict[int, float | None] = {}
    queued = []
    for engine in engines:
        newest = latest_value(engine, EngineMetric.REQUESTS_WAITING, since)
        if newest is None or newest <= 0:  # the common case: nothing more to read
            waited[engine.pk] = None if newest is None else 0.0
        else:
            queued.append(engine)
    rows = newest_samples(queued, EngineMetric.REQUESTS_WAITING, since, 400)
    return waited | {engine.pk: _waited_seconds(rows.get(engine.pk, []), now)
                     for engine in queued}


def _waited_seconds(rows: list[tuple[datetime, float]], now: datetime) -> float | None:
    """How long the figures of ``rows`` (newest first) have stayed above 0 until ``now``;
    None without rows, 0 when the newest is not above 0."""
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
        "token: the engine is out of slots (vLLM's --max-num-seqs, llama-server's --parallel) "
        "or KV cache. Ollama reports no queue: for it the wait is unknown."
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
