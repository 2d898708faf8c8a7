"""Node unreachable: a node's worker has stopped beating, so nothing about the node is current.

Every node's worker beats every ``SPARKOPS_HEARTBEAT_SECONDS`` (``collectors.heartbeat``); a
node whose last beat is older than ``SPARKOPS_UNREACHABLE_AFTER_BEATS`` beats is unreachable:
the host is down or wedged (a GB10 out of unified memory does not raise an error, it stops), its
worker died, or the network between it and the centre is cut. Which of these it is the centre
cannot tell; what it can tell is that the figures it holds for that node are the last ones
known, not the present.

So this one alert stands for the whole node, and while the node is silent its other rules are
held (``dashboard.alerting.evaluation``): no ``engine-down`` per engine because their
containers could not be read, no alert resolved because the last ledger looked fine. A dead
agent collects nothing, so nothing would evaluate the node at all: the central task
``watch_nodes`` (``dashboard.alerting.tasks``) evaluates every silent node each heartbeat
interval, which is what makes this alert fire, and every node whose alert is open, which is
what resolves it when beats return even before the node's first collection.

A node that never beat (its rows predate fleets, or no worker of its own ever registered it)
is never unreachable: its value is unknown, which opens and resolves nothing.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from collectors.heartbeat import contact_age_seconds, interval_seconds, unreachable_after_seconds
from collectors.models import Engine, Node
from dashboard.alerting.conditions import Condition
from dashboard.alerting.rules.base import Rule
from sparkops.timetext import age_text, moment_text

NAME = "node-unreachable"


def evaluate(node: Node, ledger: dict, engines: list[Engine], t: dict[str, Any],
             now: datetime) -> list[Condition]:
    """One condition for the node: the age of its last beat against the bound, on the centre's
    clock (``now``); unknown for a node that never beat. Cost: none (no query)."""
    bound = unreachable_after_seconds()
    age = contact_age_seconds(node, now)
    if age is None:
        summary = (f"{node.name} has never sent a heartbeat: its collections alone say whether "
                   "it is current")
    elif age > bound:
        summary = (f"{node.name} is unreachable: last contact {age_text(age)} ago, at "
                   f"{moment_text(node.heartbeat_at, UTC)} (the bound is {age_text(bound)}); "
                   "its other alerts are held at their last state")
    else:
        summary = f"{node.name} is reachable: last contact {age_text(age)} ago"
    return [Condition(
        rule=NAME, node_id=node.pk, engine_id=None, value=age, threshold=bound, clear=bound,
        direction="above", severity="critical", summary=summary,
        details={
            "last_contact_at": node.heartbeat_at.isoformat() if node.heartbeat_at else None,
            "contact_age_seconds": round(age, 1) if age is not None else None,
            "unreachable_after_seconds": bound,
            "heartbeat_interval_seconds": interval_seconds(),
            "agent_started_at": node.agent_started_at.isoformat()
            if node.agent_started_at else None,
            "clock_skew_seconds": node.clock_skew_seconds,
        },
    )]


RULE = Rule(
    name=NAME,
    title="Node unreachable",
    description=(
        "The node's worker has not sent a heartbeat for longer than "
        "SPARKOPS_UNREACHABLE_AFTER_BEATS heartbeats (3 × SPARKOPS_HEARTBEAT_SECONDS, 30 s, by "
        "default): the host is down or wedged, its worker stopped, or the network to it is cut. "
        "The centre checks every silent node each heartbeat interval, so a node is reported at "
        "most that bound plus one interval plus the evaluation's own time after its last beat "
        "(about 40 s by default). While the node is unreachable, and once back until its first "
        "collection, this is the only rule evaluated for it (also when this rule is "
        "disabled): its other alerts (engine-down for each of its engines, headroom, …) are "
        "held as they were, neither fired nor resolved on the figures from before it went "
        "silent. Resolves when the beats return. A node that never sent a heartbeat is "
        "judged by its collections alone."
    ),
    for_seconds=0,
    evaluate=evaluate,
    value_unit="s",
)
