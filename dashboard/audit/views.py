"""The audit log and the login lockouts: pages for the people who answer for the node.

The audit page (``audit.view_audit``) lists every dangerous or configuration action, allowed,
refused or failed, filterable by action, user, outcome, node and date range. The logins page
(``audit.unlock_logins``) lists the accounts and addresses locked now and the latest failed
logins, and lifts a lock (POST + CSRF, audited).
"""

from __future__ import annotations

from datetime import date
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import messages
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from collectors.models import Node
from dashboard.audit import logins
from dashboard.audit.access import UNLOCK_LOGINS, VIEW_AUDIT, guarded
from dashboard.audit.models import AuditEntry
from dashboard.audit.records import OUTCOMES, AuditFilter, audit, filtered_entries, outcome_of

AUDIT_PAGE_SIZE = 50
RECENT_FAILURES = 100
UNLOCK_ACTION = "unlock-login"


class AuditFilterForm(forms.Form):
    """The audit page's filters (GET); every field optional."""

    action = forms.ChoiceField(required=False)
    user = forms.CharField(required=False, max_length=150)
    outcome = forms.ChoiceField(required=False, choices=[("", "any outcome")]
                                + [(outcome, outcome) for outcome in OUTCOMES])
    node = forms.ChoiceField(required=False)
    since = forms.DateField(required=False, label="From",
                            widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, label="To",
                            widget=forms.DateInput(attrs={"type": "date"}))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        actions = AuditEntry.objects.order_by("action").values_list("action", flat=True)
        self.fields["action"].choices = [("", "any action")] + [
            (action, action) for action in actions.distinct()]
        self.fields["node"].choices = [("", "any node")] + [
            (name, name) for name in Node.objects.order_by("name").values_list("name", flat=True)]

    def wanted(self) -> AuditFilter:
        """The filter asked for; an invalid field counts as "any" (its error is shown)."""
        if not self.is_bound:
            return AuditFilter()
        self.is_valid()
        data = self.cleaned_data  # only the fields that validated
        return AuditFilter(action=data.get("action") or "", user=data.get("user") or "",
                           outcome=data.get("outcome") or "", node=data.get("node") or "",
                           since=_day(data.get("since")), until=_day(data.get("until")))


@guarded(VIEW_AUDIT, "view-audit")
def audit_log(request: HttpRequest) -> HttpResponse:
    """Audit rows, newest first, ``AUDIT_PAGE_SIZE`` a page; filters in the query string."""
    form = AuditFilterForm(request.GET or None)
    rows = filtered_entries(form.wanted())
    page = Paginator(rows, AUDIT_PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    return render(request, "audit/audit.html", {
        "form": form,
        "page": page,
        "rows": [{"entry": entry, "outcome": outcome_of(entry)} for entry in page],
        "query": query.urlencode(),
    })


@guarded(UNLOCK_LOGINS, UNLOCK_ACTION)
def login_lockouts(request: HttpRequest) -> HttpResponse:
    """Accounts and addresses locked now, and the latest failed logins."""
    return render(request, "audit/logins.html", {
        "lockouts": logins.current_lockouts(timezone.now()),
        "failures": logins.recent_failures()[:RECENT_FAILURES],
        "recent_limit": RECENT_FAILURES,
        "cool_off_minutes": round(logins.cool_off().total_seconds() / 60),
        "failure_limit": settings.AXES_FAILURE_LIMIT,
    })


@require_POST
@guarded(UNLOCK_LOGINS, UNLOCK_ACTION)
def login_unlock(request: HttpRequest) -> HttpResponse:
    """Lift one lock: POST ``kind`` ("account" or "address") and ``value``."""
    kind, value = request.POST.get("kind", ""), request.POST.get("value", "").strip()
    try:
        removed = logins.unlock(kind, value)
    except ValueError as error:
        messages.error(request, f"Nothing unlocked: {error}.")
        return redirect("dashboard:logins")
    audit(UNLOCK_ACTION, allowed=True, user=request.user,
          outcome=f"lifted the lockout of {kind} {value} ({removed} counters removed)",
          details={"kind": kind, "value": value, "removed": removed})
    messages.success(request, f"Unlocked {kind} {value}.")
    return redirect("dashboard:logins")


def _day(value: date | None) -> date | None:
    return value if isinstance(value, date) else None
