"""What the two restart rules share: one condition per engine from its latest matching restart.

A condition is active while that restart is recent (finished, or requested when it has not
finished, within the rule's memory) and inactive after, so the alert resolves by itself.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from collectors.models import Node
from dashboard.alerting.conditions import Condition, Severity
from dashboard.restarts.models import Restart


def latest_restart_conditions(node: Node, now: datetime, minutes: float, rule: str,
                              match: dict[str, Any], severity: Severity = "critical",
                              ignore: Callable[[Restart], bool] | None = None,
                              ) -> list[Condition]:
    """One condition per engine of ``node`` whose latest restart matching ``match`` (a filter
    on Restart) is not ``ignore``d: active when it ended less than ``minutes`` ago. One query.
    """
    since = now - timedelta(minutes=minutes)
    latest: dict[int, Restart] = {}
    for restart in Restart.objects.filter(node=node, **match).select_related("engine") \
            .order_by("requested_at"):
        latest[restart.engine_id] = restart
    conditions = []
    for engine_id, restart in latest.items():
        if ignore is not None and ignore(restart):
            continue
        at = restart.finished_at or restart.requested_at
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
