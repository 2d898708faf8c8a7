"""Every enabled rule evaluated for one node, with the settings in force.

Kept apart from the rule package: the rules declare their defaults and need no stored state of
their own, while this step reads the admins' overrides (``dashboard.alerting.settings``).

**A node out of contact is held.** The rules read what the node's collections stored; once
the node stops beating (``collectors.heartbeat``) that is only its last known state. Judging
it again would fire ``engine-down`` for every engine whose container nobody can read now and
resolve alerts whose figures merely stopped moving. So for a node that is unreachable only
``node-unreachable`` is evaluated (:func:`contact_hold`), and the lifecycle, which leaves the
alerts of rules that did not run as they are (``evaluated_rules``), keeps every other alert of
the node as it was: visible, firing or pending, not resolved. The hold lasts until the node's
first collection after its node-unreachable alert opened: its beats may return before its
collections do, and until then the figures are still the old ones. It holds whether or not
node-unreachable is enabled: stale figures are stale either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from collectors.heartbeat import is_unreachable
from collectors.models import Node
from collectors.reads import present_engines
from dashboard.alerting import restart_reads
from dashboard.alerting.conditions import Condition
from dashboard.alerting.lifecycle import OpenAlert, open_alerts_of
from dashboard.alerting.recent import one_read
from dashboard.alerting.rules import RULES
from dashboard.alerting.rules.node_unreachable import NAME as NODE_UNREACHABLE
from dashboard.alerting.settings import all_rule_settings, read_once

UNREACHABLE = "unreachable"  # its last beat is older than the bound
RETURNING = "returning"  # beating again, not yet collected since it went silent


@dataclass(frozen=True)
class Evaluation:
    """One round's rule results for a node: the conditions, the rules that ran (the others'
    alerts stay as they are), and why the node's other rules were held ("" when none was)."""

    conditions: list[Condition] = field(default_factory=list)
    evaluated: set[str] = field(default_factory=set)
    held: str = ""


def evaluate_rules(node: Node, now: datetime, *, held: str | None = None) -> Evaluation:
    """Every enabled rule's conditions for ``node``, and the set of rules evaluated; only
    node-unreachable while the node is held (:func:`contact_hold`, unless the caller passes
    what it found).

    Cost: one query for the settings of every rule (read once for the round, including the
    rules that read another rule's settings) and one for the engines, plus each rule's
    own queries, the engines' recent samples read once per question for all rules
    (``dashboard.alerting.recent``) and the node's restarts once for the rules that judge them
    (``dashboard.alerting.restart_reads``); for a node that beats, one more for its open
    node-unreachable alert, unless the caller passes ``held``.
    """
    if held is None:
        held = contact_hold(node, now)
    ledger = node.ledger or {}
    engines = present_engines(node)
    result = Evaluation(held=held)
    with read_once(), one_read(engines), restart_reads.one_read(engines):
        settings = all_rule_settings()
        for name, rule in RULES.items():
            if not settings[name].enabled or (held and name != NODE_UNREACHABLE):
                continue
            result.evaluated.add(name)
            result.conditions.extend(rule.evaluate(node, ledger, engines,
                                                   dict(settings[name].thresholds), now))
    return result


def contact_hold(node: Node, now: datetime,
                 open_alerts: list[OpenAlert] | None = None) -> str:
    """Why ``node``'s rules other than node-unreachable must not judge its stored figures now:
    :data:`UNREACHABLE`, :data:`RETURNING` (its node-unreachable alert is still open and no
    collection finished since that alert opened), or "" when they may.

    The last collection is stamped with the node's clock; it is put on the centre's with the
    skew of the node's latest beat. ``open_alerts`` are the node's open alerts, when the
    caller read them (``lifecycle.open_alerts_of``). Cost: no query for a node that never beat
    or is unreachable, or when ``open_alerts`` is passed; else one.
    """
    if node.heartbeat_at is None:
        return ""
    if is_unreachable(node, now):
        return UNREACHABLE
    if open_alerts is None:
        open_alerts = open_alerts_of(node)
    opened = next((alert.started_at for alert in open_alerts
                   if alert.rule == NODE_UNREACHABLE), None)
    if opened is None:
        return ""
    collected = node.last_collection_at
    if collected is not None and node.clock_skew_seconds is not None:
        collected -= timedelta(seconds=node.clock_skew_seconds)
    return RETURNING if collected is None or collected <= opened else ""
