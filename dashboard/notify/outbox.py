"""The notification outbox: write rows now, deliver them at least once, later.

Writing: :func:`enqueue` creates one :class:`Notification` per channel. Call it inside the
transaction that records the state change being reported, so that both commit or neither does.

Delivering: :func:`deliver_due` (from the Celery task) and :func:`deliver_now` (the "Send test"
button) share one protocol, after healthchecks.io's ``sendalerts`` (RELIABILITY.md finding 2):

1. Read the due rows: neither delivered nor failed, ``next_attempt_at <= now``, and unclaimed
   or claimed longer ago than ``lease`` (the worker holding it died mid-send).
2. Claim each with a conditional UPDATE that matches the row exactly as it was read
   (``claimed_at`` and ``attempts`` unchanged, still open). Only a claim that updated one row
   proceeds, so two workers never send the same row at the same time.
3. Send it through ``TRANSPORTS[channel.kind]`` outside any transaction, then record: success
   sets ``delivered_at``; a temporary error schedules the next attempt with backoff and releases
   the claim; a permanent one sets ``failed_at``. The channel gets ``last_success_at`` or
   ``last_error``; HTTP 410 also disables it.

Guarantee: at-least-once. Nothing is lost: a row only leaves the due set delivered or failed
with a reason. A duplicate is possible only when a worker dies (or outlives its lease) after the
receiver accepted a message and before ``delivered_at`` was written; the next worker then sends
it again with the same ``message_id``, which receivers use to drop it. The lease must therefore
stay above the longest send (webhook deadline 10 s; SMTP a few multiples of ``EMAIL_TIMEOUT``).
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
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from collectors.models import Node
from dashboard.notify import transports
from dashboard.notify.models import Channel, Notification
from dashboard.notify.transports import TransportError

__all__ = [
    "BACKOFF",
    "GIVE_UP_AFTER",
    "LEASE",
    "MAX_RETRY_AFTER",
    "DeliveryReport",
    "channels_for",
    "deliver_due",
    "deliver_now",
    "enqueue",
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


@dataclass
class DeliveryReport:
    """What one delivery run did; lists hold message ids."""

    found: int = 0
    delivered: list[str] = field(default_factory=list)
    retrying: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    lost_claims: int = 0  # due rows another worker claimed first

    @property
    def attempted(self) -> int:
        return len(self.delivered) + len(self.retrying) + len(self.failed)

    def merge(self, other: DeliveryReport) -> None:
        self.found += other.found
        self.delivered += other.delivered
        self.retrying += other.retrying
        self.failed += other.failed
        self.lost_claims += other.lost_claims


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
    to its ``message_id`` and ``timestamp`` to its creation time (see ``payloads``). Cost: one
    query for the channels and one INSERT.
    """
    if kind not in Notification.Kind.values:
        raise ValueError(f"unknown notification kind {kind!r}")
    targets = list(channels_for(node) if channels is None else channels)
    at = now or timezone.now()
    rows = []
    for channel in targets:
        row = Notification(channel=channel, kind=kind, alert_id=alert_id, subject=subject,
                           text=text, html=html, created_at=at, next_attempt_at=at)
        row.payload = {**payload, "id": row.message_id, "timestamp": at.isoformat()}
        rows.append(row)
    with transaction.atomic():
        return Notification.objects.bulk_create(rows)


# --- delivering -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Policy:
    worker: str
    backoff: Sequence[float]
    give_up_after: timedelta


class _Clock:
    """``now`` as given (or the wall clock), advanced by the monotonic time spent since.

    Claims must carry the time they were really made: a batch that starts at ``now`` and takes
    a minute must not stamp its last claim with the start time, or another worker would take it
    over as stale while it is being sent.
    """

    def __init__(self, now: datetime | None) -> None:
        self._start = now or timezone.now()
        self._mono = time.monotonic()

    def now(self) -> datetime:
        return self._start + timedelta(seconds=time.monotonic() - self._mono)


def deliver_due(
    now: datetime | None = None,
    *,
    worker: str | None = None,
    limit: int = 100,
    lease: timedelta = LEASE,
    backoff: Sequence[float] | None = None,
    give_up_after: timedelta = GIVE_UP_AFTER,
) -> DeliveryReport:
    """Deliver up to ``limit`` due notifications, oldest due first; safe to run concurrently.

    Cost: one SELECT, then per row a claim UPDATE, a SELECT, the send (up to the transport's
    deadline) and two UPDATEs. Rows are sent one after another.
    """
    clock = _Clock(now)
    policy = _policy(worker, backoff, give_up_after)
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
) -> DeliveryReport:
    """Deliver these notifications now if they are due, by the same claim protocol."""
    clock = _Clock(now)
    policy = _policy(worker, backoff, give_up_after)
    chosen = Notification.objects.filter(pk__in=[row.pk for row in notifications])
    return _deliver_rows(_due_rows(chosen, clock.now(), lease, None), clock, policy)


def _policy(
    worker: str | None, backoff: Sequence[float] | None, give_up_after: timedelta
) -> _Policy:
    schedule = tuple(backoff if backoff is not None
                     else getattr(settings, "SPARKOPS_NOTIFY_BACKOFF", BACKOFF))
    if not schedule or any(delay < 0 for delay in schedule):
        raise ValueError(f"backoff must be non-negative seconds, not {schedule!r}")
    return _Policy(worker or worker_name(), schedule, give_up_after)


@dataclass(frozen=True)
class _Snapshot:
    """A due row as read: the claim UPDATE only succeeds if it is still exactly so."""

    pk: int
    claimed_at: datetime | None
    attempts: int


def _due_rows(
    rows: QuerySet[Notification], now: datetime, lease: timedelta, limit: int | None
) -> list[_Snapshot]:
    due = rows.filter(
        Q(claimed_at__isnull=True) | Q(claimed_at__lt=now - lease),
        delivered_at__isnull=True,
        failed_at__isnull=True,
        next_attempt_at__lte=now,
    ).order_by("next_attempt_at", "pk").values_list("pk", "claimed_at", "attempts")
    if limit is not None:
        due = due[:limit]
    return [_Snapshot(*values) for values in due]


def _deliver_rows(snapshot: list[_Snapshot], clock: _Clock, policy: _Policy) -> DeliveryReport:
    report = DeliveryReport(found=len(snapshot))
    for row in snapshot:
        claimed_at = clock.now()
        if not _claim(row, claimed_at, policy.worker):
            report.lost_claims += 1
            continue
        notification = Notification.objects.select_related("channel").filter(pk=row.pk).first()
        if notification is None:  # its channel was deleted meanwhile, and the row with it
            continue
        _attempt(notification, claimed_at, clock, policy, report)
    return report


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
    clock: _Clock,
    policy: _Policy,
    report: DeliveryReport,
) -> None:
    channel = notification.channel
    if not channel.enabled and notification.kind != Notification.Kind.TEST:
        # An admin (or a 410) switched the channel off: record why instead of sending, so
        # re-enabling it later does not release a backlog of stale alerts.
        _record_not_sent(notification, claimed_at, clock.now(), policy, report)
        return
    try:
        _transport_for(channel).send(notification)
    except TransportError as error:
        _record_failure(notification, claimed_at, clock.now(), error, policy, report)
    except Exception as error:  # a bug must not stop the batch or leave the row claimed
        log.exception("sending notification %s failed unexpectedly", notification.message_id)
        wrapped = TransportError(f"internal error: {type(error).__name__}: {error}")
        _record_failure(notification, claimed_at, clock.now(), wrapped, policy, report)
    else:
        _record_success(notification, clock.now(), report)


def _transport_for(channel: Channel) -> transports.Transport:
    try:
        return transports.TRANSPORTS[channel.kind]
    except KeyError:
        raise TransportError(f"no transport for channel kind {channel.kind!r}",
                             permanent=True) from None


def _record_success(notification: Notification, at: datetime, report: DeliveryReport) -> None:
    # Not conditional on the claim: if our lease ran out and another worker took over, the
    # message was still delivered, and saying so prevents yet another send.
    Notification.objects.filter(pk=notification.pk, delivered_at__isnull=True).update(
        delivered_at=at, failed_at=None, attempts=F("attempts") + 1, last_error="")
    Channel.objects.filter(pk=notification.channel_id).update(last_success_at=at)
    report.delivered.append(notification.message_id)


def _record_failure(
    notification: Notification,
    claimed_at: datetime,
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
    _record_channel_error(notification.channel_id, at, message, error.disable_channel)


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


def _record_channel_error(channel_id: int, at: datetime, message: str, disable: bool) -> None:
    # Field-level UPDATEs, not channel.save(): an admin may be editing the channel right now.
    changes: dict[str, Any] = {"last_error": message, "last_error_at": at}
    if disable:
        changes.update(enabled=False, disabled_reason=message)
    Channel.objects.filter(pk=channel_id).update(**changes)
