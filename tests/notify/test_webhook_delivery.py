"""Webhook delivery against a real loopback receiver that verifies signatures."""

from __future__ import annotations

import json
import socket
import time
from datetime import timedelta
from email.utils import format_datetime

import pytest

from dashboard.notify import outbox
from dashboard.notify.models import Channel, Notification
from dashboard.notify.transports import parse_retry_after
from sparkops.testing.ports import free_port
from sparkops.testing.webhooks import Reply, WebhookReceiver
from tests.notify.conftest import T0, enqueue_alert
from tests.notify.servers import resolving, silent_listener

pytestmark = pytest.mark.slow


def test_500_three_times_then_200_is_one_delivery_with_one_id(receiver, make_webhook):
    receiver.reply(Reply(500), Reply(502), Reply(503), Reply(200))
    channel = make_webhook(receiver)
    row = enqueue_alert(channel)

    now = T0
    waits = []
    for _ in range(4):
        outbox.deliver_due(now=now)
        row.refresh_from_db()
        if row.delivered_at:
            break
        waits.append(round((row.next_attempt_at - now).total_seconds()))
        assert outbox.deliver_due(now=row.next_attempt_at - timedelta(seconds=1)).found == 0
        now = row.next_attempt_at

    assert row.delivered_at is not None and row.failed_at is None
    assert row.attempts == 4
    assert waits == [10, 30, 60]  # outbox.BACKOFF
    assert [r.headers["webhook-id"] for r in receiver.requests] == [row.message_id] * 4
    assert all(r.verified for r in receiver.requests), [r.verify_error for r in receiver.requests]
    assert json.loads(receiver.requests[-1].body)["id"] == row.message_id
    assert outbox.deliver_due(now=now + timedelta(hours=1)).found == 0
    assert len(receiver.requests) == 4
    channel.refresh_from_db()
    assert channel.last_success_at is not None
    assert "HTTP 503" in channel.last_error  # kept as history; last_success_at is newer


def test_410_fails_the_row_and_disables_the_channel_with_the_reason(receiver, make_webhook,
                                                                     node):
    receiver.reply(Reply(410))
    channel = make_webhook(receiver)
    first = enqueue_alert(channel)
    queued_behind = enqueue_alert(channel)

    report = outbox.deliver_due(now=T0)

    first.refresh_from_db()
    queued_behind.refresh_from_db()
    channel.refresh_from_db()
    assert report.failed == [first.message_id, queued_behind.message_id]
    assert first.failed_at is not None and "HTTP 410" in first.last_error
    assert not channel.enabled
    assert "HTTP 410" in channel.disabled_reason and "disabled" in channel.disabled_reason
    # The row behind it is closed without a send, and new alerts skip the channel.
    assert queued_behind.last_error.startswith("not sent: the channel is disabled")
    assert len(receiver.requests) == 1
    assert list(outbox.channels_for(node)) == []


def test_a_receiver_that_never_answers_times_out_and_is_retried_later(receiver, make_webhook):
    receiver.reply(Reply(hang=True))
    channel = make_webhook(receiver)
    row = enqueue_alert(channel)

    started = time.monotonic()
    report = outbox.deliver_due(now=T0)
    elapsed = time.monotonic() - started

    row.refresh_from_db()
    assert report.retrying == [row.message_id]
    assert elapsed < 3.0  # the 1 s deadline, not forever
    assert row.failed_at is None and row.delivered_at is None
    assert row.claimed_at is None  # released for the next attempt
    assert "timed out" in row.last_error
    assert row.next_attempt_at == pytest.approx(T0 + timedelta(seconds=10),
                                                abs=timedelta(seconds=3))

    outbox.deliver_due(now=row.next_attempt_at)
    row.refresh_from_db()
    assert row.delivered_at is not None
    assert len(receiver.requests) == 2


def test_429_retry_after_is_honoured(receiver, make_webhook):
    receiver.reply(Reply(429, {"Retry-After": "120"}))
    row = enqueue_alert(make_webhook(receiver))

    outbox.deliver_due(now=T0, backoff=[0])

    row.refresh_from_db()
    wait = (row.next_attempt_at - T0).total_seconds()
    assert 120 <= wait < 122
    assert "HTTP 429" in row.last_error
    assert outbox.deliver_due(now=T0 + timedelta(seconds=60), backoff=[0]).found == 0
    outbox.deliver_due(now=row.next_attempt_at, backoff=[0])
    row.refresh_from_db()
    assert row.delivered_at is not None


def test_retry_after_accepts_seconds_and_http_dates():
    assert parse_retry_after("120") == 120.0
    assert parse_retry_after(format_datetime(T0 + timedelta(seconds=90), usegmt=True),
                             now=T0) == 90.0
    assert parse_retry_after(format_datetime(T0 - timedelta(seconds=90), usegmt=True),
                             now=T0) == 0.0
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None


@pytest.mark.parametrize("status", [400, 401, 404])
def test_other_4xx_are_permanent(receiver, make_webhook, status):
    receiver.reply(Reply(status))
    channel = make_webhook(receiver)
    row = enqueue_alert(channel)

    outbox.deliver_due(now=T0)

    row.refresh_from_db()
    channel.refresh_from_db()
    assert row.failed_at is not None and f"HTTP {status}" in row.last_error
    assert channel.enabled and f"HTTP {status}" in channel.last_error


def test_a_redirect_is_not_followed(receiver, make_webhook):
    with WebhookReceiver() as elsewhere:
        receiver.reply(Reply(302, {"Location": elsewhere.url("/stolen")}))
        row = enqueue_alert(make_webhook(receiver))

        outbox.deliver_due(now=T0)

    row.refresh_from_db()
    assert row.failed_at is not None
    assert "redirects are not followed" in row.last_error
    assert elsewhere.requests == []


def test_connection_refused_is_temporary(make_webhook):
    row = enqueue_alert(make_webhook(f"http://127.0.0.1:{free_port()}/hook"))

    outbox.deliver_due(now=T0)

    row.refresh_from_db()
    assert row.failed_at is None and row.attempts == 1
    assert "refused" in row.last_error


def test_a_name_resolving_to_a_forbidden_address_is_never_contacted(make_webhook, monkeypatch,
                                                                    settings):
    settings.SPARKOPS_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    with silent_listener("127.0.0.2") as (port, pending):
        monkeypatch.setattr(socket, "getaddrinfo", resolving({"internal.test": "127.0.0.2"}))
        channel = make_webhook(f"http://internal.test:{port}/hook")
        row = enqueue_alert(channel)

        outbox.deliver_due(now=T0)

        assert pending() == 0
    row.refresh_from_db()
    assert row.failed_at is not None
    assert "127.0.0.2" in row.last_error and "loopback" in row.last_error
    assert "SPARKOPS_WEBHOOK_ALLOWED_NETWORKS" in row.last_error
    channel.refresh_from_db()
    assert channel.enabled and channel.last_error == row.last_error


def test_a_name_resolving_to_an_allowlisted_address_is_delivered(receiver, make_webhook,
                                                                 monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", resolving({"hooks.test": "127.0.0.1"}))
    channel = make_webhook(f"http://hooks.test:{receiver.port}/hook")
    receiver.secret = channel.secret
    row = enqueue_alert(channel)

    outbox.deliver_due(now=T0)

    row.refresh_from_db()
    assert row.delivered_at is not None
    assert receiver.requests[0].verified
    assert receiver.requests[0].headers["host"] == f"hooks.test:{receiver.port}"


def test_the_body_is_the_documented_payload(receiver, make_webhook):
    row = enqueue_alert(make_webhook(receiver), kind="resolved", resolved_at=T0)

    outbox.deliver_due(now=T0)

    received = receiver.requests[0]
    assert received.headers["content-type"] == "application/json"
    body = json.loads(received.body)
    assert body["type"] == "alert.resolved"
    assert body["id"] == row.message_id
    assert body["url"] == "https://sparkops.example/alerts/42/"
    assert body["alert"]["resolved_at"] == T0.isoformat()
    assert body["alert"]["details"]["cause"].startswith("vllm-b KV pool")
    assert Notification.objects.get(pk=row.pk).delivered_at is not None
    assert Channel.objects.get().last_success_at is not None
