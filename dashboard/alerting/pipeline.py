"""After a collection: evaluate the rules, move the alerts, queue their notifications."""

from __future__ import annotations

from datetime import datetime

from collectors.models import Node
from dashboard.alerting.lifecycle import Notice, alert_as_dict, evaluate
from dashboard.alerting.rules import evaluate_rules
from dashboard.notify.outbox import enqueue
from dashboard.notify.payloads import build_alert_message


def run_alerts(node: Node, now: datetime) -> list[Notice]:
    """Evaluate every enabled rule for ``node``; queue one outbox row per notice and channel."""
    conditions, evaluated = evaluate_rules(node, now)
    notices = evaluate(node, conditions, now, evaluated_rules=evaluated)
    for notice in notices:
        payload, subject, text, html = build_alert_message(alert_as_dict(notice.alert),
                                                           notice.kind)
        enqueue(kind=notice.kind, payload=payload, subject=subject, text=text, html=html,
                alert_id=notice.alert.pk, node=node)
    return notices
