"""Login limits through the real login view: per account, per address, spoofed headers, the
failure log, and the staff page that lists and lifts lockouts."""

from __future__ import annotations

from datetime import timedelta

import pytest
from axes.models import AccessAttempt, AccessFailureLog
from django.test import Client, RequestFactory
from django.urls import reverse
from django.utils import timezone

from dashboard.audit.models import AuditEntry
from tests.access import grant

PASSWORD = "a-long-test-password"
LIMIT = 5  # AXES_FAILURE_LIMIT's default


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice", password=PASSWORD)


@pytest.fixture
def bob(django_user_model):
    return django_user_model.objects.create_user("bob", password=PASSWORD)


def log_in(username: str, password: str, address: str = "127.0.0.1", **headers: str):
    """One login through the login page, as a fresh browser; returns (response, logged in)."""
    browser = Client()
    response = browser.post(reverse("login"), {"username": username, "password": password},
                            REMOTE_ADDR=address, **headers)
    return response, "_auth_user_id" in browser.session


def test_wrong_passwords_lock_the_account_even_from_many_addresses(alice):
    for attempt in range(LIMIT - 1):
        response, ok = log_in("alice", "wrong", address=f"192.0.2.{attempt + 1}")
        assert not ok and response.status_code == 200  # the usual "didn't match"
    response, ok = log_in("alice", "wrong", address="192.0.2.99")
    assert not ok and response.status_code == 429  # the failure that reaches the limit

    response, ok = log_in("alice", PASSWORD, address="198.51.100.1")

    assert not ok and response.status_code == 429
    page = response.content.decode()
    assert "Too many failed attempts for this account or address; try again in 15 minutes." \
        in page
    assert 'name="password"' in page  # the login form, not a bare error


def test_the_lock_lifts_after_the_cool_off(alice):
    for _ in range(LIMIT):
        log_in("alice", "wrong")
    assert log_in("alice", PASSWORD)[1] is False
    # Fifteen minutes pass since the latest failure.
    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(minutes=16))

    assert log_in("alice", PASSWORD)[1] is True


def test_wrong_passwords_for_many_accounts_lock_the_address(alice, bob):
    for attempt in range(LIMIT):
        log_in(f"guess{attempt}", "wrong", address="203.0.113.5")

    locked, ok = log_in("bob", PASSWORD, address="203.0.113.5")
    elsewhere = log_in("bob", PASSWORD, address="203.0.113.6")[1]

    assert locked.status_code == 429 and not ok
    assert elsewhere is True


def test_a_spoofed_forwarded_for_does_not_escape_the_address_limit(bob):
    for attempt in range(LIMIT):
        log_in(f"guess{attempt}", "wrong", HTTP_X_FORWARDED_FOR=f"10.9.8.{attempt}")

    response, ok = log_in("bob", PASSWORD, HTTP_X_FORWARDED_FOR="10.9.8.200")

    assert response.status_code == 429 and not ok
    assert set(AccessFailureLog.objects.values_list("ip_address", flat=True)) == {"127.0.0.1"}


def test_behind_a_trusted_proxy_the_client_is_the_address_the_proxy_saw(bob, settings):
    settings.SPARKOPS_TRUSTED_PROXIES = ["127.0.0.1/32"]
    for attempt in range(LIMIT):
        # The client writes the left part; the proxy appends the address it accepted from.
        log_in(f"guess{attempt}", "wrong", HTTP_X_FORWARDED_FOR=f"10.9.8.{attempt}, 192.0.2.80")

    spoofing, _ = log_in("bob", PASSWORD, HTTP_X_FORWARDED_FOR="10.9.8.200, 192.0.2.80")
    other_client = log_in("bob", PASSWORD, HTTP_X_FORWARDED_FOR="192.0.2.81")[1]

    assert spoofing.status_code == 429
    assert other_client is True
    assert set(AccessFailureLog.objects.values_list("ip_address", flat=True)) == {"192.0.2.80"}


@pytest.mark.parametrize(("trusted", "remote", "forwarded", "expected"), [
    ([], "192.0.2.1", "10.0.0.1", "192.0.2.1"),
    (["127.0.0.1/32"], "192.0.2.1", "10.0.0.1", "192.0.2.1"),  # the peer is no proxy
    (["127.0.0.1/32"], "127.0.0.1", "", "127.0.0.1"),
    (["127.0.0.1/32", "10.0.0.0/8"], "127.0.0.1", "6.6.6.6, 192.0.2.9, 10.1.1.1", "192.0.2.9"),
    (["127.0.0.1/32"], "127.0.0.1", "6.6.6.6, not-an-address", "127.0.0.1"),
    (["::1/128"], "::1", "[2001:db8::5]:443", "2001:db8::5"),
    ([], "::ffff:192.0.2.4", "", "192.0.2.4"),
])
def test_client_address(settings, trusted, remote, forwarded, expected):
    from dashboard.audit.clientaddress import client_address

    settings.SPARKOPS_TRUSTED_PROXIES = trusted
    request = RequestFactory().get("/", REMOTE_ADDR=remote, HTTP_X_FORWARDED_FOR=forwarded)

    assert client_address(request) == expected


def test_failures_are_recorded_with_account_address_and_time(alice):
    before = timezone.now()
    log_in("alice", "wrong", address="192.0.2.10")
    log_in("nobody-here", "wrong", address="192.0.2.11")

    rows = list(AccessFailureLog.objects.order_by("attempt_time"))
    assert [(r.username, r.ip_address) for r in rows] == [("alice", "192.0.2.10"),
                                                           ("nobody-here", "192.0.2.11")]
    assert all(r.attempt_time >= before for r in rows)


# --- the logins page ------------------------------------------------------------------------

@pytest.fixture
def security_client(django_user_model):
    user = django_user_model.objects.create_user("security", password=PASSWORD, is_staff=True)
    client = Client()
    client.force_login(grant(user, "unlock_logins"))
    return client


def test_the_logins_page_lists_a_lockout_and_unlocking_lifts_it(alice, security_client):
    for _ in range(LIMIT):
        log_in("alice", "wrong", address="192.0.2.20")

    page = security_client.get(reverse("dashboard:logins")).content.decode()

    assert "account <strong>alice</strong>" in page and "address <strong>192.0.2.20</strong>" \
        in page
    assert "Recent failed logins" in page and page.count("192.0.2.20") >= LIMIT

    response = security_client.post(reverse("dashboard:login-unlock"),
                                     {"kind": "account", "value": "alice"},
                                     REMOTE_ADDR="198.51.100.99", follow=True)

    assert "Unlocked account alice." in response.content.decode()
    assert log_in("alice", PASSWORD, address="192.0.2.21")[1] is True
    entry = AuditEntry.objects.get(action="unlock-login")
    assert (entry.allowed, entry.actor, entry.address, entry.details["value"]) == \
        (True, "security", "198.51.100.99", "alice")
    assert AccessFailureLog.objects.count() >= LIMIT  # the log is kept


def test_the_logins_page_needs_its_permission(alice, django_user_model):
    staff = django_user_model.objects.create_user("staff", password=PASSWORD, is_staff=True)
    client = Client()
    client.force_login(staff)
    for _ in range(LIMIT):
        log_in("alice", "wrong")

    listing = client.get(reverse("dashboard:logins"))
    unlock = client.post(reverse("dashboard:login-unlock"), {"kind": "account",
                                                             "value": "alice"})

    assert listing.status_code == unlock.status_code == 403
    assert "(audit.unlock_logins)" in unlock.content.decode()
    assert not AuditEntry.objects.get(action="unlock-login").allowed
    assert log_in("alice", PASSWORD)[1] is False
    assert "/logins/" not in client.get(reverse("dashboard:home")).content.decode()


def test_unlocking_nothing_unlocks_nothing(alice, security_client):
    for _ in range(LIMIT):
        log_in("alice", "wrong")

    response = security_client.post(reverse("dashboard:login-unlock"),
                                     {"kind": "account", "value": ""}, follow=True)

    assert "Nothing unlocked" in response.content.decode()
    assert log_in("alice", PASSWORD)[1] is False
