"""Delivery cannot be held by one slow receiver: run budget per send, one send in flight per
channel, a circuit breaker per channel, one delivery run per data directory, bounded tests."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse

from dashboard.notify import outbox, tasks
from dashboard.notify.models import Channel, Notification
from dashboard.notify.transports import TRANSPORTS, TransportError
from sparkops.testing.webhooks import Reply
from tests.notify.conftest import T0, enqueue_alert


class ScriptedTransport:
    """Answers per channel name: an exception to raise, or None to accept; records deadlines."""

    def __init__(self, failing: dict[str, Exception] | None = None,
                 during: Callable[[Notification], None] | None = None) -> None:
        self.failing = dict(failing or {})
        self.during = during
        self.sent: list[tuple[str, str]] = []
        self.deadlines: list[float | None] = []

    def send(self, notification: Notification, deadline: float | None = None) -> None:
        self.sent.append((notification.channel.name, notification.message_id))
        self.deadlines.append(deadline)
        if self.during is not None:
            self.during(notification)
        error = self.failing.get(notification.channel.name)
        if error is not None:
            raise error


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> Callable[..., ScriptedTransport]:
    def install(**options: Any) -> ScriptedTransport:
        transport = ScriptedTransport(**options)
        monkeypatch.setitem(TRANSPORTS, "webhook", transport)
        return transport

    return install


def _timeout() -> TransportError:
    return TransportError("timed out after 10 s waiting for the response")


# --- the run's budget -----------------------------------------------------------------------


def test_each_send_gets_at_most_what_is_left_of_the_budget(scripted, make_webhook):
    transport = scripted()
    enqueue_alert(make_webhook("https://hooks.example/a"))

    outbox.deliver_due(now=T0, budget=5.0)
    outbox.deliver_due(now=T0)  # no budget: the transport's own deadline

    assert len(transport.deadlines) == 1
    assert 0 < transport.deadlines[0] <= 5.0


def test_no_send_starts_once_the_budget_is_spent(scripted, make_webhook):
    transport = scripted()
    row = enqueue_alert(make_webhook("https://hooks.example/a"))

    report = outbox.deliver_due(now=T0, budget=outbox.MIN_SEND_SECONDS / 2)

    assert transport.sent == []
    assert report.out_of_budget and report.deferred == 1
    row.refresh_from_db()
    assert row.status == "pending" and row.claimed_at is None


def test_the_task_passes_its_remaining_budget_to_each_send(scripted, make_webhook,
                                                           monkeypatch):
    transport = scripted()
    enqueue_alert(make_webhook("https://hooks.example/a"), now=T0 - timedelta(days=3650))
    monkeypatch.setattr(tasks, "TIME_BUDGET", 7.0)

    assert tasks.deliver_notifications()["delivered"] == 1
    assert 0 < transport.deadlines[0] <= 7.0


# --- one send in flight per channel ---------------------------------------------------------


def test_a_channel_being_sent_to_is_skipped_by_a_concurrent_run_other_channels_are_not(
        scripted, make_webhook):
    busy, free = make_webhook("https://hooks.example/a", name="busy"), \
        make_webhook("https://hooks.example/b", name="free")
    first = enqueue_alert(busy, now=T0)
    enqueue_alert(busy, now=T0 + timedelta(seconds=1))
    other = enqueue_alert(free, now=T0 + timedelta(seconds=2))
    concurrent: list[outbox.DeliveryReport] = []

    def run_b_during_the_first_send(notification: Notification) -> None:
        if notification.pk == first.pk:
            concurrent.append(outbox.deliver_due(now=T0 + timedelta(seconds=5), worker="b"))

    transport = scripted(during=run_b_during_the_first_send)
    outbox.deliver_due(now=T0 + timedelta(seconds=5), worker="a", limit=1)

    # While a sends to "busy", b sees none of its rows and sends only the other channel's.
    assert concurrent[0].delivered == [other.message_id]
    assert [name for name, _ in transport.sent] == ["busy", "free"]
    assert Channel.objects.get(pk=busy.pk).sending_until is None


def test_a_dead_senders_channel_claim_expires_with_its_lease(scripted, make_webhook):
    transport = scripted()
    channel = make_webhook("https://hooks.example/a")
    enqueue_alert(channel)
    Channel.objects.filter(pk=channel.pk).update(sending_until=T0 + outbox.LEASE)

    assert outbox.deliver_due(now=T0 + timedelta(seconds=30)).found == 0
    report = outbox.deliver_due(now=T0 + outbox.LEASE + timedelta(seconds=1))

    assert len(report.delivered) == 1 and len(transport.sent) == 1


# --- the circuit breaker --------------------------------------------------------------------


def test_a_channel_that_times_out_pauses_and_its_other_rows_wait(scripted, make_webhook):
    transport = scripted(failing={"slow": _timeout()})
    slow, fine = make_webhook("https://hooks.example/a", name="slow"), \
        make_webhook("https://hooks.example/b", name="fine")
    slow_rows = [enqueue_alert(slow, now=T0 + timedelta(seconds=i)) for i in range(5)]
    fine_rows = [enqueue_alert(fine, now=T0 + timedelta(seconds=i)) for i in range(5)]

    report = outbox.deliver_due(now=T0 + timedelta(minutes=1))

    # One send to the slow channel, not five; the other channel is not held up.
    assert [name for name, _ in transport.sent].count("slow") == 1
    assert sorted(report.delivered) == sorted(row.message_id for row in fine_rows)
    slow.refresh_from_db()
    assert slow.failures_in_a_row == 1
    pause = (slow.paused_until - slow.last_error_at).total_seconds()
    assert pause == outbox.BACKOFF[0]
    assert {row.status for row in Notification.objects.filter(channel=slow)} == \
        {"retrying", "pending"}
    # Still paused a moment later: nothing is sent to it.
    assert outbox.deliver_due(now=slow.paused_until - timedelta(seconds=1)).found == 0
    assert len(slow_rows) == 5


def test_the_pause_grows_with_failures_in_a_row_and_a_success_lets_the_queue_go(
        scripted, make_webhook):
    transport = scripted(failing={"slow": _timeout()})
    slow = make_webhook("https://hooks.example/a", name="slow")
    rows = [enqueue_alert(slow, now=T0 + timedelta(seconds=i)) for i in range(6)]
    now, pauses = T0 + timedelta(seconds=10), []
    for _ in range(4):
        outbox.deliver_due(now=now)
        slow.refresh_from_db()
        pauses.append(round((slow.paused_until - now).total_seconds()))
        now = slow.paused_until

    assert pauses == list(outbox.BACKOFF[:4])
    assert len(transport.sent) == 4  # one probe per pause

    transport.failing.clear()  # the receiver answers again
    report = outbox.deliver_due(now=now + timedelta(hours=1))

    assert sorted(report.delivered) == sorted(row.message_id for row in rows)
    slow.refresh_from_db()
    assert (slow.failures_in_a_row, slow.paused_until, slow.sending_until) == (0, None, None)


def test_a_permanent_error_is_an_answer_and_does_not_pause_the_channel(scripted, make_webhook):
    scripted(failing={"picky": TransportError("HTTP 400 Bad Request", permanent=True)})
    channel = make_webhook("https://hooks.example/a", name="picky")
    for i in range(3):
        enqueue_alert(channel, now=T0 + timedelta(seconds=i))

    report = outbox.deliver_due(now=T0 + timedelta(minutes=1))

    assert len(report.failed) == 3
    channel.refresh_from_db()
    assert (channel.failures_in_a_row, channel.paused_until) == (0, None)


def test_rows_of_a_channel_paused_for_a_day_are_given_up_with_a_reason(scripted, make_webhook):
    transport = scripted()
    channel = make_webhook("https://hooks.example/a")
    row = enqueue_alert(channel, now=T0)
    later = T0 + outbox.GIVE_UP_AFTER + timedelta(minutes=1)
    Channel.objects.filter(pk=channel.pk).update(paused_until=later + timedelta(minutes=5))

    outbox.deliver_due(now=later)

    row.refresh_from_db()
    assert transport.sent == [] and row.status == "failed"
    assert "the channel was paused after repeated failures" in row.last_error


# --- one delivery run at a time -------------------------------------------------------------


def test_a_second_delivery_run_returns_at_once_while_one_is_going(scripted, make_webhook):
    channel = make_webhook("https://hooks.example/a")
    enqueue_alert(channel, now=T0 - timedelta(days=3650))
    second: list[dict[str, int]] = []

    def run_another(_notification: Notification) -> None:
        # A separate thread, as another slot of the worker's pool would be.
        worker = threading.Thread(target=lambda: second.append(tasks.deliver_notifications()))
        worker.start()
        worker.join(10)

    transport = scripted(during=run_another)
    first = tasks.deliver_notifications()

    assert second == [{"delivered": 0, "retrying": 0, "failed": 0, "lost_claims": 0,
                       "busy": 1}]
    assert first["delivered"] == 1 and len(transport.sent) == 1


# --- "Send test" ----------------------------------------------------------------------------


@pytest.mark.slow
def test_send_test_to_a_hanging_receiver_returns_within_the_short_deadline(
        admin_client, receiver, make_webhook, monkeypatch):
    monkeypatch.setattr(TRANSPORTS["webhook"], "deadline", 10.0)  # the production deadline
    receiver.reply(Reply(hang=True))
    channel = make_webhook(receiver)

    started = time.monotonic()
    response = admin_client.post(reverse("dashboard:channel-test", args=[channel.pk]),
                                 follow=True)
    took = time.monotonic() - started

    said = re.search(r"Test notification to hook failed: timed out after ([\d.]+) s",
                     response.content.decode())
    assert said is not None and float(said.group(1)) <= outbox.TEST_DEADLINE
    assert took < 10.0  # the webhook's own deadline never applied
    assert Notification.objects.get().status == "failed"


def test_send_test_is_refused_while_enough_tests_are_running(admin_client, make_webhook,
                                                             receiver):
    channel = make_webhook(receiver)
    taken = 0
    try:
        while outbox._test_slots.acquire(blocking=False):
            taken += 1
        response = admin_client.post(reverse("dashboard:channel-test", args=[channel.pk]),
                                     follow=True)
    finally:
        for _ in range(taken):
            outbox._test_slots.release()

    assert taken == outbox.TEST_SENDS_AT_ONCE
    assert "test notifications are being sent right now; try again" in \
        response.content.decode()
    assert not Notification.objects.exists() and receiver.requests == []


def test_send_test_waits_for_no_one_when_the_channel_is_sending(admin_client, make_webhook,
                                                                receiver):
    channel = make_webhook(receiver)
    Channel.objects.filter(pk=channel.pk).update(
        sending_until=T0.replace(year=2100))  # a delivery holds the channel

    response = admin_client.post(reverse("dashboard:channel-test", args=[channel.pk]),
                                 follow=True)

    assert "another notification to this channel is being sent" in response.content.decode()
    assert receiver.requests == []
    assert Notification.objects.get().status == "failed"


def test_send_test_ignores_the_pause_and_a_success_ends_it(admin_client, make_webhook,
                                                           receiver):
    channel = make_webhook(receiver)
    Channel.objects.filter(pk=channel.pk).update(paused_until=T0.replace(year=2100),
                                                 failures_in_a_row=5)

    response = admin_client.post(reverse("dashboard:channel-test", args=[channel.pk]),
                                 follow=True)

    assert "Test notification delivered to hook." in response.content.decode()
    channel.refresh_from_db()
    assert (channel.failures_in_a_row, channel.paused_until) == (0, None)


# --- routing ------------------------------------------------------------------------------------


def test_delivery_has_its_own_queue_which_the_stacks_worker_consumes():
    from sparkops.celery import NOTIFY_QUEUE, app, beat_schedule, worker_queues

    assert app.amqp.router.route({}, tasks.deliver_notifications.name)["queue"].name == \
        NOTIFY_QUEUE
    schedule = beat_schedule(["n1"], 5.0)
    assert schedule["deliver-notifications"]["options"]["queue"] == NOTIFY_QUEUE
    assert schedule["rollup-samples"]["options"]["queue"] == "sparkops"
    assert NOTIFY_QUEUE in worker_queues("n1")
