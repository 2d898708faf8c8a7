"""Engine down: an engine's container is not running, its startup failed, or it stopped
answering what its kind is read from (vLLM's ``/metrics``, llama-server's or Ollama's API; not
while it is still starting). A headless rank of an engine spread over nodes serves no API
(``collectors.spanning``): it is judged by its container alone."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from collectors.models import Engine, Node
from dashboard.alerting.conditions import Condition
from dashboard.alerting.restart_reads import judged_restarts
from dashboard.alerting.rules.base import Rule, endpoints_label
from dashboard.restarts.models import Restart

# Startup phases in which an engine does not answer its endpoints yet: a failed read then is
# normal.
STARTING_PHASES = {"starting", "loading", "profiling", "kv_allocated"}


def evaluate(node: Node, ledger: dict, engines: list[Engine], t: dict[str, Any],
             now: datetime) -> list[Condition]:
    """An engine that stopped, failed, or stopped answering its endpoints (not while starting).

    During a planned restart the engine is down on purpose: held until the restart's deadline,
    after which a still-down engine alerts as usual.
    """
    in_restart = _planned_restarts_in_progress(node, now)
    conditions = []
    for engine in engines:
        reason = "" if engine.pk in in_restart else _down_reason(engine)
        conditions.append(Condition(
            rule=RULE.name, node_id=node.pk, engine_id=engine.pk,
            value=1.0 if reason else 0.0, threshold=0.5, clear=0.5, direction="above",
            severity="critical",
            summary=f"{engine.name} is down: {reason}" if reason else f"{engine.name} is up",
            details={"engine": engine.name, "reason": reason, "phase": engine.phase,
                     "container_state": engine.container_state},
        ))
    return conditions


def _planned_restarts_in_progress(node: Node, now: datetime) -> set[int]:
    """Engines of ``node`` in a planned restart that has not passed its deadline (the node's
    judged restarts, read at most once a round: ``dashboard.alerting.restart_reads``)."""
    return {r.engine_id for r in judged_restarts(node, _planned_and_running)
            if r.deadline is None or r.deadline > now}


def _planned_and_running(restart: Restart) -> bool:
    return restart.kind == Restart.Kind.PLANNED and restart.status == Restart.Status.RUNNING


def _down_reason(engine: Engine) -> str:
    """Why ``engine`` is down, for people; empty when it is up."""
    if engine.phase == "unloaded":  # a model its router stopped: not down (the router may be)
        return ""
    if engine.container_state != "running":
        return f"container {engine.container_state} (exit code {engine.exit_code})"
    if (engine.span or {}).get("serves_api") is False:
        return ""  # a headless rank: no API to answer, and its start-up never logs "ready"
    if engine.phase == "failed":
        errors = (engine.startup or {}).get("errors") or []
        return f"startup failed: {errors[0]['message']}" if errors else "startup failed"
    if engine.last_scrape_error and engine.phase not in STARTING_PHASES:
        return f"{endpoints_label(engine)}: {engine.last_scrape_error}"
    return ""


RULE = Rule(
    name="engine-down",
    title="Engine down",
    description=(
        "An engine's container is not running or its server does not answer. Engines in "
        "a planned restart are not evaluated by this rule."
    ),
    for_seconds=60,
    evaluate=evaluate,
    value_unit="down",
)
