"""The webhook address policy: global unicast unless allowlisted."""

from __future__ import annotations

import ipaddress
import socket

import pytest
from django.core.exceptions import ImproperlyConfigured

from dashboard.notify.addresses import allow_address, refusal_reason, refused_targets, unwrap
from tests.notify.servers import resolving


@pytest.fixture(autouse=True)
def _no_allowlist(settings):
    settings.SPARKOPS_WEBHOOK_ALLOWED_NETWORKS = []


@pytest.mark.parametrize(("address", "reason"), [
    ("100.64.0.1", "CGNAT (shared address space)"),
    ("100.127.255.254", "CGNAT (shared address space)"),
    ("64:ff9b::a00:1", "private: 10.0.0.1 inside 64:ff9b::a00:1"),  # NAT64-wrapped 10.0.0.1
    ("64:ff9b:1::a00:1", "private: 10.0.0.1 inside 64:ff9b:1::a00:1"),  # local-use NAT64
    ("2002:a00:1::", "private: 10.0.0.1 inside 2002:a00:1::"),  # 6to4
    ("::ffff:127.0.0.1", "loopback: 127.0.0.1 inside ::ffff:"),  # spelling varies by Python
    ("::ffff:169.254.169.254", "link-local: 169.254.169.254 inside ::ffff:"),
    ("224.0.0.1", "multicast"),
    ("233.252.0.1", "multicast"),
    ("ff02::1", "multicast"),
    ("169.254.169.254", "link-local"),
    ("fe80::1", "link-local"),
    ("127.0.0.1", "loopback"),
    ("127.0.0.2", "loopback"),
    ("::1", "loopback"),
    ("10.0.0.1", "private"),
    ("172.16.0.1", "private"),
    ("192.168.1.1", "private"),
    ("fc00::1", "private"),
    ("0.0.0.0", "unspecified"),
    ("::", "unspecified"),
    ("240.0.0.1", "private"),
    ("198.18.0.1", "private"),
    ("2001:db8::1", "private"),
    # IPv6 special ranges that Python 3.11 counts as global, or that only its tables catch.
    ("fec0::1", "site-local (deprecated"),
    ("feff:ffff::1", "site-local (deprecated"),  # the top of fec0::/10
    ("3fff::1", "documentation"),
    ("3fff:fff::1", "documentation"),
    ("::a00:1", "reserved"),  # IPv4-compatible (deprecated), not unwrapped
    ("::ffff:0:a00:1", "reserved"),  # IPv4-translated
    ("5f00::1", "reserved"),  # SRv6 SIDs
    ("100::1", "private"),  # discard-only
    ("2001::1", "private"),  # Teredo
    ("2001:20::1", "private"),  # ORCHIDv2
    ("fe00::1", "reserved"),
])
def test_special_addresses_are_refused_with_a_reason(address, reason):
    parsed = ipaddress.ip_address(address)

    assert (refusal_reason(parsed) or "").startswith(reason)
    assert allow_address(parsed) is False


@pytest.mark.parametrize("address", [
    "93.184.215.14", "8.8.8.8", "2606:4700:4700::1111", "64:ff9b::808:808", "::ffff:8.8.8.8",
])
def test_global_unicast_addresses_are_allowed(address):
    assert allow_address(ipaddress.ip_address(address)) is True


def test_an_allowlisted_private_network_is_allowed_also_when_wrapped(settings):
    settings.SPARKOPS_WEBHOOK_ALLOWED_NETWORKS = ["10.0.0.0/8", "fd00:1::/64"]

    for allowed in ("10.1.2.3", "64:ff9b::a00:1", "::ffff:10.0.0.1", "fd00:1::5"):
        assert allow_address(ipaddress.ip_address(allowed)), allowed
    for refused in ("192.168.1.1", "fd00:2::5", "169.254.169.254"):
        assert not allow_address(ipaddress.ip_address(refused)), refused


def test_a_malformed_allowlist_entry_says_which_setting_to_fix(settings):
    settings.SPARKOPS_WEBHOOK_ALLOWED_NETWORKS = ["10.0.0.0/33"]

    with pytest.raises(ImproperlyConfigured, match="SPARKOPS_WEBHOOK_ALLOWED_NETWORKS"):
        allow_address(ipaddress.ip_address("8.8.8.8"))


def test_unwrap_leaves_plain_addresses_alone():
    for plain in ("10.0.0.1", "2606:4700::1"):
        assert unwrap(ipaddress.ip_address(plain)) == ipaddress.ip_address(plain)


def test_refused_targets_resolves_the_host_and_explains_the_fix(monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", resolving({"intranet.test": "127.0.0.2"}))

    (refused,) = refused_targets("https://intranet.test/hook")

    assert str(refused.address) == "127.0.0.2" and refused.reason == "loopback"
    message = refused.message()
    assert message.startswith("intranet.test resolves to 127.0.0.2, which is not a public "
                              "address (loopback)")
    assert "127.0.0.2/32" in message and "SPARKOPS_WEBHOOK_ALLOWED_NETWORKS" in message
    assert refused_targets("https://[2606:4700:4700::1111]/hook") == []
