"""What the tests that run SparkOps' own processes share: stopping a process group they started,
and signing in to a running stack over HTTP as its first admin."""

from __future__ import annotations

import os
import re
import signal
import subprocess

import requests


def stop_group(process: subprocess.Popen, stop_signal: int = signal.SIGTERM,
               timeout: float = 30) -> None:
    """Stop the process group ``process`` leads (started with ``start_new_session=True``):
    ``stop_signal``, then SIGKILL to the group if it is not gone within ``timeout`` seconds."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, stop_signal)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def sign_in(base: str, password: str, *, node: str | None, username: str = "admin",
            **request_options) -> requests.Session:
    """A session signed in at ``base`` (the login form, its CSRF token, the post), which must
    land on ``node``'s overview, or on the home page's fleet view when ``node`` is None."""
    session = requests.Session()
    page = session.get(f"{base}/login/", timeout=10, **request_options)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    response = session.post(
        f"{base}/login/",
        data={"username": username, "password": password, "csrfmiddlewaretoken": token},
        headers={"Referer": f"{base}/login/"}, timeout=10, **request_options,
    )
    response.raise_for_status()
    if node is None:
        assert response.url == f"{base}/" and 'id="fleet"' in response.text, response.url
    else:
        assert response.url.endswith(f"/nodes/{node}/"), response.url
    return session
