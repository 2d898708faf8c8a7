"""Email delivery against a real SMTP server (aiosmtpd) and a tarpit."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from dashboard.notify import outbox
from sparkops.testing.ports import free_port
from tests.notify.conftest import T0, enqueue_alert
from tests.notify.servers import ScriptedSMTPHandler, silent_listener, smtp_server

pytestmark = pytest.mark.slow


@pytest.fixture
def use_smtp(settings: Any) -> Iterator[Any]:
    """Point Django's real SMTP backend at a port (pytest-django installs the locmem one)."""

    def point(port: int, timeout: float = 2.0) -> None:
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        settings.EMAIL_HOST = "127.0.0.1"
        settings.EMAIL_PORT = port
        settings.EMAIL_TIMEOUT = timeout
        settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
        settings.EMAIL_HOST_USER = settings.EMAIL_HOST_PASSWORD = ""
        settings.DEFAULT_FROM_EMAIL = "sparkops@ops.example"

    yield point


def test_an_alert_email_has_subject_text_html_and_a_stable_message_id(use_smtp, make_email):
    handler = ScriptedSMTPHandler()
    with smtp_server(handler) as port:
        use_smtp(port)
        row = enqueue_alert(make_email("a@example.com", "b@example.com"),
                            summary="<b>vllm-a</b> squeezed")
        report = outbox.deliver_due(now=T0)

    assert report.delivered == [row.message_id]
    (message,) = handler.messages
    assert message["Message-ID"] == f"<{row.message_id}@ops.example>"
    assert message["To"] == "a@example.com, b@example.com"
    assert message["Subject"].strip().startswith("[SparkOps] FIRING critical: prefill-squeeze on "
                                         "spark-a/vllm-a")
    assert message["Auto-Submitted"] == "auto-generated"
    parts = {part.get_content_type(): part.get_content()
             for part in message.walk() if not part.is_multipart()}
    assert "<b>vllm-a</b> squeezed" in parts["text/plain"]
    assert "&lt;b&gt;vllm-a&lt;/b&gt; squeezed" in parts["text/html"]
    assert "https://sparkops.example/alerts/42/" in parts["text/html"]


def test_smtp_451_then_success_is_delivered_on_the_retry(use_smtp, make_email):
    handler = ScriptedSMTPHandler(rcpt=["451 4.3.0 try later"])
    with smtp_server(handler) as port:
        use_smtp(port)
        channel = make_email()
        row = enqueue_alert(channel)

        first = outbox.deliver_due(now=T0)
        row.refresh_from_db()
        assert first.retrying == [row.message_id]
        assert "SMTP 451 4.3.0 try later" in row.last_error
        assert row.failed_at is None and handler.messages == []

        outbox.deliver_due(now=row.next_attempt_at)

    row.refresh_from_db()
    assert row.delivered_at is not None and row.attempts == 2
    (message,) = handler.messages
    assert message["Message-ID"] == f"<{row.message_id}@ops.example>"


@pytest.mark.parametrize("script", [
    {"rcpt": ["550 5.7.1 relaying denied"]},
    {"data": ["550 5.7.1 message rejected as spam"]},
])
def test_smtp_550_is_permanent_with_the_code_in_the_error(use_smtp, make_email, script):
    handler = ScriptedSMTPHandler(**script)
    with smtp_server(handler) as port:
        use_smtp(port)
        channel = make_email()
        row = enqueue_alert(channel)
        report = outbox.deliver_due(now=T0)

    row.refresh_from_db()
    channel.refresh_from_db()
    assert report.failed == [row.message_id]
    assert "SMTP 550 5.7.1" in row.last_error
    assert channel.last_error == row.last_error and channel.enabled
    assert handler.messages == []


def test_a_tarpit_smtp_server_times_out_and_is_retried(use_smtp, make_email):
    with silent_listener() as (port, _pending):
        use_smtp(port, timeout=0.5)
        row = enqueue_alert(make_email())
        started = time.monotonic()
        outbox.deliver_due(now=T0)
        elapsed = time.monotonic() - started

    row.refresh_from_db()
    assert elapsed < 3.0
    assert row.failed_at is None and row.attempts == 1
    assert "did not answer within 0.5 s" in row.last_error


def test_a_closed_smtp_port_is_temporary(use_smtp, make_email):
    use_smtp(free_port())
    row = enqueue_alert(make_email())

    outbox.deliver_due(now=T0)

    row.refresh_from_db()
    assert row.failed_at is None and "refused" in row.last_error
