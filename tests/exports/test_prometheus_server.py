"""A real Prometheus server (the Debian ``prometheus`` binary) scrapes SparkOps' ``/metrics``
with the export token, over loopback, and answers queries with SparkOps' figures."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.utils import timezone

from collectors.models import Node
from sparkops.testing.ports import free_port, wait_for_port
from tests.exports.world import GIB, TOKEN, build

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PROMETHEUS = "/usr/bin/prometheus"
# Scrapes run every second; the first one happens within a second or two of start-up.
QUERY_DEADLINE_S = 60.0


def _config(target: str) -> str:
    """Two jobs on the same target: one with the token, one without (which must fail)."""
    return json.dumps({  # JSON is YAML: no YAML library needed to write it
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "sparkops", "metrics_path": "/metrics",
             "authorization": {"type": "Bearer", "credentials": TOKEN},
             "static_configs": [{"targets": [target]}]},
            {"job_name": "sparkops-without-token", "metrics_path": "/metrics",
             "static_configs": [{"targets": [target]}]},
        ],
    }, indent=2)


@pytest.fixture
def prometheus(tmp_path: Path, live_server) -> Iterator[str]:
    """A private Prometheus on a free 127.0.0.1 port scraping the live server; its base URL."""
    if not shutil.which(PROMETHEUS):
        pytest.fail(f"{PROMETHEUS} is missing: install the Debian package 'prometheus' "
                    "(apt-get install prometheus)")
    server = urllib.parse.urlsplit(live_server.url)
    config = tmp_path / "prometheus.yml"
    config.write_text(_config(f"127.0.0.1:{server.port}"))
    port = free_port()
    log = (tmp_path / "prometheus.log").open("w")
    process = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}",
         # Console assets are not needed; pointing them into the temp dir keeps Prometheus off
         # the system's /etc and /usr/share paths. Prometheus has no update check or telemetry.
         f"--web.console.templates={tmp_path}", f"--web.console.libraries={tmp_path}",
         "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        wait_for_port(port, timeout=30)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
        log.close()


def _query(base: str, promql: str) -> list[dict]:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            payload = json.load(response)
    except (urllib.error.URLError, TimeoutError):
        return []  # still starting up
    assert payload["status"] == "success", payload
    return payload["data"]["result"]


def _wait_for(base: str, promql: str, tmp_path: Path) -> list[dict]:
    deadline = time.monotonic() + QUERY_DEADLINE_S
    while time.monotonic() < deadline:
        result = _query(base, promql)
        if result:
            return result
        time.sleep(0.5)
    targets = _query(base, "up")
    log = (tmp_path / "prometheus.log").read_text()
    raise AssertionError(f"Prometheus had no {promql!r} after {QUERY_DEADLINE_S} s; "
                         f"up: {targets}; log:\n{log}")


def test_prometheus_scrapes_sparkops_with_the_export_token(settings, prometheus, tmp_path):
    settings.SPARKOPS_EXPORT_TOKEN = TOKEN
    settings.SPARKOPS_EXPORT_ALLOWED_NETWORKS = []  # loopback gets no free pass: token only
    settings.SPARKOPS_COLLECT_INTERVAL = 60.0  # keep the seeded collection current meanwhile
    node = Node.objects.create(name="spark-a", hostname="spark-a", mem_total_bytes=128 * GIB)
    build(node, timezone.now())

    [available] = _wait_for(prometheus, "sparkops_mem_available_bytes", tmp_path)
    [up] = _wait_for(prometheus, 'up{job="sparkops"}', tmp_path)
    [refused] = _wait_for(prometheus, 'up{job="sparkops-without-token"}', tmp_path)
    [phase] = _wait_for(prometheus, 'sparkops_engine_phase{engine="gemma",phase="ready"}',
                        tmp_path)

    assert available["metric"]["node"] == "spark-a"
    assert available["metric"]["job"] == "sparkops"
    assert float(available["value"][1]) == 40 * GIB
    assert up["value"][1] == "1"
    assert refused["value"][1] == "0"  # the same target without the token: 401
    assert phase["value"][1] == "1"
    # Unknown figures never reach Prometheus as zeros.
    assert _query(prometheus, "sparkops_mem_free_bytes") == []
