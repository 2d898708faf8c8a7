"""What a notification says: the webhook JSON payload and the email subject, text and HTML.

Webhook payload — a JSON object, UTF-8, sent as the POST body with Standard Webhooks
signature headers (see ``signing``). Keys may be added later; none will be removed or retyped::

    {
      "type": "alert.firing" | "alert.resolved" | "alert.repeat" | "alert.updated" | "test",
      "id": "msg_<32 hex digits>",      # = the webhook-id header, identical on every retry
      "timestamp": "<ISO 8601>",        # when the notification was written, not the attempt
      "alert": {                        # absent when type is "test"
        "id": 42,
        "rule": "prefill-squeeze",
        "state": "firing" | "resolved" | ...,
        "severity": "critical" | "warning" | "info",
        "node": "spark-a",
        "engine": "vllm-a" | null,      # null for node-wide rules
        "summary": "one line for people",
        "cause": "<one line>" | null,   # the cause it fired for; never rewritten later
        "cause_now": "<one line>" | null,  # a different cause named since it fired
        "details": {...},               # the rule's numbers and cause, a JSON object
        "started_at": "<ISO 8601>" | null,   # condition first seen (pending)
        "fired_at": "<ISO 8601>" | null,
        "resolved_at": "<ISO 8601>" | null
      },
      "new_incidents": ["<one line>", ...],  # only when type is "alert.updated": what is new
      "channel": {"id": 3, "name": "ops"},   # only when type is "test"
      "url": "<absolute link>"          # the alert's page; for "test", the channels page
    }

``id`` and ``timestamp`` are filled in per notification by ``outbox.enqueue``. Receivers should
drop a message whose ``id`` they have already processed: delivery is at-least-once.

The builders take plain dicts so that this package does not depend on the alerting models.
Text bodies are plain; HTML bodies come from templates with autoescaping, so an alert summary
containing markup is shown, never interpreted.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone

from dashboard.notify.models import Channel

__all__ = ["ALERT_KINDS", "Message", "build_alert_message", "build_test_message"]

Message = tuple[dict[str, Any], str, str, str]  # payload, subject, text, html

ALERT_KINDS = {"firing": "FIRING", "repeat": "STILL FIRING", "resolved": "RESOLVED",
               "updated": "NEW INCIDENT"}
_ALERT_FIELDS = ("id", "rule", "state", "severity", "node", "engine", "summary")
_CAUSE_FIELDS = ("cause", "cause_now")
_TIME_FIELDS = ("started_at", "fired_at", "resolved_at")
_SUBJECT_LIMIT = 200


def build_alert_message(alert: dict[str, Any], kind: str,
                        news: Sequence[str] = ()) -> Message:
    """Payload, subject, text and HTML for one alert notification.

    ``alert`` holds the keys of the payload's ``alert`` object (missing ones become null);
    times may be datetimes or ISO strings. An optional ``figures`` key, (label, text) rows,
    is how the email shows ``details``; without it each detail is shown as JSON. An optional
    ``url`` key (absolute, or a path joined to ``SPARKOPS_PUBLIC_URL``) links to the alert's
    page. ``kind`` is firing, repeat, resolved
    or updated; ``news`` (for updated, required there) says what is new, one line each.
    Cost: two template renders.
    """
    if kind not in ALERT_KINDS:
        raise ValueError(f"not an alert notification kind: {kind!r}")
    if (kind == "updated") != bool(news):
        raise ValueError("an updated notification says what is new, and only it does")
    fields: dict[str, Any] = {name: alert.get(name) for name in _ALERT_FIELDS}
    fields.update({name: alert.get(name) or None for name in _CAUSE_FIELDS})
    fields["details"] = _json_ready(alert.get("details") or {})
    fields.update({name: _iso(alert.get(name)) for name in _TIME_FIELDS})
    url = _absolute(alert.get("url") or "/")
    payload: dict[str, Any] = {"type": f"alert.{kind}", "alert": fields, "url": url}
    if news:
        payload["new_incidents"] = list(news)
    context = {
        "headline": ALERT_KINDS[kind],
        "kind": kind,
        "alert": fields,
        "where": _where(fields),
        "times": [(label, _readable(fields[name])) for name, label in (
            ("started_at", "Started"), ("fired_at", "Fired"), ("resolved_at", "Resolved"))
            if fields[name]],
        "details": _figure_rows(alert.get("figures"), fields["details"]),
        "news": list(news),
        "url": url,
    }
    told = news[0] if news else _with_cause(fields["summary"] or "", fields["cause"])
    subject = _one_line(
        f"[SparkOps] {ALERT_KINDS[kind]} {fields['severity'] or ''}: {fields['rule']} on "
        f"{_where(fields)} — {told}")
    return (payload, subject, render_to_string("notify/alert_email.txt", context),
            render_to_string("notify/alert_email.html", context))


def build_test_message(channel: Channel) -> Message:
    """Payload, subject, text and HTML for the "Send test" button of ``channel``."""
    url = _absolute(reverse("dashboard:channels"))
    payload = {"type": "test", "channel": {"id": channel.pk, "name": channel.name}, "url": url}
    context = {"channel": channel, "url": url}
    subject = _one_line(f"[SparkOps] Test notification for channel {channel.name}")
    return (payload, subject, render_to_string("notify/test_email.txt", context),
            render_to_string("notify/test_email.html", context))


def _where(fields: dict[str, Any]) -> str:
    node = fields.get("node") or "?"
    return f"{node}/{fields['engine']}" if fields.get("engine") else str(node)


def _absolute(link: str) -> str:
    if link.lower().startswith(("http://", "https://")):
        return link
    # Anything else (a path, or a scheme such as javascript:) is taken as a path on this site.
    return settings.SPARKOPS_PUBLIC_URL.rstrip("/") + "/" + link.lstrip("/")


def _iso(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def _readable(value: str) -> str:
    """An ISO time in the site's time zone for people; other strings unchanged."""
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return value
    if timezone.is_naive(moment):
        return value
    return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S %Z")


def _json_ready(details: Any) -> Any:
    """Details as plain JSON types (datetimes and decimals become strings)."""
    return json.loads(json.dumps(details, cls=DjangoJSONEncoder))


def _with_cause(summary: str, cause: str | None) -> str:
    return f"{summary}; cause: {cause}" if cause and cause not in summary else summary


def _figure_rows(figures: Any, details: Any) -> list[tuple[str, str]]:
    """The email's rows of figures: the labelled ones when given, else ``details`` as JSON."""
    if figures:
        return [(str(label), str(text)) for label, text in figures]
    return _detail_rows(details)


def _detail_rows(details: Any) -> list[tuple[str, str]]:
    if not isinstance(details, dict):
        return [("details", json.dumps(details, ensure_ascii=False))]
    return [(str(key), value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))
            for key, value in details.items()]


def _one_line(text: str) -> str:
    cleaned = " ".join(text.split())
    return cleaned if len(cleaned) <= _SUBJECT_LIMIT else cleaned[: _SUBJECT_LIMIT - 1] + "…"
