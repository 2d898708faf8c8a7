"""Every enabled rule evaluated for one node, with the settings in force.

Kept apart from the rule package: the rules declare their defaults and need no stored state of
their own, while this step reads the admins' overrides (``dashboard.alerting.settings``).
"""

from __future__ import annotations

from datetime import datetime

from collectors.models import Engine, Node
from dashboard.alerting.conditions import Condition
from dashboard.alerting.rules import RULES
from dashboard.alerting.settings import all_rule_settings


def evaluate_rules(node: Node, now: datetime) -> tuple[list[Condition], set[str]]:
    """Every enabled rule's conditions for ``node``, and the set of rules evaluated.

    Cost: one query for the settings of every rule and one for the engines, plus each rule's
    own queries.
    """
    ledger = node.ledger or {}
    engines = list(Engine.objects.filter(node=node, present=True))
    settings = all_rule_settings()
    conditions: list[Condition] = []
    evaluated: set[str] = set()
    for name, rule in RULES.items():
        setting = settings[name]
        if not setting.enabled:
            continue
        evaluated.add(name)
        conditions += rule.evaluate(node, ledger, engines, dict(setting.thresholds), now)
    return conditions, evaluated
