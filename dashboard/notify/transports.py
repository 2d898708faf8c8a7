"""One notifier class per channel kind, registered in :data:`TRANSPORTS`.

A transport sends one :class:`~dashboard.notify.models.Notification` and either returns (the
receiver accepted it) or raises :class:`TransportError`. It writes nothing to the database; the
outbox records the outcome. Classification, in short:

- email: SMTP 4xx, connection refused, timeouts and dropped connections are temporary; SMTP 5xx
  is permanent. The SMTP code and text are in the message.
- webhook: 2xx is success; 408, 429, 5xx, timeouts and connection errors are temporary
  (``Retry-After`` honoured); 410 is permanent and disables the channel; other 4xx, any 3xx
  (redirects are not followed) and addresses refused by the SSRF policy are permanent.
"""

from __future__ import annotations

import email.utils
import json
import smtplib
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Protocol

from django.conf import settings
from django.core import mail
from django.core.mail import EmailMultiAlternatives

from dashboard.notify import addresses
from dashboard.notify.models import Channel, Notification
from dashboard.notify.signing import signature_headers
from sparkops.httpfetch import FetchError, IPAddress, fetch

__all__ = [
    "TRANSPORTS",
    "EmailTransport",
    "Transport",
    "TransportError",
    "WebhookTransport",
    "parse_retry_after",
]


class TransportError(Exception):
    """A send that did not succeed.

    ``permanent``: retrying cannot help (the row is marked failed). ``retry_after``: seconds
    the receiver asked us to wait (at least that long before the next attempt).
    ``disable_channel``: the receiver said the target is gone (HTTP 410); the outbox switches
    the channel off with ``message`` as the reason.
    """

    def __init__(
        self,
        message: str,
        permanent: bool = False,
        retry_after: float | None = None,
        *,
        disable_channel: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.permanent = permanent
        self.retry_after = retry_after
        self.disable_channel = disable_channel


class Transport(Protocol):
    def send(self, notification: Notification, deadline: float | None = None) -> None:
        """Deliver ``notification`` to its channel or raise TransportError.

        ``deadline``: seconds the caller can give this send, when that is less than the
        transport's own limit (None: the transport's own).
        """


# --- email ------------------------------------------------------------------------------------


class EmailTransport:
    """Sends subject, text and HTML through Django's email backend (SMTP in production).

    The connection is opened per message with ``EMAIL_TIMEOUT`` (or the caller's ``deadline``
    if shorter): without a timeout a tarpit SMTP server blocks forever. The timeout bounds each
    socket operation, not the whole conversation, so a server that answers just before each
    timeout can stretch a send to a few multiples of it; the outbox's claim lease must stay
    well above that.

    When some recipients are refused and others accepted, Django reports success and the
    refusals are not visible here; a refusal of *all* recipients is an error.
    """

    def send(self, notification: Notification, deadline: float | None = None) -> None:
        recipients = notification.channel.recipients
        if not recipients:
            raise TransportError("the channel has no recipient addresses", permanent=True)
        timeout = _shorter(settings.EMAIL_TIMEOUT, deadline)
        connection = mail.get_connection(fail_silently=False, timeout=timeout)
        message = EmailMultiAlternatives(
            subject=" ".join(notification.subject.split()),  # a newline would raise BadHeader
            body=notification.text,
            from_email=settings.DEFAULT_FROM_EMAIL,
            to=recipients,
            connection=connection,
            headers=_email_headers(notification),
        )
        if notification.html:
            message.attach_alternative(notification.html, "text/html")
        try:
            sent = message.send()
        except smtplib.SMTPRecipientsRefused as error:
            raise _recipients_refused(error) from None
        except smtplib.SMTPResponseException as error:
            raise _smtp_reply_error(error) from None
        except smtplib.SMTPServerDisconnected as error:
            # smtplib reports a read timeout (a tarpit's missing greeting) as a disconnect.
            if isinstance(error.__context__, TimeoutError):
                raise _smtp_timeout(timeout) from None
            raise TransportError(f"SMTP server closed the connection: {error}") from None
        except smtplib.SMTPException as error:
            # E.g. STARTTLS or AUTH not offered: a settings problem. Temporary, so that the
            # alerts queued meanwhile go out once an administrator has fixed the settings.
            raise TransportError(f"SMTP error: {type(error).__name__}: {error}") from None
        except TimeoutError:
            raise _smtp_timeout(timeout) from None
        except ConnectionRefusedError:
            raise TransportError(f"SMTP connection refused by {_smtp_server()}") from None
        except OSError as error:
            raise TransportError(f"cannot talk to SMTP server {_smtp_server()}: {error}") from None
        if sent != 1:
            raise TransportError("the email backend reported that nothing was sent")


def _email_headers(notification: Notification) -> dict[str, str]:
    domain = settings.DEFAULT_FROM_EMAIL.rpartition("@")[2].strip("> ") or "sparkops"
    headers = {
        # The same Message-ID on every retry lets mail systems drop a duplicate.
        "Message-ID": f"<{notification.message_id}@{domain}>",
        # RFC 3834: tells vacation responders not to answer.
        "Auto-Submitted": "auto-generated",
        "X-SparkOps-Kind": notification.kind,
    }
    if notification.alert_id is not None:
        # Mail clients thread every message about one alert under this reference.
        headers["References"] = f"<alert-{notification.alert_id}@{domain}>"
    return headers


def _smtp_server() -> str:
    return f"{settings.EMAIL_HOST}:{settings.EMAIL_PORT}"


def _shorter(own: float, deadline: float | None) -> float:
    return own if deadline is None else min(own, deadline)


def _smtp_timeout(timeout: float) -> TransportError:
    return TransportError(f"SMTP server {_smtp_server()} did not answer within {timeout:g} s")


def _reply_text(reply: bytes | str) -> str:
    text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)
    return " ".join(text.split())


def _smtp_reply_error(error: smtplib.SMTPResponseException) -> TransportError:
    stage = {
        smtplib.SMTPSenderRefused: "sender refused",
        smtplib.SMTPDataError: "message refused",
        smtplib.SMTPConnectError: "connection refused by greeting",
        smtplib.SMTPHeloError: "HELO refused",
        smtplib.SMTPAuthenticationError: "authentication failed",
    }.get(type(error), "SMTP error")
    code = error.smtp_code
    return TransportError(f"{stage}: SMTP {code} {_reply_text(error.smtp_error)}",
                          permanent=500 <= code < 600)


def _recipients_refused(error: smtplib.SMTPRecipientsRefused) -> TransportError:
    replies = [
        (address, code, _reply_text(reply)) for address, (code, reply) in error.recipients.items()
    ]
    detail = "; ".join(f"{address}: SMTP {code} {text}" for address, code, text in replies)
    # One temporary refusal is reason enough to try again: that recipient may accept later.
    permanent = all(500 <= code < 600 for _address, code, _text in replies)
    return TransportError(f"all recipients refused: {detail}", permanent=permanent)


# --- webhook ----------------------------------------------------------------------------------

_TEMPORARY_FETCH_KINDS = frozenset({"dns", "refused", "connection", "tls", "timeout", "protocol"})
_TEMPORARY_STATUSES = frozenset({408, 429})


class WebhookTransport:
    """POSTs the notification's payload as JSON, signed with Standard Webhooks headers.

    Goes through ``sparkops.httpfetch.fetch``: one total ``deadline`` for resolving,
    connecting, sending and reading the answer; the response body is capped at
    ``max_response_bytes`` and otherwise ignored; redirects are never followed; every resolved
    address is checked against the SSRF policy before connecting. Cost: one new connection per
    attempt, at most ``deadline`` seconds (or the caller's shorter one).
    """

    def __init__(self, deadline: float = 10.0, max_response_bytes: int = 64 * 1024) -> None:
        self.deadline = deadline
        self.max_response_bytes = max_response_bytes

    def send(self, notification: Notification, deadline: float | None = None) -> None:
        channel = notification.channel
        if not channel.url or not channel.secret:
            raise TransportError("the channel has no URL or no secret", permanent=True)
        body = json.dumps(notification.payload, sort_keys=True, separators=(",", ":"),
                          ensure_ascii=False).encode()
        headers = {
            "Content-Type": "application/json",
            **signature_headers(channel.secret, notification.message_id, body),
        }
        refusals: dict[IPAddress, str] = {}
        try:
            fetch(
                channel.url,
                method="POST",
                body=body,
                headers=headers,
                deadline=_shorter(self.deadline, deadline),
                max_bytes=self.max_response_bytes,
                accept_status=range(200, 300),
                allow_address=_recording_policy(refusals),
            )
        except FetchError as error:
            if error.kind in ("too_large", "truncated"):
                # These arise only after a 2xx status line was accepted: the receiver took the
                # message; what it said afterwards does not matter to us.
                return
            raise _webhook_error(error, channel, refusals) from None


def _recording_policy(refusals: dict[IPAddress, str]) -> Callable[[IPAddress], bool]:
    """``addresses.allow_address`` that also remembers why it refused, for the error message."""

    def allow(address: IPAddress) -> bool:
        reason = addresses.refusal_reason(address)
        if reason is not None:
            refusals[address] = reason
        return reason is None

    return allow


def _webhook_error(
    error: FetchError, channel: Channel, refusals: Mapping[IPAddress, str]
) -> TransportError:
    if error.kind == "http_status" and error.status is not None:
        return _status_error(error)
    if error.kind == "redirect":
        return TransportError(f"{error.reason}: redirects are not followed; configure the final "
                              "URL", permanent=True)
    if error.kind == "forbidden_address":
        details = ", ".join(f"{address} ({why})" for address, why in refusals.items())
        return TransportError(
            f"{error.reason}: {details or 'refused by the address policy'}; an administrator "
            f"can allowlist its network in {addresses.ALLOWLIST_SETTING}", permanent=True)
    if error.kind in _TEMPORARY_FETCH_KINDS:
        return TransportError(error.reason)
    return TransportError(error.reason, permanent=True)  # invalid_url and anything new


def _status_error(error: FetchError) -> TransportError:
    status = error.status or 0
    if status == 410:
        return TransportError(f"{error.reason}: the receiver says this webhook is gone; "
                              "channel disabled", permanent=True, disable_channel=True)
    if status in _TEMPORARY_STATUSES or status >= 500:
        return TransportError(error.reason,
                              retry_after=parse_retry_after(error.headers.get("retry-after")))
    return TransportError(error.reason, permanent=True)


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or HTTP-date); None if unusable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    reference = now or datetime.fromtimestamp(time.time(), UTC)
    return max(0.0, (when - reference).total_seconds())


TRANSPORTS: dict[str, Transport] = {
    "email": EmailTransport(),
    "webhook": WebhookTransport(),
}
