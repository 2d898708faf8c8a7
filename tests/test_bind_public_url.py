"""SPARKOPS_BIND and SPARKOPS_PUBLIC_URL: one rule (sparkops.address) from the bind to the
address people use, the hosts the site answers to and the origins its forms may come from."""

from __future__ import annotations

import argparse
import runpy
import socket

import pytest
from django.core.exceptions import ImproperlyConfigured
from gunicorn.util import parse_address

from sparkops.address import (
    AddressError,
    Bind,
    bind_argument,
    derived_public_url,
    parse_bind,
    parse_public_url,
)
from tests.conftest import PROJECT

SETTINGS = PROJECT / "sparkops" / "settings.py"
ADDRESS_VARIABLES = ("SPARKOPS_BIND", "SPARKOPS_PUBLIC_URL", "SPARKOPS_HTTPS",
                     "SPARKOPS_ALLOWED_HOSTS", "SPARKOPS_CSRF_TRUSTED_ORIGINS")


@pytest.mark.parametrize(("value", "bind"), [
    ("0.0.0.0", "0.0.0.0:8470"),
    ("[::]", "[::]:8470"),
    ("::", "[::]:8470"),
    ("spark-01.lan", "spark-01.lan:8470"),
    ("Spark-01.LAN:8000", "spark-01.lan:8000"),
    ("127.0.0.1:9000", "127.0.0.1:9000"),
    ("[::1]:8471", "[::1]:8471"),
    (" 10.0.0.5 ", "10.0.0.5:8470"),
])
def test_a_bind_without_a_port_keeps_sparkops_own_port(value, bind):
    assert str(parse_bind(value)) == bind


@pytest.mark.parametrize("value", ["0.0.0.0", "[::]", "spark-01.lan", "127.0.0.1:9000"])
def test_gunicorn_reads_the_normalised_bind_as_meant(value):
    """What the stack hands gunicorn: the port is always there, so gunicorn's own default port
    (8000, for a bind without one) never applies."""
    parsed = parse_bind(value)
    host, port = parse_address(str(parsed))

    assert (host, port) == (parsed.host, parsed.port)
    assert parse_address("0.0.0.0") == ("0.0.0.0", 8000)  # why the port must be added


@pytest.mark.parametrize("value", [
    "bad:port", ":8470", "127.0.0.1:", "127.0.0.1:0", "127.0.0.1:65536", "unix:/run/sparkops.sock",
    "http://spark-01:8470", "[::1", "[::1]:x", "spark_01", "1.2.3.4.5", "256.1.1.1", "::zz",
    "spark 01",
])
def test_a_malformed_bind_names_the_variable(value):
    with pytest.raises(AddressError) as raised:
        parse_bind(value)

    message = str(raised.value)
    assert message.startswith(f"SPARKOPS_BIND={value!r}: expected HOST or HOST:PORT")
    assert "\n" not in message


def test_a_bind_option_follows_the_same_rule():
    """For a command's --bind option (argparse's type=): normalised, or a usage error."""
    assert bind_argument("0.0.0.0") == "0.0.0.0:8470"
    with pytest.raises(argparse.ArgumentTypeError, match=r"^--bind='spark-01:http': expected"):
        bind_argument("spark-01:http")


@pytest.mark.parametrize(("bind", "https", "url"), [
    (Bind("127.0.0.1", 8470), False, "http://127.0.0.1:8470"),
    (Bind("127.0.0.1", 8470), True, "https://127.0.0.1:8470"),
    (Bind("spark-01.lan", 9000), False, "http://spark-01.lan:9000"),
    (Bind("::1", 8470), False, "http://[::1]:8470"),
    (Bind("0.0.0.0", 8470), False, "http://spark-01:8470"),
    (Bind("::", 8470), True, "https://spark-01:8470"),
])
def test_the_public_url_follows_from_the_bind(bind, https, url):
    assert derived_public_url(bind, https=https, hostname="Spark-01") == url


@pytest.mark.parametrize(("value", "url"), [
    ("https://SparkOps.Example.com/", "https://sparkops.example.com"),
    ("http://spark-01.lan:8470", "http://spark-01.lan:8470"),
    ("https://[2001:db8::5]:8443", "https://[2001:db8::5]:8443"),
])
def test_a_configured_public_url_is_kept_in_canonical_form(value, url):
    assert parse_public_url(value) == url


@pytest.mark.parametrize("value", [
    "ftp://sparkops.example.com", "https://", "sparkops.example.com", "https://x.example/sparkops",
    "https://x.example:99999", "https://admin@x.example", "https://x.example/?a=1",
    "https://x_y.example",
])
def test_a_malformed_public_url_names_the_variable(value):
    with pytest.raises(AddressError,
                       match=r"^SPARKOPS_PUBLIC_URL=.*: expected http\(s\)://HOST\[:PORT\]"):
        parse_public_url(value)


def _settings(monkeypatch, tmp_path, **env: str) -> dict:
    """The settings module as a process started with ``env`` would compute it."""
    for name in ADDRESS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SPARKOPS_DATA_DIR", str(tmp_path / "data"))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return runpy.run_path(str(SETTINGS))


def test_settings_default_to_loopback_on_sparkops_port(monkeypatch, tmp_path):
    settings = _settings(monkeypatch, tmp_path)

    assert settings["SPARKOPS_BIND"] == "127.0.0.1:8470"
    assert settings["SPARKOPS_PUBLIC_URL"] == "http://127.0.0.1:8470"
    assert settings["ALLOWED_HOSTS"] == ["127.0.0.1", "localhost", "[::1]"]
    assert settings["CSRF_TRUSTED_ORIGINS"] == ["http://127.0.0.1:8470"]
    assert settings["SECURE_SSL_HOST"] is None


def test_settings_for_a_wildcard_bind_name_this_machine(monkeypatch, tmp_path):
    monkeypatch.setattr(socket, "gethostname", lambda: "Spark-01")

    settings = _settings(monkeypatch, tmp_path, SPARKOPS_BIND="0.0.0.0", SPARKOPS_HTTPS="1")

    assert settings["SPARKOPS_BIND"] == "0.0.0.0:8470"
    assert settings["SPARKOPS_PUBLIC_URL"] == "https://spark-01:8470"
    assert settings["ALLOWED_HOSTS"] == ["127.0.0.1", "localhost", "[::1]", "spark-01"]
    assert settings["CSRF_TRUSTED_ORIGINS"] == ["https://spark-01:8470"]
    assert settings["SECURE_SSL_HOST"] == "spark-01:8470"


def test_settings_behind_a_tls_proxy_accept_its_host_and_origin(monkeypatch, tmp_path):
    settings = _settings(monkeypatch, tmp_path, SPARKOPS_HTTPS="1",
                         SPARKOPS_PUBLIC_URL="https://sparkops.example.com/")

    assert settings["SPARKOPS_BIND"] == "127.0.0.1:8470"
    assert settings["SPARKOPS_PUBLIC_URL"] == "https://sparkops.example.com"
    assert "sparkops.example.com" in settings["ALLOWED_HOSTS"]
    assert settings["CSRF_TRUSTED_ORIGINS"] == ["https://sparkops.example.com"]
    # Plain HTTP is sent to the public host, not to the host the request named.
    assert settings["SECURE_SSL_REDIRECT"] is True
    assert settings["SECURE_SSL_HOST"] == "sparkops.example.com"


def test_configured_hosts_and_origins_replace_the_derived_ones(monkeypatch, tmp_path):
    settings = _settings(monkeypatch, tmp_path, SPARKOPS_PUBLIC_URL="https://a.example",
                         SPARKOPS_ALLOWED_HOSTS="b.example",
                         SPARKOPS_CSRF_TRUSTED_ORIGINS="https://b.example")

    assert settings["ALLOWED_HOSTS"] == ["b.example"]
    assert settings["CSRF_TRUSTED_ORIGINS"] == ["https://b.example"]


@pytest.mark.parametrize(("name", "value"), [
    ("SPARKOPS_BIND", "spark-01:http"),
    ("SPARKOPS_PUBLIC_URL", "sparkops.example.com"),
])
def test_a_malformed_address_stops_the_settings(monkeypatch, tmp_path, name, value):
    with pytest.raises(ImproperlyConfigured, match=f"^{name}="):
        _settings(monkeypatch, tmp_path, **{name: value})
