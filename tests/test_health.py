"""``/healthz`` and ``/readyz``: liveness without login or database, readiness from the
database, the broker and this node's collection, each check with its reason; both answer plain
HTTP with ``SPARKOPS_HTTPS=1``.

The stack serving them over real HTTP is ``tests/test_quiet_logs.py`` (fresh collection: ready)
and ``tests/test_upgrade_release.py`` (an old database: stale, not ready).
"""

from __future__ import annotations

import logging
from datetime import timedelta

import psycopg
import pytest
from django.db import connections
from django.db.utils import load_backend
from django.utils import timezone

from collectors.health import collection_bound, readiness
from collectors.models import Collection, Node
from sparkops.backends import check_broker, check_database, describe_database, mask_url
from sparkops.testing.ports import free_port
from sparkops.testing.postgres import fresh_database
from sparkops.version import VERSION


def _collect(node: Node, ago: float, ok: bool = True, error: str = "") -> Collection:
    at = timezone.now() - timedelta(seconds=ago)
    return Collection.objects.create(node=node, at=at, window_started_at=at, ok=ok, error=error)


@pytest.fixture
def this_node(db, settings) -> Node:
    settings.SPARKOPS_COLLECT_INTERVAL = 5.0
    return Node.objects.create(name=settings.SPARKOPS_NODE_NAME, hostname="here")


def _wrapper(**database: object):
    """A database connection of its own for ``database`` (not the test database)."""
    configured = connections.configure_settings({"default": database})["default"]
    return load_backend(configured["ENGINE"]).DatabaseWrapper(configured, alias="probe")


# --- /healthz -------------------------------------------------------------------------------------


def test_healthz_answers_without_login_and_without_the_database(client):
    # No database for this test: pytest-django makes any query raise.
    response = client.get("/healthz")

    assert response.status_code == 200
    assert response.json() == {"status": "ok", "version": VERSION}
    assert "no-store" in response["Cache-Control"]


def test_probes_answer_plain_http_when_https_is_on(client, settings, db):
    settings.SECURE_SSL_REDIRECT = True  # what SPARKOPS_HTTPS=1 sets

    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code in (200, 503)
    assert client.get("/login/").status_code == 301  # everything else still goes to HTTPS


def test_probes_keep_the_allowed_host_names(client, settings):
    settings.ALLOWED_HOSTS = ["sparkops.example"]
    assert client.get("/healthz", HTTP_HOST="evil.example").status_code == 400


# --- /readyz --------------------------------------------------------------------------------------


def test_readyz_is_ready_when_this_nodes_collection_is_fresh(client, this_node):
    _collect(this_node, ago=3)

    response = client.get("/readyz")

    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ready" and body["version"] == VERSION
    assert body["node"] == this_node.name
    assert set(body["checks"]) == {"database", "broker", "collection"}
    assert all(check["ok"] for check in body["checks"].values())
    assert 2 <= body["checks"]["collection"]["age_seconds"] < 30
    assert "collected 3 s ago" in body["checks"]["collection"]["reason"]
    assert "no-store" in response["Cache-Control"]


def test_readyz_is_not_ready_when_the_collection_is_stale(client, this_node):
    assert collection_bound() == 25.0  # three intervals of 5 s, plus 10 s
    _collect(this_node, ago=40)

    response = client.get("/readyz")

    assert response.status_code == 503
    collection = response.json()["checks"]["collection"]
    assert collection["ok"] is False
    assert 39 <= collection["age_seconds"] < 60
    assert "is 40 s old (more than 25 s)" in collection["reason"]
    assert response.json()["checks"]["database"]["ok"] is True


def test_a_probe_that_finds_the_node_not_ready_writes_no_error_line(client, this_node, caplog):
    with caplog.at_level(logging.DEBUG, logger="django.request"):
        assert client.get("/readyz").status_code == 503
    assert [record for record in caplog.records if record.name == "django.request"] == []


def test_a_late_collection_within_the_bound_is_still_ready(this_node):
    _collect(this_node, ago=20)
    _collect(this_node, ago=1, ok=False, error="meminfo unreadable")

    assert readiness().ok


def test_failing_collections_say_why(client, this_node):
    _collect(this_node, ago=60)
    _collect(this_node, ago=2, ok=False, error="meminfo unreadable: permission denied")

    collection = client.get("/readyz").json()["checks"]["collection"]

    assert collection["ok"] is False
    assert collection["reason"].endswith("the last one failed: meminfo unreadable: permission "
                                         "denied")


def test_a_node_never_collected_is_not_ready(client, db, settings):
    body = client.get("/readyz").json()

    assert body["status"] == "not ready"
    assert body["checks"]["collection"] == {
        "ok": False, "age_seconds": None,
        "reason": f"node {settings.SPARKOPS_NODE_NAME} has no collection yet"}


def test_another_nodes_collection_does_not_make_this_one_ready(client, this_node):
    _collect(Node.objects.create(name="elsewhere"), ago=1)
    assert client.get("/readyz").status_code == 503


# --- the broker and the database ------------------------------------------------------------------


def test_a_broker_that_does_not_answer_is_not_ready(client, this_node, settings):
    _collect(this_node, ago=1)
    settings.CELERY_BROKER_URL = f"redis://:broker-secret@127.0.0.1:{free_port()}/0"
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {}

    response = client.get("/readyz")

    assert response.status_code == 503
    broker = response.json()["checks"]["broker"]
    assert broker["ok"] is False
    assert "does not answer" in broker["reason"] and "refused" in broker["reason"]
    assert "broker-secret" not in response.content.decode()


def test_the_file_broker_is_reachable_while_its_folders_exist(settings, tmp_path):
    folders = {key: str(tmp_path / name) for key, name in (
        ("data_folder_in", "queue"), ("data_folder_out", "queue"),
        ("processed_folder", "processed"), ("control_folder", "control"))}
    settings.CELERY_BROKER_URL = "filesystem://"
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = folders
    for name in ("queue", "processed", "control"):
        (tmp_path / name).mkdir()
    assert check_broker().ok

    (tmp_path / "control").rmdir()
    check = check_broker()
    assert not check.ok
    assert check.reason == f"the broker folder {tmp_path / 'control'} does not exist"


@pytest.mark.slow
def test_a_redis_broker_that_answers_is_reachable(settings, redis_url):
    settings.CELERY_BROKER_URL = redis_url
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {}
    check = check_broker()
    assert check.ok, check.reason


def test_a_database_that_does_not_answer_is_named_without_its_password():
    wrapper = _wrapper(ENGINE="django.db.backends.postgresql", NAME="sparkops", USER="sparkops",
                       PASSWORD="db-secret-1", HOST="127.0.0.1", PORT=free_port())

    check = check_database(wrapper=wrapper)

    assert not check.ok
    assert check.reason.startswith("the database does not answer: ")
    assert f"port {wrapper.settings_dict['PORT']} failed" in check.reason
    assert "db-secret-1" not in check.reason and "sparkops" not in check.reason


def test_a_missing_sqlite_file_is_reported_and_not_created(tmp_path):
    path = tmp_path / "gone.sqlite3"
    check = check_database(wrapper=_wrapper(ENGINE="django.db.backends.sqlite3", NAME=str(path)))

    assert not check.ok and check.reason == f"the SQLite file {path} does not exist"
    assert not path.exists()


def test_an_sqlite_file_that_is_not_migrated_is_not_ready(tmp_path):
    path = tmp_path / "empty.sqlite3"
    path.write_bytes(b"")
    check = check_database(wrapper=_wrapper(ENGINE="django.db.backends.sqlite3", NAME=str(path)))

    assert not check.ok and "no such table: django_migrations" in check.reason


def test_readiness_does_not_read_collections_from_a_database_that_is_down(this_node,
                                                                          monkeypatch):
    _collect(this_node, ago=1)
    down = _wrapper(ENGINE="django.db.backends.sqlite3", NAME="/nonexistent/db.sqlite3")
    monkeypatch.setattr("collectors.health.check_database", lambda: check_database(wrapper=down))

    result = readiness()

    assert not result.ok
    assert [check.name for check in result.failed()] == ["database", "collection"]
    assert result.failed()[1].reason == "unknown: the database does not answer"


@pytest.mark.slow
def test_postgresql_answers_once_it_is_migrated(postgres_url):
    import dj_database_url

    url = fresh_database(postgres_url, "ready")
    wrapper = _wrapper(**dj_database_url.parse(url))

    empty = check_database(wrapper=wrapper)
    assert not empty.ok and 'relation "django_migrations" does not exist' in empty.reason

    with psycopg.connect(url, autocommit=True) as database:
        database.execute("CREATE TABLE django_migrations (app text, name text)")
        database.execute("INSERT INTO django_migrations VALUES ('collectors', '0001_initial')")
    migrated = check_database(wrapper=wrapper)
    assert migrated.ok, migrated.reason
    assert migrated.reason == "the database answers (1 migrations applied)"


def test_urls_and_databases_are_described_with_their_passwords_masked():
    assert mask_url("redis://:s3cret@redis:6379/0") == "redis://:•••@redis:6379/0"
    assert mask_url("redis://redis:6379/0") == "redis://redis:6379/0"
    assert describe_database({"ENGINE": "django.db.backends.postgresql", "NAME": "ops",
                              "USER": "u", "PASSWORD": "p", "HOST": "db", "PORT": 5432}) == \
        "PostgreSQL postgresql://u:•••@db:5432/ops"
    assert describe_database({"ENGINE": "django.db.backends.sqlite3", "NAME": "/d/s.sqlite3"}) \
        == "SQLite /d/s.sqlite3"
