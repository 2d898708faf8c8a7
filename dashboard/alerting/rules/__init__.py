"""The alert rules: one module per rule, holding its documentation, defaults and evaluation.

Each module defines ``RULE`` (a :class:`~dashboard.alerting.rules.base.Rule`); :data:`RULES`
lists them in documentation order, the order of the rule settings page. The rules read stored
state only (the ledger written after each collection, engine rows and samples, ledger changes,
restarts) and compare sizes in GiB. Adding a rule is a new module here and one line in
:data:`RULES`; its stored overrides need no migration (``RuleSetting`` is keyed by name).
"""

from __future__ import annotations

from dashboard.alerting.rules import (
    engine_down,
    fragmentation,
    headroom_floor,
    memory_not_returned,
    node_unreachable,
    orphan_rank,
    overcommit,
    predicted_squeeze,
    prefill_squeeze,
    prefill_stall,
    queue_backlog,
    restart_failed,
    unexpected_reboot,
    unplanned_restart,
)
from dashboard.alerting.rules.base import DEFAULT_REPEAT_SECONDS, Rule, ThresholdSpec

RULES: dict[str, Rule] = {
    rule.name: rule
    for rule in (
        prefill_squeeze.RULE,
        predicted_squeeze.RULE,
        headroom_floor.RULE,
        fragmentation.RULE,
        queue_backlog.RULE,
        prefill_stall.RULE,
        engine_down.RULE,
        node_unreachable.RULE,
        orphan_rank.RULE,
        overcommit.RULE,
        unplanned_restart.RULE,
        restart_failed.RULE,
        unexpected_reboot.RULE,
        memory_not_returned.RULE,
    )
}

__all__ = ["DEFAULT_REPEAT_SECONDS", "RULES", "Rule", "ThresholdSpec"]
