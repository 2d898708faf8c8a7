"""Install SparkOps as a systemd service, or remove it: ``bin/sparkops install|uninstall``.

A GB10 admin runs this as root on the node (DGX OS: Ubuntu 24.04, Python 3.12, systemd), before
any virtual environment exists, with the system's Python: like ``sparkops/supervise.py`` it
imports only the standard library, nothing of Django or the project, and is run by path
(``python3 -P sparkops/install.py``). ``install`` creates, each path a constant below:

* the system user and group ``sparkops`` (no login shell, home = the data directory);
* ``/opt/sparkops/app``, a copy of the application, root's and read-only for the service, and
  ``/opt/sparkops/venv``, built with the Python running this and holding ``requirements.lock``
  (hash-checked), stamped so that ``bin/sparkops start`` installs nothing (``write_stamp``);
* ``/var/lib/sparkops``, the data directory (sparkops, 0700);
* ``/etc/sparkops/sparkops.env``, the settings, written only when absent, so a reinstall or an
  upgrade keeps the admin's edits (root:sparkops, 0640, in a folder of 0750);
* the page-cache helper ``/usr/local/sbin/sparkops-drop-caches`` and the sudoers rule that lets
  sparkops run it, checked by ``visudo`` before it is put in place: SparkOps never runs as root;
* the Docker access chosen with ``--docker-access``: ``proxy`` (the default; the least-privilege
  Docker API proxy from ``deploy/docker-proxy/``), ``group`` (sparkops joins the docker group,
  which is root-equivalent) or ``none`` (monitor only: ``SPARKOPS_READ_ONLY=1``);
* the unit ``/etc/systemd/system/sparkops.service`` from ``deploy/systemd/sparkops.service``,
  then ``systemctl enable`` and ``restart`` where systemd runs (``--no-start`` leaves that out).

``uninstall`` stops and removes the units, the helper, the sudoers rule and ``/opt/sparkops``,
and keeps the data, the settings and the user unless ``--purge``.

Every step prints one progress line (``[1/9] creating the system user sparkops ... done``); an
error stops the run with one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import grp
import hashlib
import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

SERVICE_USER = "sparkops"
SERVICE_GROUP = "sparkops"
OPT_DIR = Path("/opt/sparkops")
APP_DIR = OPT_DIR / "app"
VENV_DIR = OPT_DIR / "venv"
DATA_DIR = Path("/var/lib/sparkops")
ADMIN_PASSWORD_FILE = DATA_DIR / "admin-password"
ETC_DIR = Path("/etc/sparkops")
ENV_FILE = ETC_DIR / "sparkops.env"
PROXY_CONFIG = ETC_DIR / "docker-proxy.cfg"
UNIT_DIR = Path("/etc/systemd/system")
UNIT_NAME = "sparkops.service"
UNIT_FILE = UNIT_DIR / UNIT_NAME
PROXY_UNIT_NAME = "sparkops-docker-proxy.service"
PROXY_UNIT_FILE = UNIT_DIR / PROXY_UNIT_NAME
PROXY_SOCKET_URL = "unix:///run/sparkops-docker/docker.sock"
HELPER = Path("/usr/local/sbin/sparkops-drop-caches")
SUDOERS = Path("/etc/sudoers.d/sparkops")
DOCKER_GROUP = "docker"
# Present while systemd runs as PID 1 (sd_booted()).
SYSTEMD_RUNNING = Path("/run/systemd/system")

# The tree being installed (a git checkout or an unpacked copy), and what is taken from it.
SOURCE = Path(__file__).resolve().parent.parent
UNIT_TEMPLATE = "deploy/systemd/sparkops.service"
PROXY_SOURCE_CONFIG = "deploy/docker-proxy/haproxy.cfg"
PROXY_SOURCE_UNIT = "deploy/docker-proxy/sparkops-docker-proxy.service"
HELPER_SOURCE = "bin/sparkops-drop-caches"
SUDOERS_SOURCE = "bin/sparkops-drop-caches.sudoers"
# What the service's venv holds: SparkOps' runtime pins, each with its hashes.
LOCK_FILE = "requirements.lock"
STAMP_FILE = ".requirements.sha256"
# Never copied from a tree that is not a git checkout: local state, caches, the checkout's venv.
LOCAL_STATE = {".git", ".venv", "var", "__pycache__", ".pytest_cache", ".ruff_cache"}

DOCKER_ACCESS = ("proxy", "group", "none")
DEFAULT_BIND = "127.0.0.1:8470"
MIN_PYTHON = (3, 11)
WILDCARD_HOSTS = {"", "0.0.0.0", "[::]", "::"}
LOOPBACK_HOSTS = {"localhost", "[::1]", "::1"}
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
PLACEHOLDER = re.compile(r"@[A-Z_]+@")


class InstallError(Exception):
    """Installing or removing stopped; ``str(error)`` is the one-line reason."""


# --- the stamp that bin/sparkops' ensure_venv checks ---------------------------------------------


def write_stamp(app_dir: Path, venv_dir: Path) -> str:
    """Mark ``venv_dir`` as holding ``app_dir``'s ``requirements.lock``, exactly as
    ``bin/sparkops``' ``venv_stamp_write`` does and ``ensure_venv`` checks: the file
    ``$VENV/.requirements.sha256`` holds the line ``sha256sum requirements.lock`` prints in the
    application's folder ("<sha256 hex>  requirements.lock"). ``bin/sparkops start`` then
    installs nothing, so the service starts from a read-only application and venv. Returns the
    line."""
    digest = hashlib.sha256((app_dir / LOCK_FILE).read_bytes()).hexdigest()
    line = f"{digest}  {LOCK_FILE}\n"
    (venv_dir / STAMP_FILE).write_text(line)
    return line


# --- what the installer writes: the settings file and the unit -----------------------------------


def default_node_name() -> str:
    """The node name SparkOps' settings derive from the host name (sparkops.settings)."""
    name = re.sub(r"[^a-z0-9-]+", "-", socket.gethostname().lower()).strip("-")
    return name or "node"


def split_bind(bind: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8470`` for IPv6) as host and port; InstallError if it is not one."""
    host, colon, port = bind.rpartition(":")
    if not colon or not port.isdigit() or not 1 <= int(port) <= 65535 or " " in bind:
        raise InstallError(f"--bind {bind!r}: expected HOST:PORT, e.g. {DEFAULT_BIND}")
    return host, int(port)


def public_url(bind: str) -> str:
    """The address a browser uses for ``bind``: the host name where it listens on every
    interface."""
    host, port = split_bind(bind)
    if host in WILDCARD_HOSTS:
        host = socket.gethostname()
    return f"http://{host}:{port}"


def is_loopback(host: str) -> bool:
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def render_settings(*, bind: str, node_name: str, docker_access: str) -> str:
    """The first ``sparkops.env``: systemd's ``EnvironmentFile=`` format (one ``KEY=VALUE`` a
    line, no quotes, no expansion, ``#`` comments on lines of their own)."""
    host, _ = split_bind(bind)
    url = public_url(bind)
    if is_loopback(host):
        allowed = "# SPARKOPS_ALLOWED_HOSTS=spark-01.example.org,127.0.0.1,localhost"
    else:
        names = [socket.gethostname()]
        if host not in WILDCARD_HOSTS:
            names.append(host)
        allowed = "SPARKOPS_ALLOWED_HOSTS=" + ",".join([*dict.fromkeys(names), "127.0.0.1",
                                                        "localhost"])
    if docker_access == "proxy":
        docker = [
            "# The container engine, through the least-privilege Docker API proxy that",
            f"# `bin/sparkops install` set up ({PROXY_UNIT_NAME}, configuration",
            f"# {PROXY_CONFIG}): it passes only the calls SparkOps makes, on a socket",
            "# of group sparkops. Docker's own socket is root-equivalent and stays out of reach.",
            f"SPARKOPS_DOCKER_HOST={PROXY_SOCKET_URL}",
        ]
    elif docker_access == "group":
        docker = [
            "# The container engine: Docker's own socket, which sparkops reaches as a member of",
            "# the docker group (root-equivalent; `--docker-access proxy` narrows it).",
            "# SPARKOPS_DOCKER_HOST=unix:///run/docker.sock",
        ]
    else:
        docker = [
            "# No container engine access (--docker-access none): SparkOps only monitors. It",
            "# never stops or starts a container, and never drops the page cache.",
            "SPARKOPS_READ_ONLY=1",
            f"# SPARKOPS_DOCKER_HOST={PROXY_SOCKET_URL}",
        ]
    lines = [
        "# SparkOps' settings, read by sparkops.service (systemd EnvironmentFile=): one",
        "# KEY=VALUE a line, no quotes, no variables; a comment is a line of its own.",
        "# Written once by `bin/sparkops install`; a reinstall or an upgrade keeps your edits.",
        "# After a change: systemctl restart sparkops. Every setting: README, \"Configuration\".",
        "",
        "# The database, the broker's messages, the secret key and the first admin's password.",
        f"# Keep it: the service may write nowhere else ({UNIT_NAME}: ReadWritePaths=).",
        f"SPARKOPS_DATA_DIR={DATA_DIR}",
        "",
        "# Address of the web server (HOST:PORT). Behind a reverse proxy keep it on loopback.",
        f"SPARKOPS_BIND={bind}",
        "# Host names the site answers to (comma-separated).",
        allowed,
        "# This node's name: its queue is node.<name>, its history is kept under it.",
        f"SPARKOPS_NODE_NAME={node_name}",
        "# This SparkOps' address, for links in notifications.",
        f"SPARKOPS_PUBLIC_URL={url}",
        "# Behind a TLS proxy: secure cookies, HSTS and the redirect.",
        "# SPARKOPS_HTTPS=1",
        "",
        *docker,
        "",
        "# The page-cache helper, run through `sudo -n` (SparkOps adds that itself; the",
        f"# sudoers rule {SUDOERS} allows exactly this command without arguments).",
        f"SPARKOPS_DROP_CACHES_COMMAND={HELPER}",
        "",
        "# The memory cgroup the engines are confined to, if any (a slice with MemoryMax=):",
        "# the headroom is then the smaller of MemAvailable and the budget's room.",
        "# SPARKOPS_MEMORY_BUDGET_CGROUP=/sys/fs/cgroup/inference.slice",
        "",
        "# The first admin: user name and password (otherwise generated into",
        f"# {ADMIN_PASSWORD_FILE}).",
        "# SPARKOPS_ADMIN_USER=admin",
        "# SPARKOPS_ADMIN_PASSWORD=",
        "",
        "# Mail relay for email channels.",
        "# SPARKOPS_SMTP_HOST=smtp.example.org",
        "# SPARKOPS_SMTP_PORT=587",
        "# SPARKOPS_SMTP_STARTTLS=1",
        "# SPARKOPS_SMTP_USER=sparkops",
        "# SPARKOPS_SMTP_PASSWORD=",
        "# SPARKOPS_MAIL_FROM=sparkops@example.org",
        "",
        "# Bearer token for /metrics and /api/v1/ (a Prometheus scrape job).",
        "# SPARKOPS_EXPORT_TOKEN=",
        "# SPARKOPS_TIME_ZONE=UTC",
        "",
        "# PostgreSQL and Redis instead of the embedded SQLite and file broker:",
        "# DATABASE_URL=postgresql://sparkops@127.0.0.1/sparkops",
        "# CELERY_BROKER_URL=redis://127.0.0.1:6379/0",
    ]
    return "\n".join(lines) + "\n"


def read_settings(text: str) -> dict[str, str]:
    """``KEY=VALUE`` lines as systemd's ``EnvironmentFile=`` reads them (comments skipped,
    surrounding quotes removed); enough to read back what an admin kept."""
    settings = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;" or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        settings[key.strip()] = value
    return settings


def render_unit(template: str, *, docker_access: str, proxy: bool) -> str:
    """``deploy/systemd/sparkops.service`` with its ``@NAME@`` placeholders filled in; ``proxy``:
    the Docker API proxy's unit is installed, and SparkOps starts after it."""
    if proxy:
        dependency = (f"# The least-privilege Docker API proxy that SPARKOPS_DOCKER_HOST names.\n"
                      f"Wants={PROXY_UNIT_NAME}\nAfter={PROXY_UNIT_NAME}")
    else:
        dependency = f"# No Docker API proxy (--docker-access {docker_access})."
    if docker_access == "group":
        groups = (f"# Docker's socket belongs to group {DOCKER_GROUP} (root-equivalent).\n"
                  f"SupplementaryGroups={DOCKER_GROUP}")
    elif docker_access == "proxy":
        groups = f"# The Docker API proxy's socket belongs to group {SERVICE_GROUP}: no other."
    else:
        groups = "# No container engine access (--docker-access none): no other group."
    values = {
        "@USER@": SERVICE_USER, "@GROUP@": SERVICE_GROUP, "@APP_DIR@": str(APP_DIR),
        "@VENV_DIR@": str(VENV_DIR), "@DATA_DIR@": str(DATA_DIR), "@ENV_FILE@": str(ENV_FILE),
        "@PROXY_DEPENDENCY@": dependency, "@SUPPLEMENTARY_GROUPS@": groups,
        "@PRIVILEGE_SANDBOX@": privilege_sandbox(docker_access),
    }
    text = PLACEHOLDER.sub(lambda match: values.get(match.group(0), match.group(0)), template)
    unknown = sorted(set(PLACEHOLDER.findall(text)))
    if unknown:
        raise InstallError(f"{UNIT_TEMPLATE} has placeholders the installer does not know: "
                           f"{', '.join(unknown)}")
    return text


def privilege_sandbox(docker_access: str) -> str:
    """The unit's lines on NoNewPrivileges and the seccomp-based options.

    For a service whose ``User=`` is not root, systemd can install a seccomp filter only with
    the process's no-new-privileges flag set, so each option below turns NoNewPrivileges on by
    itself; with it, sudo cannot run the page-cache helper as root. Only a monitor that never
    drops the page cache (``--docker-access none``) gets them."""
    if docker_access != "none":
        return "\n".join([
            "# - NoNewPrivileges=, and every option that installs a seccomp filter:",
            "#   SystemCallFilter=, SystemCallArchitectures=, RestrictAddressFamilies=,",
            "#   RestrictNamespaces=, RestrictRealtime=, RestrictSUIDSGID=, LockPersonality=,",
            "#   MemoryDenyWriteExecute=, ProtectKernelModules=, ProtectKernelLogs=,",
            "#   ProtectKernelTunables=, ProtectHostname=. For a service whose User= is not",
            "#   root, systemd installs such a filter only with NoNewPrivileges on, so each",
            "#   of them turns it on, and sudo then refuses to run the page-cache helper",
            f"#   ({HELPER}) as root. ProtectKernelTunables= would also make",
            "#   /proc/sys/vm/drop_caches, which the helper writes, read-only in the service's",
            "#   mount namespace. (`--docker-access none`, which never drops the page cache,",
            "#   turns them on.)",
        ])
    return "\n".join([
        "# - MemoryDenyWriteExecute=: ctypes, under NVML's bindings, may build code in memory.",
        "# Monitor only (--docker-access none): SparkOps never runs the page-cache helper, so",
        "# nothing needs sudo, and the options that imply NoNewPrivileges are on.",
        "NoNewPrivileges=yes",
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectKernelLogs=yes",
        "ProtectHostname=yes",
        "RestrictRealtime=yes",
        "RestrictSUIDSGID=yes",
        "RestrictNamespaces=yes",
        "LockPersonality=yes",
        "SystemCallArchitectures=native",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK",
    ])


# --- checks before anything changes --------------------------------------------------------------


def require_root(command: str) -> None:
    if os.geteuid() != 0:
        raise InstallError(f"must run as root (sudo bin/sparkops {command})")


def unreachable_by_others(path: Path) -> Path | None:
    """The first folder on the way to ``path`` (symbolic links resolved) that other users
    cannot enter, or ``path`` itself if they cannot run it; None when anyone can run it."""
    real = Path(os.path.realpath(path))
    for folder in reversed(real.parents):
        if not os.stat(folder).st_mode & 0o001:
            return folder
    return None if os.stat(real).st_mode & 0o001 else real


def check_python() -> None:
    """The Python running this builds the venv the service runs: recent enough, with venv, and
    runnable by sparkops (not a per-user build under /root)."""
    if sys.version_info < MIN_PYTHON:
        raise InstallError(f"Python {sys.version.split()[0]} is too old: SparkOps needs 3.11 or "
                           f"later (sudo env PYTHON=/usr/bin/python3.12 bin/sparkops install)")
    try:
        import ensurepip  # noqa: F401 - only whether it is there
        import venv  # noqa: F401
    except ImportError:
        raise InstallError(f"{sys.executable} cannot create a venv (no ensurepip): install "
                           f"it with apt-get install python3-venv") from None
    closed = unreachable_by_others(Path(sys.executable))
    if closed is not None:
        raise InstallError(f"{sys.executable} cannot be run by user {SERVICE_USER} ({closed} is "
                           f"closed to other users): run the installer with the system's Python,"
                           f" e.g. sudo env PYTHON=/usr/bin/python3 bin/sparkops install")


def check_source(docker_access: str) -> None:
    needed = [UNIT_TEMPLATE, "bin/sparkops", "manage.py", LOCK_FILE]
    if docker_access != "none":
        needed += [HELPER_SOURCE, SUDOERS_SOURCE]
    missing = [name for name in needed if not (SOURCE / name).is_file()]
    if missing:
        raise InstallError(f"{SOURCE} is not a complete copy of SparkOps: {', '.join(missing)} "
                           f"missing")


def check_tools(docker_access: str) -> None:
    tools = ["useradd", "userdel", "usermod", "gpasswd"]
    if docker_access != "none":
        tools.append("visudo")
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        package = " (apt-get install sudo)" if missing == ["visudo"] else ""
        raise InstallError(f"needed commands are not installed: {', '.join(missing)}{package}")
    if docker_access == "group" and group_entry(DOCKER_GROUP) is None:
        raise InstallError(f"--docker-access group: there is no group {DOCKER_GROUP!r} (is "
                           f"Docker installed?)")


# --- small helpers --------------------------------------------------------------------------------


def run(argv: list[str], what: str) -> str:
    """Run ``argv``; its standard output, or InstallError naming ``what`` and the last line it
    printed."""
    try:
        result = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    except OSError as error:
        raise InstallError(f"{what}: cannot run {argv[0]}: {error.strerror}") from None
    if result.returncode != 0:
        said = (result.stderr.strip() or result.stdout.strip()).splitlines()
        raise InstallError(f"{what} failed (exit status {result.returncode})"
                           f"{': ' + said[-1].strip() if said else ''}")
    return result.stdout


def user_entry(name: str) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None


def group_entry(name: str) -> grp.struct_group | None:
    try:
        return grp.getgrnam(name)
    except KeyError:
        return None


def service_ids() -> tuple[int, int]:
    entry = user_entry(SERVICE_USER)
    if entry is None:
        raise InstallError(f"user {SERVICE_USER} is missing")
    return entry.pw_uid, entry.pw_gid


def install_file(content: bytes, target: Path, mode: int, uid: int = 0, gid: int = 0) -> None:
    """Put ``content`` at ``target`` with its owner and mode set before it appears there (a
    temporary file beside it, renamed into place)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(content)
            os.fchown(file.fileno(), uid, gid)
            os.fchmod(file.fileno(), mode)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def remove_path(path: Path) -> bool:
    """Remove a file or a folder tree; whether there was one."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
        return True
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def systemd_runs() -> bool:
    return SYSTEMD_RUNNING.is_dir()


def member_of(group: str, user: str) -> bool:
    entry = group_entry(group)
    return entry is not None and user in entry.gr_mem


def user_processes(uid: int) -> list[int]:
    """Pids of the live processes (not zombies) whose real or effective user is ``uid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            fields = dict(line.split(":", 1) for line in
                          (entry / "status").read_text().splitlines() if ":" in line)
            live = not fields.get("State", "").strip().startswith("Z")
            if live and str(uid) in fields.get("Uid", "").split()[:2]:
                found.append(int(entry.name))
    return sorted(found)


class Progress:
    """Numbered progress lines: ``[2/9] copying ... done``, then any notes of that step."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.number = 0
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        self.notes.append(text)

    def step(self, title: str, action: Callable[[], str | None]) -> None:
        self.number += 1
        print(f"[{self.number}/{self.total}] {title} ...", end=" ", flush=True)
        try:
            outcome = action()
        except BaseException:
            print("failed", flush=True)
            raise
        print(outcome or "done", flush=True)
        for text in self.notes:
            print(f"      {text}", flush=True)
        self.notes.clear()


# --- install --------------------------------------------------------------------------------------


def nologin_shell() -> str:
    for shell in ("/usr/sbin/nologin", "/sbin/nologin"):
        if os.access(shell, os.X_OK):
            return shell
    return "/bin/false"


def create_user(progress: Progress) -> str:
    entry = user_entry(SERVICE_USER)
    if entry is not None:
        if entry.pw_shell not in ("/usr/sbin/nologin", "/sbin/nologin", "/bin/false"):
            progress.note(f"warning: user {SERVICE_USER} has the login shell {entry.pw_shell}; "
                          f"`usermod --shell /usr/sbin/nologin {SERVICE_USER}` closes it")
        return "kept (already there)"
    argv = ["useradd", "--system", "--no-create-home", "--home-dir", str(DATA_DIR),
            "--shell", nologin_shell(), "--comment", "SparkOps service"]
    argv += ["--gid", SERVICE_GROUP] if group_entry(SERVICE_GROUP) else ["--user-group"]
    run([*argv, SERVICE_USER], f"useradd {SERVICE_USER}")
    return "done"


def source_files(source: Path) -> tuple[list[str], list[str]]:
    """The files to install, relative to ``source``, and those left out as private.

    In a git checkout: what git tracks, plus new files not yet committed that .gitignore does
    not exclude; otherwise every file but the local state (``LOCAL_STATE``) and compiled
    bytecode. A file that is not tracked and that only its owner may read (an admin's
    ``sparkops.env`` beside ``compose.yaml``, say) is someone's secret, not part of the
    application: it is left out, since the copy is readable by everyone."""
    tracked: list[str] = []
    others: list[str] = []
    if (source / ".git").exists() and shutil.which("git"):
        git = ["git", "-c", f"safe.directory={source}", "-C", str(source), "ls-files", "-z"]
        listed = [subprocess.run([*git, *options], capture_output=True, text=True,
                                 stdin=subprocess.DEVNULL)
                  for options in (["--cached"], ["--others", "--exclude-standard"])]
        if all(result.returncode == 0 for result in listed):
            tracked, others = ([name for name in result.stdout.split("\0") if name]
                               for result in listed)
    if not tracked:
        for folder, subfolders, files in os.walk(source):
            subfolders[:] = sorted(name for name in subfolders if name not in LOCAL_STATE)
            others += [str((Path(folder) / name).relative_to(source)) for name in sorted(files)
                       if not name.endswith(".pyc")]
    regular = [name for name in dict.fromkeys(tracked + others)
               if (source / name).is_file() and not (source / name).is_symlink()]
    private = [name for name in regular
               if name not in tracked and not os.stat(source / name).st_mode & 0o004]
    return sorted(set(regular) - set(private)), sorted(private)


def copy_application(progress: Progress) -> str:
    """Copy the application into a fresh folder beside ``APP_DIR``, then swap it in: root's,
    files 0644 (0755 where executable), folders 0755."""
    files, private = source_files(SOURCE)
    OPT_DIR.mkdir(mode=0o755, exist_ok=True)
    os.chown(OPT_DIR, 0, 0)
    os.chmod(OPT_DIR, 0o755)
    fresh = OPT_DIR / "app.new"
    remove_path(fresh)
    fresh.mkdir(mode=0o755)
    for name in files:
        target = fresh / name
        target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        shutil.copyfile(SOURCE / name, target)
        executable = os.stat(SOURCE / name).st_mode & 0o111
        os.chmod(target, 0o755 if executable else 0o644)
    old = OPT_DIR / "app.old"
    remove_path(old)
    if APP_DIR.exists():
        APP_DIR.rename(old)
    fresh.rename(APP_DIR)
    remove_path(old)
    progress.note(f"{len(files)} files from {SOURCE}")
    if private:
        shown = ", ".join(private[:5]) + (", ..." if len(private) > 5 else "")
        progress.note(f"left out {len(private)} private files git does not track: {shown}")
    return "done"


def venv_matches(python: str) -> bool:
    """Whether ``VENV_DIR`` was built by this same Python (its pyvenv.cfg says which)."""
    try:
        config = read_settings((VENV_DIR / "pyvenv.cfg").read_text().replace(" = ", "="))
    except OSError:
        return False
    version = ".".join(str(part) for part in sys.version_info[:3])
    return (config.get("home") == os.path.dirname(python) and config.get("version") == version
            and os.access(VENV_DIR / "bin" / "python", os.X_OK))


def build_venv(progress: Progress) -> str:
    """The service's venv: the lock, hash-checked, into a venv of this Python; the
    application's bytecode compiled ahead (the service cannot write it); the stamp."""
    python = sys.executable
    if venv_matches(python):
        progress.note(f"reused the venv of {python}")
    else:
        remove_path(VENV_DIR)
        run([python, "-m", "venv", str(VENV_DIR)], f"{python} -m venv")
    venv_python = str(VENV_DIR / "bin" / "python")
    run([venv_python, "-m", "pip", "install", "--quiet", "--no-input",
         "--disable-pip-version-check", "--require-hashes", "-r", str(APP_DIR / LOCK_FILE)],
        f"pip install -r {LOCK_FILE}")
    progress.note(f"installed {LOCK_FILE}, every file checked against its hash")
    run([venv_python, "-m", "compileall", "-q", str(APP_DIR)], "compiling the application")
    write_stamp(APP_DIR, VENV_DIR)
    return "done"


def create_data_dir(progress: Progress) -> str:
    uid, gid = service_ids()
    existed = DATA_DIR.exists()
    DATA_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    if os.lstat(DATA_DIR).st_uid != uid:
        # Kept from an installation whose user had another uid: hand it all to this one.
        for folder, subfolders, files in os.walk(DATA_DIR):
            for name in [*subfolders, *files]:
                os.lchown(os.path.join(folder, name), uid, gid)
        if existed:
            progress.note(f"handed the kept {DATA_DIR} to user {SERVICE_USER}")
    os.chown(DATA_DIR, uid, gid)
    os.chmod(DATA_DIR, 0o700)
    return "kept, owner and mode checked" if existed else "done"


def write_settings(progress: Progress, *, bind: str, node_name: str,
                   docker_access: str) -> str:
    _, gid = service_ids()
    ETC_DIR.mkdir(mode=0o750, exist_ok=True)
    os.chown(ETC_DIR, 0, gid)
    os.chmod(ETC_DIR, 0o750)
    text = render_settings(bind=bind, node_name=node_name, docker_access=docker_access)
    try:
        descriptor = os.open(ENV_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
    except FileExistsError:
        os.chown(ENV_FILE, 0, gid)
        os.chmod(ENV_FILE, 0o640)
        for warning in kept_settings_warnings(ENV_FILE.read_text(), docker_access):
            progress.note(f"warning: {warning}")
        return "kept (your edits stay; --bind and --node-name apply to a new file only)"
    with os.fdopen(descriptor, "w") as file:
        os.fchown(file.fileno(), 0, gid)
        os.fchmod(file.fileno(), 0o640)
        file.write(text)
    return "done"


def kept_settings_warnings(text: str, docker_access: str) -> list[str]:
    """What in a kept settings file disagrees with the chosen ``--docker-access``."""
    settings = read_settings(text)
    warnings = []
    host = settings.get("SPARKOPS_DOCKER_HOST", "")
    read_only = settings.get("SPARKOPS_READ_ONLY", "").lower() in ("1", "true", "yes", "on")
    if docker_access == "proxy" and host != PROXY_SOCKET_URL:
        warnings.append(f"{ENV_FILE} does not set SPARKOPS_DOCKER_HOST={PROXY_SOCKET_URL} "
                        f"(the proxy's socket)")
    if docker_access != "proxy" and host == PROXY_SOCKET_URL:
        warnings.append(f"{ENV_FILE} sets SPARKOPS_DOCKER_HOST to the proxy's socket, and "
                        f"--docker-access {docker_access} installs no proxy")
    if docker_access != "none" and read_only:
        warnings.append(f"{ENV_FILE} sets SPARKOPS_READ_ONLY: SparkOps only monitors")
    if docker_access == "none" and not read_only:
        warnings.append(f"{ENV_FILE} does not set SPARKOPS_READ_ONLY=1 (--docker-access none)")
    return warnings


def install_drop_caches_helper(progress: Progress, docker_access: str) -> str:
    if docker_access == "none":
        removed = [path for path in (SUDOERS, HELPER) if remove_path(path)]
        if removed:
            progress.note(f"removed {', '.join(map(str, removed))} of an earlier installation")
        return "not installed (--docker-access none: SparkOps never drops the page cache)"
    install_file((SOURCE / HELPER_SOURCE).read_bytes(), HELPER, 0o755)
    rule = (SOURCE / SUDOERS_SOURCE).read_bytes()
    # Checked outside /etc/sudoers.d (sudo reads every file there, a broken one locks sudo
    # out), then moved into place.
    descriptor, checked = tempfile.mkstemp(dir=SUDOERS.parent.parent, prefix=".sparkops-sudoers.")
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(rule)
            os.fchmod(file.fileno(), 0o440)
        run(["visudo", "-c", "-q", "-f", checked], f"visudo -cf {SUDOERS_SOURCE}")
        SUDOERS.parent.mkdir(mode=0o750, exist_ok=True)
        shutil.move(checked, SUDOERS)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(checked)
    os.chown(SUDOERS, 0, 0)
    os.chmod(SUDOERS, 0o440)
    progress.note(f"{HELPER} and {SUDOERS}: sudo -n {HELPER} for {SERVICE_USER}")
    return "done"


def set_docker_access(progress: Progress, docker_access: str) -> tuple[str, bool]:
    """Give sparkops the chosen access; returns the outcome and whether the proxy's unit is
    installed."""
    if docker_access != "group" and member_of(DOCKER_GROUP, SERVICE_USER):
        run(["gpasswd", "--delete", SERVICE_USER, DOCKER_GROUP], "gpasswd --delete")
        progress.note(f"took {SERVICE_USER} out of the {DOCKER_GROUP} group")
    if docker_access != "proxy" and remove_proxy_unit():
        progress.note(f"removed {PROXY_UNIT_FILE}")
    if docker_access == "group":
        run(["usermod", "--append", "--groups", DOCKER_GROUP, SERVICE_USER], "usermod")
        progress.note(f"warning: the {DOCKER_GROUP} group is root-equivalent: whoever runs "
                      f"code as {SERVICE_USER} can start a privileged container")
        return f"{SERVICE_USER} joined the {DOCKER_GROUP} group", False
    if docker_access == "none":
        return "none: monitor only", False
    config, unit = SOURCE / PROXY_SOURCE_CONFIG, SOURCE / PROXY_SOURCE_UNIT
    if not (config.is_file() and unit.is_file()):
        progress.note(f"warning: this copy has no {PROXY_SOURCE_CONFIG} and {PROXY_SOURCE_UNIT}:"
                      f" nothing listens on {PROXY_SOCKET_URL}")
        return "proxy not installed", False
    install_file(config.read_bytes(), PROXY_CONFIG, 0o644)
    install_file(unit.read_bytes(), PROXY_UNIT_FILE, 0o644)
    progress.note(f"{PROXY_CONFIG} and {PROXY_UNIT_FILE}")
    if shutil.which("haproxy") is None:
        progress.note("warning: haproxy is not installed, the proxy cannot start: "
                      "apt-get install haproxy")
    if group_entry(DOCKER_GROUP) is None:
        progress.note(f"warning: the proxy reaches the engine's socket as a member of group "
                      f"{DOCKER_GROUP}, and there is no such group here "
                      f"({PROXY_UNIT_FILE} says how to give Podman's socket to one)")
    return "done", True


def remove_proxy_unit() -> bool:
    if not PROXY_UNIT_FILE.exists():
        return False
    if systemd_runs():
        run(["systemctl", "disable", "--now", PROXY_UNIT_NAME], f"stopping {PROXY_UNIT_NAME}")
    return remove_path(PROXY_UNIT_FILE)


def write_unit(docker_access: str, proxy: bool) -> str:
    template = (SOURCE / UNIT_TEMPLATE).read_text()
    text = render_unit(template, docker_access=docker_access, proxy=proxy)
    install_file(text.encode(), UNIT_FILE, 0o644)
    return "done"


def start_commands(proxy: bool) -> list[list[str]]:
    """What starts (or, after an upgrade, restarts) the service and, with it, the proxy."""
    units = [PROXY_UNIT_NAME, UNIT_NAME] if proxy else [UNIT_NAME]
    return [["systemctl", "daemon-reload"], ["systemctl", "enable", *units],
            *(["systemctl", "restart", unit] for unit in units)]


def start_service(progress: Progress, *, no_start: bool, proxy: bool) -> str:
    commands = start_commands(proxy)
    text = " && ".join(" ".join(argv) for argv in commands)
    if no_start:
        progress.note(f"to start it: {text}")
        return "skipped (--no-start)"
    if not systemd_runs():
        progress.note(f"once systemd runs: {text}")
        return "skipped (systemd is not running here)"
    for argv in commands:
        if argv[-1] == PROXY_UNIT_NAME and argv[1] == "restart":
            # SparkOps runs without the proxy too (its pages say the engine is unreachable).
            try:
                run(argv, " ".join(argv))
            except InstallError as error:
                progress.note(f"warning: {error}; see systemctl status {PROXY_UNIT_NAME}")
            continue
        run(argv, " ".join(argv))
    return "done"


def install(args: argparse.Namespace) -> None:
    require_root("install")
    split_bind(args.bind)
    node_name = args.node_name or default_node_name()
    if not NODE_NAME.match(node_name):
        raise InstallError(f"--node-name {node_name!r}: use letters, digits, '.', '_' and '-' "
                           f"(at most 63, starting with a letter or digit)")
    check_python()
    check_source(args.docker_access)
    check_tools(args.docker_access)
    os.umask(0o022)
    print(f"Installing SparkOps from {SOURCE} as the systemd service {UNIT_NAME}.")
    progress = Progress(9)
    proxy = False

    def docker_access() -> str:
        nonlocal proxy
        outcome, proxy = set_docker_access(progress, args.docker_access)
        return outcome

    progress.step(f"creating the system user {SERVICE_USER}", lambda: create_user(progress))
    progress.step(f"copying the application to {APP_DIR}", lambda: copy_application(progress))
    progress.step(f"building the venv {VENV_DIR} (pip, a minute or two)",
                  lambda: build_venv(progress))
    progress.step(f"creating the data directory {DATA_DIR}", lambda: create_data_dir(progress))
    progress.step(f"writing the settings {ENV_FILE}", lambda: write_settings(
        progress, bind=args.bind, node_name=node_name, docker_access=args.docker_access))
    progress.step("installing the page-cache helper and its sudoers rule",
                  lambda: install_drop_caches_helper(progress, args.docker_access))
    progress.step(f"setting up Docker access ({args.docker_access})", docker_access)
    progress.step(f"writing the unit {UNIT_FILE}", lambda: write_unit(args.docker_access, proxy))
    progress.step(f"starting {UNIT_NAME}", lambda: start_service(
        progress, no_start=args.no_start, proxy=proxy))
    settings = read_settings(ENV_FILE.read_text())
    url = public_url(settings.get("SPARKOPS_BIND", DEFAULT_BIND))
    print(f"SparkOps is installed. Open {url}/ and sign in as "
          f"{settings.get('SPARKOPS_ADMIN_USER', 'admin')}.")
    if settings.get("SPARKOPS_ADMIN_PASSWORD"):
        print(f"The admin password is SPARKOPS_ADMIN_PASSWORD in {ENV_FILE}.")
    else:
        print(f"The admin password is in {ADMIN_PASSWORD_FILE} once the service has started "
              f"(readable by root and {SERVICE_USER}).")
    print(f"Settings: {ENV_FILE}. Logs: journalctl -u {UNIT_NAME.removesuffix('.service')}.")


# --- uninstall ------------------------------------------------------------------------------------


def stop_service() -> str:
    units = [name for name, path in ((UNIT_NAME, UNIT_FILE), (PROXY_UNIT_NAME, PROXY_UNIT_FILE))
             if path.exists()]
    if systemd_runs():
        for name in units:
            run(["systemctl", "disable", "--now", name], f"stopping {name}")
    entry = user_entry(SERVICE_USER)
    running = user_processes(entry.pw_uid) if entry else []
    if running:
        raise InstallError(f"user {SERVICE_USER} still runs processes "
                           f"({', '.join(map(str, running[:8]))}): stop SparkOps first")
    if not systemd_runs():
        return "nothing to stop (systemd is not running here)"
    return f"stopped and disabled {', '.join(units)}" if units else "nothing to stop"


def remove_units() -> str:
    removed = [path for path in (UNIT_FILE, PROXY_UNIT_FILE) if remove_path(path)]
    if removed and systemd_runs():
        run(["systemctl", "daemon-reload"], "systemctl daemon-reload")
    return "done" if removed else "none there"


def remove_helper() -> str:
    removed = [path for path in (SUDOERS, HELPER) if remove_path(path)]
    return "done" if removed else "none there"


def remove_application() -> str:
    if member_of(DOCKER_GROUP, SERVICE_USER):
        run(["gpasswd", "--delete", SERVICE_USER, DOCKER_GROUP], "gpasswd --delete")
    return "done" if remove_path(OPT_DIR) else "none there"


def purge() -> str:
    removed = [str(path) for path in (DATA_DIR, ETC_DIR) if remove_path(path)]
    if user_entry(SERVICE_USER) is not None:
        run(["userdel", SERVICE_USER], f"userdel {SERVICE_USER}")
        removed.append(f"user {SERVICE_USER}")
    if group_entry(SERVICE_GROUP) is not None:
        run(["groupdel", SERVICE_GROUP], f"groupdel {SERVICE_GROUP}")
        removed.append(f"group {SERVICE_GROUP}")
    return f"removed {', '.join(removed)}" if removed else "none there"


def uninstall(args: argparse.Namespace) -> None:
    require_root("uninstall")
    print(f"Removing the SparkOps service{' and all its data' if args.purge else ''}.")
    progress = Progress(5 if args.purge else 4)
    progress.step(f"stopping {UNIT_NAME}", stop_service)
    progress.step(f"removing {UNIT_FILE} and {PROXY_UNIT_NAME}", remove_units)
    progress.step(f"removing {HELPER} and {SUDOERS}", remove_helper)
    progress.step(f"removing {OPT_DIR}", remove_application)
    if args.purge:
        progress.step(f"removing {DATA_DIR}, {ETC_DIR} and user {SERVICE_USER}", purge)
        print("SparkOps is removed, with its data, settings and user.")
        return
    print(f"SparkOps is removed. Kept: {DATA_DIR} (the database, secret key and admin "
          f"password), {ETC_DIR} (settings) and user {SERVICE_USER}; "
          f"`bin/sparkops uninstall --purge` removes them too.")


# --- the command line -----------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(
        prog="bin/sparkops", description="Install SparkOps as a systemd service, or remove it "
                                         "(as root).")
    commands = main.add_subparsers(dest="command", required=True, metavar="install|uninstall")
    add = commands.add_parser(
        "install", help="install or upgrade the service",
        description=f"Install or upgrade SparkOps as the systemd service {UNIT_NAME}: user "
                    f"{SERVICE_USER}, {APP_DIR}, {VENV_DIR}, {DATA_DIR}, {ENV_FILE} (kept if "
                    f"there), the page-cache helper and its sudoers rule, the unit; then enable "
                    f"and start it where systemd runs.")
    add.add_argument("--bind", default=DEFAULT_BIND, metavar="HOST:PORT",
                     help=f"address of the web server, for a new settings file "
                          f"(default {DEFAULT_BIND})")
    add.add_argument("--node-name", metavar="NAME",
                     help="this node's name, for a new settings file (default: from the host "
                          "name)")
    add.add_argument("--docker-access", choices=DOCKER_ACCESS, default="proxy",
                     help="how SparkOps reaches the container engine: proxy (default; the "
                          "least-privilege Docker API proxy), group (the docker group, "
                          "root-equivalent) or none (monitor only)")
    add.add_argument("--no-start", action="store_true",
                     help="install everything but do not enable or start the service")
    add.set_defaults(handler=install)
    remove = commands.add_parser(
        "uninstall", help="remove the service",
        description=f"Stop and remove the service, its units, the page-cache helper, the "
                    f"sudoers rule and {OPT_DIR}. {DATA_DIR}, {ETC_DIR} and user "
                    f"{SERVICE_USER} are kept unless --purge.")
    remove.add_argument("--purge", action="store_true",
                        help=f"also remove {DATA_DIR} (the database), {ETC_DIR} and the user")
    remove.set_defaults(handler=uninstall)
    return main


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        args.handler(args)
    except InstallError as error:
        print(f"sparkops {args.command}: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        where = f" ({error.filename})" if error.filename else ""
        print(f"sparkops {args.command}: {error.strerror or error}{where}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
