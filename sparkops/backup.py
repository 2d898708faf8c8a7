"""Backing up and restoring SparkOps' database (``bin/sparkops backup`` and ``restore``).

**Backup** writes a consistent copy while the stack runs, into a new file created 0600 (it holds
sessions, password hashes and webhook secrets) and given its name only once complete:

* SQLite: sqlite3's online backup API, in one step, so the copy is one snapshot of the database
  (in WAL mode the writers go on meanwhile); the copy is switched to a rollback journal, so it
  is one self-contained file.
* PostgreSQL: ``pg_dump --format=custom``, one snapshot too. The connection settings come from
  ``DATABASE_URL`` and reach ``pg_dump`` through its environment (``PGHOST``, ``PGPASSWORD``,
  ...), never its command line, where every user of the machine could read them.

**Restore** replaces the database with a backup, only while nothing runs on this data directory
(``sparkops.stackstate``: no live supervisor, no fresh worker heartbeat), and only a backup
that is a SparkOps database made by this release or an older one (a newer one's migrations
would be unknown here). The current database is backed up first, beside the others, so a
restore can itself be undone. Then:

* SQLite: the backup is copied next to the database, the database's ``-wal`` and ``-shm``
  files are removed (a WAL left from the old database must never be applied to the new one)
  and the copy is renamed over the database, one atomic step.
* PostgreSQL: every table of the schema is dropped, with what hangs on it (a newer schema's
  tables and constraints), then ``pg_restore --no-owner --single-transaction`` writes the
  backup's, all or nothing; if it fails, the backup of the replaced database made first
  restores it.

The caller (``manage.py restore``) then runs ``migrate``, which brings a backup of an older
release up to this one.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import sqlite3
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from django.db import connections, transaction
from django.db.migrations.loader import MigrationLoader

from sparkops.backends import database_settings, is_postgresql, is_sqlite
from sparkops.stackstate import running_reason

PG_ROOT = Path("/usr/lib/postgresql")
# libpq's environment variable for each connection option DATABASE_URL can carry.
_LIBPQ_ENVIRONMENT = {
    "host": "PGHOST", "port": "PGPORT", "sslmode": "PGSSLMODE", "sslrootcert": "PGSSLROOTCERT",
    "sslcert": "PGSSLCERT", "sslkey": "PGSSLKEY", "passfile": "PGPASSFILE",
    "service": "PGSERVICE", "options": "PGOPTIONS", "application_name": "PGAPPNAME",
    "connect_timeout": "PGCONNECT_TIMEOUT", "target_session_attrs": "PGTARGETSESSIONATTRS",
}
_DUMP_TABLE = re.compile(r"^\d+; \d+ \d+ TABLE (\S+) (\S+) ")


class BackupError(Exception):
    """A backup or restore that cannot be done; the message is one line in words."""


@dataclass(frozen=True)
class RestoreOutcome:
    """What a restore did: the file it restored and where the database it replaced went."""

    source: Path
    previous: Path | None


def timestamp(now: datetime | None = None) -> str:
    return (now or datetime.now(UTC)).astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")


def default_backup_path(data_dir: Path, now: datetime | None = None,
                        prefix: str = "sparkops-backup") -> Path:
    """``<data dir>/sparkops-backup-20261201T031500Z.sqlite3`` (``.pgdump`` on PostgreSQL)."""
    suffix = ".sqlite3" if is_sqlite() else ".pgdump"
    return Path(data_dir) / f"{prefix}-{timestamp(now)}{suffix}"


def _private_temporary(target: Path) -> Path:
    """A new empty file beside ``target``, mode 0600 from its creation."""
    temporary = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
    os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    return temporary


def _publish(temporary: Path, target: Path) -> None:
    """Give the complete ``temporary`` the name ``target``, which must not exist yet."""
    try:
        os.link(temporary, target)
    except FileExistsError:
        raise BackupError(f"{target} exists already; name another file") from None
    finally:
        temporary.unlink(missing_ok=True)


# --- backup ---------------------------------------------------------------------------------------


def backup(target: Path) -> Path:
    """Write a consistent copy of the database to the new file ``target``; returns it."""
    target = Path(target).absolute()
    if target.exists():
        raise BackupError(f"{target} exists already; name another file")
    if not target.parent.is_dir():
        raise BackupError(f"{target.parent} is not a directory")
    database = database_settings()
    if is_sqlite(database):
        source = Path(database["NAME"])
        if not source.exists():
            raise BackupError(f"there is no database to back up: {source} does not exist")
        temporary = _private_temporary(target)
        try:
            copy_sqlite(source, temporary)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
    elif is_postgresql(database):
        temporary = _private_temporary(target)
        try:
            _run_postgres("pg_dump", ["--format=custom", f"--file={temporary}"], database)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
    else:
        raise BackupError(f"backups of {database['ENGINE']} databases are not supported")
    _publish(temporary, target)
    return target


def copy_sqlite(source: Path, target: Path) -> None:
    """One snapshot of the SQLite database ``source`` into the (empty) file ``target``."""
    try:
        reader = sqlite3.connect(source, timeout=20)
    except sqlite3.Error as error:
        raise BackupError(f"cannot open {source}: {error}") from None
    try:
        writer = sqlite3.connect(target)
        try:
            reader.backup(writer)  # all pages in one step: one consistent snapshot
            writer.execute("PRAGMA journal_mode=DELETE")
        finally:
            writer.close()
    except sqlite3.Error as error:
        raise BackupError(f"cannot copy {source}: {error}") from None
    finally:
        reader.close()


# --- PostgreSQL programs --------------------------------------------------------------------------


def postgres_program(name: str) -> str:
    """``pg_dump`` or ``pg_restore``: on the PATH, else the newest of ``/usr/lib/postgresql``."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(PG_ROOT.glob(f"*/bin/{name}"), key=lambda p: int(p.parts[-3])
                        if p.parts[-3].isdigit() else 0)
    if not candidates:
        raise BackupError(f"{name} is not installed (Debian package postgresql-client)")
    return str(candidates[-1])


def postgres_environment(database: dict) -> dict[str, str]:
    """The environment that points libpq's programs at ``database``, password included."""
    env = dict(os.environ)  # libpq settings an admin exported apply to Django's connection too
    for option, value in (database.get("OPTIONS") or {}).items():
        if option in _LIBPQ_ENVIRONMENT and value not in (None, ""):
            env[_LIBPQ_ENVIRONMENT[option]] = str(value)
    for key, variable in (("HOST", "PGHOST"), ("PORT", "PGPORT"), ("USER", "PGUSER"),
                          ("PASSWORD", "PGPASSWORD"), ("NAME", "PGDATABASE")):
        if database.get(key) not in (None, ""):
            env[variable] = str(database[key])
    return env


def _run_postgres(program: str, arguments: list[str], database: dict | None) -> str:
    """Run ``program`` (connected to ``database`` through the environment); its stdout."""
    env = postgres_environment(database) if database else None
    try:
        result = subprocess.run([postgres_program(program), "--no-password", *arguments],
                                env=env, capture_output=True, text=True, timeout=3600)
    except subprocess.TimeoutExpired:
        raise BackupError(f"{program} did not finish within an hour") from None
    if result.returncode != 0:
        errors = [line for line in result.stderr.splitlines() if line.strip()]
        raise BackupError(f"{program} failed: {errors[-1] if errors else result.returncode}")
    return result.stdout


# --- what a backup holds --------------------------------------------------------------------------


def sqlite_migrations(path: Path) -> set[tuple[str, str]]:
    """The migrations a SQLite backup has applied; BackupError unless it is a SparkOps one."""
    if not path.is_file():
        raise BackupError(f"{path} does not exist")
    try:
        with sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True) as db:
            tables = {row[0] for row in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not {"django_migrations", "collectors_node"} <= tables:
                raise BackupError(f"{path} is not a SparkOps database (it has no "
                                  "django_migrations or collectors_node table)")
            if db.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                raise BackupError(f"{path} is damaged (SQLite's quick_check fails)")
            rows = db.execute("SELECT app, name FROM django_migrations").fetchall()
    except sqlite3.DatabaseError as error:
        raise BackupError(f"{path} is not a SparkOps database: {error}") from None
    return {(app, name) for app, name in rows}


def postgres_dump_tables(path: Path) -> set[str]:
    """The tables (``schema.name``) in a ``pg_dump --format=custom`` file."""
    listing = _run_postgres("pg_restore", ["--list", str(path)], None)
    return {f"{m.group(1)}.{m.group(2)}" for m in map(_DUMP_TABLE.match, listing.splitlines())
            if m}


def postgres_migrations(path: Path) -> set[tuple[str, str]]:
    """The migrations a PostgreSQL backup has applied; BackupError unless it is a SparkOps
    one."""
    if not path.is_file():
        raise BackupError(f"{path} does not exist")
    try:
        tables = {name.split(".", 1)[1] for name in postgres_dump_tables(path)}
    except BackupError as error:
        raise BackupError(f"{path} is not a pg_dump custom-format file ({error})") from None
    if not {"django_migrations", "collectors_node"} <= tables:
        raise BackupError(f"{path} is not a SparkOps database (it has no django_migrations or "
                          "collectors_node table)")
    script = _run_postgres("pg_restore", ["--data-only", "--table=django_migrations",
                                          "--file=-", str(path)], None)
    found, copying = set(), False
    for line in script.splitlines():
        if line.startswith("COPY ") and "django_migrations" in line:
            copying = True
        elif copying and line == "\\.":
            break
        elif copying:
            fields = line.split("\t")
            found.add((fields[1], fields[2]))
    return found


def unknown_migrations(applied: set[tuple[str, str]]) -> list[str]:
    """Migrations of this release's apps that a backup has applied but this release lacks."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    known = set(loader.disk_migrations)
    return sorted(f"{app}.{name}" for app, name in applied
                  if app in loader.migrated_apps and (app, name) not in known)


# --- restore --------------------------------------------------------------------------------------


def restore(source: Path, *, data_dir: Path, liveness_timeout: float) -> RestoreOutcome:
    """Replace the database with the backup ``source`` (see the module's docstring)."""
    source = Path(source).absolute()
    running = running_reason(Path(data_dir), liveness_timeout)
    if running:
        raise BackupError(f"restore refused: {running}; stop SparkOps first")
    database = database_settings()
    if is_sqlite(database):
        applied = sqlite_migrations(source)
    elif is_postgresql(database):
        applied = postgres_migrations(source)
    else:
        raise BackupError(f"restores of {database['ENGINE']} databases are not supported")
    newer = unknown_migrations(applied)
    if newer:
        raise BackupError(f"{source} was made by a newer SparkOps: this release does not know "
                          f"its migrations {', '.join(newer)}")
    connections.close_all()
    previous = _keep_current(Path(data_dir), database)
    if is_sqlite(database):
        _replace_sqlite(source, Path(database["NAME"]))
    else:
        _replace_postgres(source, database)
    connections.close_all()
    return RestoreOutcome(source=source, previous=previous)


def _keep_current(data_dir: Path, database: dict) -> Path | None:
    """A backup of the database about to be replaced (None when there is none)."""
    if is_sqlite(database) and not Path(database["NAME"]).exists():
        return None
    return backup(default_backup_path(data_dir, prefix="sparkops-before-restore"))


def _replace_sqlite(source: Path, database: Path) -> None:
    temporary = _private_temporary(database)
    try:
        copy_sqlite(source, temporary)
        if os.geteuid() == 0:
            # Restored by root for a service that runs as its own user: the database stays
            # that user's, as the one it replaces was (or as the data directory is).
            owner = (database if database.exists() else database.parent).stat()
            os.chown(temporary, owner.st_uid, owner.st_gid)
        for leftover in (Path(f"{database}-wal"), Path(f"{database}-shm")):
            leftover.unlink(missing_ok=True)
        os.replace(temporary, database)
    finally:
        temporary.unlink(missing_ok=True)


def _replace_postgres(source: Path, database: dict) -> None:
    # Every table goes first, in one transaction, with what hangs on it (CASCADE): a newer
    # schema's tables, and its constraints on the tables the backup has too (a foreign key the
    # backup does not know would keep pg_restore --clean from dropping the key it points at).
    connection = connections["default"]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT table_schema, table_name FROM information_schema.tables "
                       "WHERE table_type = 'BASE TABLE' AND table_schema = current_schema()")
        for schema, table in sorted(cursor.fetchall()):
            cursor.execute(f"DROP TABLE IF EXISTS {connection.ops.quote_name(schema)}."
                           f"{connection.ops.quote_name(table)} CASCADE")
    connections.close_all()
    _run_postgres("pg_restore", ["--no-owner", "--single-transaction", "--exit-on-error",
                                 f"--dbname={database['NAME']}", str(source)], database)
