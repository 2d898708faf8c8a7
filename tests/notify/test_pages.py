"""Channel pages through Django's test client, with real receivers behind "Send test"."""

from __future__ import annotations

import json
import re
import socket

import pytest
from django.test import Client
from django.urls import reverse

from dashboard.audit.models import AuditEntry
from dashboard.notify.forms import ChannelForm
from dashboard.notify.models import Channel, Notification
from sparkops.testing.webhooks import Reply
from tests.access import grant
from tests.notify.conftest import enqueue_alert
from tests.notify.servers import ScriptedSMTPHandler, resolving, smtp_server

pytestmark = pytest.mark.slow


@pytest.fixture
def user_client(client, django_user_model):
    user = django_user_model.objects.create_user("viewer", "", "a-long-test-password")
    client.force_login(user)
    return client


def _webhook_form(url: str, **extra: str) -> dict[str, str]:
    return {"name": "chat", "kind": "webhook", "url": url, "enabled": "on", "node": "", **extra}


@pytest.mark.parametrize(("method", "name", "args"), [
    ("get", "channels", []), ("get", "channel-new", []), ("get", "channel-edit", [1]),
    ("post", "channel-test", [1]), ("post", "channel-toggle", [1]),
    ("get", "channel-delete", [1]), ("post", "channel-delete", [1]),
])
def test_anonymous_users_are_sent_to_login(client, db, method, name, args):
    response = getattr(client, method)(reverse(f"dashboard:{name}", args=args))

    assert response.status_code == 302
    assert response["Location"].startswith("/login/?next=")


def test_non_staff_can_look_but_not_change(user_client, make_webhook, receiver):
    channel = make_webhook(receiver)

    page = user_client.get(reverse("dashboard:channels"))
    assert page.status_code == 200
    assert "hook" in page.content.decode() and "Send test" not in page.content.decode()
    assert user_client.get(reverse("dashboard:channel-new")).status_code == 403
    assert user_client.post(reverse("dashboard:channel-new"),
                            _webhook_form(receiver.url())).status_code == 403
    assert user_client.get(reverse("dashboard:channel-edit", args=[channel.pk])).status_code \
        == 403
    assert user_client.post(reverse("dashboard:channel-test", args=[channel.pk])).status_code \
        == 403
    assert user_client.post(reverse("dashboard:channel-toggle", args=[channel.pk]),
                            {"enabled": "0"}).status_code == 403
    assert Channel.objects.count() == 1 and Channel.objects.get().enabled
    assert Notification.objects.count() == 0
    assert receiver.requests == []


def test_staff_create_a_webhook_see_its_secret_once_and_send_a_test(admin_client, receiver):
    created = admin_client.post(reverse("dashboard:channel-new"), _webhook_form(receiver.url()))

    assert created.status_code == 200
    channel = Channel.objects.get()
    shown = re.search(r'id="webhook-secret">([^<]+)<', created.content.decode()).group(1)
    assert shown == channel.secret and shown.startswith("whsec_")
    for page in ("dashboard:channels", "dashboard:channel-edit"):
        args = [channel.pk] if page.endswith("edit") else []
        assert channel.secret not in admin_client.get(reverse(page, args=args)).content.decode()

    receiver.secret = shown  # what the receiver's operator copied from the page
    response = admin_client.post(reverse("dashboard:channel-test", args=[channel.pk]),
                                 follow=True)

    assert "Test notification delivered to chat." in response.content.decode()
    (received,) = receiver.requests
    assert received.verified, received.verify_error
    notification = Notification.objects.get()
    assert (notification.kind, notification.status) == ("test", "delivered")
    assert received.headers["webhook-id"] == notification.message_id
    assert json.loads(received.body)["type"] == "test"
    assert "delivered" in response.content.decode()  # the recent notifications column


def test_send_test_shows_the_error(admin_client, receiver, make_webhook):
    receiver.reply(Reply(404))
    channel = make_webhook(receiver)

    response = admin_client.post(reverse("dashboard:channel-test", args=[channel.pk]),
                                 follow=True)

    assert "Test notification to hook failed: HTTP 404 Not Found" in response.content.decode()
    assert Notification.objects.get().status == "failed"


def test_send_test_by_email_reaches_a_real_smtp_server(admin_client, settings, make_email):
    handler = ScriptedSMTPHandler()
    with smtp_server(handler) as port:
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", port, 2
        channel = make_email("ops@example.com")
        response = admin_client.post(reverse("dashboard:channel-test", args=[channel.pk]),
                                     follow=True)

    assert "Test notification delivered to mail." in response.content.decode()
    (message,) = handler.messages
    assert message["Subject"] == "[SparkOps] Test notification for channel mail"


def test_csrf_is_enforced_on_send_test(django_user_model, make_webhook, receiver):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(django_user_model.objects.create_superuser("root", "", "pw-pw-pw-pw-1"))
    channel = make_webhook(receiver)
    url = reverse("dashboard:channel-test", args=[channel.pk])

    assert browser.post(url).status_code == 403
    assert Notification.objects.count() == 0 and receiver.requests == []

    browser.get(reverse("dashboard:channels"))  # sets the CSRF cookie, as a page view would
    token = browser.cookies["csrftoken"].value
    assert browser.post(url, {"csrfmiddlewaretoken": token}).status_code == 302
    assert len(receiver.requests) == 1


def test_the_form_refuses_a_forbidden_target_and_says_how_to_allow_it(admin_client,
                                                                      monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", resolving({"intranet.test": "127.0.0.2"}))

    for url, address in (("http://intranet.test/hook", "127.0.0.2"),
                         ("http://169.254.169.254/latest/meta-data/", "169.254.169.254")):
        response = admin_client.post(reverse("dashboard:channel-new"), _webhook_form(url))
        page = response.content.decode()
        assert response.status_code == 200
        assert address in page and "SPARKOPS_WEBHOOK_ALLOWED_NETWORKS" in page
    assert Channel.objects.count() == 0


@pytest.mark.parametrize(("url", "error"), [
    ("ftp://files.example/x", "Enter an http:// or https:// URL with a host."),
    ("http://user:pw@hooks.example/x", "Credentials in the URL are not supported"),
    ("", "A webhook channel needs a URL."),
])
def test_the_form_checks_webhook_urls(admin_client, url, error):
    response = admin_client.post(reverse("dashboard:channel-new"), _webhook_form(url))

    assert error in response.content.decode()
    assert Channel.objects.count() == 0


def test_the_form_checks_email_addresses(admin_client, node):
    form = {"name": "ops", "kind": "email", "enabled": "on", "node": str(node.pk)}

    bad = admin_client.post(reverse("dashboard:channel-new"),
                            {**form, "recipients": "ops@example.com, not-an-address"})
    assert "Not an email address: not-an-address" in bad.content.decode()

    good = admin_client.post(reverse("dashboard:channel-new"),
                             {**form, "recipients": "ops@example.com\noncall@example.com"})
    assert good.status_code == 302
    channel = Channel.objects.get()
    assert channel.config == {"to": ["ops@example.com", "oncall@example.com"]}
    assert channel.node == node


def test_edit_can_rotate_the_secret_and_keeps_it_otherwise(admin_client, make_webhook,
                                                           monkeypatch):
    # Saving resolves the host; this one stands for a public receiver (nothing is sent).
    monkeypatch.setattr(socket, "getaddrinfo", resolving({"hooks.example": "93.184.215.14"}))
    channel = make_webhook("https://hooks.example/a")
    old = channel.secret
    edit = reverse("dashboard:channel-edit", args=[channel.pk])

    kept = admin_client.post(edit, _webhook_form("https://hooks.example/b"))
    channel.refresh_from_db()
    assert kept.status_code == 302 and channel.secret == old and channel.url.endswith("/b")

    rotated = admin_client.post(edit, _webhook_form("https://hooks.example/b",
                                                    rotate_secret="on"))
    channel.refresh_from_db()
    assert channel.secret != old and channel.secret in rotated.content.decode()


def test_disable_and_enable_again_clears_the_reason(admin_client, make_webhook):
    channel = make_webhook("https://hooks.example/a", enabled=False,
                           disabled_reason="HTTP 410 Gone: channel disabled")
    toggle = reverse("dashboard:channel-toggle", args=[channel.pk])

    page = admin_client.get(reverse("dashboard:channels")).content.decode()
    assert "HTTP 410 Gone: channel disabled" in page

    admin_client.post(toggle, {"enabled": "1"})
    channel.refresh_from_db()
    assert channel.enabled and channel.disabled_reason == ""
    admin_client.post(toggle, {"enabled": "0"})
    channel.refresh_from_db()
    assert not channel.enabled


def test_the_list_shows_each_channels_recent_notifications(admin_client, make_webhook):
    channel = make_webhook("https://hooks.example/secret-token-in-path")
    row = enqueue_alert(channel)
    Notification.objects.filter(pk=row.pk).update(attempts=2, last_error="HTTP 503")

    page = admin_client.get(reverse("dashboard:channels")).content.decode()

    assert "retrying" in page and "2 attempts" in page and "HTTP 503" in page
    assert "https://hooks.example/…" in page
    assert "secret-token-in-path" not in page


# --- permissions and audit ------------------------------------------------------------------

@pytest.fixture
def bare_staff_client(django_user_model):
    """Staff without any permission: before, enough to redirect or disable alert delivery."""
    user = django_user_model.objects.create_user("bare", "", "a-long-test-password",
                                                 is_staff=True)
    bare = Client()
    bare.force_login(user)
    return bare


@pytest.fixture
def channel_editor_client(django_user_model):
    user = django_user_model.objects.create_user("editor", "", "a-long-test-password")
    editor = Client()
    editor.force_login(grant(user, "change_channels"))
    return editor


def test_staff_without_the_permission_cannot_redirect_or_disable_a_channel(
        bare_staff_client, make_email):
    channel = make_email("ops@example.com")
    form = {"name": "mail", "kind": "email", "enabled": "on", "node": "",
            "recipients": "attacker@example.net"}

    responses = [
        bare_staff_client.post(reverse("dashboard:channel-new"), form),
        bare_staff_client.post(reverse("dashboard:channel-edit", args=[channel.pk]), form,
                               REMOTE_ADDR="192.0.2.50"),
        bare_staff_client.post(reverse("dashboard:channel-toggle", args=[channel.pk]),
                               {"enabled": "0"}),
    ]

    assert [r.status_code for r in responses] == [403] * 3
    assert "bare lacks the permission to create, edit, enable and disable notification " \
        "channels (notify.change_channels)" in responses[1].content.decode()
    channel.refresh_from_db()
    assert channel.enabled and channel.recipients == ["ops@example.com"]
    assert Channel.objects.count() == 1
    rows = {row.action: row for row in AuditEntry.objects.all()}
    assert set(rows) == {"create-channel", "edit-channel", "toggle-channel"}
    assert not any(row.allowed for row in rows.values())
    assert (rows["edit-channel"].address, rows["edit-channel"].details["pk"]) == \
        ("192.0.2.50", channel.pk)
    assert "/channels/new/" not in bare_staff_client.get(reverse("dashboard:channels")) \
        .content.decode()


def test_channel_changes_are_audited_without_secrets(channel_editor_client, monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", resolving({"hooks.example": "93.184.215.14"}))
    new = reverse("dashboard:channel-new")

    created = channel_editor_client.post(new, _webhook_form("https://hooks.example/T0KEN-a"))
    channel = Channel.objects.get()
    edit = reverse("dashboard:channel-edit", args=[channel.pk])
    channel_editor_client.post(edit, _webhook_form("https://hooks.example/T0KEN-b",
                                                   rotate_secret="on", name="chat-ops"))
    channel_editor_client.post(reverse("dashboard:channel-toggle", args=[channel.pk]),
                               {"enabled": "0"})

    assert created.status_code == 200
    channel.refresh_from_db()
    rows = list(AuditEntry.objects.order_by("at", "pk"))
    assert [(r.action, r.allowed, r.actor) for r in rows] == [
        ("create-channel", True, "editor"), ("edit-channel", True, "editor"),
        ("toggle-channel", True, "editor")]
    edited = rows[1]
    assert edited.details["changed"] == {"name": {"from": "chat", "to": "chat-ops"}}
    assert edited.details["url_changed"] is True and edited.details["secret_generated"] is True
    assert rows[2].details["changed"] == {"enabled": {"from": True, "to": False}}
    recorded = json.dumps([[r.outcome, r.details] for r in rows], ensure_ascii=False)
    assert "https://hooks.example/…" in recorded
    assert "T0KEN" not in recorded and "whsec_" not in recorded
    assert channel.secret not in recorded


def test_send_test_needs_the_channel_permission(bare_staff_client, make_webhook, receiver):
    channel = make_webhook(receiver)

    response = bare_staff_client.post(reverse("dashboard:channel-test", args=[channel.pk]))

    assert response.status_code == 403
    assert "notify.change_channels" in response.content.decode()
    assert receiver.requests == []
    refused = AuditEntry.objects.get()
    assert (refused.action, refused.allowed) == ("test-channel", False)


def test_saving_the_form_keeps_the_senders_delivery_state(admin_client, make_webhook,
                                                          monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", resolving({"hooks.example": "93.184.215.14"}))
    channel = make_webhook("https://hooks.example/a")
    edit = reverse("dashboard:channel-edit", args=[channel.pk])
    # A sender records a failure and opens the breaker while the admin's form is being saved:
    # the form's save must not write back the copy it loaded.
    stale = Channel.objects.get(pk=channel.pk)
    Channel.objects.filter(pk=channel.pk).update(failures_in_a_row=3, last_error="HTTP 503")
    form = ChannelForm(_webhook_form("https://hooks.example/b", name="renamed"), instance=stale)
    assert form.is_valid(), form.errors

    form.save()

    channel.refresh_from_db()
    assert channel.name == "renamed" and channel.url.endswith("/b")
    assert (channel.failures_in_a_row, channel.last_error) == (3, "HTTP 503")
    assert admin_client.get(edit).status_code == 200
