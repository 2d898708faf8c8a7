"""The small shared world of the test suite: a node, procfs fixture trees, a logged-in client,
and throwaway Redis and PostgreSQL servers started from the real Debian binaries."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from collectors.models import Node
from collectors.procfs import Procfs
from sparkops.testing.ports import free_port, wait_for_port
from sparkops.testing.postgres import fresh_database, pg_bin, postgres_server

# Shared fixtures that live in their own harness modules: a real browser, a real container engine
# and memory budgets for its containers.
from tests.browser import browser, page  # noqa: E402,F401
from tests.containers import (  # noqa: E402,F401
    docker_host,
    memory_budget,
    remove_started_containers,
)

FIXTURES = Path(__file__).parent / "fixtures"
PROJECT = Path(__file__).resolve().parent.parent
GIB = 1024**3


@pytest.fixture(autouse=True)
def _plain_static_storage(settings) -> None:
    # The manifest storage needs `collectstatic`; tests render templates without running it.
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }


@pytest.fixture(autouse=True)
def _fast_password_hasher(settings) -> None:
    # PBKDF2 at Django's 1,000,000 iterations costs about 0.3 s per login or password set, and
    # the login tests make dozens; what they check is the lockout, not the hash. Processes that
    # the tests start (manage.py, the stack) keep the production hashers.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _remove_the_tests_containers() -> Iterator[None]:
    # A test's containers are removed when it ends, passed or failed: engines left running
    # would be the next test's neighbours, in its ledger and its discovery.
    yield
    remove_started_containers()


@pytest.fixture(autouse=True)
def _sparkops_stays_the_current_celery_app() -> Iterator[None]:
    # A task's ``delay()`` goes through Celery's *current* app, and ``Celery(...)`` makes each
    # new app current unless told ``set_as_current=False``: a probe app a test made for a
    # fleet's broker would take every later test's tasks in this process to that broker, past
    # ``task_always_eager``. The test that does so fails here, by name.
    from celery import current_app

    from sparkops.celery import app

    yield
    leaked = current_app._get_current_object()
    if leaked is not app:
        app.set_current()
        pytest.fail(f"the test left Celery app {leaked.main!r} current: create it with "
                    "set_as_current=False", pytrace=False)


@pytest.fixture(autouse=True)
def _no_settled_chart_rows_from_another_test() -> None:
    # Charts keep settled roll-up rows per process (dashboard.settled); a rolled-back test's
    # node or engine ids are the next test's, with other rows behind them.
    from dashboard.settled import settled_rows

    settled_rows.clear()


SEED_MIGRATION = "collectors.migrations.0012_seed_model_architectures"


@pytest.fixture(autouse=True)
def _seeded_model_architectures(request) -> None:
    # The table of model architectures is seeded by a data migration, and a transactional
    # test's flush empties every table for the tests after it: a test with the database sees
    # the table as a fresh installation has it, seeded by that same migration.
    wants_db = request.node.get_closest_marker("django_db") is not None \
        or {"db", "transactional_db", "live_server"} & set(request.fixturenames)
    if not wants_db:
        return
    request.getfixturevalue("db")
    from django.apps import apps

    from collectors.models import ModelArchitecture

    if not ModelArchitecture.objects.exists():
        importlib.import_module(SEED_MIGRATION).seed_model_architectures(apps, None)


@pytest.fixture
def node(db) -> Node:
    return Node.objects.create(
        name="spark-a", hostname="spark-a", mem_total_bytes=int(121.69 * GIB)
    )


@pytest.fixture
def procfs_tree(tmp_path: Path):
    """Build a procfs root from a meminfo text (and optional PSI text)."""

    def build(meminfo: str | None, pressure: str | None = None) -> Procfs:
        root = tmp_path / f"proc-{uuid.uuid4().hex[:6]}"
        (root / "pressure").mkdir(parents=True)
        if meminfo is not None:
            (root / "meminfo").write_text(meminfo)
        if pressure is not None:
            (root / "pressure" / "memory").write_text(pressure)
        return Procfs(root)

    return build


@pytest.fixture
def admin_client(client, django_user_model):
    user = django_user_model.objects.create_superuser("admin", "", "a-long-test-password")
    client.force_login(user)
    return client


def subprocess_env(**extra: str) -> dict[str, str]:
    """This environment for a child process, minus what only the test process may have."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_ALLOW_ASYNC_UNSAFE"}
    return {**env, **extra}


def rerun_on_postgresql(test_file: str, postgres_url: str, data_dir: Path) -> None:
    """Run ``test_file``'s tests that are not slow again, in a process of their own on a fresh
    PostgreSQL database of the cluster ``postgres_url``; skipped when this run is on PostgreSQL
    already. Fails with the child's output unless every test passed and none was skipped."""
    from django.db import connection

    if connection.vendor == "postgresql":
        pytest.skip("this run is on PostgreSQL already: the tests above ran there")
    env = subprocess_env(DATABASE_URL=fresh_database(postgres_url, Path(test_file).stem),
                         SPARKOPS_DATA_DIR=str(data_dir))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-p", "no:xdist", "-m", "not slow", test_file], cwd=PROJECT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "skipped" not in run.stdout


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory) -> Iterator[str]:
    """A private redis-server on a free loopback port, nothing kept on disk."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed (Debian package redis-server)")
    port = free_port()
    workdir = tmp_path_factory.mktemp("redis")
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(workdir)],
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A private PostgreSQL cluster (:func:`sparkops.testing.postgres.postgres_server`) for the
    whole session; the test fails, naming the Debian package, if the binaries are missing."""
    try:
        pg_bin("initdb")
    except RuntimeError as error:
        pytest.fail(str(error))
    with postgres_server() as url:
        yield url


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--alone", choices=("with", "skip", "only"), default="with",
        help="tests marked alone (they judge the whole machine's free memory): run them with "
             "the others (default), leave them out (the side-by-side run of bin/sparkops "
             "test), or run only them (its second run, in one process)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep or leave out the tests marked ``alone`` (``--alone``); then the slow tests first,
    each group in its usual order: run side by side (pytest-xdist, one file to a worker), the
    long files then start at once and the many quick ones fill the gaps at the end, instead of
    a long file starting last and running by itself."""
    choice = config.getoption("--alone")
    if choice != "with":
        keep = choice == "only"
        deselected = [item for item in items if bool(item.get_closest_marker("alone")) != keep]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [item for item in items if bool(item.get_closest_marker("alone")) == keep]
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
