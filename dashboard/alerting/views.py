"""Pages for alerts, silences and rule settings: thin adapters over the alerting modules.

Everyone logged in can read them. Changing anything (creating or expiring a silence, editing a
rule) needs ``user.is_staff``; anyone else gets 403. Changes are POST with CSRF.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from functools import wraps
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from collectors.models import Node
from dashboard.alerting.forms import RuleSettingForm, SilenceForm
from dashboard.alerting.models import Alert, AlertState, RuleSetting, Silence
from dashboard.alerting.settings import RULES, all_rule_settings
from dashboard.alerting.silences import (
    active_silences,
    expire_silence,
    expired_silences,
    silences_muting,
    upcoming_silences,
)

# How many resolved alerts and expired silences the pages show; older ones stay in the DB.
HISTORY_LIMIT = 100
DEFAULT_SILENCE_HOURS = 2

View = Callable[..., HttpResponse]


def staff_required(view: View) -> View:
    """Login first (redirect), then staff only (403 for everyone else)."""

    @login_required
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_staff:
            raise PermissionDenied("Only staff can change alerting settings.")
        return view(request, *args, **kwargs)

    return wrapper


@login_required
def alerts(request: HttpRequest) -> HttpResponse:
    """Firing alerts first, then pending, then the latest resolved ones; ``?node=`` filters."""
    nodes = Node.objects.all()
    chosen = nodes.filter(name=request.GET.get("node", "")).first()
    listed = Alert.objects.select_related("node", "engine")
    if chosen is not None:
        listed = listed.filter(node=chosen)
    return render(request, "alerting/alerts.html", {
        "nodes": nodes,
        "chosen": chosen,
        "firing": listed.filter(state=AlertState.FIRING).order_by("-fired_at", "-id"),
        "pending": listed.filter(state=AlertState.PENDING).order_by("-started_at", "-id"),
        "resolved": listed.filter(state=AlertState.RESOLVED)
        .order_by("-resolved_at", "-id")[:HISTORY_LIMIT],
        "history_limit": HISTORY_LIMIT,
        "rules": RULES,
    })


@login_required
def alert(request: HttpRequest, pk: int) -> HttpResponse:
    """One alert: its figures, its AlertEvent timeline and the silences muting it now."""
    found = get_object_or_404(Alert.objects.select_related("node", "engine"), pk=pk)
    now = timezone.now()
    return render(request, "alerting/alert.html", {
        "alert": found,
        "events": found.events.all(),
        "muting": silences_muting(found, now) if found.is_open else [],
        "rule": RULES.get(found.rule),
    })


@login_required
def silences(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    return render(request, "alerting/silences.html", {
        "active": active_silences(now),
        "upcoming": upcoming_silences(now),
        "expired": expired_silences(now)[:HISTORY_LIMIT],
        "history_limit": HISTORY_LIMIT,
        "form": _new_silence_form(request, now) if request.user.is_staff else None,
    })


@staff_required
def silence_new(request: HttpRequest) -> HttpResponse:
    """GET: the form (prefilled from ``?node=&rule=&engine=``); POST: create, back to the list."""
    now = timezone.now()
    if request.method != "POST":
        return render(request, "alerting/silence_form.html",
                      {"form": _new_silence_form(request, now)})
    form = SilenceForm(request.POST, now=now)
    if not form.is_valid():
        return render(request, "alerting/silence_form.html", {"form": form}, status=400)
    silence = form.save(request.user)
    messages.success(request, f"Silence #{silence.pk} of {silence.matcher_text} is active "
                              f"until {timezone.localtime(silence.ends_at):%Y-%m-%d %H:%M}.")
    return redirect("dashboard:silences")


@require_POST
@staff_required
def silence_expire(request: HttpRequest, pk: int) -> HttpResponse:
    silence = get_object_or_404(Silence, pk=pk)
    if expire_silence(silence, timezone.now(), by=request.user):
        messages.success(request, f"Silence #{silence.pk} expired.")
    else:
        messages.info(request, f"Silence #{silence.pk} had already ended.")
    return redirect("dashboard:silences")


@login_required
def rules(request: HttpRequest) -> HttpResponse:
    """Each rule's documentation and the settings in force, with what an admin changed."""
    return render(request, "alerting/rules.html", {"settings": all_rule_settings().values()})


@staff_required
def rule_edit(request: HttpRequest, rule: str) -> HttpResponse:
    defaults = RULES.get(rule)
    if defaults is None:
        raise Http404(f"no rule {rule}")
    stored = RuleSetting.objects.filter(rule=rule).first()
    if request.method != "POST":
        form = RuleSettingForm(defaults=defaults, stored=stored)
        return render(request, "alerting/rule_edit.html", {"form": form, "rule": defaults})
    form = RuleSettingForm(request.POST, defaults=defaults, stored=stored)
    if not form.is_valid():
        return render(request, "alerting/rule_edit.html", {"form": form, "rule": defaults},
                      status=400)
    form.save(request.user, timezone.now())
    messages.success(request, f"Settings of {defaults.title} saved; they apply from the next "
                              "evaluation.")
    return redirect("dashboard:rules")


def _new_silence_form(request: HttpRequest, now: datetime) -> SilenceForm:
    ends_at = timezone.localtime(now + timedelta(hours=DEFAULT_SILENCE_HOURS))
    initial = {"ends_at": ends_at.replace(second=0, microsecond=0)}
    for key in ("node", "rule", "engine"):
        if request.GET.get(key):
            initial[key] = request.GET[key]
    return SilenceForm(initial=initial, now=now)
