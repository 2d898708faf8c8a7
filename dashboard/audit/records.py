"""Write the audit row every dangerous or configuration action leaves behind, allowed or not,
and read them back for the audit page.

Rows record who (user, or the worker's ``actor``), from where (the client address of the
request), what (``action``), on what (node, engine, restart), whether it was allowed, and what
came of it. Code that has no request at hand (planning, the page-cache helper) still gets the
address: a view runs it inside :func:`from_request`, which the rows written meanwhile read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any

from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils import timezone

from dashboard.audit.clientaddress import client_address
from dashboard.audit.models import AuditEntry

__all__ = ["AuditFilter", "audit", "audit_request", "filtered_entries", "from_request",
           "outcome_of"]

# The address of the request being handled, for rows written by code the view calls.
_current_address: ContextVar[str | None] = ContextVar("audit_address", default=None)

FAILED_PREFIX = "failed"
OUTCOMES = ("allowed", "refused", "failed")


def audit(action: str, *, allowed: bool, user: Any = None, actor: str = "", node: Any = None,
          engine: Any = None, restart: Any = None, outcome: str = "",
          details: dict[str, Any] | None = None, address: str | None = None) -> AuditEntry:
    """Record ``action`` (e.g. "plan-restart", "stop", "drop-caches") and what came of it.

    ``user`` is the admin who asked (None for the worker, which names itself in ``actor``).
    ``address`` defaults to the one set by :func:`from_request`, if any. An allowed action that
    went wrong says so with an ``outcome`` starting "failed".
    """
    return AuditEntry.objects.create(
        action=action, allowed=allowed,
        user=user if getattr(user, "is_authenticated", False) else None,
        actor=actor or (getattr(user, "get_username", lambda: "")() if user else ""),
        address=address or _current_address.get(),
        node=node, engine=engine, restart=restart, outcome=outcome, details=details or {},
    )


def audit_request(request: HttpRequest, action: str, *, allowed: bool,
                  **kwargs: Any) -> AuditEntry:
    """:func:`audit` for the user and client address of ``request``."""
    return audit(action, allowed=allowed, user=request.user, address=client_address(request),
                 **kwargs)


@contextlib.contextmanager
def from_request(request: HttpRequest) -> Iterator[None]:
    """Audit rows written inside this block carry ``request``'s client address."""
    token = _current_address.set(client_address(request))
    try:
        yield
    finally:
        _current_address.reset(token)


@dataclass(frozen=True)
class AuditFilter:
    """What the audit page narrows to; empty fields mean "any"."""

    action: str = ""
    user: str = ""  # a username, or a worker's actor ("worker:<host>")
    outcome: str = ""  # one of OUTCOMES
    node: str = ""  # a node's name
    since: date | None = None  # inclusive, in the site's zone
    until: date | None = None  # inclusive, in the site's zone


def filtered_entries(wanted: AuditFilter) -> QuerySet[AuditEntry]:
    """Audit rows matching ``wanted``, newest first. Cost: one indexed query (paged by caller)."""
    rows = AuditEntry.objects.select_related("user", "node", "engine", "restart")
    if wanted.action:
        rows = rows.filter(action=wanted.action)
    if wanted.user:
        rows = rows.filter(Q(user__username=wanted.user) | Q(actor=wanted.user))
    if wanted.outcome == "refused":
        rows = rows.filter(allowed=False)
    elif wanted.outcome == "failed":
        rows = rows.filter(allowed=True, outcome__startswith=FAILED_PREFIX)
    elif wanted.outcome == "allowed":
        rows = rows.filter(allowed=True).exclude(outcome__startswith=FAILED_PREFIX)
    if wanted.node:
        rows = rows.filter(node__name=wanted.node)
    if wanted.since is not None:
        rows = rows.filter(at__gte=_day_start(wanted.since))
    if wanted.until is not None:
        rows = rows.filter(at__lt=_day_start(wanted.until + timedelta(days=1)))
    return rows.order_by("-at", "-pk")


def outcome_of(entry: AuditEntry) -> str:
    """"refused", "failed" or "allowed": the filter's words for one row."""
    if not entry.allowed:
        return "refused"
    return "failed" if entry.outcome.startswith(FAILED_PREFIX) else "allowed"


def _day_start(day: date) -> datetime:
    return timezone.make_aware(datetime.combine(day, time.min), timezone.get_current_timezone())
