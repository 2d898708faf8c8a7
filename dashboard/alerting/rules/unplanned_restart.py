"""Unplanned restart: an engine's container restarted, stopped or vanished behind SparkOps'
back (``dashboard.restarts.unplanned`` records each one as a Restart of kind "unplanned")."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from collectors.models import Engine, Node
from dashboard.alerting.conditions import Condition
from dashboard.alerting.rules.base import Rule, ThresholdSpec
from dashboard.alerting.rules.restart_history import latest_restart_conditions
from dashboard.restarts.models import Restart


def evaluate(node: Node, ledger: dict, engines: list[Engine], t: dict[str, Any],
             now: datetime) -> list[Condition]:
    """An engine restarted behind SparkOps' back recently (one condition per engine)."""
    return latest_restart_conditions(node, now, t["recent_minutes"], RULE.name, _unplanned)


def _unplanned(restart: Restart) -> bool:
    return restart.kind == Restart.Kind.UNPLANNED


RULE = Rule(
    name="unplanned-restart",
    title="Unplanned restart",
    description=(
        "An engine's container restarted, stopped or vanished without a planned restart "
        "(StartedAt changed, it exited, the OOM killer hit it, or it is gone). Every "
        "restart costs about ten minutes of startup on a GB10."
    ),
    for_seconds=0,
    evaluate=evaluate,
    value_unit="restarts",
    repeat_seconds=24 * 3600,
    thresholds=(
        ThresholdSpec("recent_minutes", "Remember for", 30.0, "min",
                      "How long after an unplanned restart the alert stays open.",
                      minimum=1.0, maximum=1440.0),
    ),
)
