"""SparkOps settings.

Defaults run with zero setup: SQLite and a file-system Celery broker under ``SPARKOPS_DATA_DIR``.
Production values come from the environment (README, "Configuration"); a malformed value stops
start-up with a message naming the variable (see ``sparkops.env``).
"""

from __future__ import annotations

import ipaddress
import os
import re
import secrets
import socket
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from sparkops.address import (
    DEFAULT_BIND,
    AddressError,
    default_allowed_hosts,
    parse_bind,
    public_url_setting,
    url_netloc,
    url_origin,
)
from sparkops.datadir import PRIVATE_UMASK, create_private_file
from sparkops.env import (
    env_bool,
    env_float,
    env_int,
    env_list,
    env_optional,
    env_path_below,
    env_str,
)

# Every process of SparkOps loads these settings before it creates a file: from here on, what it
# creates (the data directory, SQLite and its -wal/-shm, broker messages, the beat schedule) is
# private to its user (folders 0700, files 0600). Existing installations are tightened when the
# project's app is ready (sparkops.apps), once logging is configured to say so.
os.umask(PRIVATE_UMASK)

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(env_str("SPARKOPS_DATA_DIR", str(BASE_DIR / "var"))).resolve()
DATA_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)


def _secret_key() -> str:
    """The key from the environment, else one generated once and kept in the data directory."""
    configured = env_optional("SPARKOPS_SECRET_KEY")
    if configured:
        return configured
    key_file = DATA_DIR / "secret_key"
    # Created 0600 in one step; when two processes start at once, the first one's key wins.
    create_private_file(key_file, secrets.token_urlsafe(50))
    return key_file.read_text().strip()


def _default_node_name() -> str:
    return re.sub(r"[^a-z0-9-]+", "-", socket.gethostname().lower()).strip("-") or "node"


SECRET_KEY = _secret_key()
DEBUG = env_bool("SPARKOPS_DEBUG", False)
# ALLOWED_HOSTS and CSRF_TRUSTED_ORIGINS follow the public URL: see the web server's section.

# Behind TLS (a reverse proxy terminating HTTPS), set SPARKOPS_HTTPS=1: secure cookies, HSTS and the
# redirect follow, and `manage.py check --deploy` passes.
HTTPS = env_bool("SPARKOPS_HTTPS", False)
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
SECURE_SSL_REDIRECT = HTTPS
# Probes answer plain HTTP on the local port (dashboard/health.py): no certificate needed.
SECURE_REDIRECT_EXEMPT = [r"^(healthz|readyz)$"]
SECURE_HSTS_SECONDS = 31_536_000 if HTTPS else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = HTTPS
SECURE_HSTS_PRELOAD = HTTPS
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if HTTPS else None
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "sparkops.apps.SparkOpsConfig",
    "csp",
    "collectors",
    "dashboard",
    "dashboard.audit",
    "dashboard.alerting",
    "dashboard.notify",
    "dashboard.restarts",
    "dashboard.exports",
    "axes",  # records login failures and locks out guessing (django-axes)
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "dashboard.zone.ViewerZoneMiddleware",
    # Last, so it can turn a locked-out login into the lockout page (axes' documented place).
    "axes.middleware.AxesMiddleware",
]

# Content-Security-Policy (django-csp): scripts, styles, images and requests from this site
# only, no inline script and no eval (the pages' scripts are static files; plotly's SVG charts
# need neither). Styles allow 'unsafe-inline': the templates size bars with style attributes and
# plotly injects its own <style> element; an inline style cannot run code.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'", "'unsafe-inline'"],
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'none'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    },
}

ROOT_URLCONF = "sparkops.urls"
WSGI_APPLICATION = "sparkops.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "sparkops.context_processors.demo",
            ],
        },
    },
]

# SQLite in WAL mode with IMMEDIATE transactions lets the web server read while the worker writes;
# the 20 s busy timeout covers a prune or roll-up holding the write lock. Connections are kept a
# minute (per thread), on SQLite too: opening one (Django's functions registered, the PRAGMAs run)
# for every request and task was an eighth of the one process's CPU while it watched. Each keeps
# a page cache of 1 MiB, not SQLite's 2 MiB: the one process holds a connection per worker and
# web thread, and a page not cached is one read from the kernel's own page cache.
_SQLITE_URL = f"sqlite:///{DATA_DIR / 'sparkops.sqlite3'}"
DATABASES = {
    "default": dj_database_url.parse(env_str("DATABASE_URL", _SQLITE_URL), conn_max_age=60)
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; "
                        "PRAGMA cache_size=-1024;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard:home"
LOGOUT_REDIRECT_URL = "login"

# --- sign-in limits (django-axes) and configuration changes -------------------------------------
# Axes' backend comes first: it refuses a locked-out account or address before any password is
# checked, then Django's own backend authenticates.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# Locked out when either the account or the client address has this many failures in a row,
# each within the cool-off of the one before; the lock lifts by itself after the cool-off (an
# admin can lift it earlier on the "Logins" page). Every further try while locked restarts it.
AXES_FAILURE_LIMIT = env_int("SPARKOPS_LOGIN_FAILURE_LIMIT", 5, minimum=1)
SPARKOPS_LOGIN_COOLOFF_MINUTES = env_int("SPARKOPS_LOGIN_COOLOFF_MINUTES", 15, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=SPARKOPS_LOGIN_COOLOFF_MINUTES)
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
# A success does not clear the address's count: someone holding one account must not be able to
# wipe the failures their address piled up guessing another.
AXES_RESET_ON_SUCCESS = False
# Every failure is kept as a row (who, from where, when), not only the running count.
AXES_ENABLE_ACCESS_FAILURE_LOG = True
# The client address: the socket's peer, unless that peer is a reverse proxy listed in
# SPARKOPS_TRUSTED_PROXIES (CIDRs); only then is X-Forwarded-For read, right to left, so a
# client cannot pick its own address by sending the header (dashboard.audit.clientaddress).
SPARKOPS_TRUSTED_PROXIES = env_list("SPARKOPS_TRUSTED_PROXIES", [])
for _proxy in SPARKOPS_TRUSTED_PROXIES:
    try:
        ipaddress.ip_network(_proxy, strict=False)
    except ValueError:
        raise ImproperlyConfigured(
            f"SPARKOPS_TRUSTED_PROXIES: {_proxy!r} is not a network (e.g. 127.0.0.1/32)"
        ) from None
AXES_CLIENT_IP_CALLABLE = "dashboard.audit.clientaddress.client_address"
# A lockout answers with the login page and the reason in words (HTTP 429).
AXES_LOCKOUT_CALLABLE = "dashboard.audit.logins.lockout_response"
# No banner at every process start (it would be the first line of every `manage.py` command);
# failures and lockouts are still logged as warnings (see LOGGING).
AXES_VERBOSE = False
# Silences longer than this are refused: a forgotten silence must not mute a node for months.
SPARKOPS_SILENCE_MAX_DAYS = env_float("SPARKOPS_SILENCE_MAX_DAYS", 7, minimum=0.01)

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("SPARKOPS_TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "staticfiles"
STATIC_ROOT.mkdir(mode=0o700, exist_ok=True)  # WhiteNoise warns on every request without it
STATICFILES_DIRS = [BASE_DIR / "static"]
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    # plotly.min.js straight from the installed plotly package: GB10 sites are often offline.
    "sparkops.staticfinders.PlotlyFinder",
]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}
# Django's storages chmod what they save to 0644 unless told otherwise; `collectstatic` writes into
# the data directory, which stays private (the app serves its static files itself).
FILE_UPLOAD_PERMISSIONS = 0o600
FILE_UPLOAD_DIRECTORY_PERMISSIONS = 0o700

# What an admin reads (the terminal of `bin/sparkops start`, journald): the start-up summary,
# failures and deliveries, at the default INFO. A line per request (gunicorn's access log, Django's
# 4xx warnings) and per task (Celery's received/succeeded, beat's sends) comes back with DEBUG,
# which also lets every library's debugging through (runstack passes the level to its processes).
SPARKOPS_LOG_LEVEL = env_str("SPARKOPS_LOG_LEVEL", "INFO").upper()
if SPARKOPS_LOG_LEVEL not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
    raise ImproperlyConfigured(f"SPARKOPS_LOG_LEVEL={env_str('SPARKOPS_LOG_LEVEL', '')!r}: "
                               "expected one of DEBUG, INFO, WARNING, ERROR, CRITICAL")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": SPARKOPS_LOG_LEVEL},
    "loggers": {
        # django-axes logs every successful login and every clean-up at INFO; its failures and
        # lockouts are warnings, which is what an admin reads the log for.
        "axes": {"level": "WARNING"},
        # "Not Found: /favicon.ico" and every other 4xx is a warning per request; server errors
        # (5xx) are errors and stay.
        "django.request": {"level": "DEBUG" if SPARKOPS_LOG_LEVEL == "DEBUG" else "ERROR"},
    },
}

# --- SparkOps: this node and its collection ---------------------------------------------------
# The node this process runs on. A central SparkOps watching a fleet runs one worker per node,
# each started with its own SPARKOPS_NODE_NAME and consuming only that node's queue.
SPARKOPS_NODE_NAME = env_str("SPARKOPS_NODE_NAME", _default_node_name())
# Nodes the beat schedules collections for, besides every node an agent registered
# (collectors.fleetbeat); "none": no host of the beat's own (a centre that only watches agents,
# whose own node then neither registers nor shows in the fleet).
SPARKOPS_BEAT_NODES = [name for name in env_list("SPARKOPS_BEAT_NODES", [SPARKOPS_NODE_NAME])
                       if name.lower() != "none"]
# Seconds between host-memory collections. Each collection watches MemAvailable for the whole
# interval (see collectors.sampling), so a transient prefill buffer between two rows is not lost.
SPARKOPS_COLLECT_INTERVAL = env_float("SPARKOPS_COLLECT_INTERVAL", 5.0, minimum=1.0)
# How often MemAvailable is read inside an interval; 0.1 s catches any dip of 0.5 s or longer.
SPARKOPS_DIP_PERIOD = env_float("SPARKOPS_DIP_PERIOD", 0.1, minimum=0.01)
SPARKOPS_PROCFS = env_str("SPARKOPS_PROCFS", "/proc")
# Where the node's /sys is read (interconnect ports, collectors.sysfs); tests point it at a tree.
SPARKOPS_SYSFS = env_str("SPARKOPS_SYSFS", "/sys")
# Seconds between two heartbeats of a node's worker (collectors.heartbeat). A node whose last
# beat is older than SPARKOPS_UNREACHABLE_AFTER_BEATS of them is unreachable (the
# node-unreachable alert), and its engines' own alerts wait for it to come back.
SPARKOPS_HEARTBEAT_SECONDS = env_float("SPARKOPS_HEARTBEAT_SECONDS", 10.0, minimum=0.5)
SPARKOPS_UNREACHABLE_AFTER_BEATS = env_float("SPARKOPS_UNREACHABLE_AFTER_BEATS", 3.0, minimum=2)
# The memory cgroup the node's engines are confined to (a systemd slice with MemoryMax=, a
# container cgroup parent), if any: cgroup v2 or a v1 memory controller's directory. Its room
# (limit less its working set) is read with MemAvailable, and the headroom is the smaller of
# the two. Empty: no budget, the headroom is the host's.
SPARKOPS_MEMORY_BUDGET_CGROUP = env_path_below(
    "SPARKOPS_MEMORY_BUDGET_CGROUP", "/sys/fs/cgroup",
    "/sys/fs/cgroup/inference.slice or /sys/fs/cgroup/memory/inference")
# History is kept in tiers (collectors.retention): raw 5 s samples for a day, then minute,
# ten-minute and hourly roll-ups (min/mean/max), the last for SPARKOPS_ROLLUP_RETENTION_DAYS.
SPARKOPS_RAW_RETENTION_DAYS = env_float("SPARKOPS_RAW_RETENTION_DAYS", 1, minimum=0.01)
SPARKOPS_ROLLUP_RETENTION_DAYS = env_float("SPARKOPS_ROLLUP_RETENTION_DAYS", 90, minimum=1)
# A ledger component (an engine's KV pool, page cache, a process) moving by more than this share
# of MemTotal is recorded as a change an alert can name as its cause.
SPARKOPS_LEDGER_CHANGE_FRACTION = env_float("SPARKOPS_LEDGER_CHANGE_FRACTION", 0.005, minimum=0)
SPARKOPS_MAX_CHART_POINTS = env_int("SPARKOPS_MAX_CHART_POINTS", 2000, minimum=100)
# Minutes of host samples (one a second) and ledgers the flight recorder keeps on the node's disk
# (<data dir>/flight-recorder/<node>/), fsynced every collection, for the post-mortem of a host
# that wedged or lost power (collectors.flightrecorder).
SPARKOPS_FLIGHT_RECORDER_MINUTES = env_float("SPARKOPS_FLIGHT_RECORDER_MINUTES", 15, minimum=1)

# --- alert delivery ------------------------------------------------------------------------------
# Django's SMTP backend; EMAIL_TIMEOUT matters: without it a tarpit SMTP server blocks forever.
EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
EMAIL_HOST = env_str("SPARKOPS_SMTP_HOST", "localhost")
EMAIL_PORT = env_int("SPARKOPS_SMTP_PORT", 25, minimum=1)
EMAIL_HOST_USER = env_str("SPARKOPS_SMTP_USER", "")
EMAIL_HOST_PASSWORD = env_str("SPARKOPS_SMTP_PASSWORD", "")
EMAIL_USE_TLS = env_bool("SPARKOPS_SMTP_STARTTLS", False)
EMAIL_USE_SSL = env_bool("SPARKOPS_SMTP_SSL", False)
EMAIL_TIMEOUT = env_float("SPARKOPS_SMTP_TIMEOUT", 10.0, minimum=1)
DEFAULT_FROM_EMAIL = env_str("SPARKOPS_MAIL_FROM", "sparkops@localhost")
# Webhook targets on private, loopback or link-local networks are refused unless listed here
# (comma-separated CIDRs), e.g. "10.0.0.0/8" for an internal chat server.
SPARKOPS_WEBHOOK_ALLOWED_NETWORKS = env_list("SPARKOPS_WEBHOOK_ALLOWED_NETWORKS", [])

# A notification claimed by a sender that has not finished after this long is taken over by
# another (the first one died mid-send): longer than the slowest send (SMTP timeouts add up).
SPARKOPS_NOTIFY_LEASE_SECONDS = env_float("SPARKOPS_NOTIFY_LEASE_SECONDS", 120, minimum=1)
# Links in notifications start with SPARKOPS_PUBLIC_URL (see the web server's section).

# --- planned restarts ---------------------------------------------------------------------------
# Read-only mode: SparkOps monitors and never touches. No container is stopped or started and the
# page cache is never dropped; planning a restart is refused and the pages say so.
SPARKOPS_READ_ONLY = env_bool("SPARKOPS_READ_ONLY", False)
# The privileged helper that drops the page cache. It takes no arguments; not running as root,
# SparkOps calls it through `sudo -n` (README: "Dropping the page cache").
SPARKOPS_DROP_CACHES_COMMAND = env_list(
    "SPARKOPS_DROP_CACHES_COMMAND", [str(BASE_DIR / "bin" / "sparkops-drop-caches")]
)
# Dropping the page cache is costly for everything else on the node: at most once per cooldown.
SPARKOPS_DROP_CACHES_COOLDOWN_SECONDS = env_float("SPARKOPS_DROP_CACHES_COOLDOWN_SECONDS", 300,
                                                  minimum=0)
# How long after an engine stopped its memory must be back (MemAvailable, or the memory budget's
# room, up by what it held) before SparkOps calls it "memory not returned": a restart is then not
# started into it, and an unplanned stop raises the memory-not-returned alert.
SPARKOPS_MEMORY_RETURN_GRACE_SECONDS = env_float("SPARKOPS_MEMORY_RETURN_GRACE_SECONDS", 60,
                                                 minimum=1)
# While a restarted engine loads, MemFree below this floor has the runbook drop the page cache
# again (the guarded start). 0: what the engine still has to allocate plus the restart margin.
SPARKOPS_GUARDED_START_FLOOR_GIB = env_float("SPARKOPS_GUARDED_START_FLOOR_GIB", 0, minimum=0)
# How long a restart waits for an engine's running requests to finish before stopping it.
SPARKOPS_RESTART_DRAIN_TIMEOUT_SECONDS = env_float("SPARKOPS_RESTART_DRAIN_TIMEOUT_SECONDS", 120,
                                                   minimum=0)
# A planned restart that could not begin within this long after its time is cancelled, so a
# request queued during an outage does not fire hours later.
SPARKOPS_RESTART_START_GRACE_SECONDS = env_float("SPARKOPS_RESTART_START_GRACE_SECONDS", 300,
                                                 minimum=1)
# A running restart whose worker has not reported for this long is marked interrupted.
SPARKOPS_RESTART_HEARTBEAT_STALE_SECONDS = env_float("SPARKOPS_RESTART_HEARTBEAT_STALE_SECONDS",
                                                     120, minimum=5)
# Startup deadline: the expected startup × this factor, and never less than the minimum (field
# reports say 5–15 minutes; health checks need at least 15).
SPARKOPS_RESTART_DEADLINE_FACTOR = env_float("SPARKOPS_RESTART_DEADLINE_FACTOR", 1.5, minimum=1)
SPARKOPS_RESTART_MIN_DEADLINE_SECONDS = env_float("SPARKOPS_RESTART_MIN_DEADLINE_SECONDS", 900,
                                                  minimum=1)
# A restart of an engine that spans nodes runs a part on every rank's node; each waits at most
# this long for the others at each of their meeting points (dashboard.restarts.groups), on top
# of the time the awaited step itself may take.
SPARKOPS_RESTART_GROUP_WAIT_SECONDS = env_float("SPARKOPS_RESTART_GROUP_WAIT_SECONDS", 300,
                                                minimum=1)

# --- exports and demo ----------------------------------------------------------------------------
# SparkOps' own /metrics and read-only JSON API answer a bearer token (set one to enable them)
# or, without a token, clients from these networks (e.g. the Prometheus host).
SPARKOPS_EXPORT_TOKEN = env_optional("SPARKOPS_EXPORT_TOKEN")
SPARKOPS_EXPORT_ALLOWED_NETWORKS = env_list("SPARKOPS_EXPORT_ALLOWED_NETWORKS", [])
# Demo mode: emulated engines replay the seeds' story; every page says the data is a demo.
SPARKOPS_DEMO = env_bool("SPARKOPS_DEMO", False)
# Node memory bandwidth for the decode roofline (GB10: 273 GB/s LPDDR5x).
SPARKOPS_MEMORY_BANDWIDTH_GBPS = env_float("SPARKOPS_MEMORY_BANDWIDTH_GBPS", 273.0, minimum=1)

for _name in ("SPARKOPS_WEBHOOK_ALLOWED_NETWORKS", "SPARKOPS_EXPORT_ALLOWED_NETWORKS"):
    for _network in globals()[_name]:
        try:
            ipaddress.ip_network(_network, strict=False)
        except ValueError:
            raise ImproperlyConfigured(
                f"{_name}: {_network!r} is not a network (e.g. 10.0.0.0/8)"
            ) from None

# --- Celery -------------------------------------------------------------------------------------
# The embedded default is kombu's file-system transport: beat and workers on one machine exchange
# messages through a directory, no server needed. Set CELERY_BROKER_URL=redis://... for a fleet.
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "filesystem://")
_BROKER_DIR = DATA_DIR / "broker"
if CELERY_BROKER_URL.startswith("filesystem://"):
    # kombu's transport with atomic writes and lock-aware reads (see sparkops/fsbroker.py).
    CELERY_BROKER_TRANSPORT = "sparkops.fsbroker:Transport"
    for _sub in ("queue", "processed", "control"):
        (_BROKER_DIR / _sub).mkdir(mode=0o700, parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_BROKER_DIR / "queue"),
        "data_folder_out": str(_BROKER_DIR / "queue"),
        "processed_folder": str(_BROKER_DIR / "processed"),
        "control_folder": str(_BROKER_DIR / "control"),
        "store_processed": False,
        # How long a worker waits at most between two looks for new messages (kombu's default):
        # a message written by the worker's own process (beat, the tasks' follow-ups such as an
        # alert's evaluation and delivery, the one process's web server) ends the wait at once
        # (sparkops.fsbroker), so this bounds only how late one from another process is seen.
        # Looking four times a second, as before, was most of the worker's consumer loop.
        "polling_interval": 1.0,
    }
else:
    # A broker that accepts TCP but never answers must fail in seconds, not hang a publisher.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"socket_timeout": 5, "socket_connect_timeout": 5}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
# Late acks plus reject-on-worker-lost: a task whose process is OOM-killed is re-run, not lost.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = "sparkops"
# Celery's Django fixup closes every database connection before and after each task unless this
# is set; set, once in 2 × 1000 tasks. Between, the worker applies Django's own rule at each
# task's start and end, as a web request does (sparkops.celery: a connection that broke or is
# older than CONN_MAX_AGE is closed), so a task opens no connection of its own.
CELERY_DB_REUSE_MAX = 1000
CELERY_TIMEZONE = TIME_ZONE
CELERY_BEAT_SCHEDULE_FILENAME = str(DATA_DIR / "celerybeat-schedule")

# --- the web server started by `./sparkops start`, and the address people reach it at ---------
# SPARKOPS_BIND is HOST or HOST:PORT; without a port, SparkOps' own 8470. It is normalised to
# HOST:PORT, which is what the stack hands gunicorn. SPARKOPS_PUBLIC_URL is this SparkOps'
# address for people: links in notifications, the host the site answers to, the origin its forms
# are posted from and where plain HTTP is redirected. Unset, it follows from the bind:
# http://<host>:<port> (https:// with SPARKOPS_HTTPS=1; a wildcard bind gives this machine's host
# name). Behind a TLS proxy, set it to the proxy's https:// address. Rules: sparkops.address.
try:
    _BIND = parse_bind(env_str("SPARKOPS_BIND", DEFAULT_BIND))
    SPARKOPS_PUBLIC_URL = public_url_setting(env_optional("SPARKOPS_PUBLIC_URL"), _BIND,
                                             https=HTTPS)
except AddressError as _error:
    raise ImproperlyConfigured(str(_error)) from None
SPARKOPS_BIND = str(_BIND)
ALLOWED_HOSTS = env_list("SPARKOPS_ALLOWED_HOSTS", default_allowed_hosts(SPARKOPS_PUBLIC_URL))
CSRF_TRUSTED_ORIGINS = env_list("SPARKOPS_CSRF_TRUSTED_ORIGINS", [url_origin(SPARKOPS_PUBLIC_URL)])
# Behind TLS, a plain-HTTP request is redirected to the public URL's host, not to whatever host
# it named (Django's SECURE_SSL_HOST).
SECURE_SSL_HOST = url_netloc(SPARKOPS_PUBLIC_URL) if HTTPS else None
# The stack's supervisor kills and restarts a Celery worker that has not shown it is alive (by
# touching a file in the data directory, every few seconds) for this long: a stopped or frozen
# worker would otherwise stay up and do nothing. Longer than any pause a busy node causes.
SPARKOPS_WORKER_LIVENESS_TIMEOUT = env_float("SPARKOPS_WORKER_LIVENESS_TIMEOUT", 60, minimum=2)
# How `bin/sparkops start` runs the stack: "one-process" (the default: the web server in a thread of
# the Celery worker's process, sparkops.onestack) or "processes" (gunicorn and the worker, each a
# process, under a plain supervisor). Both run the same worker, queues and beat.
SPARKOPS_STACK = env_str("SPARKOPS_STACK", "one-process").lower()
if SPARKOPS_STACK not in ("one-process", "processes"):
    raise ImproperlyConfigured(f"SPARKOPS_STACK={env_str('SPARKOPS_STACK', '')!r}: "
                               "expected one-process or processes")
