"""The fleet at a glance: every node's headroom against its engines' prefill needs, its firing
alerts, its engines, and when the centre last heard from it.

The read model of the fleet page (``dashboard.fleet_views``), in plain functions over stored
rows: ``Node.ledger`` (the headroom and each engine's prefill need, ``collectors.ledger``), the
present engines (their phase and rates as the overview's cards write them,
``collectors.enginecard``), the firing alerts, and the heartbeat (``collectors.heartbeat``).

**Contact.** The last contact is the node's last heartbeat (the centre's clock), or, for a
node whose worker never beat (a one-node stack from before fleets), its last collection (the
collector's clock). A node past the heartbeat's bound is *unreachable*: its figures stay on the
page as its last known state, greyed and aged ("last contact 3 min ago"), never dropped and
never passed off as current. A node without a heartbeat whose collections stopped is *stale*
by the overview's rule (``collectors.sampling.stale_after``). The clock skew (the node's clock
less the centre's, measured at each beat) is shown from 1 s and warned from 5 s: samples are on
the node's clock, so comparing them with the centre's moments is off by that much.

Cost: a constant number of queries whatever the number of nodes (:func:`fleet_overview`: the
nodes, their present engines in one prefetch, the firing alerts, the prefill margin).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Prefetch

from collectors.enginecard import engine_card
from collectors.heartbeat import contact_age_seconds, is_unreachable, unreachable_after_seconds
from collectors.models import Engine, Node
from collectors.sampling import stale_after
from dashboard.alerting.models import Alert, AlertState
from dashboard.alerting.settings import prefill_margin_bytes
from dashboard.drift import DriftRow, Finding, drift_findings, drift_table
from sparkops.timetext import age_text
from sparkops.units import UNKNOWN, fixed_gib_text

SEVERITIES = ("critical", "warning", "info")
SKEW_SHOWN_SECONDS = 1.0
SKEW_WARNED_SECONDS = 5.0

REACHABLE = "reachable"
UNREACHABLE = "unreachable"
STALE = "stale"
NEVER = "never"


@dataclass(frozen=True)
class Contact:
    """When the centre last heard from a node, and what that says about its figures.

    ``state`` is :data:`REACHABLE`, :data:`UNREACHABLE`, :data:`STALE` or :data:`NEVER`;
    ``source`` "heartbeat" or "last collection" ("" for never); ``text`` for people
    ("last contact 3 min 5 s ago (heartbeat)", "never"); ``skew_text`` the clock skew in
    words ("" under 1 s or unknown) and ``skew_warned`` from 5 s.
    """

    state: str
    source: str
    at: datetime | None
    age_seconds: float | None
    text: str
    skew_seconds: float | None
    skew_text: str
    skew_warned: bool

    @property
    def greyed(self) -> bool:
        """Its figures are the last known, not current."""
        return self.state in (UNREACHABLE, STALE)


@dataclass(frozen=True)
class PrefillRoom:
    """One engine's prefill need against the node's headroom, with the prefill-squeeze
    margin: ``fits`` None when either figure is unknown."""

    engine: str
    need_bytes: int | None
    spare_bytes: int | None
    fits: bool | None
    text: str


@dataclass
class NodeSummary:
    """One node's row of the fleet page."""

    node: Node
    contact: Contact
    headroom_bytes: int | None
    headroom_text: str
    ledger_at: str | None
    prefill: list[PrefillRoom]
    engines: list[dict[str, Any]]
    firing_by_severity: dict[str, int]
    worst: Alert | None
    firing_count: int = field(default=0)


@dataclass
class FleetOverview:
    nodes: list[NodeSummary]
    drift: list[DriftRow]
    findings: list[Finding]
    margin_bytes: int

    @property
    def unreachable_count(self) -> int:
        return sum(1 for row in self.nodes if row.contact.state == UNREACHABLE)

    @property
    def firing_count(self) -> int:
        return sum(row.firing_count for row in self.nodes)

    @property
    def drift_count(self) -> int:
        return sum(1 for row in self.drift if row.differs)

    @property
    def bound_text(self) -> str:
        """After how long without a heartbeat a node is unreachable, in words."""
        return age_text(unreachable_after_seconds())


def fleet_nodes() -> list[Node]:
    """Every node with its present engines prefetched (two queries)."""
    present = Engine.objects.filter(present=True).order_by("name")
    return list(Node.objects.order_by("name")
                .prefetch_related(Prefetch("engines", queryset=present)))


def fleet_overview(now: datetime, collect_interval: float) -> FleetOverview:
    """The whole fleet page as of the centre's clock ``now``. Cost: four queries (nodes,
    engines, firing alerts, the prefill-squeeze settings), whatever the number of nodes."""
    nodes = fleet_nodes()
    firing: dict[int, list[Alert]] = {}
    for alert in firing_alerts():
        firing.setdefault(alert.node_id, []).append(alert)
    margin = prefill_margin_bytes()
    return FleetOverview(
        nodes=[node_summary(node, firing.get(node.pk, []), margin, now, collect_interval)
               for node in nodes],
        drift=drift_table(nodes),
        findings=drift_findings(nodes),
        margin_bytes=margin,
    )


def firing_alerts() -> list[Alert]:
    """Every firing alert of the fleet, worst first: by severity, then the latest fired.
    One query (the engine names joined)."""
    rank = {severity: i for i, severity in enumerate(SEVERITIES)}
    alerts = list(Alert.objects.filter(state=AlertState.FIRING).select_related("engine")
                  .order_by("-fired_at", "-pk"))
    return sorted(alerts, key=lambda alert: rank.get(alert.severity, len(rank)))


def node_summary(node: Node, firing: list[Alert], margin: int, now: datetime,
                 collect_interval: float) -> NodeSummary:
    """One node's row from its row, prefetched engines and firing alerts (worst first).
    Cost: no query when its engines are prefetched."""
    ledger = node.ledger or {}
    headroom = ledger.get("headroom")
    counts = Counter(alert.severity for alert in firing)
    return NodeSummary(
        node=node,
        contact=node_contact(node, now, collect_interval),
        headroom_bytes=headroom,
        headroom_text=fixed_gib_text(headroom) if ledger else f"{UNKNOWN} — no ledger yet",
        ledger_at=ledger.get("at"),
        prefill=[prefill_room(share, headroom, margin) for share in ledger.get("engines", [])],
        engines=[engine_card(engine) for engine in node.engines.all()],
        firing_by_severity={severity: counts[severity] for severity in SEVERITIES
                            if counts[severity]},
        worst=firing[0] if firing else None,
        firing_count=len(firing),
    )


def prefill_room(share: dict[str, Any], headroom: int | None, margin: int) -> PrefillRoom:
    """Whether the engine's next prefill fits the node's headroom (the interval's lowest, as
    the prefill-squeeze alert judges it) with the margin, in words."""
    name, need = share.get("name", "?"), share.get("prefill_need")
    if need is None:
        return PrefillRoom(name, None, None, None,
                           f"{name}: prefill need {UNKNOWN} — set "
                           "sparkops.prefill-bytes-per-token or serve a model with a config.json")
    if headroom is None:
        return PrefillRoom(name, need, None, None,
                           f"{name}: prefill need {fixed_gib_text(need)}, headroom {UNKNOWN}")
    spare = headroom - margin - need
    margin_text = f"with the {fixed_gib_text(margin)} margin"
    verdict = (f"fits, {fixed_gib_text(spare)} to spare {margin_text}" if spare >= 0
               else f"does not fit: {fixed_gib_text(-spare)} short {margin_text}")
    return PrefillRoom(name, need, spare, spare >= 0,
                       f"{name}: prefill need {fixed_gib_text(need)} — {verdict}")


def node_contact(node: Node, now: datetime, collect_interval: float) -> Contact:
    """When the centre last heard from ``node`` (module docstring). Cost: none."""
    skew = node.clock_skew_seconds
    skew_text = clock_skew_text(skew)
    warned = skew is not None and abs(skew) >= SKEW_WARNED_SECONDS
    age = contact_age_seconds(node, now)
    if age is not None:
        state = UNREACHABLE if is_unreachable(node, now) else REACHABLE
        return Contact(state, "heartbeat", node.heartbeat_at, age,
                       f"last contact {age_text(age)} ago (heartbeat)", skew, skew_text, warned)
    collected = node.last_collection_at
    if collected is None:
        return Contact(NEVER, "", None, None, "never", skew, skew_text, warned)
    age = max(0.0, (now - collected).total_seconds())
    state = STALE if age > stale_after(collect_interval) else REACHABLE
    return Contact(state, "last collection", collected, age,
                   f"last contact {age_text(age)} ago (last collection)", skew, skew_text,
                   warned)


def clock_skew_text(skew: float | None) -> str:
    """"node clock 7.2 s ahead of the centre" (or behind); "" under 1 s or when unknown."""
    if skew is None or abs(skew) < SKEW_SHOWN_SECONDS:
        return ""
    way = "ahead of" if skew > 0 else "behind"
    return f"node clock {abs(skew):.1f} s {way} the centre"

