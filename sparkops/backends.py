"""The database and the broker this installation uses: described for people and checked.

``describe_database`` and ``describe_broker`` say which engine and where, with any password
masked, for the start-up summary and ``manage.py status``. ``check_database`` and
``check_broker`` answer whether each one answers now, within a short deadline, for ``/readyz``
and ``status``:

* the database: a fresh connection (never the process's pooled one, so a check cannot leave a
  broken connection behind) reads ``django_migrations``, which also proves it is migrated; a
  SQLite file that does not exist is reported as missing rather than created by the check;
* the broker: a kombu connection with a connect and socket deadline; the embedded file-system
  broker counts as reachable when its folders exist and this process may write them (it has no
  server to ask).

A check's reason is one line in words. ``/readyz`` shows it without a login, so it names no
URL, user or password of the database or broker (the descriptions are for ``status`` and the
start-up summary); a connection error can name a host and port, and the configured password
is masked out of it should it ever appear.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

MASK = "•••"
CHECK_TIMEOUT_SECONDS = 3.0
_FILE_BROKER_FOLDERS = ("data_folder_in", "data_folder_out", "processed_folder", "control_folder")


@dataclass(frozen=True)
class Check:
    """One readiness check: whether it holds, why in words, and an age where one applies."""

    name: str
    ok: bool
    reason: str
    age_seconds: float | None = None

    def as_dict(self) -> dict[str, object]:
        age = None if self.age_seconds is None else round(self.age_seconds, 1)
        return {"ok": self.ok, "reason": self.reason, "age_seconds": age}


def mask_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``•••``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{parts.username or ''}:{MASK}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _masked(text: str, *secrets: str | None) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, MASK)
    return text


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 300 else text[:299] + "…"


# --- the database ---------------------------------------------------------------------------------


def database_settings() -> dict:
    return settings.DATABASES["default"]


def is_sqlite(database: dict | None = None) -> bool:
    return (database or database_settings())["ENGINE"] == "django.db.backends.sqlite3"


def is_postgresql(database: dict | None = None) -> bool:
    return (database or database_settings())["ENGINE"] == "django.db.backends.postgresql"


def describe_database(database: dict | None = None) -> str:
    """``SQLite /var/lib/sparkops/sparkops.sqlite3`` or
    ``PostgreSQL postgresql://sparkops:•••@db:5432/sparkops``."""
    database = database or database_settings()
    if is_sqlite(database):
        return f"SQLite {database['NAME']}"
    if is_postgresql(database):
        user = database.get("USER") or ""
        credentials = f"{user}:{MASK}@" if database.get("PASSWORD") else (
            f"{user}@" if user else "")
        host = database.get("HOST") or database.get("OPTIONS", {}).get("host") or "localhost"
        port = f":{database['PORT']}" if database.get("PORT") else ""
        return f"PostgreSQL postgresql://{credentials}{host}{port}/{database.get('NAME', '')}"
    engine = database["ENGINE"].rsplit(".", 1)[-1]
    return f"{engine} database {database.get('NAME', '')} on {database.get('HOST') or 'localhost'}"


def check_database(timeout: float = CHECK_TIMEOUT_SECONDS,
                   wrapper: BaseDatabaseWrapper | None = None) -> Check:
    """Whether the database answers and is migrated, on a connection of its own (to the
    ``default`` database unless ``wrapper`` names another)."""
    wrapper = wrapper or connections["default"]
    database = wrapper.settings_dict
    if is_sqlite(database) and not wrapper.is_in_memory_db() \
            and not Path(database["NAME"]).exists():
        return Check("database", False, f"the SQLite file {database['NAME']} does not exist")
    try:
        params = wrapper.get_connection_params()
        if is_postgresql(database):
            params["connect_timeout"] = max(int(timeout), 1)
        elif is_sqlite(database):
            params["timeout"] = timeout
        raw = wrapper.get_new_connection(params)
        try:
            cursor = raw.cursor()
            cursor.execute("SELECT COUNT(*) FROM django_migrations")
            applied = cursor.fetchone()[0]
            cursor.close()
        finally:
            raw.close()
    except Exception as error:  # noqa: BLE001 - every failure is a "no" with its reason
        reason = _masked(_one_line(error), database.get("PASSWORD"))
        return Check("database", False, f"the database does not answer: {reason}")
    return Check("database", True, f"the database answers ({applied} migrations applied)")


# --- the broker -----------------------------------------------------------------------------------


def is_file_broker(url: str | None = None) -> bool:
    return (url or settings.CELERY_BROKER_URL).startswith("filesystem://")


def file_broker_folders() -> list[Path]:
    options = settings.CELERY_BROKER_TRANSPORT_OPTIONS
    return sorted({Path(options[key]) for key in _FILE_BROKER_FOLDERS if options.get(key)})


def describe_broker(url: str | None = None) -> str:
    """``embedded file-system broker in /var/lib/sparkops/broker`` or the broker's URL, its
    password masked."""
    url = url or settings.CELERY_BROKER_URL
    if is_file_broker(url):
        folders = file_broker_folders()
        where = os.path.commonpath([str(folder) for folder in folders]) if folders else "?"
        return f"embedded file-system broker in {where}"
    return mask_url(url)


def check_broker(timeout: float = CHECK_TIMEOUT_SECONDS) -> Check:
    """Whether the broker takes connections (the file broker: its folders are writable)."""
    url = settings.CELERY_BROKER_URL
    if is_file_broker(url):
        for folder in file_broker_folders():
            if not folder.is_dir():
                return Check("broker", False, f"the broker folder {folder} does not exist")
            if not os.access(folder, os.W_OK | os.X_OK):
                return Check("broker", False, f"the broker folder {folder} is not writable")
        return Check("broker", True, "the embedded file-system broker's folders are writable")
    from kombu import Connection

    options = {**settings.CELERY_BROKER_TRANSPORT_OPTIONS,
               "socket_timeout": timeout, "socket_connect_timeout": timeout,
               "max_retries": 0}
    password = urlsplit(url).password
    try:
        with Connection(url, connect_timeout=timeout, transport_options=options) as connection:
            connection.ensure_connection(max_retries=1, interval_start=0, interval_step=0,
                                         timeout=timeout)
    except Exception as error:  # noqa: BLE001 - every failure is a "no" with its reason
        return Check("broker", False, "the broker does not answer: "
                                      f"{_masked(_one_line(error), password)}")
    return Check("broker", True, "the broker answers")
