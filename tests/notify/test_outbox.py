"""The outbox protocol: enqueue, claims, stale claims, races, backoff and giving up."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from collectors.models import Node
from dashboard.notify import outbox, tasks
from dashboard.notify.models import Channel, Notification
from dashboard.notify.transports import TRANSPORTS, TransportError
from tests.notify.conftest import T0, enqueue_alert


class RecordingTransport:
    """Records what it sends; ``during`` runs mid-send, ``errors`` are raised in turn."""

    def __init__(self, during: Callable[[Notification], None] | None = None,
                 errors: list[Exception] | None = None, pause: float = 0.0) -> None:
        self.sent: list[str] = []
        self.during = during
        self.errors = list(errors or [])
        self.pause = pause
        self._lock = threading.Lock()

    def send(self, notification: Notification, deadline: float | None = None) -> None:
        with self._lock:
            self.sent.append(notification.message_id)
        if self.pause:
            time.sleep(self.pause)
        if self.during is not None:
            self.during(notification)
        if self.errors:
            raise self.errors.pop(0)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Callable[..., RecordingTransport]:
    def install(**options: Any) -> RecordingTransport:
        transport = RecordingTransport(**options)
        monkeypatch.setitem(TRANSPORTS, "webhook", transport)
        return transport

    return install


# --- enqueue ----------------------------------------------------------------------------------


def test_enqueue_writes_one_row_per_enabled_channel_for_the_node(make_webhook, node):
    other = Node.objects.create(name="spark-b")
    everywhere = make_webhook("https://hooks.example/a", name="all")
    here = make_webhook("https://hooks.example/b", name="here", node=node)
    make_webhook("https://hooks.example/c", name="there", node=other)
    make_webhook("https://hooks.example/d", name="off", enabled=False)

    rows = outbox.enqueue(kind="firing", payload={"type": "alert.firing"}, subject="s",
                          text="t", html="<p>t</p>", alert_id=7, node=node, now=T0)

    assert {row.channel for row in rows} == {everywhere, here}
    for row in Notification.objects.filter(pk__in=[r.pk for r in rows]):
        assert row.message_id.startswith("msg_") and len(row.message_id) == 36
        assert row.payload == {"type": "alert.firing", "id": row.message_id,
                               "timestamp": T0.isoformat()}
        assert (row.alert_id, row.next_attempt_at, row.attempts) == (7, T0, 0)
        assert row.status == "pending"


def test_enqueue_refuses_an_unknown_kind(db):
    with pytest.raises(ValueError, match="unknown notification kind"):
        outbox.enqueue(kind="fired", payload={}, subject="s", text="t", html="")


# --- claims -----------------------------------------------------------------------------------


def test_a_stale_claim_of_a_dead_worker_is_taken_over_and_delivered_once(receiver,
                                                                        make_webhook):
    row = enqueue_alert(make_webhook(receiver), now=T0)
    # A worker claimed the row and died before recording anything.
    Notification.objects.filter(pk=row.pk).update(claimed_at=T0, claimed_by="dead-worker")

    assert outbox.deliver_due(now=T0 + timedelta(seconds=30)).found == 0  # still leased
    report = outbox.deliver_due(now=T0 + outbox.LEASE + timedelta(seconds=1), worker="heir")

    row.refresh_from_db()
    assert report.delivered == [row.message_id]
    assert row.delivered_at is not None and row.claimed_by == "heir"
    assert len(receiver.requests) == 1 and receiver.requests[0].verified
    assert outbox.deliver_due(now=T0 + timedelta(hours=1)).found == 0
    assert len(receiver.requests) == 1


def test_of_two_workers_that_read_the_same_row_only_one_claims_it(make_webhook):
    enqueue_alert(make_webhook("https://hooks.example/x"))
    (seen_by_a,) = outbox._due_rows(Notification.objects.all(), T0, outbox.LEASE, None)
    (seen_by_b,) = outbox._due_rows(Notification.objects.all(), T0, outbox.LEASE, None)

    assert outbox._claim(seen_by_a, T0, "a") is True
    assert outbox._claim(seen_by_b, T0, "b") is False
    assert Notification.objects.get().claimed_by == "a"


@pytest.mark.parametrize("b_outcome", ["delivers", "fails and releases"])
def test_a_worker_never_sends_a_row_another_worker_handled_after_both_read_it(
        fake, make_webhook, monkeypatch, b_outcome):
    errors = [TransportError("HTTP 503")] if b_outcome == "fails and releases" else []
    transport = fake(errors=errors)
    row = enqueue_alert(make_webhook("https://hooks.example/x"))
    real_claim = outbox._claim_channel
    raced: list[bool] = []

    def claim_after_b_ran(snapshot: Any, at: Any, lease_end: Any) -> bool:
        if not raced:
            raced.append(True)
            # b reads the same row, claims, sends and records, all before a claims. Its failure
            # pauses the channel for a minute: with no pause the channel's pause would end at
            # b's failure time, and whether that is before or after a's claim time (each worker
            # advances T0 by its own monotonic clock) would decide the outcome by chance.
            outbox.deliver_due(now=T0, worker="b", backoff=[60])
        return real_claim(snapshot, at, lease_end)

    monkeypatch.setattr(outbox, "_claim_channel", claim_after_b_ran)
    report_a = outbox.deliver_due(now=T0, worker="a", backoff=[0])

    assert report_a.found == 1 and report_a.attempted == 0
    # After b's success a finds the row changed; after b's failure the channel is paused.
    assert (report_a.lost_claims, report_a.deferred) == \
        ((1, 0) if b_outcome == "delivers" else (0, 1))
    assert transport.sent == [row.message_id]
    assert Channel.objects.get().sending_until is None  # nobody holds the channel any more


def test_a_row_being_sent_is_not_picked_up_by_a_concurrent_run(fake, make_webhook):
    concurrent: list[outbox.DeliveryReport] = []
    transport = fake(during=lambda _n: concurrent.append(outbox.deliver_due(now=T0,
                                                                            worker="b")))
    enqueue_alert(make_webhook("https://hooks.example/x"))

    outbox.deliver_due(now=T0, worker="a")

    assert concurrent[0].found == 0
    assert len(transport.sent) == 1


# --- outcomes ---------------------------------------------------------------------------------


def test_backoff_grows_and_is_capped(fake, make_webhook):
    fake(errors=[TransportError("HTTP 503") for _ in range(10)])
    row = enqueue_alert(make_webhook("https://hooks.example/x"))
    now, waits = T0, []
    for _ in range(10):
        outbox.deliver_due(now=now)
        row.refresh_from_db()
        waits.append(round((row.next_attempt_at - now).total_seconds()))
        now = row.next_attempt_at

    assert waits == [10, 30, 60, 120, 300, 600, 1200, 1800, 1800, 1800]
    assert row.attempts == 10 and row.status == "retrying"


def test_a_temporary_error_a_day_after_the_alert_is_final(fake, make_webhook):
    fake(errors=[TransportError("HTTP 503")])
    row = enqueue_alert(make_webhook("https://hooks.example/x"))

    outbox.deliver_due(now=T0 + outbox.GIVE_UP_AFTER)

    row.refresh_from_db()
    assert row.failed_at is not None
    assert row.last_error == "gave up after 1 attempts: HTTP 503"


def test_an_unexpected_exception_releases_the_row_for_a_retry(fake, make_webhook):
    fake(errors=[RuntimeError("bug")])
    row = enqueue_alert(make_webhook("https://hooks.example/x"))

    report = outbox.deliver_due(now=T0)

    row.refresh_from_db()
    assert report.retrying == [row.message_id]
    assert row.claimed_at is None and row.last_error == "internal error: RuntimeError: bug"


def test_a_failed_test_notification_is_not_retried(fake, make_webhook):
    fake(errors=[TransportError("HTTP 503")])
    channel = make_webhook("https://hooks.example/x")
    (row,) = outbox.enqueue(kind="test", payload={}, subject="s", text="t", html="",
                            channels=[channel], now=T0)

    outbox.deliver_due(now=T0)

    row.refresh_from_db()
    assert row.failed_at is not None and row.last_error == "HTTP 503"


def test_rows_of_a_channel_switched_off_are_closed_without_sending(fake, make_webhook):
    transport = fake()
    channel = make_webhook("https://hooks.example/x")
    row = enqueue_alert(channel)
    Channel.objects.filter(pk=channel.pk).update(enabled=False)

    outbox.deliver_due(now=T0)

    row.refresh_from_db()
    channel.refresh_from_db()
    assert transport.sent == []
    assert row.status == "failed"
    assert row.last_error == "not sent: the channel is disabled (switched off by an administrator)"
    assert channel.last_error == ""


def test_the_task_delivers_in_bounded_batches(fake, make_webhook, monkeypatch):
    transport = fake()
    channel = make_webhook("https://hooks.example/x")
    for _ in range(5):
        enqueue_alert(channel, now=timezone.now() - timedelta(minutes=1))
    monkeypatch.setattr(tasks, "BATCH", 2)
    monkeypatch.setattr(tasks, "MAX_BATCHES", 2)

    summary = tasks.deliver_notifications()

    assert summary == {"delivered": 4, "retrying": 0, "failed": 0, "lost_claims": 0}
    assert len(transport.sent) == 4
    assert tasks.deliver_notifications()["delivered"] == 1
