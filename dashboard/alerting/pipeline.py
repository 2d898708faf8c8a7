"""After a collection, and for nodes out of contact: evaluate the rules, move the alerts, queue
their notifications.

The outbox rows are written inside the same transaction as the alert's state change
(``on_notice``), so a crash between the two can neither lose a notification nor leave an alert
that fired without one: delivery is at-least-once.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Q

from collectors.heartbeat import unreachable_after_seconds
from collectors.models import Event, Node
from dashboard.alerting.evaluation import contact_hold, evaluate_rules
from dashboard.alerting.lifecycle import Notice, alert_as_dict, evaluate, open_alerts_of
from dashboard.alerting.models import OPEN_STATES, Alert
from dashboard.alerting.rules.node_unreachable import NAME as NODE_UNREACHABLE
from dashboard.alerting.rules.prefill_stall import RULE as PREFILL_STALL
from dashboard.alerting.settings import read_once
from dashboard.notify.outbox import enqueue
from dashboard.notify.payloads import build_alert_message
from dashboard.restarts.unplanned import record_unplanned_restarts


def run_alerts(node: Node, now: datetime) -> list[Notice]:
    """Evaluate every enabled rule for ``node``; one outbox row per notice and channel.

    A node out of contact is held (``dashboard.alerting.evaluation``): only node-unreachable
    is evaluated, and its stored events are not turned into unplanned restarts nor judged for
    memory not returned until its figures are current again: judged from samples that stopped
    when it went silent, its memory would look as if it never came back.

    The node's open alerts are read once, first, for the hold, the lifecycle and the stalls
    that ended (only a prefill-stall alert open when the round began can end in it)."""
    open_alerts = open_alerts_of(node)
    held = contact_hold(node, now, open_alerts)
    if not held:  # first: the rules read the restarts it records
        record_unplanned_restarts(node, now)
    with read_once():  # the rules and the lifecycle judge by one read of the settings
        round_ = evaluate_rules(node, now, held=held)
        notices = evaluate(node, round_.conditions, now, evaluated_rules=round_.evaluated,
                           on_notice=lambda notice: queue_notice(notice, node, now),
                           open_alerts=open_alerts)
    if any(alert.rule == PREFILL_STALL.name for alert in open_alerts):
        _record_stalls(node, now)
    return notices


def nodes_out_of_contact(now: datetime) -> list[Node]:
    """The nodes the central watch evaluates (``watch_nodes``): every node whose last beat is
    older than the unreachable bound on the centre's clock ``now``, and every node whose
    node-unreachable alert is open (so that it resolves when the beats return, even before
    the node's first collection). Nodes that never beat are judged by their collections.
    Cost: one query."""
    silent_since = now - timedelta(seconds=unreachable_after_seconds())
    open_alerts = Alert.objects.filter(rule=NODE_UNREACHABLE, state__in=OPEN_STATES) \
        .values("node_id")
    return list(Node.objects.filter(Q(heartbeat_at__lt=silent_since) | Q(pk__in=open_alerts))
                .order_by("name"))


def queue_notice(notice: Notice, node: Node, now: datetime) -> None:
    """Write ``notice`` to the outbox: one row per channel of ``node``, in the caller's
    transaction. Cost: two template renders, a query for the channels and one INSERT."""
    payload, subject, text, html = build_alert_message(alert_as_dict(notice.alert),
                                                       notice.kind, news=notice.news)
    enqueue(kind=notice.kind, payload=payload, subject=subject, text=text, html=html,
            alert_id=notice.alert.pk, node=node, now=now)


def _record_stalls(node: Node, now: datetime) -> None:
    """A prefill stall that ended becomes an event on the engine's timeline, with its length."""
    ended = Alert.objects.filter(node=node, rule=PREFILL_STALL.name, resolved_at=now,
                                 engine__isnull=False).select_related("engine")
    Event.objects.bulk_create([
        Event(node=node, engine=alert.engine, at=alert.started_at, kind="prefill-stall",
              severity="warning",
              message=f"{alert.engine.name}: decode stalled for "
                      f"{(alert.resolved_at - alert.started_at).total_seconds():.0f} s while a "
                      f"long prompt prefilled")
        for alert in ended
    ])
