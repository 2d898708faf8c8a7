"""Channel pages: list (any signed-in user), create, edit, enable/disable, delete and send a test.

Views are thin: the form validates, ``outbox`` enqueues and delivers. Creating, editing,
enabling, disabling and deleting a channel needs ``notify.change_channels`` (403 otherwise, and
an audit row "refused" for a POST) and a POST with a CSRF token; each change writes an audit row
that names the channel and what changed, never its secret or the webhook URL's path and query.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.db.models import Prefetch
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from dashboard.audit.access import CHANGE_CHANNELS, guarded
from dashboard.audit.records import audit
from dashboard.notify import outbox
from dashboard.notify.forms import ChannelForm
from dashboard.notify.models import Channel, Notification

RECENT_PER_CHANNEL = 5
CREATE_CHANNEL_ACTION = "create-channel"
EDIT_CHANNEL_ACTION = "edit-channel"
TOGGLE_CHANNEL_ACTION = "toggle-channel"
TEST_CHANNEL_ACTION = "test-channel"
DELETE_CHANNEL_ACTION = "delete-channel"
# Written on each queued notification given up because its channel is deleted.
DELETED_REASON = "given up: the channel was deleted"


class ChannelBusy(Exception):
    """A notification of the channel is being sent right now; the channel stays."""


@login_required
def channels(request: HttpRequest) -> HttpResponse:
    """Every channel with its health and its latest notifications. Cost: two queries."""
    recent = Notification.objects.order_by("-created_at", "-pk")[:RECENT_PER_CHANNEL]
    listed = Channel.objects.select_related("node").prefetch_related(
        Prefetch("notifications", queryset=recent, to_attr="recent"))
    return render(request, "notify/channels.html", {
        "channels": listed,
        "can_edit": CHANGE_CHANNELS.held_by(request.user),
    })


@guarded(CHANGE_CHANNELS, CREATE_CHANNEL_ACTION)
def channel_new(request: HttpRequest) -> HttpResponse:
    form = ChannelForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        channel = form.save()
        _audit_channel(request, CREATE_CHANNEL_ACTION, channel, None, form.new_secret)
        return _saved(request, channel, form.new_secret)
    return render(request, "notify/channel_form.html", {"form": form, "channel": None})


@guarded(CHANGE_CHANNELS, EDIT_CHANNEL_ACTION)
def channel_edit(request: HttpRequest, pk: int) -> HttpResponse:
    channel = get_object_or_404(Channel, pk=pk)
    # Read before the form binds: validating a ModelForm writes into its instance.
    before = (channel_summary(channel), channel.url)
    form = ChannelForm(request.POST or None, instance=channel)
    if request.method == "POST" and form.is_valid():
        channel = form.save()
        _audit_channel(request, EDIT_CHANNEL_ACTION, channel, before, form.new_secret)
        return _saved(request, channel, form.new_secret)
    return render(request, "notify/channel_form.html", {"form": form, "channel": channel})


def channel_summary(channel: Channel) -> dict[str, Any]:
    """What an audit row may say about a channel: never its secret, and of a webhook URL only
    the origin (its path and query often hold a token)."""
    return {"name": channel.name, "kind": channel.kind, "enabled": channel.enabled,
            "node": channel.node.name if channel.node_id else None, "target": channel.target}


def _audit_channel(request: HttpRequest, action: str, channel: Channel,
                   before: tuple[dict[str, Any], str] | None, new_secret: str | None) -> None:
    """One audit row for a saved channel: what it is now and, for an edit, what changed."""
    after = channel_summary(channel)
    details: dict[str, Any] = {"channel": channel.pk, **after,
                               "secret_generated": new_secret is not None}
    outcome = f"channel {channel.name} ({channel.kind}) → {channel.target}"
    if before is not None:
        old, old_url = before
        changed = {key: {"from": old[key], "to": value} for key, value in after.items()
                   if old[key] != value}
        details["changed"] = changed
        if channel.kind == Channel.Kind.WEBHOOK:
            details["url_changed"] = old_url != channel.url
        names = [*changed, *(["url"] if details.get("url_changed") else [])]
        outcome += f"; changed: {', '.join(dict.fromkeys(names))}" if names else "; unchanged"
    audit(action, allowed=True, user=request.user, node=channel.node, outcome=outcome,
          details=details)


def _saved(request: HttpRequest, channel: Channel, secret: str | None) -> HttpResponse:
    if secret is None:
        messages.success(request, f"Saved channel {channel.name}.")
        return redirect("dashboard:channels")
    # The secret is shown in this one response and nowhere else: not in a redirect's flash
    # message, which would sit in a cookie.
    return render(request, "notify/channel_secret.html", {"channel": channel, "secret": secret})


@require_POST
@guarded(CHANGE_CHANNELS, TOGGLE_CHANNEL_ACTION)
def channel_toggle(request: HttpRequest, pk: int) -> HttpResponse:
    """Enable (POST enabled=1) or disable (enabled=0) a channel; enabling clears the reason."""
    channel = get_object_or_404(Channel, pk=pk)
    enable = request.POST.get("enabled") == "1"
    changes = {"enabled": enable}
    if enable:
        changes["disabled_reason"] = ""
    Channel.objects.filter(pk=channel.pk).update(**changes)
    audit(TOGGLE_CHANNEL_ACTION, allowed=True, user=request.user, node=channel.node,
          outcome=f"channel {channel.name} {'enabled' if enable else 'disabled'}",
          details={"channel": channel.pk, "changed": {"enabled": {"from": channel.enabled,
                                                                  "to": enable}}})
    messages.success(request, f"{'Enabled' if enable else 'Disabled'} channel {channel.name}.")
    return redirect("dashboard:channels")


@require_POST
@guarded(CHANGE_CHANNELS, TEST_CHANNEL_ACTION)
def channel_test(request: HttpRequest, pk: int) -> HttpResponse:
    """Send a test notification to this channel within this request, in a few seconds at most.

    ``outbox.send_test`` bounds it: ``outbox.TEST_DEADLINE`` seconds in all, a few tests at once
    per web process, one send in flight per channel; anything beyond is refused with a reason.
    A test is not retried: the admin sees the error now and can try again.
    """
    channel = get_object_or_404(Channel, pk=pk)
    outcome = outbox.send_test(channel, worker=f"web:{outbox.worker_name()}")
    if outcome.delivered:
        messages.success(request, outcome.message)
    else:
        messages.error(request, outcome.message)
    return redirect("dashboard:channels")


@guarded(CHANGE_CHANNELS, DELETE_CHANNEL_ACTION)
def channel_delete(request: HttpRequest, pk: int) -> HttpResponse:
    """GET: what deleting the channel would do, and a confirmation. POST: delete it.

    Queued notifications (pending or retrying) are first given up with
    :data:`DELETED_REASON`, by a conditional UPDATE on unclaimed rows, so no worker can claim one
    afterwards; if a worker holds a live claim (a send in flight), nothing changes and the
    deletion is refused until the send has finished. The channel then goes with its delivery
    history (the rows cascade); the audit row keeps the counts.
    """
    channel = get_object_or_404(Channel.objects.select_related("node"), pk=pk)
    if request.method != "POST":
        return render(request, "notify/channel_delete.html",
                      {"channel": channel, **_delivery_counts(channel)})
    summary = channel_summary(channel)
    try:
        given_up, history = _delete_channel(channel)
    except ChannelBusy:
        reason = (f"channel {channel.name} is sending a notification right now; try again "
                  "once it has finished")
        audit(DELETE_CHANNEL_ACTION, allowed=True, user=request.user, node=channel.node,
              outcome=f"failed: {reason}", details={"channel": channel.pk, **summary})
        messages.error(request, f"Not deleted: {reason}.")
        return redirect("dashboard:channels")
    audit(DELETE_CHANNEL_ACTION, allowed=True, user=request.user, node=channel.node,
          outcome=f"channel {summary['name']} ({summary['kind']}) deleted; {given_up} queued "
                  f"notification{'s' if given_up != 1 else ''} given up",
          details={"channel": pk, **summary, "given_up": given_up, "history_rows": history})
    dropped = f"; {given_up} queued notifications were given up" if given_up else ""
    messages.success(request, f"Deleted channel {summary['name']}{dropped}.")
    return redirect("dashboard:channels")


def _open(channel: Channel) -> Any:
    return Notification.objects.filter(channel=channel, delivered_at__isnull=True,
                                       failed_at__isnull=True)


def _live_claim(now: Any) -> dict[str, Any]:
    return {"claimed_at__isnull": False, "claimed_at__gte": now - outbox.LEASE}


def _delivery_counts(channel: Channel) -> dict[str, int]:
    """How many notifications would be given up, are being sent, and are history."""
    now = timezone.now()
    sending = _open(channel).filter(**_live_claim(now)).count()
    return {"queued": _open(channel).count() - sending, "sending": sending,
            "history": Notification.objects.filter(channel=channel).count()}


def _delete_channel(channel: Channel) -> tuple[int, int]:
    """Give up the channel's queued notifications and delete it; ``(given up, history rows)``.

    Raises :class:`ChannelBusy`, changing nothing, while a live claim is held. A claim older
    than ``outbox.LEASE`` belongs to a worker that died: a worker would reclaim it, so it is
    given up like an unclaimed row.
    """
    now = timezone.now()
    with transaction.atomic():
        # The channel's lock orders this against ``outbox.enqueue``: a notice queued just before
        # is given up below; one queued after finds the channel gone.
        Channel.objects.select_for_update().filter(pk=channel.pk).first()
        if _open(channel).filter(**_live_claim(now)).exists():
            raise ChannelBusy(channel.name)
        stale_or_free = _open(channel).exclude(**_live_claim(now))
        given_up = stale_or_free.update(failed_at=now, last_error=DELETED_REASON)
        # A worker that claimed a row between the check and the update makes the claim live.
        if _open(channel).filter(**_live_claim(now)).exists():
            raise ChannelBusy(channel.name)
        history = Notification.objects.filter(channel=channel).count()
        channel.delete()
    return given_up, history
