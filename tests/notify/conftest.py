"""Fixtures for the notification tests: loopback receivers, channels, fast transports."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from dashboard.notify import outbox
from dashboard.notify.models import Channel, Notification
from dashboard.notify.payloads import build_alert_message
from dashboard.notify.transports import TRANSPORTS
from sparkops.testing.webhooks import WebhookReceiver

# A fixed instant for explicit ``now`` values: tests move time forward by passing it, not by
# sleeping. Real deliveries stamp headers with the wall clock, which is what receivers check.
T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _notify_settings(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # The receivers live on 127.0.0.1: allow exactly that address, nothing else private.
    settings.SPARKOPS_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    settings.SPARKOPS_PUBLIC_URL = "https://sparkops.example"
    # A receiver that never answers should cost a test one second, not ten.
    monkeypatch.setattr(TRANSPORTS["webhook"], "deadline", 1.0)


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as server:
        yield server


@pytest.fixture
def make_webhook(db: Any) -> Callable[..., Channel]:
    def make(target: WebhookReceiver | str, **fields: Any) -> Channel:
        url = target if isinstance(target, str) else target.url()
        channel = Channel.objects.create(name=fields.pop("name", "hook"), kind="webhook",
                                         config={"url": url}, **fields)
        if isinstance(target, WebhookReceiver):
            target.secret = channel.secret
        return channel

    return make


@pytest.fixture
def make_email(db: Any) -> Callable[..., Channel]:
    def make(*to: str, **fields: Any) -> Channel:
        return Channel.objects.create(name=fields.pop("name", "mail"), kind="email",
                                      config={"to": list(to or ["ops@example.com"])}, **fields)

    return make


def alert_dict(**overrides: Any) -> dict[str, Any]:
    """An alert as the alerting package will hand it over (a plain dict)."""
    alert = {
        "id": 42,
        "rule": "prefill-squeeze",
        "state": "firing",
        "severity": "critical",
        "node": "spark-a",
        "engine": "vllm-a",
        "summary": "vllm-a needs 6.0 GiB for prefill, 3.1 GiB left",
        "details": {"headroom_gib": 3.1, "need_gib": 6.0,
                    "cause": "vllm-b KV pool went 8 → 24 GiB at 14:02"},
        "started_at": T0,
        "fired_at": T0,
        "resolved_at": None,
        "url": "/alerts/42/",
    }
    return {**alert, **overrides}


def enqueue_alert(channel: Channel, kind: str = "firing", now: datetime = T0,
                  **overrides: Any) -> Notification:
    payload, subject, text, html = build_alert_message(alert_dict(**overrides), kind)
    (row,) = outbox.enqueue(kind=kind, payload=payload, subject=subject, text=text, html=html,
                            alert_id=42, channels=[channel], now=now)
    return row
