"""Which addresses a webhook may be sent to: the SSRF policy.

A target address is allowed when it is *global unicast*, or when an administrator listed a
network containing it in ``SPARKOPS_WEBHOOK_ALLOWED_NETWORKS``. Before classifying, addresses
that carry an IPv4 address inside IPv6 are unwrapped (IPv4-mapped ``::ffff:a.b.c.d``, NAT64
``64:ff9b::/96`` and ``64:ff9b:1::/48``, 6to4 ``2002::/16``), because the packet ends up at the
embedded IPv4 address: ``64:ff9b::a00:1`` is 10.0.0.1 behind a NAT64 gateway.

``ipaddress.is_private`` alone is not a policy: on Python 3.11 it is False for CGNAT
(100.64.0.0/10) and for NAT64 addresses, and ``is_global`` is True for multicast. Hence the
explicit checks below.

The check runs twice: when an admin saves a channel (:func:`refused_targets`, which resolves the
host name, for a helpful form error) and on every delivery at connect time
(:func:`allow_address`, passed to ``sparkops.httpfetch.fetch``), which is the check that
matters: DNS may answer differently at send time than at save time.
"""

from __future__ import annotations

import functools
import ipaddress
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from sparkops.httpfetch import IPAddress, resolve

__all__ = [
    "ALLOWLIST_SETTING",
    "RefusedTarget",
    "allow_address",
    "refusal_reason",
    "refused_targets",
    "unwrap",
]

ALLOWLIST_SETTING = "SPARKOPS_WEBHOOK_ALLOWED_NETWORKS"

# Networks that embed an IPv4 address in their last 32 bits (RFC 6052 and RFC 8215).
_NAT64_NETWORKS = (
    ipaddress.IPv6Network("64:ff9b::/96"),
    ipaddress.IPv6Network("64:ff9b:1::/48"),
)
# Refused whatever a Python version's ``ipaddress`` tables say (3.11 counts all of these as
# global): shared address space (CGNAT, RFC 6598); IPv6 site-local (RFC 3879 deprecated it, but
# old routers and hosts still route it inside a site, like a private network); the IPv6
# documentation prefix 3fff::/20 (RFC 9637, 2024).
_ALWAYS_REFUSED: tuple[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str], ...] = (
    (ipaddress.IPv4Network("100.64.0.0/10"), "CGNAT (shared address space)"),
    (ipaddress.IPv6Network("fec0::/10"), "site-local (deprecated, routed inside a site)"),
    (ipaddress.IPv6Network("3fff::/20"), "documentation"),
)

# Name resolution at form-save time must not hang the admin's request.
_RESOLVE_TIMEOUT = 3.0


def unwrap(address: IPAddress) -> IPAddress:
    """The IPv4 address a packet to ``address`` really reaches, or ``address`` itself.

    Cost: a few integer operations.
    """
    if isinstance(address, ipaddress.IPv4Address):
        return address
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if any(address in network for network in _NAT64_NETWORKS):
        return ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
    return address


def refusal_reason(address: IPAddress) -> str | None:
    """Why ``address`` may not be a webhook target, or None when it may.

    Allowed: the address (or the IPv4 address it wraps) is inside an allowlisted network, or the
    unwrapped address is global unicast. The reason is a short phrase for people, e.g.
    "loopback", "private", "CGNAT (shared address space)", "10.0.0.1 inside a NAT64 address".
    """
    inner = unwrap(address)
    networks = _allowed_networks(tuple(getattr(settings, ALLOWLIST_SETTING, ())))
    if any(candidate in network for candidate in {address, inner} for network in networks
           if candidate.version == network.version):
        return None
    reason = _classify(inner)
    if reason is None:
        return None
    return reason if inner == address else f"{reason}: {inner} inside {address}"


def allow_address(address: IPAddress) -> bool:
    """The ``allow_address`` hook for ``sparkops.httpfetch.fetch``."""
    return refusal_reason(address) is None


@dataclass(frozen=True)
class RefusedTarget:
    """One resolved address of a webhook host that the policy refuses, with the reason."""

    host: str
    address: IPAddress
    reason: str

    @property
    def allowlist_entry(self) -> str:
        """The narrowest CIDR an administrator could add to allow exactly this address."""
        return f"{self.address}/{self.address.max_prefixlen}"

    def message(self) -> str:
        subject = str(self.address) if self.host == str(self.address) \
            else f"{self.host} resolves to {self.address}"
        return (
            f"{subject}, which is not a public address ({self.reason}); webhooks to it are "
            f"refused. An administrator can allow it by adding {self.allowlist_entry} (or its "
            f"network) to the {ALLOWLIST_SETTING} setting."
        )


def refused_targets(url: str) -> list[RefusedTarget]:
    """Resolve the host of ``url`` and return every address the policy refuses.

    Raises ValueError with a message for people when the URL has no host or the host cannot be
    resolved within a few seconds. Cost: one DNS lookup on a helper thread.
    """
    host = urllib.parse.urlsplit(url).hostname
    if not host:
        raise ValueError("the URL has no host")
    refused = []
    for address in _resolve(host):
        reason = refusal_reason(address)
        if reason is not None:
            refused.append(RefusedTarget(host, address, reason))
    return refused


def _classify(address: IPAddress) -> str | None:
    """None for global unicast; otherwise the first matching kind of special address."""
    listed = next((reason for network, reason in _ALWAYS_REFUSED
                   if network.version == address.version and address in network), None)
    if listed is not None:
        return listed
    checks = (
        (address.is_unspecified, "unspecified"),
        (address.is_loopback, "loopback"),
        (address.is_multicast, "multicast"),
        (address.is_link_local, "link-local"),
        (address.is_private, "private"),
        (address.is_reserved, "reserved"),
        (not address.is_global, "not globally routable"),
    )
    return next((reason for matched, reason in checks if matched), None)


@functools.lru_cache(maxsize=8)
def _allowed_networks(entries: tuple[str, ...]) -> tuple[ipaddress.IPv4Network
                                                        | ipaddress.IPv6Network, ...]:
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError as error:
            raise ImproperlyConfigured(
                f"{ALLOWLIST_SETTING} has an entry that is not a network: {entry!r} ({error}); "
                f"use CIDR notation such as 10.0.0.0/8"
            ) from None
    return tuple(networks)


def _resolve(host: str) -> Iterable[IPAddress]:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        found = resolve(host, None, _RESOLVE_TIMEOUT)
    except TimeoutError:
        raise ValueError(f"resolving {host} took longer than {_RESOLVE_TIMEOUT:g} s") from None
    except OSError as error:
        raise ValueError(f"cannot resolve {host}: {error}") from None
    # getaddrinfo may append a scope ("fe80::1%eth0"); the policy looks at the address alone.
    return list(dict.fromkeys(
        ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0]) for _family, sockaddr in found))
