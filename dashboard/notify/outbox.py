"""The notification outbox: write rows now, deliver them at least once, later.

Writing: :func:`enqueue` creates one :class:`Notification` per channel. Call it inside the
transaction that records the state change being reported, so that both commit or neither does.

Delivering: :func:`deliver_due` (from the Celery task) and :func:`deliver_now` (the "Send test"
button) share one protocol, after healthchecks.io's ``sendalerts``:

1. Read the due rows: neither delivered nor failed, ``next_attempt_at <= now``, unclaimed or
   claimed longer ago than ``lease`` (the worker holding it died mid-send), and of a channel
   that is neither sending (``sending_until`` live) nor paused (``paused_until`` ahead; test
   rows ignore the pause). Open rows of a paused channel older than ``give_up_after`` are
   closed as failed first, so a channel that stays down cannot keep rows open for ever.
2. For each row, in order, while the run's ``budget`` lasts: claim its channel with a
   conditional UPDATE (not sending, not paused) that sets ``sending_until = now + lease``, so
   at most one send is in flight per channel, whichever worker or web thread sends it. A row
   whose channel is taken or paused is left for a later run (``deferred``).
3. Claim the row with a conditional UPDATE that matches it exactly as it was read
   (``claimed_at`` and ``attempts`` unchanged, still open). Only a claim that updated one row
   proceeds, so two workers never send the same row at the same time; a lost row claim
   releases the channel.
4. Send it through ``TRANSPORTS[channel.kind]`` outside any transaction, with a deadline of
   the transport's own or what is left of the budget, whichever is shorter; then record:
   success sets ``delivered_at``; a temporary error schedules the next attempt with backoff
   and releases the claim; a permanent one sets ``failed_at``. The channel's record and its
   release are one UPDATE: success sets ``last_success_at`` and closes the circuit breaker
   (``failures_in_a_row`` 0, ``paused_until`` None); a temporary error sets ``last_error``,
   counts the failure and pauses the channel for the backoff of its failures in a row (or its
   Retry-After), so the channel's other rows wait instead of each hanging a worker in turn;
   a permanent error is an answer from the receiver and only sets ``last_error``; HTTP 410 also
   disables the channel.

Guarantee: at-least-once. Nothing is lost: a row only leaves the due set delivered or failed
with a reason, and a paused or busy channel only delays its rows. A duplicate is possible only
when a worker dies (or outlives its lease) after the receiver accepted a message and before
``delivered_at`` was written; the next worker then sends it again with the same
``message_id``, which receivers use to drop it. The lease must therefore stay above the longest
send (webhook deadline 10 s; SMTP a few multiples of ``EMAIL_TIMEOUT``).

Bounds: a run never starts a send once its budget is spent, and no send outlasts the budget
(SMTP: each socket operation is bounded, see ``transports``). A channel that does not answer
costs one send per pause: 10 s, then 30 s, 60 s... up to 30 min apart, not 10 s per queued row.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Case, F, Q, QuerySet, Value, When
from django.utils import timezone

from collectors.models import Node
from dashboard.notify import transports
from dashboard.notify.models import Channel, Notification
from dashboard.notify.payloads import build_test_message
from dashboard.notify.transports import TransportError
from sparkops.prepared import PreparedRead

__all__ = [
    "BACKOFF",
    "GIVE_UP_AFTER",
    "LEASE",
    "MAX_RETRY_AFTER",
    "MIN_SEND_SECONDS",
    "TEST_DEADLINE",
    "TEST_SENDS_AT_ONCE",
    "DeliveryReport",
    "TestOutcome",
    "channels_for",
    "deliver_due",
    "deliver_now",
    "enqueue",
    "send_test",
    "worker_name",
]

log = logging.getLogger(__name__)

# Seconds to wait after the 1st, 2nd, ... failed attempt; the last value repeats. Override with
# the optional setting SPARKOPS_NOTIFY_BACKOFF or the ``backoff`` argument (tests use zeros).
BACKOFF: tuple[float, ...] = (10, 30, 60, 120, 300, 600, 1200, 1800)
# A worker's claim older than this is considered abandoned and taken over.
LEASE = timedelta(minutes=2)
# A receiver's Retry-After is honoured up to this long, so one answer cannot park a row forever.
MAX_RETRY_AFTER = 3600.0
# After this long since the row was written, a temporary error is final: an alert that could
# not be delivered for a day is recorded as failed rather than sent out of context.
GIVE_UP_AFTER = timedelta(hours=24)
# A send is not started with less of the run's budget left than this: it could not finish.
MIN_SEND_SECONDS = 1.0
# "Send test" runs on a web thread: it gets this long in all, and this many run at once per
# web process (the others are refused), so a hanging receiver cannot hold the web server.
TEST_DEADLINE = 3.0
TEST_SENDS_AT_ONCE = 2


@dataclass
class DeliveryReport:
    """What one delivery run did; lists hold message ids."""

    found: int = 0
    delivered: list[str] = field(default_factory=list)
    retrying: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    lost_claims: int = 0  # due rows another worker claimed first
    deferred: int = 0  # due rows left for later: channel busy or paused, or budget spent
    out_of_budget: bool = False  # the run stopped because its budget was spent

    @property
    def attempted(self) -> int:
        return len(self.delivered) + len(self.retrying) + len(self.failed)

    def merge(self, other: DeliveryReport) -> None:
        self.found += other.found
        self.delivered += other.delivered
        self.retrying += other.retrying
        self.failed += other.failed
        self.lost_claims += other.lost_claims
        self.deferred += other.deferred
        self.out_of_budget = self.out_of_budget or other.out_of_budget


def worker_name() -> str:
    """Who holds a claim: host, process and thread, so a stale claim can be traced."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


# --- writing ----------------------------------------------------------------------------------


def channels_for(node: Node | int | None) -> QuerySet[Channel]:
    """Enabled channels that take notifications about ``node``.

    A channel without a node takes every node's notifications; a channel for a node takes only
    that node's. A notification about no node goes to the channels without a node.
    """
    enabled = Channel.objects.filter(enabled=True)
    if node is None:
        return enabled.filter(node__isnull=True)
    return enabled.filter(Q(node__isnull=True) | Q(node=node))


def enqueue(
    *,
    kind: str,
    payload: dict[str, Any],
    subject: str,
    text: str,
    html: str,
    alert_id: int | None = None,
    node: Node | int | None = None,
    channels: Iterable[Channel] | None = None,
    now: datetime | None = None,
) -> list[Notification]:
    """Write one due notification per channel and return them (unsent).

    ``channels`` None means :func:`channels_for` ``node``; given channels are used as they are,
    enabled or not (the "Send test" button). Each row's payload is ``payload`` with ``id`` set
    to its ``message_id`` and ``timestamp`` to its creation time (see ``payloads``). A channel
    deleted meanwhile gets none. Cost: one query for the channels, one to lock them and one
    INSERT.
    """
    if kind not in Notification.Kind.values:
        raise ValueError(f"unknown notification kind {kind!r}")
    targets = list(channels_for(node) if channels is None else channels)
    at = now or timezone.now()
    with transaction.atomic():
        # Lock the channels first: one being deleted meanwhile (``notify.views``, which locks it
        # too) is waited for and then left out, instead of failing this insert on its key.
        present = set(Channel.objects.select_for_update()
                      .filter(pk__in=[channel.pk for channel in targets])
                      .values_list("pk", flat=True))
        rows = []
        for channel in targets:
            if channel.pk not in present:
                continue
            row = Notification(channel=channel, kind=kind, alert_id=alert_id, subject=subject,
                               text=text, html=html, created_at=at, next_attempt_at=at)
            row.payload = {**payload, "id": row.message_id, "timestamp": at.isoformat()}
            rows.append(row)
        return Notification.objects.bulk_create(rows)


# --- delivering -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Policy:
    worker: str
    backoff: Sequence[float]
    give_up_after: timedelta
    lease: timedelta


class _Clock:
    """``now`` as given (or the wall clock), advanced by the monotonic time spent since.

    Claims must carry the time they were really made: a batch that starts at ``now`` and takes
    a minute must not stamp its last claim with the start time, or another worker would take it
    over as stale while it is being sent. ``budget`` (seconds, None for unbounded) is measured
    on the same monotonic clock.
    """

    def __init__(self, now: datetime | None, budget: float | None = None) -> None:
        self._start = now or timezone.now()
        self._mono = time.monotonic()
        self._budget = budget

    def now(self) -> datetime:
        return self._start + timedelta(seconds=time.monotonic() - self._mono)

    def remaining(self) -> float | None:
        """Seconds of the budget left (never below 0), or None when there is no budget."""
        if self._budget is None:
            return None
        return max(0.0, self._budget - (time.monotonic() - self._mono))


def deliver_due(
    now: datetime | None = None,
    *,
    worker: str | None = None,
    limit: int = 100,
    lease: timedelta = LEASE,
    backoff: Sequence[float] | None = None,
    give_up_after: timedelta = GIVE_UP_AFTER,
    budget: float | None = None,
) -> DeliveryReport:
    """Deliver up to ``limit`` due notifications, oldest due first; safe to run concurrently.

    ``budget``: seconds this call may take. No send starts with less than
    :data:`MIN_SEND_SECONDS` of it left, and each send's deadline is cut to what is left.

    Cost: with no open row, one SELECT; else an UPDATE (paused rows given up) and a SELECT,
    then per row two claim UPDATEs, a SELECT, the send (up to its deadline) and two UPDATEs.
    Rows are sent one after another.
    """
    clock = _Clock(now, budget)
    policy = _policy(worker, backoff, give_up_after, lease)
    if not _ANY_OPEN(clock.now() - lease):
        return DeliveryReport()
    _give_up_paused(clock.now(), policy)
    snapshot = _due_rows(Notification.objects.all(), clock.now(), lease, limit)
    return _deliver_rows(snapshot, clock, policy)


def deliver_now(
    notifications: Iterable[Notification],
    *,
    now: datetime | None = None,
    worker: str | None = None,
    lease: timedelta = LEASE,
    backoff: Sequence[float] | None = None,
    give_up_after: timedelta = GIVE_UP_AFTER,
    budget: float | None = None,
) -> DeliveryReport:
    """Deliver these notifications now if they are due, by the same claim protocol."""
    clock = _Clock(now, budget)
    policy = _policy(worker, backoff, give_up_after, lease)
    chosen = Notification.objects.filter(pk__in=[row.pk for row in notifications])
    return _deliver_rows(_due_rows(chosen, clock.now(), lease, None), clock, policy)


# --- "Send test" --------------------------------------------------------------------------------

_test_slots = threading.BoundedSemaphore(TEST_SENDS_AT_ONCE)


@dataclass(frozen=True)
class TestOutcome:
    """What "Send test" did: ``delivered``, and a sentence for the person who asked."""

    delivered: bool
    message: str


def send_test(channel: Channel, *, worker: str | None = None,
              deadline: float = TEST_DEADLINE) -> TestOutcome:
    """Write a test notification for ``channel`` and try to deliver it within ``deadline`` s.

    For a request thread: at most :data:`TEST_SENDS_AT_ONCE` tests run at once in this process
    (another is refused without writing anything), the send gets ``deadline`` seconds in all,
    and a channel that is sending right now (one send in flight per channel) is not sent to:
    the test row is closed as failed with that reason. A test ignores the channel's pause (an
    administrator checking a receiver wants to know now); its outcome counts for the circuit
    breaker like any send, so a test that succeeds lets the channel's queued rows go. A test is
    never retried. Cost: one send of at most ``deadline`` seconds, a handful of queries.
    """
    if not _test_slots.acquire(blocking=False):
        return TestOutcome(False, f"{TEST_SENDS_AT_ONCE} test notifications are being sent "
                                  "right now; try again in a few seconds.")
    try:
        payload, subject, text, html = build_test_message(channel)
        (row,) = enqueue(kind=Notification.Kind.TEST, payload=payload, subject=subject,
                         text=text, html=html, channels=[channel])
        report = deliver_now([row], worker=worker, budget=deadline)
        if not report.attempted:  # the channel is taken by another send
            Notification.objects.filter(pk=row.pk, claimed_at__isnull=True).update(
                failed_at=timezone.now(),
                last_error="not sent: another notification to this channel is being sent; "
                           "try again in a few seconds")
        row.refresh_from_db()
    finally:
        _test_slots.release()
    if row.delivered_at is not None:
        return TestOutcome(True, f"Test notification delivered to {channel.name}.")
    return TestOutcome(False, f"Test notification to {channel.name} failed: "
                              f"{row.last_error or row.status}")


# --- the protocol -------------------------------------------------------------------------------


def _policy(
    worker: str | None, backoff: Sequence[float] | None, give_up_after: timedelta,
    lease: timedelta,
) -> _Policy:
    schedule = tuple(backoff if backoff is not None
                     else getattr(settings, "SPARKOPS_NOTIFY_BACKOFF", BACKOFF))
    if not schedule or any(delay < 0 for delay in schedule):
        raise ValueError(f"backoff must be non-negative seconds, not {schedule!r}")
    return _Policy(worker or worker_name(), schedule, give_up_after, lease)


@dataclass(frozen=True)
class _Snapshot:
    """A due row as read: the claim UPDATE only succeeds if it is still exactly so."""

    pk: int
    claimed_at: datetime | None
    attempts: int
    channel_id: int
    kind: str


def _open_rows(rows: QuerySet[Notification],
               lease_ended_before: datetime) -> QuerySet[Notification]:
    """The rows neither delivered nor failed, and not claimed by a lease still running (one
    taken at or after ``lease_ended_before``, now less the lease)."""
    return rows.filter(
        Q(claimed_at__isnull=True) | Q(claimed_at__lt=lease_ended_before),
        delivered_at__isnull=True,
        failed_at__isnull=True,
    )


# Whether any row is open (a prepared read: the sweep runs every 15 s and mostly finds
# nothing).
_ANY_OPEN = PreparedRead(lambda lease_ended_before: _open_rows(
    Notification.objects.all(), lease_ended_before).values_list("pk", flat=True)[:1])


def _due_rows(
    rows: QuerySet[Notification], now: datetime, lease: timedelta, limit: int | None
) -> list[_Snapshot]:
    due = _open_rows(rows, now - lease).filter(
        Q(channel__sending_until__isnull=True) | Q(channel__sending_until__lte=now),
        Q(channel__paused_until__isnull=True) | Q(channel__paused_until__lte=now)
        | Q(kind=Notification.Kind.TEST),
        next_attempt_at__lte=now,
    ).order_by("next_attempt_at", "pk").values_list("pk", "claimed_at", "attempts",
                                                    "channel_id", "kind")
    if limit is not None:
        due = due[:limit]
    return [_Snapshot(*values) for values in due]


def _give_up_paused(now: datetime, policy: _Policy) -> int:
    """Close the open rows of paused channels that are older than ``give_up_after``.

    Without this a row of a channel that stays down would wait until its turn as the probe,
    each probe one pause apart, long after anyone cares. Cost: one UPDATE.
    """
    return _open_rows(Notification.objects.all(), now - policy.lease).filter(
        created_at__lte=now - policy.give_up_after, channel__paused_until__gt=now,
    ).exclude(kind=Notification.Kind.TEST).update(
        failed_at=now,
        last_error=f"gave up after {policy.give_up_after}: the channel was paused after "
                   "repeated failures")


def _deliver_rows(snapshot: list[_Snapshot], clock: _Clock, policy: _Policy) -> DeliveryReport:
    report = DeliveryReport(found=len(snapshot))
    for position, row in enumerate(snapshot):
        remaining = clock.remaining()
        if remaining is not None and remaining < MIN_SEND_SECONDS:
            report.out_of_budget = True
            report.deferred += len(snapshot) - position
            break
        claimed_at = clock.now()
        lease_end = claimed_at + policy.lease
        if not _claim_channel(row, claimed_at, lease_end):
            report.deferred += 1
            continue
        if not _claim(row, claimed_at, policy.worker):
            _release_channel(row.channel_id, lease_end)
            report.lost_claims += 1
            continue
        notification = Notification.objects.select_related("channel").filter(pk=row.pk).first()
        if notification is None:  # its channel was deleted meanwhile, and the row with it
            continue
        _attempt(notification, claimed_at, lease_end, clock, policy, report)
    return report


def _claim_channel(row: _Snapshot, at: datetime, lease_end: datetime) -> bool:
    """Take the row's channel for one send; False if another send holds it or it is paused.

    One conditional UPDATE of the channel row: on PostgreSQL a concurrent claim waits for the
    first one's commit and then re-checks ``sending_until``, so only one of them wins.
    """
    free = Q(sending_until__isnull=True) | Q(sending_until__lte=at)
    if row.kind != Notification.Kind.TEST:
        free &= Q(paused_until__isnull=True) | Q(paused_until__lte=at)
    return Channel.objects.filter(free, pk=row.channel_id).update(sending_until=lease_end) == 1


def _released(lease_end: datetime) -> Case:
    # Only our own lease is released: if we outlived it, another sender holds the channel now.
    return Case(When(sending_until=lease_end, then=Value(None)), default=F("sending_until"))


def _release_channel(channel_id: int, lease_end: datetime) -> None:
    Channel.objects.filter(pk=channel_id, sending_until=lease_end).update(sending_until=None)


def _claim(row: _Snapshot, at: datetime, worker: str) -> bool:
    """Take the row if nobody changed it since it was read; True when this worker holds it.

    Matching ``attempts`` as well as ``claimed_at`` closes the gap where another worker claimed
    the row, failed and released it (``claimed_at`` back to NULL) between our read and claim.
    """
    updated = Notification.objects.filter(
        pk=row.pk,
        claimed_at=row.claimed_at,
        attempts=row.attempts,
        delivered_at__isnull=True,
        failed_at__isnull=True,
    ).update(claimed_at=at, claimed_by=worker)
    return updated == 1


def _attempt(
    notification: Notification,
    claimed_at: datetime,
    lease_end: datetime,
    clock: _Clock,
    policy: _Policy,
    report: DeliveryReport,
) -> None:
    channel = notification.channel
    if not channel.enabled and notification.kind != Notification.Kind.TEST:
        # An admin (or a 410) switched the channel off: record why instead of sending, so
        # re-enabling it later does not release a backlog of stale alerts.
        _record_not_sent(notification, claimed_at, clock.now(), policy, report)
        _release_channel(channel.pk, lease_end)
        return
    try:
        _transport_for(channel).send(notification, deadline=clock.remaining())
    except TransportError as error:
        _record_failure(notification, claimed_at, lease_end, clock.now(), error, policy,
                        report)
    except Exception as error:  # a bug must not stop the batch or leave the row claimed
        log.exception("sending notification %s failed unexpectedly", notification.message_id)
        wrapped = TransportError(f"internal error: {type(error).__name__}: {error}")
        _record_failure(notification, claimed_at, lease_end, clock.now(), wrapped, policy,
                        report)
    else:
        _record_success(notification, lease_end, clock.now(), report)


def _transport_for(channel: Channel) -> transports.Transport:
    try:
        return transports.TRANSPORTS[channel.kind]
    except KeyError:
        raise TransportError(f"no transport for channel kind {channel.kind!r}",
                             permanent=True) from None


def _record_success(notification: Notification, lease_end: datetime, at: datetime,
                    report: DeliveryReport) -> None:
    # Not conditional on the claim: if our lease ran out and another worker took over, the
    # message was still delivered, and saying so prevents yet another send.
    Notification.objects.filter(pk=notification.pk, delivered_at__isnull=True).update(
        delivered_at=at, failed_at=None, attempts=F("attempts") + 1, last_error="")
    # The receiver answers again: close the circuit breaker, the channel's queue may go.
    Channel.objects.filter(pk=notification.channel_id).update(
        last_success_at=at, failures_in_a_row=0, paused_until=None,
        sending_until=_released(lease_end))
    report.delivered.append(notification.message_id)


def _record_failure(
    notification: Notification,
    claimed_at: datetime,
    lease_end: datetime,
    at: datetime,
    error: TransportError,
    policy: _Policy,
    report: DeliveryReport,
) -> None:
    attempts = notification.attempts + 1
    message = error.message
    final = error.permanent or notification.kind == Notification.Kind.TEST
    if not final and at - notification.created_at >= policy.give_up_after:
        final = True
        message = f"gave up after {attempts} attempts: {message}"
    # Only the claim holder records a failure: a worker that outlived its lease must not undo
    # what the worker that took over has recorded since.
    held = Notification.objects.filter(pk=notification.pk, claimed_at=claimed_at,
                                       claimed_by=policy.worker, delivered_at__isnull=True)
    if final:
        held.update(attempts=attempts, failed_at=at, last_error=message)
        report.failed.append(notification.message_id)
    else:
        delay = _retry_delay(attempts, error.retry_after, policy.backoff)
        held.update(attempts=attempts, next_attempt_at=at + timedelta(seconds=delay),
                    claimed_at=None, claimed_by="", last_error=message)
        report.retrying.append(notification.message_id)
    _record_channel_error(notification.channel, lease_end, at, message, error, policy)


def _record_not_sent(
    notification: Notification,
    claimed_at: datetime,
    at: datetime,
    policy: _Policy,
    report: DeliveryReport,
) -> None:
    """Close a row of a disabled channel without sending; the channel's own error stays."""
    reason = notification.channel.disabled_reason or "switched off by an administrator"
    Notification.objects.filter(
        pk=notification.pk, claimed_at=claimed_at, claimed_by=policy.worker,
        delivered_at__isnull=True,
    ).update(failed_at=at, last_error=f"not sent: the channel is disabled ({reason})")
    report.failed.append(notification.message_id)


def _retry_delay(attempts: int, retry_after: float | None, backoff: Sequence[float]) -> float:
    """Backoff for the ``attempts``-th failure, or the receiver's Retry-After if longer."""
    delay = float(backoff[min(attempts, len(backoff)) - 1])
    if retry_after is not None:
        delay = max(delay, min(retry_after, MAX_RETRY_AFTER))
    return delay


def _record_channel_error(channel: Channel, lease_end: datetime, at: datetime, message: str,
                          error: TransportError, policy: _Policy) -> None:
    """Record the error on the channel and release it; a temporary error pauses it.

    ``channel.failures_in_a_row`` was read after the channel was claimed, and nobody else
    sends to the channel while the claim holds, so counting from it loses no failure.
    """
    # Field-level UPDATEs, not channel.save(): an admin may be editing the channel right now.
    changes: dict[str, Any] = {"last_error": message, "last_error_at": at,
                               "sending_until": _released(lease_end)}
    if not error.permanent:
        failures = channel.failures_in_a_row + 1
        pause = _retry_delay(failures, error.retry_after, policy.backoff)
        changes.update(failures_in_a_row=failures, paused_until=at + timedelta(seconds=pause))
    if error.disable_channel:
        changes.update(enabled=False, disabled_reason=message)
    Channel.objects.filter(pk=channel.pk).update(**changes)
