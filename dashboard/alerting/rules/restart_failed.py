"""Restart failed: a planned restart failed, was interrupted, or was aborted leaving the engine
stopped."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from collectors.models import Engine, Node
from dashboard.alerting.conditions import Condition
from dashboard.alerting.restart_reads import ENDED_BADLY
from dashboard.alerting.rules.base import Rule, ThresholdSpec
from dashboard.alerting.rules.restart_history import latest_restart_conditions
from dashboard.restarts.models import Restart


def evaluate(node: Node, ledger: dict, engines: list[Engine], t: dict[str, Any],
             now: datetime) -> list[Condition]:
    """A planned restart that failed, was interrupted, or was aborted leaving the engine down."""
    return latest_restart_conditions(node, now, t["recent_minutes"], RULE.name,
                                     _planned_and_ended_badly, ignore=_aborted_while_serving)


def _planned_and_ended_badly(restart: Restart) -> bool:
    return restart.kind == Restart.Kind.PLANNED and restart.status in ENDED_BADLY


def _aborted_while_serving(restart: Restart) -> bool:
    """Aborted before the runbook touched the container: the engine still serves."""
    return restart.status == "aborted" and (restart.container_state or {}).get("running", True)


RULE = Rule(
    name="restart-failed",
    title="Restart failed",
    description=(
        "A planned restart failed, was aborted with the engine left stopped, or was "
        "interrupted (the worker died mid-runbook): the engine may be down."
    ),
    for_seconds=0,
    evaluate=evaluate,
    value_unit="restarts",
    repeat_seconds=4 * 3600,
    thresholds=(
        ThresholdSpec("recent_minutes", "Remember for", 60.0, "min",
                      "How long after the restart ended the alert stays open.",
                      minimum=1.0, maximum=1440.0),
    ),
)
