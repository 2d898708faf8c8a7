"""Who may read SparkOps' exports (``/metrics`` and ``/api/v1/…``): machines, by token or address.

The rule, applied by :func:`export_view` before anything else:

1. Neither ``SPARKOPS_EXPORT_TOKEN`` nor ``SPARKOPS_EXPORT_ALLOWED_NETWORKS`` is set: **403**,
   "exports are disabled: set SPARKOPS_EXPORT_TOKEN or SPARKOPS_EXPORT_ALLOWED_NETWORKS".
2. The request carries ``Authorization: Bearer <token>`` and a token is configured: allowed when
   it equals the configured token (constant-time comparison), else **401**. A wrong token is
   refused even from an allowlisted address: a client that presents a wrong credential is
   misconfigured, and saying so beats letting it through by accident of where it runs.
3. The client address (``REMOTE_ADDR``) is inside one of the allowlisted networks: allowed.
   ``X-Forwarded-For`` is never read: any client can write it. Behind a reverse proxy, the proxy
   is the client; use the token there.
4. Otherwise **401** with ``WWW-Authenticate: Bearer`` when a token is configured (the client can
   present it), or **403** when only an allowlist is configured (no credential could help).

A logged-in browser session counts for nothing: the readers are Prometheus and scripts, and a
session cookie sent along by a browser must not turn into an export credential. Refusals are
JSON ``{"error": "<reason>"}``, like the API's other errors.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

__all__ = ["DISABLED_MESSAGE", "export_view", "refusal"]

TOKEN_SETTING = "SPARKOPS_EXPORT_TOKEN"
NETWORKS_SETTING = "SPARKOPS_EXPORT_ALLOWED_NETWORKS"
DISABLED_MESSAGE = f"exports are disabled: set {TOKEN_SETTING} or {NETWORKS_SETTING}"
# RFC 6750 §3: the challenge a client without (or with a wrong) bearer token gets.
_CHALLENGE = 'Bearer realm="sparkops"'
# Exports are read-only; HEAD is GET without a body (RFC 9110 §9.3.2), so it is served too.
ALLOWED_METHODS = ("GET", "HEAD")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
View = Callable[..., HttpResponse]


@functools.lru_cache(maxsize=8)
def _networks(entries: tuple[str, ...]) -> tuple[Network, ...]:
    """The allowlist parsed once per distinct setting value; a malformed entry is a
    configuration error that names the variable (raised on the first export request)."""
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ImproperlyConfigured(
                f"{NETWORKS_SETTING}: {entry!r} is not a network (e.g. 10.0.0.0/8)"
            ) from None
    return tuple(networks)


def _client_address(request: HttpRequest) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return None  # no address at all (e.g. a Unix socket): never allowlisted
    # A dual-stack listener reports IPv4 clients as ::ffff:a.b.c.d; match them as IPv4.
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _bearer_token(request: HttpRequest) -> str | None:
    """The credential of an ``Authorization: Bearer …`` header (scheme case-insensitive)."""
    scheme, _, credential = request.META.get("HTTP_AUTHORIZATION", "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return credential.strip()


def _error(status: int, reason: str, challenge: str | None = None) -> JsonResponse:
    response = JsonResponse({"error": reason}, status=status)
    if challenge is not None:
        response["WWW-Authenticate"] = challenge
    return response


def refusal(request: HttpRequest) -> JsonResponse | None:
    """The response refusing ``request`` under the rule above, or None when it is allowed.

    Cost: one header read, one constant-time comparison, one address lookup in the (cached)
    allowlist.
    """
    token: str | None = getattr(settings, TOKEN_SETTING, None) or None
    networks = _networks(tuple(getattr(settings, NETWORKS_SETTING, None) or ()))
    if token is None and not networks:
        return _error(403, DISABLED_MESSAGE)
    presented = _bearer_token(request)
    if token is not None and presented is not None:
        if hmac.compare_digest(presented.encode(), token.encode()):
            return None
        return _error(401, "the bearer token is not the export token",
                      f'{_CHALLENGE}, error="invalid_token"')
    address = _client_address(request)
    if address is not None and any(address in network for network in networks
                                   if network.version == address.version):
        return None
    if token is not None:
        return _error(401, f"a bearer token is required ({NETWORKS_SETTING} does not "
                           f"include {request.META.get('REMOTE_ADDR') or 'this client'})",
                      _CHALLENGE)
    return _error(403, f"{request.META.get('REMOTE_ADDR') or 'this client'} is not in "
                       f"{NETWORKS_SETTING} and no {TOKEN_SETTING} is set")


def export_view(view: View) -> View:
    """Wrap an export view: the access rule first, then GET/HEAD only (405 with ``Allow``).

    CSRF is exempt because nothing here changes state and no cookie grants access; responses
    are ``Cache-Control: no-store`` so no shared cache keeps a token-protected answer.
    """

    @functools.wraps(view)
    def guarded(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        response = refusal(request)
        if response is None and request.method not in ALLOWED_METHODS:
            response = _error(405, f"{request.method} is not allowed here; exports are read-only")
            response["Allow"] = ", ".join(ALLOWED_METHODS)
        if response is None:
            response = view(request, *args, **kwargs)
        response["Cache-Control"] = "no-store"
        return response

    return csrf_exempt(guarded)
