"""A new incident folded into a firing alert reaches receivers as "alert.updated", end to end:
lifecycle → outbox rows → a real loopback webhook receiver and a real SMTP server."""

from __future__ import annotations

import json
from dataclasses import replace

from dashboard.alerting.lifecycle import evaluate
from dashboard.alerting.pipeline import queue_notice
from dashboard.notify import outbox
from dashboard.notify.models import Notification
from tests.alerting.helpers import at, engine_rule, make_engine
from tests.notify.servers import ScriptedSMTPHandler, smtp_server


def _restart(node, engine, restart_id: int):
    return replace(engine_rule(node, engine, "unplanned-restart", 1.0), threshold=0.5,
                   clear=0.5, severity="critical",
                   summary=f"{engine.name}: unplanned restart {restart_id} (OOM killed)",
                   details={"restart_id": restart_id})


def _round(node, condition, now):
    return evaluate(node, [condition], now, evaluated_rules={"unplanned-restart"},
                    on_notice=lambda notice: queue_notice(notice, node, now))


def test_a_second_restart_is_announced_by_webhook_and_email_saying_what_is_new(
        node, receiver, make_webhook, make_email, settings):
    engine = make_engine(node, "vllm-a")
    make_webhook(receiver)
    make_email("ops@example.com")
    handler = ScriptedSMTPHandler()
    with smtp_server(handler) as port:
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", port, 2
        _round(node, _restart(node, engine, 1), at(0))
        _round(node, _restart(node, engine, 2), at(60))
        report = outbox.deliver_due(now=at(61))

    assert len(report.delivered) == 4  # firing and updated, to each channel
    assert sorted(Notification.objects.values_list("kind", flat=True)) == \
        ["firing", "firing", "updated", "updated"]

    firing, updated = (json.loads(r.body) for r in receiver.requests)
    assert (firing["type"], updated["type"]) == ("alert.firing", "alert.updated")
    assert updated["new_incidents"] == ["vllm-a: unplanned restart 2 (OOM killed)"]
    assert "new_incidents" not in firing
    assert updated["id"] != firing["id"] and all(r.verified for r in receiver.requests)

    mail = handler.messages[-1]
    assert str(mail["Subject"]).strip().startswith(
        "[SparkOps] NEW INCIDENT critical: unplanned-restart on spark-a/vllm-a — vllm-a: "
        "unplanned restart 2")
    text = mail.get_body(("plain",)).get_content().replace("\r\n", "\n")
    assert "New since the last notice:\n  - vllm-a: unplanned restart 2 (OOM killed)" in text
    html = mail.get_body(("html",)).get_content()
    assert "<li>vllm-a: unplanned restart 2 (OOM killed)</li>" in html
