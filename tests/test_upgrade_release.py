"""An installation of the previous release (0.1.0) upgrades as docs/DEPLOY.md says, and keeps
every row.

The upgrade, done as an admin does it, with real processes: stop (``status`` says nothing runs),
``bin/sparkops backup``, take the new release (this tree), ``manage.py migrate``, ``bin/sparkops
start`` (serves ``/healthz``; ``/readyz`` says the old collection is stale; ``status`` names the
running processes; ``restore`` is refused while they run), stop. Then every row of every table
of 0.1.0 is compared, table by table and row by row, in the columns 0.1.0 had (its raw samples,
a row per figure then, with the figures of the readings that hold them now). Restoring the
pre-upgrade backup brings the same rows back (and migrates them: the backup is older), and a
backup of the upgraded database restores to exactly the same data.

SQLite starts from ``tests/fixtures/releases/sparkops-0.1.0.sqlite3`` (made by 0.1.0's own code:
``make_release_db.py`` beside it); PostgreSQL from a database that script fills with 0.1.0's
code taken from git (``git archive cc9d0b2``).

The stack runs without beat: nothing is scheduled, so nothing but the upgrade may change a row
(a roll-up or a pruning would, rightly, and is not what is tested here).
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
import requests

from collectors.readings import ENGINE, HOST
from sparkops.testing.ports import free_port, wait_for_port
from sparkops.testing.postgres import fresh_database
from sparkops.version import VERSION
from tests.conftest import PROJECT, subprocess_env
from tests.processes import stop_group

RELEASES = PROJECT / "tests" / "fixtures" / "releases"
FIXTURE = RELEASES / "sparkops-0.1.0.sqlite3"
MAKE = RELEASES / "make_release_db.py"
NODE = "spark-old"
ADMIN_PASSWORD = "release-0.1.0-admin-password"
Snapshot = dict[str, tuple[list[str], Counter]]


# --- reading every table --------------------------------------------------------------------------


def _value(value: object) -> object:
    return json.dumps(value, sort_keys=True) if isinstance(value, dict | list) else value


def sqlite_snapshot(path: Path) -> Snapshot:
    """Every table: its columns and its rows (as a multiset of tuples)."""
    with sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True) as db:
        tables = [row[0] for row in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
        snapshot = {}
        for table in tables:
            columns = [row[1] for row in db.execute(f'PRAGMA table_info("{table}")')]
            rows = db.execute(f'SELECT * FROM "{table}"').fetchall()
            snapshot[table] = (columns, Counter(tuple(row) for row in rows))
    return snapshot


def postgres_snapshot(url: str) -> Snapshot:
    with psycopg.connect(url) as db:
        tables = [row[0] for row in db.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' "
            "AND table_type = 'BASE TABLE'")]
        snapshot = {}
        for table in tables:
            columns = [row[0] for row in db.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = "
                "'public' AND table_name = %s ORDER BY ordinal_position", (table,))]
            rows = db.execute(f'SELECT * FROM "{table}"').fetchall()
            snapshot[table] = (columns, Counter(tuple(map(_value, row)) for row in rows))
    return snapshot


# Raw samples that 0.1.0 kept a row per figure and this release keeps a reading (a row) per
# collection, a column per metric (collectors.readings): their rows are compared with the figures
# the readings hold, a row per figure again, in the columns 0.1.0 had but the row id.
UNFOLDED = {"collectors_sample": ("collectors_hostreading", "node_id", HOST),
            "collectors_enginesample": ("collectors_enginereading", "engine_id", ENGINE)}


def unfolded(snapshot: Snapshot, table: str) -> tuple[list[str], Counter] | None:
    """The figures of the readings that hold what 0.1.0's ``table`` held, as its rows."""
    source, owner, layout = UNFOLDED[table]
    if source not in snapshot:
        return None
    columns, rows = snapshot[source]
    figures: Counter = Counter()
    for row, count in rows.items():
        reading = dict(zip(columns, row, strict=True))
        notes = json.loads(reading["notes"])
        for metric in layout.metrics:
            value, note = reading[layout.column(metric)], notes.get(str(int(metric)))
            if value is not None or note is not None:
                at = reading[layout.time(metric)] or reading["at"]
                figures[(reading[owner], int(metric), at, value, note or "")] += count
    return [owner, "metric", "at", "value", "note"], figures


# What the node's own worker reads from the machine and writes again when it starts (it
# registers its node, collectors.registration): these move on purpose, the rest must not.
REREAD_AT_START = {"collectors_node": {"hostname", "mem_total_bytes"}}


def _projection(rows: Counter, positions: list[int]) -> Counter:
    """``rows`` cut down to the columns at ``positions``, rows that become equal counted
    together."""
    projected: Counter = Counter()
    for row, count in rows.items():
        projected[tuple(row[i] for i in positions)] += count
    return projected


def lost_rows(before: Snapshot, after: Snapshot) -> list[str]:
    """Every row of ``before`` that ``after`` no longer has with the same values in the columns
    ``before`` had (rows and columns ``after`` added are fine; the columns of
    :data:`REREAD_AT_START` are not compared), as readable lines."""
    lost = []
    for table, (all_columns, all_rows) in sorted(before.items()):
        reread = REREAD_AT_START.get(table, set())
        if table in UNFOLDED:
            reread = reread | {"id"}
        kept = [i for i, column in enumerate(all_columns) if column not in reread]
        columns = [all_columns[i] for i in kept]
        rows = _projection(all_rows, kept)
        now = after.get(table) or (unfolded(after, table) if table in UNFOLDED else None)
        if now is None:
            lost.append(f"{table}: the table is gone ({sum(rows.values())} rows)")
            continue
        now_columns, now_rows = now
        missing = [column for column in columns if column not in now_columns]
        if missing:
            lost.append(f"{table}: columns gone: {missing}")
            continue
        positions = [now_columns.index(column) for column in columns]
        projected = _projection(now_rows, positions)
        for row in (rows - projected).elements():
            lost.append(f"{table}: {dict(zip(columns, row, strict=True))}")
    return lost


def newer_migrations() -> set[tuple[str, str]]:
    """This tree's migrations that 0.1.0 had not applied."""
    from django.db.migrations.loader import MigrationLoader

    released = {(row[1], row[2]) for row in sqlite_snapshot(FIXTURE)["django_migrations"][1]}
    return set(MigrationLoader(None, ignore_no_migrations=True).disk_migrations) - released


def test_the_release_fixture_has_rows_in_every_table_and_stays_small():
    snapshot = sqlite_snapshot(FIXTURE)
    assert len(snapshot) >= 35
    assert [table for table, (_, rows) in snapshot.items() if not rows] == []
    assert FIXTURE.stat().st_size < 1024 * 1024
    names = {row[2] for row in snapshot["django_migrations"][1]}
    assert "0009_spec_tokens_per_step" in names and "0005_move_models_to_domain_apps" in names


def test_the_comparison_finds_a_changed_value_a_lost_row_and_a_lost_column():
    before = {"t": (["id", "v"], Counter({(1, "a"): 1, (2, "b"): 1}))}
    assert lost_rows(before, {"t": (["id", "v", "new"], Counter({(1, "a", 0): 1,
                                                                 (2, "b", 0): 1}))}) == []
    assert lost_rows(before, {"t": (["id", "v"], Counter({(1, "a"): 1, (2, "B"): 1}))}) == [
        "t: {'id': 2, 'v': 'b'}"]
    assert lost_rows(before, {"t": (["id", "v"], Counter({(1, "a"): 1}))}) == [
        "t: {'id': 2, 'v': 'b'}"]
    assert lost_rows(before, {"t": (["id"], Counter({(1,): 1, (2,): 1}))}) == [
        "t: columns gone: ['v']"]
    assert lost_rows(before, {}) == ["t: the table is gone (2 rows)"]



def test_raw_samples_are_compared_with_the_figures_their_readings_hold():
    before = {"collectors_sample": (["id", "node_id", "metric", "at", "value", "note"], Counter({
        (7, 1, 3, "t1", 5.0, ""): 1, (8, 1, 15, "t1", None, "no PSI"): 1,
        (9, 1, 4, "t0", 4.0, ""): 1}))}
    columns = ["id", "node_id", "at", "notes", *(HOST.column(m) for m in HOST.metrics),
               *HOST.timed.values()]

    def reading(notes: str, **figures) -> Snapshot:
        row = {column: None for column in columns} | {"id": 1, "node_id": 1, "at": "t1",
                                                      "notes": notes} | figures
        return {"collectors_hostreading": (columns, Counter({tuple(row.values()): 1}))}

    whole = reading('{"15": "no PSI"}', mem_available=5.0, mem_available_min=4.0,
                    mem_available_min_at="t0")
    assert lost_rows(before, whole) == []
    assert lost_rows(before, reading('{"15": "no PSI"}', mem_available=5.0,
                                     mem_available_min=4.0)) == [
        "collectors_sample: {'node_id': 1, 'metric': 4, 'at': 't0', 'value': 4.0, 'note': ''}"]
    assert lost_rows(before, reading("{}", mem_available=5.0, mem_available_min=4.0,
                                     mem_available_min_at="t0")) == [
        "collectors_sample: {'node_id': 1, 'metric': 15, 'at': 't1', 'value': None, "
        "'note': 'no PSI'}"]

# --- the admin's commands -------------------------------------------------------------------------


def _sparkops(env: dict[str, str], *args: str, expect: int = 0) -> str:
    result = subprocess.run([str(PROJECT / "bin" / "sparkops"), *args], cwd=PROJECT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == expect, result.stdout + result.stderr
    return result.stdout + result.stderr


def _manage(env: dict[str, str], *args: str) -> str:
    result = subprocess.run([sys.executable, "manage.py", *args], cwd=PROJECT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@contextmanager
def running_stack(env: dict[str, str], log: Path) -> Iterator[str]:
    """``bin/sparkops start --no-beat``; yields its base URL; stops it, whatever happens."""
    port = free_port()
    env = {**env, "SPARKOPS_BIND": f"127.0.0.1:{port}"}
    with log.open("w") as output:
        process = subprocess.Popen([str(PROJECT / "bin" / "sparkops"), "start", "--no-beat"],
                                   env=env, stdout=output, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        wait_for_port(port, timeout=120)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_group(process)


def _upgrade(env: dict[str, str], data: Path, tmp_path: Path) -> Path:
    """The documented upgrade, checking each step; returns the pre-upgrade backup."""
    # 1. Stopped: nothing runs, and the old node's collection is long stale.
    stopped = _sparkops(env, "status", expect=1)
    assert "stack:      not running" in stopped
    assert "delivery:   last at 2026-11-01 03:00:02 UTC" in stopped
    assert "firing to ops (email)" in stopped
    # 2. Backup.
    backed_up = _sparkops(env, "backup")
    backup = Path(re.search(r" to (\S+) \(", backed_up).group(1))
    assert backup.parent == data
    # 3. The new release's code is this tree; migrate.
    _manage(env, "migrate", "--noinput")
    # 4. Start, and look.
    with running_stack(env, tmp_path / "stack.log") as base:
        health = requests.get(f"{base}/healthz", timeout=10)
        assert health.status_code == 200 and health.json() == {"status": "ok",
                                                               "version": VERSION}
        ready = requests.get(f"{base}/readyz", timeout=30)
        assert ready.status_code == 503
        checks = ready.json()["checks"]
        assert checks["database"]["ok"] and checks["broker"]["ok"]
        assert not checks["collection"]["ok"]
        assert checks["collection"]["reason"].startswith(
            f"the last successful collection of node {NODE} is ")
        assert checks["collection"]["age_seconds"] > 86400
        assert requests.get(f"{base}/login/", timeout=10).status_code == 200

        running = _sparkops(env, "status", expect=1)
        # The default stack: one process, the web server in a thread of the worker's.
        assert re.search(r"stack:      running, stack \(web, worker[^)]*, one process\) "
                         r"pid \d+ since ", running), running
        refused = _sparkops(env, "restore", str(backup), expect=1)
        assert "CommandError: restore refused: the stack runs (one process, pid " in refused
    log = (tmp_path / "stack.log").read_text()
    assert f"SparkOps {VERSION} is starting on " in log
    return backup


def _password_still_works(env: dict[str, str]) -> None:
    code = ("from django.contrib.auth.hashers import check_password; "
            "from django.contrib.auth.models import User; "
            f"print(check_password({ADMIN_PASSWORD!r}, User.objects.get(username='admin')"
            ".password))")
    assert _manage(env, "shell", "-c", code).strip().splitlines()[-1] == "True"


def _restore_and_round_trip(env: dict[str, str], backup: Path, before: Snapshot,
                            snapshot, tmp_path: Path, suffix: str) -> None:
    restored = _sparkops(env, "restore", str(backup))
    newer = newer_migrations()
    if newer:  # this release has migrations 0.1.0 did not: the restore applies them
        assert f"The backup is from an older release: applying {len(newer)} migration" \
            in restored
    else:
        assert "older release" not in restored
    assert lost_rows(before, snapshot()) == []

    upgraded = snapshot()
    copy = tmp_path / f"upgraded{suffix}"
    _sparkops(env, "backup", str(copy))
    _manage(env, "shell", "-c", "from collectors.models import Node; "
                                "Node.objects.all().delete()")
    assert snapshot() != upgraded
    again = _sparkops(env, "restore", str(copy))
    assert "older release" not in again
    assert snapshot() == upgraded


@pytest.mark.slow
def test_an_installation_of_the_previous_release_upgrades_on_sqlite(tmp_path):
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    database = data / "sparkops.sqlite3"
    shutil.copyfile(FIXTURE, database)
    database.chmod(0o600)
    before = sqlite_snapshot(database)
    env = subprocess_env(SPARKOPS_DATA_DIR=str(data), SPARKOPS_NODE_NAME=NODE,
                         SPARKOPS_TIME_ZONE="UTC")

    backup = _upgrade(env, data, tmp_path)

    assert lost_rows(before, sqlite_snapshot(backup)) == []  # the backup holds all of it
    assert lost_rows(before, sqlite_snapshot(database)) == []
    assert "collectors_node" in sqlite_snapshot(database)
    _password_still_works(env)
    _restore_and_round_trip(env, backup, before, lambda: sqlite_snapshot(database), tmp_path,
                            ".sqlite3")


@pytest.mark.slow
def test_an_installation_of_the_previous_release_upgrades_on_postgresql(tmp_path,
                                                                        postgres_url):
    url = fresh_database(postgres_url, "release")
    made = subprocess.run([sys.executable, str(MAKE), "--database-url", url], cwd=PROJECT,
                          env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stdout + made.stderr
    before = postgres_snapshot(url)
    assert [table for table, (_, rows) in before.items() if not rows] == []
    assert set(before) == set(sqlite_snapshot(FIXTURE))  # the same tables as the fixture's
    data = tmp_path / "data"
    env = subprocess_env(SPARKOPS_DATA_DIR=str(data), SPARKOPS_NODE_NAME=NODE,
                         SPARKOPS_TIME_ZONE="UTC", DATABASE_URL=url)

    backup = _upgrade(env, data, tmp_path)

    assert backup.suffix == ".pgdump"
    assert lost_rows(before, postgres_snapshot(url)) == []
    _password_still_works(env)
    _restore_and_round_trip(env, backup, before, lambda: postgres_snapshot(url), tmp_path,
                            ".pgdump")
