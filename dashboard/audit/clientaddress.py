"""Where a request comes from: the one answer the login limits and the audit log both use.

The address is the TCP peer (``REMOTE_ADDR``, set by gunicorn from the socket), unless that peer
is a reverse proxy listed in ``SPARKOPS_TRUSTED_PROXIES``. Only then is ``X-Forwarded-For``
read, from the right: each trusted proxy appends the address it saw, so the right-most entry that
is not itself a trusted proxy is the client. Entries further left were written by the client and
are never believed, so a client cannot escape a per-address limit by sending the header.

Cost: one parse of the header and a few network comparisons per call.
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache

from django.conf import settings
from django.http import HttpRequest

__all__ = ["client_address"]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@lru_cache(maxsize=8)
def _trusted(networks: tuple[str, ...]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(network, strict=False) for network in networks)


def _parse(text: str) -> Address | None:
    text = text.strip()
    if text.startswith("[") and "]" in text:  # "[2001:db8::1]:443"
        text = text[1:text.index("]")]
    elif text.count(":") == 1:  # "192.0.2.1:51234"
        text = text.split(":", 1)[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped or address


def _is_trusted(address: Address, networks: tuple[Network, ...]) -> bool:
    return any(address.version == network.version and address in network for network in networks)


def client_address(request: HttpRequest) -> str | None:
    """The client's IP address as text, or None when the peer address is unreadable.

    Without trusted proxies configured, this is ``REMOTE_ADDR`` and ``X-Forwarded-For`` is
    ignored. Behind a trusted proxy, an ``X-Forwarded-For`` that is missing or holds only
    trusted or unreadable entries yields the proxy's own address.
    """
    peer = _parse(request.META.get("REMOTE_ADDR", ""))
    if peer is None:
        return None
    networks = _trusted(tuple(getattr(settings, "SPARKOPS_TRUSTED_PROXIES", ())))
    if not networks or not _is_trusted(peer, networks):
        return str(peer)
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
    for entry in reversed(forwarded.split(",")):
        hop = _parse(entry)
        if hop is None:
            # What lies left of an unreadable entry cannot be attributed to a trusted proxy.
            break
        if not _is_trusted(hop, networks):
            return str(hop)
    return str(peer)
