"""SparkOps as ``bin/sparkops start`` runs it, in a data directory of the benchmark's own.

The same steps (migrate, bootstrap, collectstatic, ``manage.py runstack``) with the embedded
defaults: SQLite and the file-system Celery broker under the data directory, so there is no
broker process. The benchmark process itself can open the same database with :func:`setup_django`
to add a webhook channel, set a rule's thresholds and read alerts.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import requests

from bench.services import PROJECT, Child, http_ok
from sparkops.testing.ports import free_port, wait_for

ADMIN_USER = "admin"
ADMIN_PASSWORD = "bench-admin-password-not-secret"


def stack_env(data_dir: Path, *, node: str, docker_host: str | None,
              database_url: str | None = None, **extra: str) -> dict[str, str]:
    """The environment of a SparkOps of the benchmark's own (defaults except where named)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARKOPS_", "DATABASE_URL",
                                                                    "CELERY_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="sparkops.settings",
        SPARKOPS_DATA_DIR=str(data_dir),
        SPARKOPS_NODE_NAME=node,
        SPARKOPS_ADMIN_USER=ADMIN_USER,
        SPARKOPS_ADMIN_PASSWORD=ADMIN_PASSWORD,
        SPARKOPS_LOG_LEVEL="WARNING",
        # The webhook receiver of the benchmark is on loopback, which SparkOps refuses unless
        # an admin allows it.
        SPARKOPS_WEBHOOK_ALLOWED_NETWORKS="127.0.0.1/32",
    )
    if docker_host:
        env["SPARKOPS_DOCKER_HOST"] = docker_host
    if database_url:
        env["DATABASE_URL"] = database_url
    env.update(extra)
    return env


def setup_django(env: dict[str, str]) -> None:
    """Configure this process's Django with ``env`` (call once, before any model import)."""
    import django

    os.environ.update(env)
    if str(PROJECT) not in sys.path:
        sys.path.insert(0, str(PROJECT))
    django.setup()


def manage(env: dict[str, str], *args: str, timeout: float = 300) -> None:
    subprocess.run([sys.executable, "manage.py", *args], cwd=PROJECT, env=env, check=True,
                   stdout=subprocess.DEVNULL, timeout=timeout)


def prepare(env: dict[str, str]) -> None:
    """What ``bin/sparkops start`` does before it runs the stack."""
    manage(env, "migrate", "--noinput")
    manage(env, "bootstrap")
    manage(env, "collectstatic", "--noinput", "--verbosity", "0")


class SparkOpsStack:
    """``manage.py runstack`` with its defaults: one process, the Celery worker (8 threads,
    beat in a thread) with the web server (waitress, 4 threads) in a thread of its own."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.child = Child("sparkops", [sys.executable, "manage.py", "runstack", "--bind",
                                        f"127.0.0.1:{self.port}"],
                           log=log_dir / "sparkops.log", env=env, cwd=PROJECT)

    def wait_ready(self, timeout: float = 60) -> None:
        wait_for(lambda: http_ok(f"{self.url}/login/"), timeout, "SparkOps web ready", 0.2)

    def stop(self) -> None:
        self.child.stop(timeout=20)


class OverviewTab(threading.Thread):
    """One browser tab left open on the node's overview, polling as ``overview.js`` does:
    headroom and engine cards every interval, the 1 h timeline every three intervals."""

    def __init__(self, base_url: str, node: str, interval: float = 5.0) -> None:
        super().__init__(daemon=True)
        self.base_url, self.node, self.interval = base_url, node, interval
        self.requests = 0
        self.errors = 0
        self._halt = threading.Event()

    def _login(self) -> requests.Session:
        session = requests.Session()
        page = session.get(f"{self.base_url}/login/", timeout=10)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        session.post(f"{self.base_url}/login/", timeout=10, data={
            "username": ADMIN_USER, "password": ADMIN_PASSWORD,
            "csrfmiddlewaretoken": token.group(1) if token else "",
        }, headers={"Referer": f"{self.base_url}/login/"})
        return session

    def run(self) -> None:
        session = self._login()
        node_url = f"{self.base_url}/nodes/{self.node}/"
        api = f"{self.base_url}/api/nodes/{self.node}"
        polls = [(1, f"{api}/headroom.json"), (1, f"{node_url}engines/cards/"),
                 (3, f"{api}/timeline.json?range=1h")]
        session.get(node_url, timeout=10)  # the page itself, once
        tick = 0
        while not self._halt.wait(self.interval if tick else 0):
            for every, url in polls:
                if tick % every:
                    continue
                try:
                    ok = session.get(url, timeout=10).status_code == 200
                except requests.RequestException:
                    ok = False
                self.requests += 1
                self.errors += 0 if ok else 1
            tick += 1

    def stop(self) -> None:
        self._halt.set()
