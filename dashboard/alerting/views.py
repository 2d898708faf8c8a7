"""Pages for alerts, silences and rule settings: thin adapters over the alerting modules.

Everyone logged in can read them. Creating or expiring a silence needs
``alerting.change_silences``, editing a rule ``alerting.change_rules`` (see
``dashboard.audit.access``); anyone else gets 403 and, for a POST, an audit row "refused".
Changes are POST with CSRF and each one writes an audit row.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from collectors.models import Node
from dashboard.alerting.forms import RuleSettingForm, SilenceForm
from dashboard.alerting.models import Alert, AlertState, RuleSetting, Silence
from dashboard.alerting.rules import RULES
from dashboard.alerting.settings import all_rule_settings
from dashboard.alerting.silences import (
    active_silences,
    expire_silence,
    expired_silences,
    silences_muting,
    upcoming_silences,
)
from dashboard.audit.access import CHANGE_RULES, CHANGE_SILENCES, guarded
from dashboard.audit.records import audit

# How many resolved alerts and expired silences the pages show; older ones stay in the DB.
HISTORY_LIMIT = 100
DEFAULT_SILENCE_HOURS = 2
CREATE_SILENCE_ACTION = "create-silence"
EXPIRE_SILENCE_ACTION = "expire-silence"
EDIT_RULE_ACTION = "edit-rule"


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
        "form": _new_silence_form(request, now) if CHANGE_SILENCES.held_by(request.user)
        else None,
        "can_change": CHANGE_SILENCES.held_by(request.user),
        "permission": CHANGE_SILENCES,
    })


@guarded(CHANGE_SILENCES, CREATE_SILENCE_ACTION)
def silence_new(request: HttpRequest) -> HttpResponse:
    """GET: the form (prefilled from ``?node=&rule=&engine=``); POST: create, back to the list.

    A broad silence comes back with what it would mute and a confirmation box (nothing saved).
    """
    now = timezone.now()
    if request.method != "POST":
        return render(request, "alerting/silence_form.html",
                      {"form": _new_silence_form(request, now)})
    form = SilenceForm(request.POST, now=now)
    if not form.is_valid():
        return render(request, "alerting/silence_form.html", {"form": form}, status=400)
    silence = form.save(request.user)
    audit(CREATE_SILENCE_ACTION, allowed=True, user=request.user, node=silence.node,
          engine=silence.engine,
          outcome=f"silence #{silence.pk} of {silence.matcher_text} until "
                  f"{_utc_text(silence.ends_at)}",
          details={"silence": silence.pk, "rule": silence.rule, "reason": silence.reason,
                   "starts_at": silence.starts_at.isoformat(),
                   "ends_at": silence.ends_at.isoformat(), "broad": form.broad})
    messages.success(request, f"Silence #{silence.pk} of {silence.matcher_text} is active "
                              f"until {_utc_text(silence.ends_at)}.")
    return redirect("dashboard:silences")


def _utc_text(moment: datetime) -> str:
    # Stored (audit) and flashed text is written once for every reader: in UTC, labelled.
    return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M} UTC"


@require_POST
@guarded(CHANGE_SILENCES, EXPIRE_SILENCE_ACTION)
def silence_expire(request: HttpRequest, pk: int) -> HttpResponse:
    silence = get_object_or_404(Silence, pk=pk)
    expired = expire_silence(silence, timezone.now(), by=request.user)
    audit(EXPIRE_SILENCE_ACTION, allowed=True, user=request.user, node=silence.node,
          engine=silence.engine,
          outcome=f"silence #{silence.pk} of {silence.matcher_text} "
                  + ("expired" if expired else "had already ended"),
          details={"silence": silence.pk, "changed": expired})
    if expired:
        messages.success(request, f"Silence #{silence.pk} expired.")
    else:
        messages.info(request, f"Silence #{silence.pk} had already ended.")
    return redirect("dashboard:silences")


@login_required
def rules(request: HttpRequest) -> HttpResponse:
    """Each rule's documentation and the settings in force, with what an admin changed."""
    return render(request, "alerting/rules.html", {"settings": all_rule_settings().values(),
                                                   "can_change": CHANGE_RULES.held_by(
                                                       request.user)})


@guarded(CHANGE_RULES, EDIT_RULE_ACTION)
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
    before = _rule_values(stored)
    saved = form.save(request.user, timezone.now())
    after = _rule_values(saved)
    changed = {key: {"from": before[key], "to": after[key]}
               for key in after if before[key] != after[key]}
    audit(EDIT_RULE_ACTION, allowed=True, user=request.user,
          outcome=f"rule {rule}: " + (", ".join(changed) + " changed" if changed
                                      else "saved unchanged"),
          details={"rule": rule, "changed": changed})
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


def _rule_values(setting: RuleSetting | None) -> dict[str, Any]:
    """What an audit row compares for a rule: the stored overrides (None: the default)."""
    if setting is None:
        return {"enabled": True, "for_seconds": None, "repeat_seconds": None, "thresholds": {}}
    return {"enabled": setting.enabled, "for_seconds": setting.for_seconds,
            "repeat_seconds": setting.repeat_seconds, "thresholds": dict(setting.thresholds)}
