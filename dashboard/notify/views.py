"""Channel pages: list (any signed-in user), create, edit, enable/disable and send a test (staff).

Views are thin: the form validates, ``outbox`` enqueues and delivers. Changing anything needs
``user.is_staff`` (403 otherwise) and a POST with a CSRF token.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import Prefetch
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from dashboard.notify import outbox
from dashboard.notify.forms import ChannelForm
from dashboard.notify.models import Channel, Notification
from dashboard.notify.payloads import build_test_message

RECENT_PER_CHANNEL = 5


def _require_staff(request: HttpRequest) -> None:
    if not request.user.is_staff:
        raise PermissionDenied("Changing notification channels needs a staff account.")


@login_required
def channels(request: HttpRequest) -> HttpResponse:
    """Every channel with its health and its latest notifications. Cost: two queries."""
    recent = Notification.objects.order_by("-created_at", "-pk")[:RECENT_PER_CHANNEL]
    listed = Channel.objects.select_related("node").prefetch_related(
        Prefetch("notifications", queryset=recent, to_attr="recent"))
    return render(request, "notify/channels.html", {
        "channels": listed,
        "can_edit": request.user.is_staff,
    })


@login_required
def channel_new(request: HttpRequest) -> HttpResponse:
    _require_staff(request)
    form = ChannelForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        channel = form.save()
        return _saved(request, channel, form.new_secret)
    return render(request, "notify/channel_form.html", {"form": form, "channel": None})


@login_required
def channel_edit(request: HttpRequest, pk: int) -> HttpResponse:
    _require_staff(request)
    channel = get_object_or_404(Channel, pk=pk)
    form = ChannelForm(request.POST or None, instance=channel)
    if request.method == "POST" and form.is_valid():
        channel = form.save()
        return _saved(request, channel, form.new_secret)
    return render(request, "notify/channel_form.html", {"form": form, "channel": channel})


def _saved(request: HttpRequest, channel: Channel, secret: str | None) -> HttpResponse:
    if secret is None:
        messages.success(request, f"Saved channel {channel.name}.")
        return redirect("dashboard:channels")
    # The secret is shown in this one response and nowhere else: not in a redirect's flash
    # message, which would sit in a cookie.
    return render(request, "notify/channel_secret.html", {"channel": channel, "secret": secret})


@login_required
@require_POST
def channel_toggle(request: HttpRequest, pk: int) -> HttpResponse:
    """Enable (POST enabled=1) or disable (enabled=0) a channel; enabling clears the reason."""
    _require_staff(request)
    channel = get_object_or_404(Channel, pk=pk)
    enable = request.POST.get("enabled") == "1"
    changes = {"enabled": enable}
    if enable:
        changes["disabled_reason"] = ""
    Channel.objects.filter(pk=channel.pk).update(**changes)
    messages.success(request, f"{'Enabled' if enable else 'Disabled'} channel {channel.name}.")
    return redirect("dashboard:channels")


@login_required
@require_POST
def channel_test(request: HttpRequest, pk: int) -> HttpResponse:
    """Enqueue a test notification for this channel and deliver it within this request.

    Blocks for up to one transport deadline (webhook 10 s, SMTP a few ``EMAIL_TIMEOUT``s).
    A test is not retried: the admin sees the error now and can try again.
    """
    _require_staff(request)
    channel = get_object_or_404(Channel, pk=pk)
    payload, subject, text, html = build_test_message(channel)
    (row,) = outbox.enqueue(kind=Notification.Kind.TEST, payload=payload, subject=subject,
                            text=text, html=html, channels=[channel])
    outbox.deliver_now([row], worker=f"web:{outbox.worker_name()}")
    row.refresh_from_db()
    if row.delivered_at is not None:
        messages.success(request, f"Test notification delivered to {channel.name}.")
    else:
        messages.error(request, f"Test notification to {channel.name} failed: "
                                f"{row.last_error or row.status}")
    return redirect("dashboard:channels")
