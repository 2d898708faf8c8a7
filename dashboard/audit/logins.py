"""Login limits on top of django-axes: the lockout page, the lockouts in force, and lifting them.

Axes counts failed logins per account and per client address (``AXES_LOCKOUT_PARAMETERS``),
keeps every failure as an ``AccessFailureLog`` row, and refuses a locked-out account or address
before any password is checked (so the right password does not help while locked). A lock lifts
by itself ``AXES_COOLOFF_TIME`` after the latest failure; every try while locked counts as one.
The client address is ``dashboard.audit.clientaddress.client_address``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from axes.handlers.proxy import AxesProxyHandler
from axes.models import AccessAttempt, AccessFailureLog
from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.db.models import Max, QuerySet, Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

__all__ = ["Lockout", "cool_off", "current_lockouts", "lockout_message", "lockout_response",
           "recent_failures", "unlock"]

ACCOUNT = "account"
ADDRESS = "address"
# HTTP 429 Too Many Requests: axes' own status for a lockout.
LOCKED_STATUS = 429


def cool_off() -> timedelta:
    """How long a lock lasts after the latest failure (``AXES_COOLOFF_TIME``)."""
    return settings.AXES_COOLOFF_TIME


def lockout_message() -> str:
    """The words the login page shows to someone locked out."""
    minutes = max(1, round(cool_off().total_seconds() / 60))
    return (f"Too many failed attempts for this account or address; try again in {minutes} "
            f"minute{'s' if minutes != 1 else ''}.")


def lockout_response(request: HttpRequest, original_response: HttpResponse | None = None,
                     credentials: dict[str, Any] | None = None) -> HttpResponse:
    """The login page again, with the lockout in words instead of a password error (HTTP 429).

    Axes calls this (``AXES_LOCKOUT_CALLABLE``) for a login refused because the account or the
    address is locked; it does not say which, so it tells an attacker nothing about accounts.
    """
    return render(request, "registration/login.html", {
        "form": AuthenticationForm(request),
        "lockout": lockout_message(),
        "next": request.POST.get("next", request.GET.get("next", "")),
    }, status=LOCKED_STATUS)


@dataclass(frozen=True)
class Lockout:
    """One account or address locked now: its failures within the cool-off and when it lifts."""

    kind: str  # ACCOUNT or ADDRESS
    value: str  # the username or the IP address
    failures: int
    last_failure_at: datetime
    until: datetime


def current_lockouts(now: datetime) -> list[Lockout]:
    """Accounts and addresses locked at ``now``, latest failure first. Cost: two queries."""
    limit, span = settings.AXES_FAILURE_LIMIT, cool_off()
    recent = AccessAttempt.objects.filter(attempt_time__gt=now - span)
    found: list[Lockout] = []
    for kind, field in ((ACCOUNT, "username"), (ADDRESS, "ip_address")):
        grouped = (recent.exclude(**{f"{field}__isnull": True}).values(field)
                   .annotate(failures=Sum("failures_since_start"), last=Max("attempt_time"))
                   .filter(failures__gte=limit))
        found += [Lockout(kind=kind, value=row[field], failures=row["failures"],
                          last_failure_at=row["last"], until=row["last"] + span)
                  for row in grouped]
    return sorted(found, key=lambda lockout: lockout.last_failure_at, reverse=True)


def recent_failures() -> QuerySet[AccessFailureLog]:
    """Every recorded failed login, newest first (the caller slices)."""
    return AccessFailureLog.objects.order_by("-attempt_time", "-pk")


def unlock(kind: str, value: str) -> int:
    """Lift the lock on one account (``kind`` ACCOUNT) or address (ADDRESS) by forgetting its
    counted failures; the failure log stays. Returns how many counters were removed."""
    if not value:
        # Axes reads an empty filter as "everything": never lift every lock by accident.
        raise ValueError("no account or address given")
    if kind == ACCOUNT:
        return AxesProxyHandler.reset_attempts(username=value)
    if kind == ADDRESS:
        return AxesProxyHandler.reset_attempts(ip_address=value)
    raise ValueError(f"unknown lockout kind {kind!r}")
