"""Deleting a notification channel: confirmation, permission, CSRF, audit, queued rows."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from dashboard.audit.models import AuditEntry
from dashboard.notify import views
from dashboard.notify.models import Channel, Notification
from tests.access import grant
from tests.notify.conftest import enqueue_alert


@pytest.fixture
def editor_client(django_user_model):
    user = django_user_model.objects.create_user("editor", "", "a-long-test-password")
    editor = Client()
    editor.force_login(grant(user, "change_channels"))
    return editor


def test_the_confirmation_says_what_happens_to_queued_notifications(editor_client,
                                                                    make_webhook):
    channel = make_webhook("https://hooks.example/a", name="chat")
    enqueue_alert(channel)
    delivered = enqueue_alert(channel)
    Notification.objects.filter(pk=delivered.pk).update(delivered_at=timezone.now())

    page = editor_client.get(reverse("dashboard:channel-delete", args=[channel.pk]))

    text = page.content.decode()
    assert page.status_code == 200
    assert "1 queued notification (pending or retrying) will be given up and never sent" in text
    assert "delivery history (2 notifications) is deleted with it" in text
    assert "csrfmiddlewaretoken" in text
    assert Channel.objects.filter(pk=channel.pk).exists()  # a GET deletes nothing
    listing = editor_client.get(reverse("dashboard:channels")).content.decode()
    assert reverse("dashboard:channel-delete", args=[channel.pk]) in listing


def test_deleting_gives_up_queued_notifications_and_writes_an_audit_row(editor_client,
                                                                       make_webhook):
    channel = make_webhook("https://hooks.example/T0KEN", name="chat")
    enqueue_alert(channel)
    enqueue_alert(channel)
    # A claim older than the lease belongs to a worker that died: given up like the others.
    stale = enqueue_alert(channel)
    Notification.objects.filter(pk=stale.pk).update(
        claimed_at=timezone.now() - views.outbox.LEASE - timedelta(seconds=1), claimed_by="w1")

    response = editor_client.post(reverse("dashboard:channel-delete", args=[channel.pk]))

    assert response.status_code == 302
    assert not Channel.objects.filter(pk=channel.pk).exists()
    assert not Notification.objects.exists()
    row = AuditEntry.objects.get(action="delete-channel")
    assert row.allowed and row.actor == "editor"
    assert row.outcome == "channel chat (webhook) deleted; 3 queued notifications given up"
    assert (row.details["given_up"], row.details["history_rows"]) == (3, 3)
    assert "T0KEN" not in str(row.details) + row.outcome


def test_a_send_in_flight_refuses_the_deletion_and_changes_nothing(editor_client, make_webhook):
    channel = make_webhook("https://hooks.example/a", name="chat")
    queued = enqueue_alert(channel)
    sending = enqueue_alert(channel)
    Notification.objects.filter(pk=sending.pk).update(claimed_at=timezone.now(),
                                                      claimed_by="worker-1")

    page = editor_client.get(reverse("dashboard:channel-delete", args=[channel.pk]))
    response = editor_client.post(reverse("dashboard:channel-delete", args=[channel.pk]),
                                  follow=True)

    assert "being sent right now: deleting is refused" in page.content.decode()
    assert "Not deleted: channel chat is sending a notification right now" in \
        response.content.decode()
    assert Channel.objects.filter(pk=channel.pk).exists()
    queued.refresh_from_db()
    assert queued.failed_at is None and queued.last_error == ""
    row = AuditEntry.objects.get(action="delete-channel")
    assert row.outcome.startswith("failed: channel chat is sending")


def test_deleting_needs_the_permission_and_a_post_with_csrf(django_user_model, make_webhook):
    channel = make_webhook("https://hooks.example/a")
    url = reverse("dashboard:channel-delete", args=[channel.pk])
    bare = Client()
    bare.force_login(django_user_model.objects.create_user("bare", is_staff=True))
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(grant(django_user_model.objects.create_user("editor"),
                             "change_channels"))

    refused = bare.post(url)
    forged = strict.post(url)

    assert refused.status_code == 403 and "notify.change_channels" in refused.content.decode()
    assert forged.status_code == 403
    assert Channel.objects.filter(pk=channel.pk).exists()
    assert AuditEntry.objects.get(action="delete-channel").allowed is False
