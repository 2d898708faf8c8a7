"""Where SparkOps' web server listens, and the address people reach it at.

``SPARKOPS_BIND`` is what gunicorn binds; ``SPARKOPS_PUBLIC_URL`` is what notifications link to,
the host the site answers to and the origin its forms are posted from. Behind a TLS reverse proxy
the two differ (gunicorn on ``127.0.0.1:8470``, people on ``https://sparkops.example.com``);
without one the public URL follows from the bind. Both rules live here, so the settings, the
stack and the notifications cannot disagree:

* a bind is ``HOST`` or ``HOST:PORT`` (an IPv4 address, ``[IPv6]`` or a host name); without a
  port it keeps SparkOps' own port 8470 (gunicorn alone would take 8000);
* the public URL, when not set, is ``http://<host>:<port>`` of the bind (``https://`` when
  SparkOps is served over TLS); a wildcard bind (``0.0.0.0``, ``[::]``) names this machine by
  its host name, since nobody browses to 0.0.0.0.

A malformed value is an :class:`AddressError` of one line naming the variable; the settings turn
it into ImproperlyConfigured, which stops start-up as ``sparkops.env`` does. This module needs only
the standard library, so code that runs before any venv exists (the installer) can use it too.
"""

from __future__ import annotations

import argparse
import ipaddress
import re
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

DEFAULT_PORT = 8470
DEFAULT_BIND = f"127.0.0.1:{DEFAULT_PORT}"
# Host names the site always answers to: the loopback addresses (health checks, a proxy on the
# same machine, an admin's tunnel).
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")

_BIND_EXAMPLES = "e.g. 127.0.0.1:8470, 0.0.0.0, [::]:8470 or spark-01.lan"
_URL_EXAMPLE = "e.g. https://sparkops.example.com"
_HOST_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")


class AddressError(ValueError):
    """A malformed bind or public URL; the message names the variable and what was expected."""


@dataclass(frozen=True)
class Bind:
    """A parsed ``SPARKOPS_BIND``: ``host`` is an IPv4 address, an IPv6 address (without
    brackets) or a lower-case host name."""

    host: str
    port: int

    @property
    def is_ipv6(self) -> bool:
        return ":" in self.host

    @property
    def is_wildcard(self) -> bool:
        """Every address of the machine (``0.0.0.0``, ``::``)."""
        try:
            return ipaddress.ip_address(self.host).is_unspecified
        except ValueError:
            return False

    def url_host(self) -> str:
        """The host as written in a URL or a gunicorn bind (IPv6 in brackets)."""
        return f"[{self.host}]" if self.is_ipv6 else self.host

    def __str__(self) -> str:
        """The bind as gunicorn takes it, always with its port."""
        return f"{self.url_host()}:{self.port}"


def _is_host_name(text: str) -> bool:
    if len(text) > 253 or text.replace(".", "").isdigit():
        return False
    return all(_HOST_LABEL.match(label) for label in text.rstrip(".").split("."))


def _port(text: str) -> int | None:
    if not text.isdigit() or len(text) > 5:
        return None
    port = int(text)
    return port if 1 <= port <= 65535 else None


def _host(text: str) -> str | None:
    """The host of a bind in canonical form, or None when it is not an address or a name."""
    if text.startswith("[") and text.endswith("]"):
        try:
            return str(ipaddress.IPv6Address(text[1:-1]))
        except ValueError:
            return None
    try:
        return str(ipaddress.IPv4Address(text))
    except ValueError:
        pass
    return text.lower() if _is_host_name(text.lower()) else None


def parse_bind(value: str, name: str = "SPARKOPS_BIND") -> Bind:
    """``HOST`` or ``HOST:PORT`` as a :class:`Bind`; the port defaults to 8470.

    A bare IPv6 address (``::``, ``::1``) is read whole, without a port: write ``[::1]:8471``
    to give one. Anything else is an :class:`AddressError` naming ``name``.
    """
    text = value.strip()
    problem = (f"{name}={value!r}: expected HOST or HOST:PORT with a port from 1 to 65535, "
               f"{_BIND_EXAMPLES}")
    if text.count(":") > 1 and not text.startswith("["):
        try:
            return Bind(str(ipaddress.IPv6Address(text)), DEFAULT_PORT)
        except ValueError:
            raise AddressError(problem) from None
    host_text, port = text, DEFAULT_PORT
    if ":" in text and not text.endswith("]"):
        host_text, _, port_text = text.rpartition(":")
        port = _port(port_text)
        if port is None:
            raise AddressError(problem)
    host = _host(host_text)
    if host is None:
        raise AddressError(problem)
    return Bind(host, port)


def bind_argument(value: str) -> str:
    """``type=`` of a ``--bind`` command-line option: the bind as gunicorn takes it."""
    try:
        return str(parse_bind(value, "--bind"))
    except AddressError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def derived_public_url(bind: Bind, *, https: bool, hostname: str | None = None) -> str:
    """The public URL that follows from the bind: ``http(s)://<host>:<port>``, with this
    machine's host name (``hostname``, default :func:`socket.gethostname`) for a wildcard bind."""
    scheme = "https" if https else "http"
    if bind.is_wildcard:
        name = (hostname if hostname is not None else socket.gethostname()).strip().lower()
        host = name if _is_host_name(name) else "localhost"
    else:
        host = bind.url_host()
    return f"{scheme}://{host}:{bind.port}"


def parse_public_url(value: str, name: str = "SPARKOPS_PUBLIC_URL") -> str:
    """An ``http(s)://HOST[:PORT]`` URL, without a trailing slash; anything else (another
    scheme, a path, a query, no host, a bad port) is an :class:`AddressError` naming ``name``."""
    text = value.strip()
    problem = f"{name}={value!r}: expected http(s)://HOST[:PORT] with no path, {_URL_EXAMPLE}"
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        raise AddressError(problem) from None
    if (parts.scheme not in ("http", "https") or not parts.hostname or parts.username
            or parts.password or parts.path not in ("", "/") or parts.query or parts.fragment
            or port == 0):
        raise AddressError(problem)
    host = parts.hostname
    if ":" not in host and _host(host) is None:
        raise AddressError(problem)
    return f"{parts.scheme}://{parts.netloc.lower()}"


def public_url_setting(configured: str | None, bind: Bind, *, https: bool) -> str:
    """``SPARKOPS_PUBLIC_URL`` as set (checked), else derived from the bind."""
    if configured is None:
        return derived_public_url(bind, https=https)
    return parse_public_url(configured)


def url_host_name(url: str) -> str:
    """The host of a URL as Django's ALLOWED_HOSTS lists it (IPv6 in brackets, no port)."""
    host = urlsplit(url).hostname or ""
    return f"[{host}]" if ":" in host else host


def url_netloc(url: str) -> str:
    """``host[:port]`` of a URL: where an HTTPS redirect sends a browser."""
    return urlsplit(url).netloc


def url_origin(url: str) -> str:
    """``scheme://host[:port]`` of a URL, as a browser's Origin header writes it."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def default_allowed_hosts(public_url: str) -> list[str]:
    """The loopback names, and the public URL's host."""
    hosts = list(LOOPBACK_HOSTS)
    host = url_host_name(public_url)
    if host and host not in hosts:
        hosts.append(host)
    return hosts
