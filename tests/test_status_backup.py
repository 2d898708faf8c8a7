"""``bin/sparkops status``, ``backup`` and ``restore``, and the supervisor's state file they read.

In-process: the state file read against ``/proc`` (live, gone and reused pids), the status
lines, a SQLite backup taken while another connection writes (one snapshot, 0600), what counts
as a SparkOps backup, and restore's refusals. Slow: the commands themselves through
``bin/sparkops`` on SQLite and on PostgreSQL (a private cluster), ``pg_dump`` without the
password on its command line, and the supervisor writing and removing its state file.

An upgrade from the previous release, with the stack started in between, is
``tests/test_upgrade_release.py``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from collectors.models import Collection, Node
from dashboard.notify.models import Channel, Notification
from dashboard.status import status_report
from sparkops import backup as backups
from sparkops.stackstate import read_stack_state, running_reason, started_ticks
from sparkops.supervise import StateFile, process_entry
from sparkops.testing.postgres import fresh_database
from sparkops.timetext import age_text
from tests.conftest import PROJECT, subprocess_env

FIXTURE_0_1_0 = PROJECT / "tests" / "fixtures" / "releases" / "sparkops-0.1.0.sqlite3"
SUPERVISE = PROJECT / "sparkops" / "supervise.py"


def _write_state(data_dir: Path, supervisor: int, processes: dict[str, int],
                 ticks: dict[int, int | None] | None = None) -> None:
    ticks = ticks or {}

    def entry(name: str, pid: int) -> dict:
        return {"name": name, "pid": pid, "started_at": "2026-12-01T03:00:00+00:00",
                "started_ticks": ticks.get(pid, started_ticks(pid)), "restarts": 0}

    (data_dir / "stack-state.json").write_text(json.dumps({
        "supervisor": entry("supervisor", supervisor),
        "processes": [entry(name, pid) for name, pid in processes.items()]}))


def _gone_pid() -> int:
    """A pid no process has now (searched from the top, where new pids come last)."""
    top = int(Path("/proc/sys/kernel/pid_max").read_text())
    return next(pid for pid in range(top - 1, 1, -1) if not Path(f"/proc/{pid}").exists())


# --- the state file -------------------------------------------------------------------------------


def test_the_state_file_is_read_against_proc(tmp_path):
    me, gone = os.getpid(), _gone_pid()
    _write_state(tmp_path, me, {"web": me, "worker": gone})

    state = read_stack_state(tmp_path)

    assert state.running
    assert [(p.name, p.alive) for p in state.processes] == [("web", True), ("worker", False)]
    assert state.supervisor.started_at == datetime(2026, 12, 1, 3, 0, tzinfo=UTC)


def test_a_pid_taken_by_another_process_does_not_count(tmp_path):
    me = os.getpid()
    _write_state(tmp_path, me, {}, ticks={me: started_ticks(me) - 1})
    assert not read_stack_state(tmp_path).running


def test_no_state_file_or_a_broken_one_means_nothing_runs(tmp_path):
    assert read_stack_state(tmp_path).supervisor is None
    (tmp_path / "stack-state.json").write_text("{not json")
    assert not read_stack_state(tmp_path).running


def test_a_fresh_worker_heartbeat_counts_as_running_and_an_old_one_does_not(tmp_path):
    alive = tmp_path / "worker.alive"
    alive.touch()
    assert "a worker touched" in running_reason(tmp_path, liveness_timeout=60)
    old = time.time() - 120
    os.utime(alive, (old, old))
    assert running_reason(tmp_path, liveness_timeout=60) is None


# --- status ---------------------------------------------------------------------------------------


def test_age_text_reads_like_a_person_would_say_it():
    assert [age_text(s) for s in (4.6, 60, 200, 3600, 7500, 86400 * 3 + 3600 * 4)] == [
        "4 s", "1 min", "3 min 20 s", "1 h", "2 h 5 min", "3 d 4 h"]


@pytest.fixture
def status_world(db, settings, tmp_path):
    settings.DATA_DIR = tmp_path
    settings.TIME_ZONE = "Asia/Seoul"
    settings.SPARKOPS_COLLECT_INTERVAL = 5.0
    return Node.objects.create(name=settings.SPARKOPS_NODE_NAME)


def test_status_names_what_runs_the_last_collection_and_delivery(status_world, tmp_path):
    now = timezone.now()
    me, gone = os.getpid(), _gone_pid()
    _write_state(tmp_path, me, {"web": me, "worker": gone})
    at = now - timedelta(seconds=12)
    Collection.objects.create(node=status_world, at=at, window_started_at=at, ok=True)
    channel = Channel.objects.create(name="ops", kind="email", config={"to": ["o@example.com"]})
    Notification.objects.create(channel=channel, kind="firing", subject="s", text="t",
                                delivered_at=now - timedelta(minutes=5))
    Notification.objects.create(channel=channel, kind="resolved", subject="s", text="t")

    report = status_report(now)
    text = "\n".join(report.lines)

    assert report.ready
    assert report.lines[0].startswith("SparkOps 0.2.0 on node ")
    assert f"stack:      running, supervisor pid {me} since 2026-12-01 12:00:00 KST" in text
    assert f"web pid {me} since" in text and f"worker pid {gone} is gone" in text
    local = (at.astimezone(timezone.get_default_timezone())).strftime("%Y-%m-%d %H:%M:%S")
    assert f"collection: last at {local} KST (12 s ago), ok" in text
    assert "delivery:   last at " in text and "(5 min ago): firing to ops (email); 1 waiting" \
        in text
    assert report.lines[-1] == "ready:      yes (database, broker and collection hold)"


def _write_one_process_state(data_dir: Path) -> None:
    """The state file as the one-process stack writes it (``sparkops.onestack``)."""
    StateFile(str(data_dir / "stack-state.json")).write_entries(
        process_entry("stack (web, worker with beat, one process)", os.getpid(),
                      "2026-12-01T03:00:00+00:00", 0), [], layout="one-process")


def test_status_names_the_one_process_stack_and_restore_refuses_while_it_runs(status_world,
                                                                              tmp_path):
    _write_one_process_state(tmp_path)
    state = read_stack_state(tmp_path)
    text = "\n".join(status_report().lines)

    assert state.running and state.layout == "one-process" and state.processes == ()
    assert (f"stack:      running, stack (web, worker with beat, one process) pid {os.getpid()} "
            "since 2026-12-01 12:00:00 KST") in text
    with pytest.raises(backups.BackupError, match=r"^restore refused: the stack runs "
                                                  rf"\(one process, pid {os.getpid()}, "):
        backups.restore(FIXTURE_0_1_0, data_dir=tmp_path, liveness_timeout=60)
    # A state file of the processes layout (or of an older release) says nothing of its layout.
    _write_state(tmp_path, os.getpid(), {"web": os.getpid()})
    assert read_stack_state(tmp_path).layout == "processes"


def test_status_is_not_ready_with_the_reason_when_collection_stopped(status_world, tmp_path):
    me = os.getpid()
    _write_state(tmp_path, _gone_pid(), {"web": me})
    at = timezone.now() - timedelta(minutes=10)
    Collection.objects.create(node=status_world, at=at, window_started_at=at, ok=True)

    report = status_report()
    text = "\n".join(report.lines)

    assert not report.ready
    assert "which is gone: the stack was killed" in text
    assert "ready:      no\n            collection: the last successful collection" in text
    assert "delivery:   no notification delivered yet" in text


# --- backup ---------------------------------------------------------------------------------------


def _sqlite_database(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE pair (id INTEGER PRIMARY KEY, half INTEGER)")


def test_a_sqlite_backup_is_one_snapshot_while_another_connection_writes(tmp_path,
                                                                         monkeypatch):
    source = tmp_path / "live.sqlite3"
    _sqlite_database(source)
    monkeypatch.setattr(backups, "database_settings", lambda: {
        "ENGINE": "django.db.backends.sqlite3", "NAME": str(source)})
    stop, writing = threading.Event(), threading.Event()

    def write_pairs() -> None:  # every transaction adds two rows: a snapshot has an even count
        db = sqlite3.connect(source, timeout=20, isolation_level=None)
        try:
            while not stop.is_set():
                db.execute("BEGIN IMMEDIATE")
                db.execute("INSERT INTO pair (half) VALUES (0)")
                db.execute("INSERT INTO pair (half) VALUES (1)")
                db.execute("COMMIT")
                writing.set()
        finally:
            db.close()

    writer = threading.Thread(target=write_pairs)
    writer.start()
    assert writing.wait(timeout=30), "the writer never committed"
    counts = []
    try:
        for n in range(15):
            copy = backups.backup(tmp_path / f"copy-{n}.sqlite3")
            with sqlite3.connect(copy) as db:
                assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
                assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
                counts.append(db.execute("SELECT COUNT(*) FROM pair").fetchone()[0])
    finally:
        stop.set()
        writer.join()

    assert all(count % 2 == 0 for count in counts), counts
    assert counts[-1] > 0  # the writer really wrote meanwhile
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_backup_is_private_from_its_creation_and_never_overwrites(tmp_path, monkeypatch):
    source = tmp_path / "db.sqlite3"
    _sqlite_database(source)
    monkeypatch.setattr(backups, "database_settings", lambda: {
        "ENGINE": "django.db.backends.sqlite3", "NAME": str(source)})
    previous = os.umask(0)
    try:
        written = backups.backup(tmp_path / "copy.sqlite3")
    finally:
        os.umask(previous)

    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    with pytest.raises(backups.BackupError, match="exists already; name another file"):
        backups.backup(written)


def test_the_default_backup_name_is_in_the_data_directory_with_the_utc_time(tmp_path):
    at = datetime(2026, 12, 1, 12, 30, 5, tzinfo=UTC)
    assert backups.default_backup_path(tmp_path, at) == \
        tmp_path / "sparkops-backup-20261201T123005Z.sqlite3"


def test_only_a_sparkops_database_is_accepted_as_a_backup(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("not a database")
    other = tmp_path / "other.sqlite3"
    _sqlite_database(other)

    with pytest.raises(backups.BackupError, match="is not a SparkOps database: file is not a "):
        backups.sqlite_migrations(text)
    with pytest.raises(backups.BackupError, match="it has no django_migrations or "
                                                  "collectors_node table"):
        backups.sqlite_migrations(other)
    applied = backups.sqlite_migrations(FIXTURE_0_1_0)
    assert ("collectors", "0009_spec_tokens_per_step") in applied
    assert backups.unknown_migrations(applied) == []


def test_a_backup_from_a_newer_release_is_recognised(db):
    applied = {("collectors", "0001_initial"), ("collectors", "0999_from_the_future")}
    assert backups.unknown_migrations(applied) == ["collectors.0999_from_the_future"]


def test_restore_refuses_while_the_stack_runs(tmp_path):
    _write_state(tmp_path, os.getpid(), {})
    with pytest.raises(backups.BackupError, match=r"^restore refused: the stack runs "
                                                  rf"\(supervisor pid {os.getpid()}, "):
        backups.restore(FIXTURE_0_1_0, data_dir=tmp_path, liveness_timeout=60)


def test_pg_dump_gets_the_password_through_its_environment_only(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(backups.subprocess, "run", lambda argv, **kw: calls.append(
        (argv, kw["env"])) or subprocess.CompletedProcess(argv, 0, "", ""))
    monkeypatch.setattr(backups, "database_settings", lambda: {
        "ENGINE": "django.db.backends.postgresql", "NAME": "ops", "USER": "sparkops",
        "PASSWORD": "pg-secret-7", "HOST": "db.example", "PORT": 5433,
        "OPTIONS": {"sslmode": "require"}})

    backups.backup(tmp_path / "ops.pgdump")

    (argv, env), = calls
    assert Path(argv[0]).name == "pg_dump" and "--format=custom" in argv
    assert not any("pg-secret-7" in word or "db.example" in word for word in argv)
    assert (env["PGPASSWORD"], env["PGHOST"], env["PGPORT"], env["PGUSER"], env["PGDATABASE"],
            env["PGSSLMODE"]) == ("pg-secret-7", "db.example", "5433", "sparkops", "ops",
                                  "require")


# --- the commands, for real -----------------------------------------------------------------------


def _command(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([str(PROJECT / "bin" / "sparkops"), *args], cwd=PROJECT, env=env,
                            capture_output=True, text=True, timeout=300)
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


def _manage(env: dict[str, str], *args: str) -> str:
    result = subprocess.run([sys.executable, "manage.py", *args], cwd=PROJECT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


NODES = "from collectors.models import Node; print(sorted(Node.objects.values_list('name', " \
        "flat=True)))"


def _nodes(env: dict[str, str]) -> str:
    return _manage(env, "shell", "-c", NODES).strip().splitlines()[-1]


def _round_trip(env: dict[str, str], data: Path, suffix: str) -> None:
    """backup (default name and a named file), change the data, restore, and see it back."""
    _manage(env, "migrate", "--noinput", "-v", "0")
    _manage(env, "shell", "-c", "from collectors.models import Node; "
                                "Node.objects.create(name='kept')")

    default = _command(env, "backup")
    written = Path(re.search(r" to (\S+) \(", default.stdout).group(1))
    assert written.parent == data and re.fullmatch(
        rf"sparkops-backup-\d{{8}}T\d{{6}}Z{re.escape(suffix)}", written.name)
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    named = data.parent / f"named{suffix}"
    _command(env, "backup", str(named))
    again = _command(env, "backup", str(named), check=False)
    assert again.returncode == 1 and "exists already" in again.stderr

    _manage(env, "shell", "-c", "from collectors.models import Node; "
                                "Node.objects.filter(name='kept').delete(); "
                                "Node.objects.create(name='later')")
    assert _nodes(env) == "['later']"

    restored = _command(env, "restore", str(named))
    assert "The replaced database is kept in " in restored.stdout
    assert _nodes(env) == "['kept']"
    kept = Path(re.search(r"kept in (\S+)\.\n", restored.stdout).group(1))
    assert kept.name.startswith("sparkops-before-restore-") and kept.name.endswith(suffix)
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600

    refused = _command(env, "restore", str(data / "nothing-here"), check=False)
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1] == \
        f"CommandError: {data / 'nothing-here'} does not exist"


@pytest.mark.slow
def test_backup_and_restore_on_sqlite(tmp_path):
    data = tmp_path / "data"
    env = subprocess_env(SPARKOPS_DATA_DIR=str(data), SPARKOPS_NODE_NAME="backup-test")
    _round_trip(env, data, ".sqlite3")
    assert not Path(f"{data / 'sparkops.sqlite3'}-wal").exists() or \
        Path(f"{data / 'sparkops.sqlite3'}-wal").stat().st_size == 0


@pytest.mark.slow
def test_backup_and_restore_on_postgresql(tmp_path, postgres_url):
    data = tmp_path / "data"
    env = subprocess_env(SPARKOPS_DATA_DIR=str(data), SPARKOPS_NODE_NAME="backup-test",
                         DATABASE_URL=fresh_database(postgres_url, "backup"))
    _round_trip(env, data, ".pgdump")
    assert next(data.glob("sparkops-backup-*.pgdump")).read_bytes()[:5] == b"PGDMP"


@pytest.mark.slow
def test_restore_refuses_a_backup_of_a_newer_release_and_leaves_the_database(tmp_path):
    data = tmp_path / "data"
    env = subprocess_env(SPARKOPS_DATA_DIR=str(data), SPARKOPS_NODE_NAME="backup-test")
    _manage(env, "migrate", "--noinput", "-v", "0")
    newer = tmp_path / "newer.sqlite3"
    newer.write_bytes(FIXTURE_0_1_0.read_bytes())
    with sqlite3.connect(newer) as db:
        db.execute("INSERT INTO django_migrations (app, name, applied) "
                   "VALUES ('collectors', '0999_from_the_future', '2027-01-01')")
    before = (data / "sparkops.sqlite3").read_bytes()

    refused = _command(env, "restore", str(newer), check=False)

    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1] == (
        f"CommandError: {newer} was made by a newer SparkOps: this release does not know its "
        "migrations collectors.0999_from_the_future")
    assert (data / "sparkops.sqlite3").read_bytes() == before
    assert not list(data.glob("sparkops-before-restore-*"))


@pytest.mark.slow
def test_the_supervisor_keeps_its_state_file_while_it_runs_and_removes_it(tmp_path):
    state, beat = tmp_path / "stack-state.json", tmp_path / "alive"
    spec = {"state": str(state), "processes": [
        {"name": "web", "argv": [sys.executable, "-c", "import time; time.sleep(60)"],
         "env": {}},
        {"name": "worker", "env": {}, "heartbeat": {"path": str(beat), "timeout": 30},
         "argv": [sys.executable, "-c", f"import pathlib, time; pathlib.Path({str(beat)!r})"
                                        ".touch(); time.sleep(60)"]}]}
    supervisor = subprocess.Popen([sys.executable, "-P", str(SUPERVISE), json.dumps(spec)],
                                  start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not (state.exists() and beat.exists()):
            assert time.monotonic() < deadline, "no state file within 30 s"
            time.sleep(0.1)
        assert stat.S_IMODE(state.stat().st_mode) == 0o600
        running = read_stack_state(tmp_path)
        assert running.running and running.supervisor.pid == supervisor.pid
        assert [(p.name, p.alive, p.restarts) for p in running.processes] == [
            ("web", True, 0), ("worker", True, 0)]
        assert running_reason(tmp_path, 60).startswith(
            f"the stack runs (supervisor pid {supervisor.pid}, ")

        supervisor.terminate()
        assert supervisor.wait(timeout=30) == 0
    finally:
        if supervisor.poll() is None:
            os.killpg(supervisor.pid, signal.SIGKILL)  # its children too
            supervisor.wait()
    assert not state.exists() and not beat.exists()
    assert running_reason(tmp_path, 60) is None


@pytest.mark.slow
def test_a_backup_of_an_older_schema_is_migrated_on_restore(tmp_path):
    data = tmp_path / "data"
    env = subprocess_env(SPARKOPS_DATA_DIR=str(data), SPARKOPS_NODE_NAME="backup-test")
    _manage(env, "migrate", "--noinput", "-v", "0")
    # One migration short of the newest: a backup of the release before it.
    *_, previous, newest = sorted(path.stem for path in
                                  (PROJECT / "collectors" / "migrations").glob("0*.py"))
    _manage(env, "migrate", "collectors", previous, "-v", "0")
    older = data.parent / "older.sqlite3"
    _command(env, "backup", str(older))
    _manage(env, "migrate", "--noinput", "-v", "0")

    restored = _command(env, "restore", str(older))

    assert "The backup is from an older release: applying 1 migration." in restored.stdout
    with sqlite3.connect(data / "sparkops.sqlite3") as db:
        assert db.execute("SELECT COUNT(*) FROM django_migrations WHERE app = 'collectors' AND "
                          "name = ?", (newest,)).fetchone()[0] == 1


CRASHED_WRITER = """
import os, sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA wal_autocheckpoint=0")
db.execute("UPDATE collectors_node SET hostname = 'written after the backup'")
os._exit(0)  # as a process killed mid-run: its WAL is left, not checkpointed
"""


@pytest.mark.slow
def test_restore_never_lets_the_old_databases_wal_into_the_new_one(tmp_path, monkeypatch, db):
    data = tmp_path / "data"
    data.mkdir()
    database = data / "sparkops.sqlite3"
    database.write_bytes(FIXTURE_0_1_0.read_bytes())
    with sqlite3.connect(database) as connection:
        connection.execute("PRAGMA journal_mode=WAL")
    monkeypatch.setattr(backups, "database_settings", lambda: {
        "ENGINE": "django.db.backends.sqlite3", "NAME": str(database)})
    saved = tmp_path / "saved.sqlite3"
    backups.backup(saved)
    subprocess.run([sys.executable, "-c", CRASHED_WRITER, str(database)], check=True)
    assert Path(f"{database}-wal").stat().st_size > 0

    outcome = backups.restore(saved, data_dir=data, liveness_timeout=60)

    assert not Path(f"{database}-wal").exists() and not Path(f"{database}-shm").exists()
    with sqlite3.connect(database) as connection:
        assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert connection.execute("SELECT hostname FROM collectors_node").fetchall() == [
            ("spark-old.example",)]
    with sqlite3.connect(outcome.previous) as connection:  # the replaced one, WAL and all
        assert connection.execute("SELECT hostname FROM collectors_node").fetchall() == [
            ("written after the backup",)]


def test_a_restore_run_as_root_leaves_the_database_to_its_owner(tmp_path, monkeypatch, db):
    # As root: the database belongs to the service's user (nobody here) and must stay its.
    owner = 65534 if os.geteuid() == 0 else os.geteuid()
    data = tmp_path / "data"
    data.mkdir()
    database = data / "sparkops.sqlite3"
    database.write_bytes(FIXTURE_0_1_0.read_bytes())
    os.chown(database, owner, owner if owner == 65534 else os.getegid())
    monkeypatch.setattr(backups, "database_settings", lambda: {
        "ENGINE": "django.db.backends.sqlite3", "NAME": str(database)})

    backups.restore(FIXTURE_0_1_0, data_dir=data, liveness_timeout=60)

    assert database.stat().st_uid == owner
