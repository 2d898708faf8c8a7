"""Signing and message building: Standard Webhooks compatibility, schema, escaping."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from dashboard.notify.models import Channel
from dashboard.notify.payloads import build_alert_message, build_test_message
from dashboard.notify.signing import new_secret, secret_bytes, sign, signature_headers
from tests.notify.conftest import T0, alert_dict


def test_signatures_verify_with_the_standard_webhooks_library():
    secret = new_secret()
    body = json.dumps({"type": "test", "text": "ünïcode"}, ensure_ascii=False).encode()

    headers = signature_headers(secret, "msg_1", body)

    assert Webhook(secret).verify(body, headers) == {"type": "test", "text": "ünïcode"}
    with pytest.raises(WebhookVerificationError):
        Webhook(new_secret()).verify(body, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(body + b" ", headers)


def test_the_signature_is_hmac_sha256_over_id_timestamp_and_body():
    secret = "whsec_" + base64.b64encode(b"k" * 32).decode()

    expected = base64.b64encode(
        hmac.new(b"k" * 32, b"msg_1.1700000000.{}", hashlib.sha256).digest()).decode()
    assert sign(secret, "msg_1", 1_700_000_000, b"{}") == f"v1,{expected}"


def test_secrets_are_random_whsec_base64_of_32_bytes():
    first, second = new_secret(), new_secret()
    assert first != second and first.startswith("whsec_")
    assert len(secret_bytes(first)) == 32
    with pytest.raises(ValueError, match="not whsec_"):
        secret_bytes("whsec_not base64!")


def test_alert_payload_follows_the_documented_schema():
    payload, subject, text, html = build_alert_message(alert_dict(), "firing")

    assert payload["type"] == "alert.firing"
    assert payload["url"] == "https://sparkops.example/alerts/42/"
    assert set(payload["alert"]) == {"id", "rule", "state", "severity", "node", "engine",
                                     "summary", "cause", "cause_now", "details",
                                     "started_at", "fired_at", "resolved_at"}
    assert payload["alert"]["fired_at"] == T0.isoformat()
    assert payload["alert"]["resolved_at"] is None
    json.dumps(payload)  # JSON-ready as it is
    assert subject == ("[SparkOps] FIRING critical: prefill-squeeze on spark-a/vllm-a — "
                       "vllm-a needs 6.0 GiB for prefill, 3.1 GiB left")
    assert "cause: vllm-b KV pool went 8 → 24 GiB at 14:02" in text
    assert "Fired: 2030-01-01 12:00:00 UTC" in text


@pytest.mark.parametrize(("kind", "headline"), [("repeat", "STILL FIRING"),
                                                ("resolved", "RESOLVED")])
def test_repeat_and_resolved_say_so(kind, headline):
    payload, subject, text, _html = build_alert_message(alert_dict(), kind)

    assert payload["type"] == f"alert.{kind}"
    assert subject.startswith(f"[SparkOps] {headline} ")
    assert text.startswith(headline)


def test_markup_in_alert_fields_is_escaped_in_html_and_kept_in_text():
    hostile = alert_dict(summary="<script>alert(1)</script>\nSubject: injected",
                         details={"<img src=x>": "a & b"}, url="javascript://%0aalert(1)")

    payload, subject, text, html = build_alert_message(hostile, "firing")

    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&lt;img src=x&gt;" in html and "a &amp; b" in html
    assert "<script>alert(1)</script>" in text
    assert "\n" not in subject
    assert 'href="javascript:' not in html  # a non-absolute link is joined to the public URL


def test_test_message_names_the_channel(db):
    channel = Channel.objects.create(name="ops <chat>", kind="email", config={"to": ["a@b.c"]})

    payload, subject, text, html = build_test_message(channel)

    assert payload == {"type": "test", "channel": {"id": channel.pk, "name": "ops <chat>"},
                       "url": "https://sparkops.example/channels/"}
    assert subject == "[SparkOps] Test notification for channel ops <chat>"
    assert "ops &lt;chat&gt;" in html and '"ops <chat>"' in text
