"""Readiness of this SparkOps: the database and broker answer, and this node's collection is
current.

``/readyz`` and ``manage.py status`` ask ``readiness()``. Three checks, each with a reason in
words:

* **database**: it answers on a fresh connection and is migrated (``sparkops.backends``);
* **broker**: it takes connections, or its folders are writable for the embedded file broker;
* **collection**: the last successful host collection of this node (``SPARKOPS_NODE_NAME``) is
  younger than ``collection_bound()`` — three collection intervals plus 10 s, so one late or
  failed collection is not yet "not ready", three in a row are. Where the newest collection
  failed, its error is the reason.

Liveness (``/healthz``) is not here: it asks nothing of the database or the broker, only that
the web process answers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone

from collectors.models import Collection
from sparkops.backends import Check, check_broker, check_database
from sparkops.version import VERSION

# Collections missed before the node counts as not current, and the slack on top (a busy worker
# starts a collection a little late).
MISSED_INTERVALS = 3
SLACK_SECONDS = 10.0


def collection_bound() -> float:
    """Seconds after which this node's last successful collection is stale."""
    return MISSED_INTERVALS * settings.SPARKOPS_COLLECT_INTERVAL + SLACK_SECONDS


@dataclass(frozen=True)
class Readiness:
    """The checks and their verdict: ready when every one holds."""

    node: str
    checks: tuple[Check, ...]
    last_collection_at: datetime | None = field(default=None)

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    def failed(self) -> list[Check]:
        return [check for check in self.checks if not check.ok]

    def as_dict(self) -> dict[str, object]:
        return {"status": "ready" if self.ok else "not ready", "version": VERSION,
                "node": self.node, "checks": {c.name: c.as_dict() for c in self.checks}}


def check_collection(node_name: str, now: datetime | None = None) -> tuple[Check, datetime | None]:
    """Whether ``node_name``'s last successful collection is recent enough; and when it was."""
    now = now or timezone.now()
    bound = collection_bound()
    collections = Collection.objects.filter(node__name=node_name).order_by("-at")
    last_ok = collections.filter(ok=True).only("at").first()
    newest = collections.only("at", "ok", "error").first()
    if newest is None:
        return Check("collection", False, f"node {node_name} has no collection yet"), None
    if last_ok is None:
        return Check("collection", False, f"no collection of node {node_name} has succeeded; "
                                          f"the last one failed: {newest.error}"), None
    age = max((now - last_ok.at).total_seconds(), 0.0)
    if age > bound:
        why = f"the last successful collection of node {node_name} is {age:.0f} s old " \
              f"(more than {bound:g} s)"
        if not newest.ok:
            why += f"; the last one failed: {newest.error}"
        return Check("collection", False, why, age), last_ok.at
    return Check("collection", True, f"node {node_name} was collected {age:.0f} s ago "
                                     f"(within {bound:g} s)", age), last_ok.at


def readiness(now: datetime | None = None) -> Readiness:
    """Run every check (the collection one only once the database answers)."""
    node = settings.SPARKOPS_NODE_NAME
    database = check_database()
    broker = check_broker()
    if not database.ok:
        collection = Check("collection", False, "unknown: the database does not answer")
        return Readiness(node, (database, broker, collection))
    try:
        collection, last_at = check_collection(node, now)
    except DatabaseError as error:
        collection, last_at = Check("collection", False, f"cannot read the collections: "
                                                         f"{' '.join(str(error).split())}"), None
    return Readiness(node, (database, broker, collection), last_at)
