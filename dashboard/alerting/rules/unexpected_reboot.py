"""Unexpected reboot: the node's host restarted while SparkOps ran on it, without SparkOps' clean
stop before, as a GB10 does when its unified memory runs out (it wedges or powers off instead of
raising a CUDA OOM).

``collectors.flightrecorder`` finds it when the node's worker starts again and writes one
``unexpected-reboot`` Event at the last recorded moment, whose message carries the post-mortem's
summary (lowest headroom, who held what, which engine was loading or prefilling). That moment can
be long before SparkOps came back (the host may have stayed down), so the alert's memory runs from
when it was found: the node's first collection after the event, or now while there is none yet.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from collectors.flightrecorder import UNEXPECTED_REBOOT
from collectors.models import Collection, Engine, Event, Node
from dashboard.alerting.conditions import Condition
from dashboard.alerting.rules.base import Rule, ThresholdSpec
from sparkops.prepared import PreparedRead
from sparkops.timetext import moment_text

# Unexpected reboots looked at per evaluation, newest first: an episode of more within the
# rule's memory is already a node that keeps falling over.
EPISODE_LIMIT = 10
# The node's latest unexpected reboots, newest first (a prepared read: every round reads them).
_LATEST_REBOOTS = PreparedRead(lambda node_id: Event.objects
                               .filter(node_id=node_id, kind=UNEXPECTED_REBOOT)
                               .order_by("-at")[:EPISODE_LIMIT])
# Where the message's summary ends and its pointer to the post-mortem file begins.
_FILE_PART = " The recorded minutes ("


def evaluate(node: Node, ledger: dict, engines: list[Engine], t: dict[str, Any],
             now: datetime) -> list[Condition]:
    """One condition for the node while an unexpected reboot was found recently; none before
    the node's first one. Cost: one query, and one more per unexpected reboot looked at."""
    events = _LATEST_REBOOTS(node.pk)
    if not events:
        return []
    since = now - timedelta(minutes=t["recent_minutes"])
    found = [(event, found_at(node, event)) for event in events]
    recent = [(event, at) for event, at in found if at is None or at >= since]
    latest, latest_found = found[0]
    count = len(recent) if recent and recent[0][0] == latest else 0
    return [Condition(
        rule=RULE.name, node_id=node.pk, engine_id=None, value=float(count),
        threshold=0.5, clear=0.5, direction="above", severity="critical",
        summary=f"{node.name}: {post_mortem_summary(latest)}",
        details={
            "event_id": latest.pk,
            "last_record_at": latest.at.isoformat(),
            "found_at": latest_found.isoformat() if latest_found else None,
            "reboot_count": count,
            "reboots": [f"last record at {moment_text(event.at, UTC)}" for event, _ in recent],
            "message": latest.message,
        },
    )]


def found_at(node: Node, event: Event) -> datetime | None:
    """When SparkOps was back after ``event``: the node's first collection after its last
    recorded moment; None while there is none yet (the reboot was only just found)."""
    return Collection.objects.filter(node=node, at__gt=event.at).order_by("at") \
        .values_list("at", flat=True).first()


def post_mortem_summary(event: Event) -> str:
    """The event's message without its pointer to the post-mortem file (which lies on the
    node's disk, not where the alert is read)."""
    return event.message.split(_FILE_PART, 1)[0]


RULE = Rule(
    name="unexpected-reboot",
    title="Unexpected reboot",
    description=(
        "The node's host restarted without SparkOps stopping cleanly first: it wedged, lost "
        "power or was reset, as a GB10 does when its unified memory runs out. The alert names "
        "the last recorded moment and what the flight recorder's last minutes show (lowest "
        "headroom, who held what, which engine was loading or prefilling)."
    ),
    for_seconds=0,
    evaluate=evaluate,
    value_unit="restarts",
    repeat_seconds=24 * 3600,
    thresholds=(
        ThresholdSpec("recent_minutes", "Remember for", 60.0, "min",
                      "How long after SparkOps found the reboot the alert stays open.",
                      minimum=1.0, maximum=1440.0),
    ),
)
