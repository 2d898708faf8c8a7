"""The README's first command, for real: install, migrate, admin, gunicorn + worker + beat.

Run once on the embedded defaults (SQLite, file-system broker) and once switched to Redis and
PostgreSQL by environment alone. Each test logs in like a browser would and waits for live
samples: beat -> broker -> worker -> database -> web.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import psycopg
import pytest
import requests

from sparkops.testing.ports import free_port, wait_for_port
from tests.conftest import PROJECT, subprocess_env
from tests.processes import sign_in, stop_group

pytestmark = pytest.mark.slow
PASSWORD = "stack-test-password-1"
NODE = "stack-test"


def _run_stack(tmp_path: Path, extra_env: dict[str, str]):
    port = free_port()
    env = subprocess_env(
        SPARKOPS_DATA_DIR=str(tmp_path / "data"),
        SPARKOPS_BIND=f"127.0.0.1:{port}",
        SPARKOPS_ADMIN_PASSWORD=PASSWORD,
        SPARKOPS_NODE_NAME=NODE,
        **extra_env,
    )
    log = open(tmp_path / "stack.log", "w")  # noqa: SIM115 - closed by the caller
    process = subprocess.Popen(
        [str(PROJECT / "bin" / "sparkops"), "start"], env=env, stdout=log,
        stderr=subprocess.STDOUT, start_new_session=True,
    )
    return process, port, log


def _wait_for_live_samples(session: requests.Session, base: str, seconds: float) -> dict:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        data = session.get(f"{base}/api/nodes/{NODE}/headroom.json", timeout=5).json()
        figures = {f["key"]: f for f in data["figures"]}
        if figures["mem_available"]["value"] is not None:
            return data
        time.sleep(0.5)
    raise AssertionError(f"no live sample within {seconds} s of logging in")


def _check_stack(tmp_path: Path, extra_env: dict[str, str]) -> None:
    process, port, log = _run_stack(tmp_path, extra_env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for_port(port, timeout=180)
        session = sign_in(base, PASSWORD, node=NODE)
        data = _wait_for_live_samples(session, base, seconds=15)

        assert data["last_ok"] is True and data["stale"] is False
        assert data["mem_total_gib"] > 0
        page = session.get(f"{base}/nodes/{NODE}/", timeout=10).text
        plotly = re.search(r'src="(/static/vendor/plotly\.min\.[0-9a-f]+\.js)"', page)
        assert plotly, "plotly.js must come from our own static files"
        assert session.get(base + plotly.group(1), timeout=10).content.startswith(b"/**")
        assert requests.get(f"{base}/api/nodes/{NODE}/headroom.json", timeout=5,
                            allow_redirects=False).status_code == 302
    finally:
        stop_group(process)
        log.close()
    assert "Created admin account 'admin' with SPARKOPS_ADMIN_PASSWORD" in (
        tmp_path / "stack.log"
    ).read_text()


def test_start_command_on_embedded_defaults(tmp_path):
    _check_stack(tmp_path, {})

    assert (tmp_path / "data" / "sparkops.sqlite3").exists()
    assert any((tmp_path / "data" / "broker").iterdir())


def test_start_command_on_redis_and_postgresql(tmp_path, redis_url, postgres_url):
    _check_stack(tmp_path, {"DATABASE_URL": postgres_url, "CELERY_BROKER_URL": redis_url})

    with psycopg.connect(postgres_url) as connection:
        count = connection.execute(
            "select count(*) from collectors_collection c join collectors_node n "
            "on n.id = c.node_id where n.name = %s and c.ok", (NODE,)
        ).fetchone()[0]
    assert count >= 1
    assert not (tmp_path / "data" / "sparkops.sqlite3").exists()
