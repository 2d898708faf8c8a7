"""An engine started with secrets, discovered through a real container engine: the API key on
its command line, a password in its environment and credentials in a database URL appear nowhere
SparkOps stores, shows, exports or prints them."""

from __future__ import annotations

import io
import json
import subprocess
import time

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from collectors import docker_api
from collectors.engines import collect_engines
from collectors.models import Engine, Event
from sparkops.testing.ports import free_port
from tests.conftest import PROJECT
from tests.containers import PODMAN, run_container, unique_name

pytestmark = [pytest.mark.slow, pytest.mark.django_db]

VLLM = str(PROJECT / "collectors" / "emulator" / "bin" / "vllm")
API_KEY = "sk-sparkops-test-9f8e7d6c5b4a3928"
DB_PASSWORD = "hunter2-db-password"
URL_PASSWORD = "url-pw-7b6a5c4d"
SECRETS = (API_KEY, DB_PASSWORD, URL_PASSWORD)
EXPORT_TOKEN = "export-token-for-tests-0123456789"


def _leaks(text: str) -> list[str]:
    return [secret for secret in SECRETS if secret in text]


@pytest.fixture
def api(docker_host):
    client = docker_api.client(docker_host)
    yield client
    client.close()


def test_secrets_of_a_real_engine_are_masked_everywhere(node, api, admin_client, settings,
                                                        tmp_path):
    port = free_port()
    name = unique_name("secret")
    command = [VLLM, "serve", "org/secret-8b", "--port", str(port), "--api-key", API_KEY,
               "--kv-cache-memory-bytes", "64M", "--emulator-weights-bytes", "16M",
               "--emulator-load-seconds", "0.2", "--emulator-profile-seconds", "0.2",
               "--emulator-graph-seconds", "0.2"]
    cid = run_container(name, command, env={
        "DB_PASS": DB_PASSWORD,
        "DATABASE_URL": f"postgresql://sparkops:{URL_PASSWORD}@db.internal:5432/ops",
    })

    deadline = time.monotonic() + 40
    while True:
        engines = {e.name: e for e in collect_engines(node, api, timezone.now())}
        found = engines.get(name)
        if found is not None and found.phase == "ready" and found.last_scrape_ok_at:
            break
        assert time.monotonic() < deadline, f"not ready: {found and found.phase}"
        time.sleep(0.5)

    row = Engine.objects.get(node=node, name=name)
    # The whole row as stored, and the events written about it.
    stored = json.dumps({field.name: str(getattr(row, field.attname))
                         for field in Engine._meta.concrete_fields})
    stored += " ".join(Event.objects.filter(engine=row).values_list("message", flat=True))
    assert _leaks(stored) == []
    # What SparkOps needs from the flags is still there, and the masked values say so.
    assert row.config["kv_cache_memory_bytes"] == 64 * 1024**2 and row.config["port"] == port
    assert row.config["all_flags"]["api-key"] == "••••••"
    assert row.env["DB_PASS"] == "••••••"
    assert row.env["DATABASE_URL"] == "postgresql://sparkops:••••••@db.internal:5432/ops"
    assert row.startup["non_default_args"]["api_key"] == "••••••"  # vLLM logs its arguments

    page = admin_client.get(f"/nodes/{node.name}/engines/{name}/")
    assert page.status_code == 200 and name in page.content.decode()
    assert _leaks(page.content.decode()) == []

    settings.SPARKOPS_EXPORT_TOKEN = EXPORT_TOKEN
    settings.SPARKOPS_EXPORT_ALLOWED_NETWORKS = []
    exported = Client().get(f"/api/v1/nodes/{node.name}/engines",
                            HTTP_AUTHORIZATION=f"Bearer {EXPORT_TOKEN}")
    cards = admin_client.get(f"/api/nodes/{node.name}/engines.json")
    metrics = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {EXPORT_TOKEN}")
    for response in (exported, cards, metrics):
        assert response.status_code == 200
        assert _leaks(response.content.decode()) == []
    assert name in exported.content.decode()

    # manage.py inspect, on the command and on the log as the engine wrote them.
    raw_log = subprocess.run([*PODMAN, "logs", cid], capture_output=True, text=True,
                             timeout=60)
    assert API_KEY in raw_log.stdout + raw_log.stderr  # the log itself holds the key
    log_file = tmp_path / f"test-{name}.log"
    log_file.write_text(raw_log.stdout + raw_log.stderr)
    try:
        printed = []
        for args in (("flags", "--", *command), ("flags", " ".join(command)),
                     ("log", str(log_file))):
            for json_output in (False, True):
                out = io.StringIO()
                call_command("inspect", *(["--json"] if json_output else []), *args,
                             stdout=out)
                printed.append(out.getvalue())
    finally:
        log_file.unlink()
    assert all(printed) and _leaks("\n".join(printed)) == []
