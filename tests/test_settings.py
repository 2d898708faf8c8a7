import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from sparkops.celery import beat_schedule
from sparkops.env import env_bool, env_float, env_int, env_list
from tests.conftest import PROJECT, subprocess_env


def test_beat_routes_each_collection_to_its_own_node_queue_and_expires_it():
    schedule = beat_schedule(["spark-a", "spark-b"], 5.0)

    entry = schedule["collect-host-memory:spark-b"]
    assert entry["task"] == "collectors.tasks.collect_host_memory"
    assert entry["args"] == ("spark-b",)
    assert entry["options"] == {"queue": "node.spark-b", "expires": 5.0}
    assert schedule["prune-samples"]["options"]["queue"] == "sparkops"


@pytest.mark.parametrize(("reader", "value", "message"), [
    (lambda: env_float("X_INTERVAL", 5.0), "5s", "X_INTERVAL='5s': expected a number"),
    (lambda: env_int("X_INTERVAL", 5), "2.5", "expected a whole number"),
    (lambda: env_int("X_INTERVAL", 5, minimum=1), "0", "must be at least 1"),
    (lambda: env_bool("X_INTERVAL", False), "maybe", "expected one of"),
    (lambda: env_float("X_INTERVAL", 5.0), "nan", "finite"),
])
def test_malformed_environment_names_the_variable(monkeypatch, reader, value, message):
    monkeypatch.setenv("X_INTERVAL", value)

    with pytest.raises(ImproperlyConfigured, match=message):
        reader()


def test_env_list_and_defaults(monkeypatch):
    monkeypatch.setenv("X_HOSTS", " a, b ,,c ")
    assert env_list("X_HOSTS", []) == ["a", "b", "c"]
    monkeypatch.delenv("X_HOSTS")
    assert env_list("X_HOSTS", ["d"]) == ["d"]


def test_wrong_node_task_is_refused(settings):
    from collectors.tasks import WrongNodeError, collect_host_memory

    settings.SPARKOPS_NODE_NAME = "spark-a"
    with pytest.raises(WrongNodeError, match="node.<its name>"):
        collect_host_memory("spark-b")


PRODUCTION = {
    "SPARKOPS_HTTPS": "1",
    "SPARKOPS_DEBUG": "0",
    "SPARKOPS_SECRET_KEY": "k" * 20 + "production-secret-key-with-enough-entropy-1234567890",
    "SPARKOPS_ALLOWED_HOSTS": "sparkops.example.com",
}


def _deploy_check(tmp_path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=PROJECT, env=subprocess_env(SPARKOPS_DATA_DIR=str(tmp_path), **env),
        capture_output=True, text=True, timeout=120,
    )


@pytest.mark.slow
def test_deploy_checks_report_nothing_with_production_settings(tmp_path):
    """`manage.py check --deploy` is clean once HTTPS and a real secret key are configured."""
    result = _deploy_check(tmp_path, **PRODUCTION)

    assert result.returncode == 0, result.stderr + result.stdout
    assert "System check identified no issues (0 silenced)." in result.stdout


@pytest.mark.slow
def test_deploy_checks_do_report_a_site_without_https(tmp_path):
    """The check above can fail: without HTTPS, Django names the missing protections."""
    result = _deploy_check(tmp_path, **{**PRODUCTION, "SPARKOPS_HTTPS": "0"})

    assert result.returncode != 0
    assert "security.W004" in result.stderr and "security.W012" in result.stderr


@pytest.mark.slow
def test_malformed_setting_stops_startup_with_its_name(tmp_path):
    env = subprocess_env(SPARKOPS_DATA_DIR=str(tmp_path), SPARKOPS_COLLECT_INTERVAL="5s")
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=PROJECT, env=env,
                            capture_output=True, text=True)

    assert result.returncode != 0
    assert "SPARKOPS_COLLECT_INTERVAL='5s': expected a number" in result.stderr


def test_a_sqlite_connection_is_kept_with_a_small_page_cache_in_wal_mode(tmp_path):
    # A fresh process on a file database, as the stack opens it: the PRAGMAs of every
    # connection, and how long it is kept.
    script = ("from django.db import connection; c = connection.cursor(); "
              "print(c.execute('PRAGMA journal_mode').fetchone()[0], "
              "c.execute('PRAGMA cache_size').fetchone()[0], "
              "c.execute('PRAGMA synchronous').fetchone()[0], "
              "connection.settings_dict['CONN_MAX_AGE'])")
    env = subprocess_env(SPARKOPS_DATA_DIR=str(tmp_path),
                         DJANGO_SETTINGS_MODULE="sparkops.settings")
    env.pop("DATABASE_URL", None)
    result = subprocess.run([sys.executable, "-c", f"import django; django.setup(); {script}"],
                            cwd=PROJECT, env=env, capture_output=True, text=True, check=True)
    # WAL; 1 MiB of cache (negative: KiB); synchronous NORMAL (1); kept a minute.
    assert result.stdout.split() == ["wal", "-1024", "1", "60"]
