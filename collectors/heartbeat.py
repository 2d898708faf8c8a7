"""A node's heartbeat: its worker says it is alive, and the centre judges who has gone silent.

Every node's worker (``bin/sparkops agent`` on a fleet node, the one worker of a one-node stack)
calls :func:`beat` every ``SPARKOPS_HEARTBEAT_SECONDS``. The beat is stamped with the database's
clock, which is the centre's for every node, and carries the node's own clock, so the skew
between the two is known (``Node.clock_skew_seconds``, positive when the node runs ahead).
Samples stay on the collector's clock (the node's); the skew says how far to trust comparing
them with the centre's moments.

A node is unreachable when its last beat is older than ``SPARKOPS_UNREACHABLE_AFTER_BEATS``
beats. A node that never beat (rows from before fleets, a node only ever collected by another
host's worker) is never called unreachable: its collections alone say whether it is current.
"""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db.models.functions import Now
from django.utils import timezone

from collectors.models import Node


def interval_seconds() -> float:
    """Seconds between two beats of a node's worker."""
    return float(settings.SPARKOPS_HEARTBEAT_SECONDS)


def unreachable_after_seconds() -> float:
    """How old a node's last beat may be before the node is unreachable."""
    return interval_seconds() * float(settings.SPARKOPS_UNREACHABLE_AFTER_BEATS)


def beat(node_name: str, node_clock: datetime | None = None) -> None:
    """Record a beat of ``node_name``'s worker now: the centre's clock from the database, the
    skew from ``node_clock`` (this process's clock when not given).

    One read of the database's clock, then one write of both figures: a beat is recorded whole
    or not at all, never a fresh beat beside the skew of an older one."""
    node_clock = node_clock or timezone.now()
    centre = Node.objects.filter(name=node_name).annotate(centre=Now()) \
        .values_list("centre", flat=True).first()
    if centre is None:  # no such node (yet): nothing to record
        return
    Node.objects.filter(name=node_name).update(
        heartbeat_at=centre, clock_skew_seconds=(node_clock - centre).total_seconds())


def contact_age_seconds(node: Node, now: datetime) -> float | None:
    """Seconds since the node's last beat on the centre's clock ``now``; None if it never beat."""
    if node.heartbeat_at is None:
        return None
    return max(0.0, (now - node.heartbeat_at).total_seconds())


def is_unreachable(node: Node, now: datetime) -> bool:
    """Has the node's worker been silent for longer than the bound? Never for a node that
    never beat."""
    age = contact_age_seconds(node, now)
    return age is not None and age > unreachable_after_seconds()
