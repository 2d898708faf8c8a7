"""An installation of the single ``dashboard`` app upgrades in place: every row, permission and
grant survives the move of the models to the domain apps, on SQLite and on PostgreSQL, and the
pages keep their URLs and ``dashboard:`` names."""

from __future__ import annotations

import json
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.urls import reverse

from sparkops.testing.postgres import fresh_database
from tests.conftest import PROJECT, subprocess_env

# Every URL name of the previous release (but the dead memory.json), with its path there.
URLS = {
    "home": ({}, "/"),
    "overview": ({"node": "spark-a"}, "/nodes/spark-a/"),
    "engine-cards": ({"node": "spark-a"}, "/nodes/spark-a/engines/cards/"),
    "engine": ({"node": "spark-a", "engine": "vllm"}, "/nodes/spark-a/engines/vllm/"),
    "engines-json": ({"node": "spark-a"}, "/api/nodes/spark-a/engines.json"),
    "engine-series-json": ({"node": "spark-a", "engine": "vllm"},
                           "/api/nodes/spark-a/engines/vllm/series.json"),
    "headroom-json": ({"node": "spark-a"}, "/api/nodes/spark-a/headroom.json"),
    "timeline-json": ({"node": "spark-a"}, "/api/nodes/spark-a/timeline.json"),
    "audit": ({}, "/audit/"),
    "logins": ({}, "/logins/"),
    "login-unlock": ({}, "/logins/unlock/"),
    "alerts": ({}, "/alerts/"),
    "alert": ({"pk": 3}, "/alerts/3/"),
    "silences": ({}, "/silences/"),
    "silence-new": ({}, "/silences/new/"),
    "silence-expire": ({"pk": 3}, "/silences/3/expire/"),
    "rules": ({}, "/rules/"),
    "rule-edit": ({"rule": "overcommit"}, "/rules/overcommit/"),
    "channels": ({}, "/channels/"),
    "channel-new": ({}, "/channels/new/"),
    "channel-edit": ({"pk": 3}, "/channels/3/"),
    "channel-toggle": ({"pk": 3}, "/channels/3/toggle/"),
    "channel-test": ({"pk": 3}, "/channels/3/test/"),
    "restarts": ({}, "/restarts/"),
    "restart": ({"pk": 3}, "/restarts/3/"),
    "restart-cancel": ({"pk": 3}, "/restarts/3/cancel/"),
    "restart-plan": ({"node": "spark-a"}, "/restarts/plan/spark-a/"),
    "restart-json": ({"pk": 3}, "/api/restarts/3.json"),
    "windows": ({}, "/restarts/windows/"),
    "window-new": ({}, "/restarts/windows/new/"),
    "window-edit": ({"pk": 3}, "/restarts/windows/3/"),
    "export-metrics": ({}, "/metrics"),
    "api-nodes": ({}, "/api/v1/nodes"),
    "api-node-ledger": ({"node": "spark-a"}, "/api/v1/nodes/spark-a/ledger"),
    "api-node-engines": ({"node": "spark-a"}, "/api/v1/nodes/spark-a/engines"),
    "api-node-restarts": ({"node": "spark-a"}, "/api/v1/nodes/spark-a/restarts"),
    "api-alerts": ({}, "/api/v1/alerts"),
    "api-not-found": ({"rest": "x"}, "/api/v1/x"),
}
GRANTED_TO_THE_USER = ["audit.view_audit", "restarts.change_windows", "restarts.run_restarts"]
GRANTED_TO_THE_GROUP = ["alerting.change_rules", "alerting.change_silences",
                        "audit.unlock_logins", "notify.change_channels"]


def _upgrade(database_url: str, data_dir: Path) -> dict:
    env = subprocess_env(DATABASE_URL=database_url, SPARKOPS_DATA_DIR=str(data_dir))
    run = subprocess.run([sys.executable, "-m", "tests.upgrade_check"], cwd=PROJECT, env=env,
                         capture_output=True, text=True, timeout=150)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def _check(facts: dict) -> None:
    assert facts["rows"] == facts["written"]  # every row, under its id, through the new models
    assert facts["links"] == {"restart.window": "sunday", "audit.restart": True,
                              "audit.address": "192.0.2.7", "notification.channel": "ops",
                              "alert.engine": "vllm-a"}
    assert facts["operator"] == GRANTED_TO_THE_USER
    assert facts["member"] == GRANTED_TO_THE_GROUP
    assert facts["group"] == sorted(name.split(".")[1] for name in GRANTED_TO_THE_GROUP)
    assert facts["dashboard_content_types"] == []
    assert set(facts["permission_rows"].values()) == {1}  # moved, not duplicated
    assert facts["schema"] == []


def test_a_sqlite_installation_upgrades_in_place(tmp_path):
    _check(_upgrade(f"sqlite:///{tmp_path / 'db.sqlite3'}", tmp_path / "data"))


@pytest.mark.slow
def test_a_postgresql_installation_upgrades_in_place(postgres_url, tmp_path):
    _check(_upgrade(fresh_database(postgres_url, "upgrade"), tmp_path / "data"))


def test_every_url_name_and_path_of_the_previous_release_still_resolves():
    for name, (kwargs, path) in URLS.items():
        assert reverse(f"dashboard:{name}", kwargs=kwargs) == path, name


@pytest.mark.django_db
def test_the_models_and_the_migrations_agree():
    out = StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()
