"""The shipped nginx example (deploy/nginx/sparkops.conf) in front of a real SparkOps.

A self-signed certificate for ``sparkops.test``, Debian's nginx running the shipped file (only its
addresses, name and certificate paths swapped for the test's; every proxy setting as shipped), and
SparkOps' own web server (gunicorn, as the stack starts it) on a loopback port with the settings
the file's header names. Then, as a browser would over HTTPS: the login page, a login that must
pass CSRF, secure cookies and HSTS; plain HTTP redirected to the public URL; and the login records
the client's address from X-Forwarded-For only because nginx is a trusted proxy.

The browser side connects from 127.0.0.2 and a client talking to SparkOps directly from
127.0.0.3, so each address in a record says which path it came by. ``sparkops.test`` resolves to
127.0.0.1 in this test process only.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from requests.adapters import HTTPAdapter

from collectors.management.commands.runstack import stack_commands
from sparkops.testing.ports import free_port, wait_for_port
from tests.conftest import PROJECT, subprocess_env
from tests.processes import stop_group

pytestmark = pytest.mark.slow

SHIPPED_CONF = PROJECT / "deploy" / "nginx" / "sparkops.conf"
PUBLIC_HOST = "sparkops.test"
PASSWORD = "tls-proxy-test-password-1"
NODE = "tls-proxy-test"
BROWSER_ADDRESS = "127.0.0.2"
DIRECT_ADDRESS = "127.0.0.3"
FORGED_ADDRESS = "203.0.113.9"
HSTS = "max-age=31536000; includeSubDomains; preload"


@dataclass(frozen=True)
class ProxiedSparkOps:
    public_url: str  # https://sparkops.test:<nginx port>
    web_port: int  # SparkOps' own bind on 127.0.0.1
    http_port: int  # nginx's plain-HTTP server
    certificate: Path
    database: Path


def _swap(text: str, old: str, new: str, count: int) -> str:
    """``text`` with ``old`` replaced; the shipped file must hold it exactly ``count`` times."""
    found = text.count(old)
    assert found == count, f"{SHIPPED_CONF.name} holds {old!r} {found} times, not {count}"
    return text.replace(old, new)


def _nginx_conf(workdir: Path, *, https_port: int, http_port: int, web_port: int,
                certificate: Path, key: Path) -> Path:
    """The shipped server blocks with the test's ports, name and certificate, in a main
    configuration that keeps every file nginx writes in ``workdir``."""
    conf = SHIPPED_CONF.read_text()
    conf = _swap(conf, "server 127.0.0.1:8470;", f"server 127.0.0.1:{web_port};", 1)
    conf = _swap(conf, "listen 80;", f"listen 127.0.0.1:{http_port};", 1)
    conf = _swap(conf, "listen 443 ssl;", f"listen 127.0.0.1:{https_port} ssl;", 1)
    conf = _swap(conf, "    listen [::]:80;\n", "", 1)  # the test listens on loopback only
    conf = _swap(conf, "    listen [::]:443 ssl;\n", "", 1)
    conf = _swap(conf, "server_name sparkops.example.com;", f"server_name {PUBLIC_HOST};", 2)
    conf = _swap(conf, "/etc/ssl/certs/sparkops.example.com.pem", str(certificate), 1)
    conf = _swap(conf, "/etc/ssl/private/sparkops.example.com.key", str(key), 1)
    (workdir / "sparkops.conf").write_text(conf)
    temp_paths = "\n".join(f"    {kind}_temp_path {workdir / kind};"
                           for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    # As root, nginx's workers would run as nobody, who cannot enter the test's private folder.
    user = "user root;\n" if os.geteuid() == 0 else ""
    main = workdir / "nginx.conf"
    main.write_text(
        f"{user}worker_processes 1;\n"
        f"error_log {workdir / 'error.log'} warn;\n"
        "events { worker_connections 64; }\n"
        "http {\n"
        f"    access_log {workdir / 'access.log'};\n"
        f"{temp_paths}\n"
        f"    include {workdir / 'sparkops.conf'};\n"
        "}\n"
    )
    return main


def _self_signed_certificate(workdir: Path) -> tuple[Path, Path]:
    certificate, key = workdir / "sparkops.test.pem", workdir / "sparkops.test.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "2", "-subj", f"/CN={PUBLIC_HOST}",
         "-addext", f"subjectAltName=DNS:{PUBLIC_HOST}",
         "-keyout", str(key), "-out", str(certificate)],
        check=True, capture_output=True, timeout=30,
    )
    return certificate, key


@pytest.fixture(scope="module")
def proxied(tmp_path_factory) -> Iterator[ProxiedSparkOps]:
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(nginx).exists():
        pytest.fail("nginx is not installed (Debian package nginx)")
    workdir = tmp_path_factory.mktemp("tls-proxy")
    certificate, key = _self_signed_certificate(workdir)
    https_port, http_port, web_port = free_port(), free_port(), free_port()
    public_url = f"https://{PUBLIC_HOST}:{https_port}"
    data = workdir / "data"
    # The settings deploy/nginx/sparkops.conf names; SPARKOPS_ALLOWED_HOSTS is left to its
    # default, which allows the public URL's host.
    env = {name: value for name, value in subprocess_env().items()
           if name not in ("SPARKOPS_ALLOWED_HOSTS", "SPARKOPS_CSRF_TRUSTED_ORIGINS")}
    env.update(SPARKOPS_DATA_DIR=str(data), SPARKOPS_BIND=f"127.0.0.1:{web_port}",
               SPARKOPS_HTTPS="1", SPARKOPS_PUBLIC_URL=public_url,
               SPARKOPS_TRUSTED_PROXIES="127.0.0.1/32", SPARKOPS_ADMIN_PASSWORD=PASSWORD,
               SPARKOPS_NODE_NAME=NODE)
    for step in (["migrate", "--noinput"], ["bootstrap"],
                 ["collectstatic", "--noinput", "--verbosity", "0"]):
        subprocess.run([sys.executable, "manage.py", *step], cwd=PROJECT, env=env, check=True,
                       capture_output=True, timeout=180)

    nginx_argv = [nginx, "-p", str(workdir), "-e", str(workdir / "error.log"),
                  "-c", str(_nginx_conf(workdir, https_port=https_port, http_port=http_port,
                                        web_port=web_port, certificate=certificate, key=key)),
                  "-g", f"daemon off; pid {workdir / 'nginx.pid'};"]
    checked = subprocess.run([*nginx_argv, "-t"], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr

    web_log = (workdir / "web.log").open("w")
    web = subprocess.Popen(stack_commands(bind=f"127.0.0.1:{web_port}", node=NODE)["web"],
                           cwd=PROJECT, env=env, stdout=web_log, stderr=subprocess.STDOUT,
                           start_new_session=True)
    proxy = None
    try:
        proxy = subprocess.Popen(nginx_argv, stdout=web_log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        wait_for_port(https_port, timeout=30)
        wait_for_port(web_port, timeout=90)
        with pytest.MonkeyPatch.context() as patch:
            real_getaddrinfo = socket.getaddrinfo

            def resolve(host, *args, **kwargs):
                return real_getaddrinfo("127.0.0.1" if host == PUBLIC_HOST else host, *args,
                                        **kwargs)

            patch.setattr(socket, "getaddrinfo", resolve)
            yield ProxiedSparkOps(public_url, web_port, http_port, certificate,
                                  data / "sparkops.sqlite3")
    finally:
        if proxy is not None:
            stop_group(proxy, signal.SIGQUIT)  # nginx's graceful stop
        stop_group(web)
        web_log.close()


class _FromAddress(HTTPAdapter):
    """Connections leave from one loopback address, so the server sees who is asking."""

    def __init__(self, address: str) -> None:
        self.address = address
        super().__init__()

    def init_poolmanager(self, *args, **kwargs):
        kwargs["source_address"] = (self.address, 0)
        return super().init_poolmanager(*args, **kwargs)


def _client(address: str, proxied: ProxiedSparkOps) -> requests.Session:
    session = requests.Session()
    # Not the environment's CA bundle or proxies: this certificate, straight to loopback.
    session.trust_env = False
    session.verify = str(proxied.certificate)
    for scheme in ("http://", "https://"):
        session.mount(scheme, _FromAddress(address))
    return session


def _form_token(page: str) -> str:
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)


def _records(proxied: ProxiedSparkOps, table: str) -> list[tuple[str, str]]:
    with sqlite3.connect(proxied.database) as connection:
        return connection.execute(f"select username, ip_address from {table}").fetchall()


@pytest.fixture(scope="module")
def logged_in(proxied) -> tuple[requests.Session, requests.Response]:
    """A browser's login through nginx: the page, then the form posted with its CSRF token (and
    an X-Forwarded-For of the client's own making, which nginx passes on with its own entry)."""
    browser = _client(BROWSER_ADDRESS, proxied)
    login = f"{proxied.public_url}/login/"
    page = browser.get(login, timeout=10)
    page.raise_for_status()
    posted = browser.post(
        login, data={"username": "admin", "password": PASSWORD,
                     "csrfmiddlewaretoken": _form_token(page.text)},
        headers={"Origin": proxied.public_url, "Referer": login,
                 "X-Forwarded-For": FORGED_ADDRESS},
        allow_redirects=False, timeout=10,
    )
    return browser, posted


def test_login_page_loads_over_https_with_hsts_from_sparkops(proxied):
    page = _client(BROWSER_ADDRESS, proxied).get(f"{proxied.public_url}/login/", timeout=10)

    assert page.status_code == 200
    assert 'name="password"' in page.text
    # One HSTS header, SparkOps' own: nginx adds none of its own.
    assert page.raw.headers.getlist("Strict-Transport-Security") == [HSTS]


def test_login_post_through_the_proxy_passes_csrf_and_sets_secure_cookies(proxied, logged_in):
    browser, posted = logged_in

    assert posted.status_code == 302, posted.text[:500]
    session_cookie = [line for line in posted.raw.headers.getlist("Set-Cookie")
                      if line.startswith("sessionid=")]
    assert len(session_cookie) == 1
    flags = [flag.strip().lower() for flag in session_cookie[0].split(";")]
    assert "secure" in flags and "httponly" in flags
    assert posted.headers["Strict-Transport-Security"] == HSTS
    landing = browser.get(proxied.public_url + posted.headers["Location"], timeout=10)
    assert landing.status_code == 200
    assert landing.url == f"{proxied.public_url}/nodes/{NODE}/"


def test_plain_http_to_the_bind_redirects_to_https_on_the_public_url(proxied):
    answer = _client(DIRECT_ADDRESS, proxied).get(
        f"http://127.0.0.1:{proxied.web_port}/login/?next=/alerts/", allow_redirects=False,
        timeout=10)

    assert answer.status_code == 301
    assert answer.headers["Location"] == f"{proxied.public_url}/login/?next=/alerts/"


def test_plain_http_to_nginx_redirects_to_https(proxied):
    answer = _client(BROWSER_ADDRESS, proxied).get(
        f"http://127.0.0.1:{proxied.http_port}/login/", headers={"Host": PUBLIC_HOST},
        allow_redirects=False, timeout=10)

    assert answer.status_code == 301
    assert answer.headers["Location"] == f"https://{PUBLIC_HOST}/login/"


def test_login_records_the_address_nginx_saw_because_nginx_is_trusted(proxied, logged_in):
    """The browser connected to nginx from 127.0.0.2; nginx connected to SparkOps from
    127.0.0.1, a trusted proxy, and appended 127.0.0.2 to the client's forged header."""
    assert logged_in[1].status_code == 302

    assert _records(proxied, "axes_accesslog") == [("admin", BROWSER_ADDRESS)]


def test_x_forwarded_for_from_an_untrusted_peer_is_not_believed(proxied):
    """A client reaching SparkOps' bind directly (127.0.0.3, not a trusted proxy) claims to be
    someone else: its failed login is recorded under its own address."""
    direct = _client(DIRECT_ADDRESS, proxied)
    login = f"http://127.0.0.1:{proxied.web_port}/login/"
    # It claims HTTPS too, or the bind would only redirect it; cookies marked Secure are sent
    # by hand, since requests keeps them off plain HTTP.
    claims = {"X-Forwarded-Proto": "https", "X-Forwarded-For": FORGED_ADDRESS}
    page = direct.get(login, headers=claims, allow_redirects=False, timeout=10)
    assert page.status_code == 200
    csrf_cookie = page.cookies["csrftoken"]
    refused = direct.post(
        login, data={"username": "admin", "password": "not-the-password",
                     "csrfmiddlewaretoken": _form_token(page.text)},
        headers={**claims, "Cookie": f"csrftoken={csrf_cookie}", "Origin": proxied.public_url,
                 "Referer": f"{proxied.public_url}/login/"},
        allow_redirects=False, timeout=10,
    )

    assert refused.status_code == 200  # the login page again, with the error
    assert _records(proxied, "axes_accessfailurelog") == [("admin", DIRECT_ADDRESS)]
