"""``bin/sparkops install|uninstall``: SparkOps as a systemd service (``sparkops/install.py``).

Fast: the unit template renders with its sandbox (and without every option that would stop sudo
from running the page-cache helper), the settings file parses with ``sparkops.env``'s rules,
the venv stamp is what ``bin/sparkops``' ``ensure_venv`` checks, and the installer refuses to run
without root in one line.

Slow, one install in a throw-away root: a Podman container whose root file system is an overlay
of this machine's (``--rootfs /:O``, writes vanish with it), run as root, host network, systemd
as its PID 1, in a private Podman (:class:`collectors.podman.PrivatePodman`) destroyed at the
end, pass or fail. In order, on the same root:

* ``install --no-start``: ``systemd-analyze verify`` checks the unit, the install's users, files
  and modes are asserted, and nothing has run (no database); reinstalls keep the admin's settings
  while the Docker access changes (group, then back to the proxy);
* ``install`` again (idempotent) is the installer's own start: it enables and starts the service,
  which collects as sparkops (every process, every id) with the no-new-privileges flag off and
  installs nothing at start; SparkOps' own page-cache call, run as a one-shot copy of the unit
  (its user, settings, environment and sandbox), reaches the helper as root through sudo;
* ``install --docker-access none`` turns on the seccomp options, and SparkOps still collects;
* ``systemctl stop`` (SIGTERM to the supervisor) stops the whole stack without systemd having to
  kill anything; ``uninstall`` keeps the data, settings and user, ``uninstall --purge`` removes
  them.

pip in the root may keep what it downloads in a cache outside the checkout and the root
(``$SPARKOPS_TEST_CACHE/pip``, by default ``/var/cache/sparkops-tests/pip``, bind-mounted). It
keeps only what the index's answers allow it to (one without caching headers is fetched again),
and checks every file against the lock's hashes whatever its source, so a cached wheel installs
exactly what a download would.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from collectors import pagecache
from collectors.podman import LeftoverError, PodmanError, PrivatePodman
from sparkops import env, install
from sparkops.testing.ports import free_port, wait_for_port
from tests.conftest import PROJECT

SCRIPT = PROJECT / "sparkops" / "install.py"
# The system's Python (Debian, Ubuntu): a per-user build under /root could not be run by sparkops.
SYSTEM_PYTHON = Path("/usr/bin/python3")
# Every option that, for a service whose User= is not root, sets the no-new-privileges flag:
# NoNewPrivileges itself, DynamicUser (which implies it), and each option that installs a
# seccomp filter, which systemd applies to a non-root service only with the flag set
# (context_has_no_new_privileges in its source). With the flag, sudo refuses to become root.
SUDO_BREAKING = {
    "NoNewPrivileges", "SystemCallFilter", "SystemCallArchitectures", "SystemCallLog",
    "RestrictAddressFamilies", "RestrictNamespaces", "RestrictRealtime", "RestrictSUIDSGID",
    "RestrictFileSystems", "LockPersonality", "MemoryDenyWriteExecute", "ProtectKernelModules",
    "ProtectKernelLogs", "ProtectKernelTunables", "ProtectHostname", "ProtectClock",
    "PrivateDevices", "DynamicUser",
}
SAMPLES_WITHIN_SECONDS = 180


# --- reading a unit and a settings file as systemd does ------------------------------------------


def unit_settings(text: str) -> dict[str, dict[str, list[str]]]:
    """A unit file's sections, each ``key -> [values]`` in order (systemd's format: a key may
    repeat; ``#`` and ``;`` start comments)."""
    sections: dict[str, dict[str, list[str]]] = {}
    section = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = sections.setdefault(line.strip("[]"), {})
            continue
        key, sep, value = line.partition("=")
        assert section is not None and sep, f"not a unit line: {line!r}"
        section.setdefault(key.strip(), []).append(value.strip())
    return sections


def environment_file(text: str) -> dict[str, str]:
    """``KEY=VALUE`` lines as systemd's EnvironmentFile= reads them (comment lines skipped)."""
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        key, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key), f"not KEY=VALUE: {line!r}"
        values[key] = value
    return values


def rendered_unit(docker_access: str, proxy: bool) -> str:
    template = (PROJECT / install.UNIT_TEMPLATE).read_text()
    return install.render_unit(template, docker_access=docker_access, proxy=proxy)


# --- fast: the pieces ----------------------------------------------------------------------------


@pytest.mark.parametrize("docker_access", install.DOCKER_ACCESS)
def test_the_unit_runs_bin_sparkops_start_as_sparkops_in_a_sandbox(docker_access):
    proxy = docker_access == "proxy"
    text = rendered_unit(docker_access, proxy)
    assert "@" not in text  # every placeholder filled in
    unit = unit_settings(text)
    service = unit["Service"]

    assert service["User"] == ["sparkops"] and service["Group"] == ["sparkops"]
    assert service["EnvironmentFile"] == ["/etc/sparkops/sparkops.env"]
    assert service["Environment"] == ["SPARKOPS_VENV=/opt/sparkops/venv"]
    assert service["WorkingDirectory"] == ["/opt/sparkops/app"]
    assert service["ExecStart"] == ["/opt/sparkops/app/bin/sparkops start"]
    assert service["Restart"] == ["on-failure"] and service["RestartSec"] == ["10"]
    assert service["TimeoutStopSec"] == ["45"] and service["KillMode"] == ["mixed"]
    assert "StandardOutput" not in service and "StandardError" not in service  # the journal
    for key, value in {"ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
                       "ReadWritePaths": "/var/lib/sparkops", "ProtectControlGroups": "yes",
                       "UMask": "0077"}.items():
        assert service[key] == [value], key
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]
    after = " ".join(unit["Unit"]["After"]).split()
    wants = " ".join(unit["Unit"]["Wants"]).split()
    assert {"network-online.target", "docker.service"} <= set(after)
    assert ("sparkops-docker-proxy.service" in after) is proxy
    assert ("sparkops-docker-proxy.service" in wants) is proxy
    assert "PrivateDevices" not in service  # NVML needs /dev/nvidia*
    assert "ProtectClock" not in service and "DeviceAllow" not in service
    assert service.get("SupplementaryGroups") == (["docker"] if docker_access == "group"
                                                  else None)
    if docker_access == "none":
        # A monitor never drops the page cache: nothing needs sudo, the seccomp options are on.
        assert service["NoNewPrivileges"] == ["yes"]
        assert service["ProtectKernelTunables"] == ["yes"]
        assert service["SystemCallArchitectures"] == ["native"]
        assert service["LockPersonality"] == ["yes"] and service["RestrictRealtime"] == ["yes"]
    else:
        assert not SUDO_BREAKING & set(service), sorted(SUDO_BREAKING & set(service))


def test_a_template_placeholder_the_installer_does_not_know_is_an_error():
    with pytest.raises(install.InstallError, match="@UNKNOWN_THING@"):
        install.render_unit("[Service]\nUser=@USER@\nX=@UNKNOWN_THING@\n",
                            docker_access="proxy", proxy=True)


def test_the_settings_file_is_what_sparkops_reads(monkeypatch):
    text = install.render_settings(bind="127.0.0.1:9123", node_name="spark-07",
                                   docker_access="proxy")
    values = environment_file(text)
    for key, value in values.items():
        monkeypatch.setenv(key, value)

    assert env.env_str("SPARKOPS_DATA_DIR", "") == "/var/lib/sparkops"
    assert env.env_str("SPARKOPS_BIND", "") == "127.0.0.1:9123"
    assert env.env_str("SPARKOPS_NODE_NAME", "") == "spark-07"
    assert env.env_str("SPARKOPS_PUBLIC_URL", "") == "http://127.0.0.1:9123"
    assert env.env_str("SPARKOPS_DOCKER_HOST", "") == "unix:///run/sparkops-docker/docker.sock"
    assert env.env_bool("SPARKOPS_READ_ONLY", False) is False
    # env_list splits at commas: the value is the helper alone, and SparkOps puts `sudo -n`
    # before it (not being root). `sudo -n <helper>` as the value would be one word, run as
    # a program named so.
    command = env.env_list("SPARKOPS_DROP_CACHES_COMMAND", [])
    assert command == ["/usr/local/sbin/sparkops-drop-caches"]
    monkeypatch.setattr(pagecache.os, "geteuid", lambda: 999)
    monkeypatch.setattr(pagecache.settings, "SPARKOPS_DROP_CACHES_COMMAND", command)
    assert pagecache.drop_command() == ["sudo", "-n", "/usr/local/sbin/sparkops-drop-caches"]
    # ... which is exactly what the sudoers rule allows, without arguments.
    rule = (PROJECT / "bin" / "sparkops-drop-caches.sudoers").read_text()
    assert 'Cmnd_Alias SPARKOPS_DROP_CACHES = /usr/local/sbin/sparkops-drop-caches ""' in rule
    assert re.search(r"^sparkops ALL = \(root\) NOPASSWD: SPARKOPS_DROP_CACHES$", rule, re.M)

    # What an admin may need is there, commented, and valid once uncommented.
    for key in ("SPARKOPS_MEMORY_BUDGET_CGROUP", "SPARKOPS_SMTP_HOST", "SPARKOPS_SMTP_PASSWORD",
                "SPARKOPS_ALLOWED_HOSTS", "SPARKOPS_HTTPS", "DATABASE_URL"):
        assert re.search(rf"^# {key}=", text, re.M), key
        assert key not in values
    budget = re.search(r"^# SPARKOPS_MEMORY_BUDGET_CGROUP=(.*)$", text, re.M).group(1)
    monkeypatch.setenv("SPARKOPS_MEMORY_BUDGET_CGROUP", budget)
    assert env.env_path_below("SPARKOPS_MEMORY_BUDGET_CGROUP", "/sys/fs/cgroup", "") == budget


def test_the_settings_file_follows_the_docker_access_and_the_bind_address():
    group = environment_file(install.render_settings(bind="127.0.0.1:8470", node_name="n",
                                                     docker_access="group"))
    assert "SPARKOPS_DOCKER_HOST" not in group and "SPARKOPS_READ_ONLY" not in group
    none = environment_file(install.render_settings(bind="127.0.0.1:8470", node_name="n",
                                                    docker_access="none"))
    assert none["SPARKOPS_READ_ONLY"] == "1" and "SPARKOPS_DOCKER_HOST" not in none

    public = environment_file(install.render_settings(bind="10.0.0.5:8470", node_name="n",
                                                      docker_access="proxy"))
    assert public["SPARKOPS_ALLOWED_HOSTS"].split(",")[-3:] == ["10.0.0.5", "127.0.0.1",
                                                                "localhost"]
    assert public["SPARKOPS_PUBLIC_URL"] == "http://10.0.0.5:8470"
    everywhere = environment_file(install.render_settings(bind="0.0.0.0:8470", node_name="n",
                                                          docker_access="proxy"))
    assert "0.0.0.0" not in everywhere["SPARKOPS_PUBLIC_URL"]
    with pytest.raises(install.InstallError, match="--bind 'localhost': expected HOST:PORT"):
        install.render_settings(bind="localhost", node_name="n", docker_access="proxy")


@pytest.fixture
def open_folder() -> Iterator[Path]:
    """A fresh folder that every user may enter (pytest's own are private to root), removed
    at the end."""
    folder = Path(tempfile.mkdtemp(prefix="sparkops-install-test-"))
    try:
        folder.chmod(0o755)
        yield folder
    finally:
        shutil.rmtree(folder)


def test_the_stamp_is_what_bin_sparkops_checks_so_start_installs_nothing(open_folder):
    app, venv = open_folder / "app", open_folder / "venv"
    (app / "bin").mkdir(parents=True)
    shutil.copy(PROJECT / "bin" / "sparkops", app / "bin" / "sparkops")
    shutil.copy(PROJECT / "requirements.lock", app / "requirements.lock")
    (venv / "bin").mkdir(parents=True)
    # A venv Python that notes each call and fails, so `start` stops at its first use.
    calls = open_folder / "calls"
    (venv / "bin" / "python").write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexit 1\n')
    (venv / "bin" / "python").chmod(0o755)

    def start() -> list[str]:
        calls.unlink(missing_ok=True)
        subprocess.run([str(app / "bin" / "sparkops"), "start"], capture_output=True,
                       timeout=60, env={**os.environ, "SPARKOPS_VENV": str(venv)})
        return calls.read_text().splitlines()

    line = install.write_stamp(app, venv)

    digest = hashlib.sha256((app / "requirements.lock").read_bytes()).hexdigest()
    assert line == (venv / ".requirements.sha256").read_text() == f"{digest}  requirements.lock\n"
    first = start()
    assert first and "pip" not in first[0], (
        f"bin/sparkops start would install again over the installer's stamp: {first}")
    # The control: with a stale lock in the stamp, `start` runs pip first.
    (app / "requirements.lock").write_text((PROJECT / "requirements.lock").read_text() + "\n")
    assert "-m pip install" in start()[0]


def test_a_python_other_users_cannot_run_is_found(open_folder):
    closed = open_folder / "home"
    (closed / "bin").mkdir(parents=True)
    python = closed / "bin" / "python3"
    python.write_text("")
    python.chmod(0o755)
    for folder in (closed, closed / "bin"):
        folder.chmod(0o755)
    assert install.unreachable_by_others(python) is None
    closed.chmod(0o700)
    assert install.unreachable_by_others(python) == closed
    closed.chmod(0o755)
    python.chmod(0o750)
    assert install.unreachable_by_others(python) == python


def test_the_application_is_what_git_tracks_or_else_the_tree_without_local_state(open_folder):
    files, _ = install.source_files(PROJECT)
    assert {"bin/sparkops", "manage.py", "sparkops/install.py", "requirements.lock",
            "deploy/systemd/sparkops.service"} <= set(files)
    assert not [name for name in files if name.startswith((".venv/", "var/", ".git/"))
                or "__pycache__" in name]

    tree = open_folder / "tree"
    for name in ("manage.py", "sparkops/settings.py", ".venv/bin/python", "var/db.sqlite3",
                 "sparkops/__pycache__/settings.cpython-312.pyc", "stray.pyc", ".git/HEAD",
                 "sparkops.env"):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text("")
        (tree / name).chmod(0o644)
    (tree / "sparkops.env").chmod(0o600)  # an admin's secrets: not copied where all can read
    assert install.source_files(tree) == (["manage.py", "sparkops/settings.py"],
                                          ["sparkops.env"])


def test_a_kept_settings_file_that_disagrees_with_the_docker_access_is_named():
    proxy = install.render_settings(bind="127.0.0.1:8470", node_name="n", docker_access="proxy")
    assert install.kept_settings_warnings(proxy, "proxy") == []
    assert "installs no proxy" in install.kept_settings_warnings(proxy, "group")[0]
    assert any("SPARKOPS_READ_ONLY=1" in warning
               for warning in install.kept_settings_warnings(proxy, "none"))
    none = install.render_settings(bind="127.0.0.1:8470", node_name="n", docker_access="none")
    assert install.kept_settings_warnings(none, "none") == []
    assert any("only monitors" in warning
               for warning in install.kept_settings_warnings(none, "group"))


@pytest.fixture
def readable_copy_of_the_installer(open_folder) -> Path:
    """The installer in a folder every user can read (the checkout may not be)."""
    (open_folder / "sparkops").mkdir()
    (open_folder / "sparkops").chmod(0o755)
    shutil.copy(SCRIPT, open_folder / "sparkops" / "install.py")
    (open_folder / "sparkops" / "install.py").chmod(0o644)
    return open_folder / "sparkops" / "install.py"


@pytest.mark.parametrize("command", ["install", "uninstall"])
def test_without_root_the_installer_refuses_in_one_line(command, readable_copy_of_the_installer):
    if not SYSTEM_PYTHON.exists():
        pytest.fail(f"{SYSTEM_PYTHON} is missing (Debian package python3)")
    result = subprocess.run(
        ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
         str(SYSTEM_PYTHON), "-P", str(readable_copy_of_the_installer), command],
        capture_output=True, text=True, timeout=30, cwd="/")
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == (f"sparkops {command}: must run as root "
                             f"(sudo bin/sparkops {command})\n")


def test_help_needs_no_root():
    for command in ("install", "uninstall"):
        result = subprocess.run([str(SYSTEM_PYTHON), "-P", str(SCRIPT), command, "--help"],
                                capture_output=True, text=True, timeout=30)
        assert result.returncode == 0 and f"usage: bin/sparkops {command}" in result.stdout


# --- slow: a throw-away root ----------------------------------------------------------------------

# Kept between runs, outside the checkout: pip's cache of what it downloaded from the index.
PIP_CACHE = Path(os.environ.get("SPARKOPS_TEST_CACHE", "/var/cache/sparkops-tests")) / "pip"


class ThrowawayRoot:
    """One container over an overlay of this machine's root file system, run as root."""

    def __init__(self, podman: PrivatePodman, name: str) -> None:
        self.podman = podman
        self.name = name

    def run(self, *argv: str, env: dict[str, str] | None = None, check: bool = True,
            timeout: float = 120) -> subprocess.CompletedProcess:
        """``argv`` in the container, in the checkout; a failure fails the test with its
        output."""
        options = ["--workdir", str(PROJECT)]
        for key, value in (env or {}).items():
            options += ["--env", f"{key}={value}"]
        result = subprocess.run([*self.podman.argv, "exec", *options, self.name, *argv],
                                capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            pytest.fail(f"{shlex.join(argv)} exited with status {result.returncode}:\n"
                        f"{result.stdout}\n{result.stderr}")
        return result

    def python(self, code: str, *args: str, timeout: float = 60) -> object:
        """Run ``code`` with the system's Python in the container (as root); what it prints,
        as JSON."""
        return json.loads(self.run(str(SYSTEM_PYTHON), "-c", code, *args,
                                   timeout=timeout).stdout)

    def read(self, path: str) -> str:
        return self.run("cat", path).stdout


def wait_for_systemd(root: ThrowawayRoot) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = root.run("systemctl", "is-system-running", check=False).stdout.strip()
        if state in ("running", "degraded"):
            return
        time.sleep(0.5)
    pytest.fail(f"systemd did not come up in the container (state {state!r})")


@pytest.fixture
def systemd_root() -> Iterator[ThrowawayRoot]:
    """A container over an overlay of ``/`` with systemd as its PID 1, in a private Podman, once
    systemd is up; all of it is removed when the test ends, passed or failed."""
    if not shutil.which("podman"):
        pytest.fail("podman is not installed (Debian packages podman and runc)")
    if not SYSTEM_PYTHON.exists():
        pytest.fail(f"{SYSTEM_PYTHON} is missing (Debian package python3)")
    PIP_CACHE.mkdir(mode=0o700, parents=True, exist_ok=True)
    podman = PrivatePodman(Path(tempfile.gettempdir()) / f"sparkops-inst-{uuid.uuid4().hex[:8]}")
    name = f"sparkops-install-{uuid.uuid4().hex[:8]}"
    argv = ["run", "--detach", "--name", name, "--network", "host",
            "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096",
            # systemd as PID 1, only its journal running (not this machine's services, which
            # would start on the host network): the installer's `systemctl` starts the rest.
            "--systemd", "always",
            *(option for point in ("/tmp", "/run", "/run/lock")
              for option in ("--tmpfs", f"{point}:rw,notmpcopyup")),
            # The checkout, wherever it is (these fresh /tmp and /run would hide it there), and
            # pip's cache, which outlives the root.
            "--volume", f"{PROJECT}:{PROJECT}:ro", "--volume", f"{PIP_CACHE}:{PIP_CACHE}"]
    try:
        try:
            podman(*argv, "--rootfs", "/:O", "/lib/systemd/systemd", "--unit=sysinit.target",
                   timeout=120)
        except PodmanError as error:
            pytest.fail(str(error))
        root = ThrowawayRoot(podman, name)
        wait_for_systemd(root)
        yield root
    finally:
        try:
            podman.destroy()
        except LeftoverError as error:
            pytest.fail(f"the throw-away root left something behind: {error}")


def pip_environment() -> dict[str, str]:
    """The installer's Python, what this machine's pip needs (its indexes, proxies) and the
    cache that outlives the root."""
    passed = {key: value for key, value in os.environ.items()
              if key.startswith("PIP_") or key.lower() in ("http_proxy", "https_proxy",
                                                             "no_proxy")}
    return {**passed, "PIP_CACHE_DIR": str(PIP_CACHE), "PYTHON": str(SYSTEM_PYTHON),
            "HOME": "/root"}


def run_installer(root: ThrowawayRoot, *args: str) -> str:
    result = root.run("bin/sparkops", *args, env=pip_environment(), timeout=600)
    assert result.stderr == "", result.stderr
    return result.stdout


def steps_of(output: str) -> dict[str, str]:
    """The installer's progress lines, ``title -> outcome``."""
    return {match.group(1): match.group(2)
            for match in re.finditer(r"^\[\d+/\d+\] (.+?) \.\.\. (.+)$", output, re.M)}


FACTS = r"""
import grp, json, os, pwd, stat, sys
def fact(path):
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    return {"owner": pwd.getpwuid(info.st_uid).pw_name, "group": grp.getgrgid(info.st_gid).gr_name,
            "mode": oct(stat.S_IMODE(info.st_mode)), "dir": stat.S_ISDIR(info.st_mode)}
def writable_by_others(root):
    found = []
    for folder, subfolders, files in os.walk(root):
        for name in [".", *subfolders, *files]:
            info = os.lstat(os.path.join(folder, name))
            if stat.S_ISLNK(info.st_mode):
                continue  # a link's own mode means nothing; its target is checked where it is
            if info.st_uid != 0 or info.st_gid != 0 or info.st_mode & 0o022:
                found.append(os.path.join(folder, name))
    return found[:20]
def entry(lookup, name):
    try:
        return list(lookup(name))
    except KeyError:
        return None
paths = sys.argv[1:]
print(json.dumps({
    "paths": {path: fact(path) for path in paths},
    "passwd": entry(pwd.getpwnam, "sparkops"),
    "group": entry(grp.getgrnam, "sparkops")[:3] if entry(grp.getgrnam, "sparkops") else None,
    "writable_in_opt": writable_by_others("/opt/sparkops") if os.path.isdir("/opt/sparkops")
                       else None,
}))
"""

INSTALLED = ["/opt/sparkops", "/opt/sparkops/app", "/opt/sparkops/app/bin/sparkops",
             "/opt/sparkops/app/manage.py", "/opt/sparkops/app/sparkops/install.py",
             "/opt/sparkops/venv", "/opt/sparkops/venv/bin/python",
             "/opt/sparkops/venv/.requirements.sha256", "/var/lib/sparkops", "/etc/sparkops",
             "/etc/sparkops/sparkops.env", "/usr/local/sbin/sparkops-drop-caches",
             "/etc/sudoers.d/sparkops", "/etc/systemd/system/sparkops.service",
             "/etc/sparkops/docker-proxy.cfg",
             "/etc/systemd/system/sparkops-docker-proxy.service",
             "/var/lib/sparkops/sparkops.sqlite3", "/var/lib/sparkops/admin-password"]
PROXY_SHIPPED = (PROJECT / install.PROXY_SOURCE_CONFIG).is_file() and (
    PROJECT / install.PROXY_SOURCE_UNIT).is_file()


def facts(root: ThrowawayRoot) -> dict:
    return root.python(FACTS, *INSTALLED)


def owner_mode(fact: dict | None) -> tuple[str, str, str] | None:
    return None if fact is None else (fact["owner"], fact["group"], fact["mode"])


def copied_mode(name: str) -> tuple[str, str, str]:
    """A file of the application as the installer copies it: root's, 0755 where the source is
    executable, else 0644."""
    return ("root", "root", "0o755" if os.stat(PROJECT / name).st_mode & 0o111 else "0o644")


def assert_installed(root: ThrowawayRoot, found: dict) -> None:
    paths = found["paths"]
    expected = {
        "/opt/sparkops": ("root", "root", "0o755"),
        "/opt/sparkops/app": ("root", "root", "0o755"),
        "/opt/sparkops/app/bin/sparkops": ("root", "root", "0o755"),
        "/opt/sparkops/app/manage.py": copied_mode("manage.py"),
        "/opt/sparkops/app/sparkops/install.py": copied_mode("sparkops/install.py"),
        "/opt/sparkops/venv": ("root", "root", "0o755"),
        "/var/lib/sparkops": ("sparkops", "sparkops", "0o700"),
        "/etc/sparkops": ("root", "sparkops", "0o750"),
        "/etc/sparkops/sparkops.env": ("root", "sparkops", "0o640"),
        "/usr/local/sbin/sparkops-drop-caches": ("root", "root", "0o755"),
        "/etc/sudoers.d/sparkops": ("root", "root", "0o440"),
        "/etc/systemd/system/sparkops.service": ("root", "root", "0o644"),
    }
    if PROXY_SHIPPED:
        expected["/etc/sparkops/docker-proxy.cfg"] = ("root", "root", "0o644")
        expected["/etc/systemd/system/sparkops-docker-proxy.service"] = ("root", "root", "0o644")
    assert {path: owner_mode(paths[path]) for path in expected} == expected
    # Nothing under /opt/sparkops is sparkops' or writable by anyone but root.
    assert found["writable_in_opt"] == []

    name, _, uid, gid, _, home, shell = found["passwd"]
    assert name == "sparkops" and 0 < uid < 1000  # a system user
    assert home == "/var/lib/sparkops" and shell in ("/usr/sbin/nologin", "/sbin/nologin")
    assert found["group"][0] == "sparkops" and found["group"][2] == gid

    # The same helper and rule as the repository's, checked by visudo where sudo reads it.
    assert root.read("/usr/local/sbin/sparkops-drop-caches") == (
        PROJECT / "bin" / "sparkops-drop-caches").read_text()
    assert root.read("/etc/sudoers.d/sparkops") == (
        PROJECT / "bin" / "sparkops-drop-caches.sudoers").read_text()
    root.run("visudo", "-c", "-q")
    # The venv holds the application's lock, stamped as bin/sparkops checks it.
    lock = hashlib.sha256((PROJECT / "requirements.lock").read_bytes()).hexdigest()
    assert root.read("/opt/sparkops/venv/.requirements.sha256") == (
        f"{lock}  requirements.lock\n")
    assert root.read("/opt/sparkops/app/requirements.lock") == (
        PROJECT / "requirements.lock").read_text()


def verify_unit(root: ThrowawayRoot) -> None:
    """``systemd-analyze verify`` on the installed unit: no error and not one warning."""
    result = root.run("systemd-analyze", "verify", "/etc/systemd/system/sparkops.service",
                      check=False)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


# Processes of the container: pid, its user and group ids (real, effective, saved, file
# system), whether it is a zombie, its command line, and its parent.
PROCESSES = r"""
import json, os
found = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        status = dict(line.split(":\t", 1) for line in open(f"/proc/{pid}/status")
                      .read().splitlines() if ":\t" in line)
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    except OSError:
        continue
    found.append({"pid": int(pid), "ppid": int(status["PPid"]),
                  "uids": status["Uid"].split(), "gids": status["Gid"].split(),
                  "nnp": status.get("NoNewPrivs"), "zombie": status["State"].startswith("Z"),
                  "argv": [part.decode(errors="replace") for part in argv if part]})
print(json.dumps(found))
"""


def stack_processes(root: ThrowawayRoot, top: int) -> list[dict]:
    """The live processes at and below ``top``."""
    everything = {entry["pid"]: entry for entry in root.python(PROCESSES)}
    tree, frontier = [], [top]
    while frontier:
        pid = frontier.pop()
        if pid in everything and not everything[pid]["zombie"]:
            tree.append(everything[pid])
            frontier += [entry["pid"] for entry in everything.values() if entry["ppid"] == pid]
    return tree


def assert_the_stack_runs_as_sparkops(root: ThrowawayRoot, top: int, uid: int,
                                      gid: int) -> list[dict]:
    tree = stack_processes(root, top)
    words = [" ".join(entry["argv"]) for entry in tree]
    # The default stack: one process, the Celery worker with the web server in a thread (a
    # helper it runs, sudo for the page cache, may show for a moment below it).
    assert "-m sparkops.onestack" in words[0] and "worker" in words[0], words
    assert not any("gunicorn" in text or "supervise.py" in text for text in words), words
    for entry in tree:
        assert entry["uids"] == [str(uid)] * 4, entry
        assert entry["gids"] == [str(gid)] * 4, entry
    # And nothing of SparkOps anywhere in the container runs as root.
    for entry in root.python(PROCESSES):
        if any("/opt/sparkops" in part for part in entry["argv"]) and not entry["zombie"]:
            assert entry["uids"][0] != "0" and entry["uids"][1] != "0", entry
    return tree


LATEST_SAMPLE = r"""
import json, sqlite3, sys, datetime
try:
    db = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True, timeout=5)
    latest, count = db.execute("select max(r.at), count(*) from collectors_hostreading r "
                               "join collectors_node n on n.id = r.node_id where n.name = ?",
                               (sys.argv[2],)).fetchone()
except sqlite3.Error:
    latest, count = None, 0
age = None
if latest:
    at = datetime.datetime.fromisoformat(latest).replace(tzinfo=datetime.timezone.utc)
    age = (datetime.datetime.now(datetime.timezone.utc) - at).total_seconds()
print(json.dumps({"age": age, "count": count}))
"""


def wait_for_live_samples(root: ThrowawayRoot, node: str, alive: Callable[[], bool],
                          log: Callable[[], str], after: int = 0) -> dict:
    """Until the database has more than ``after`` host samples of ``node``, the latest written
    within the last seconds; fails with the stack's log if it stops or takes too long."""
    deadline = time.monotonic() + SAMPLES_WITHIN_SECONDS
    latest = None
    while time.monotonic() < deadline:
        latest = root.python(LATEST_SAMPLE, "/var/lib/sparkops/sparkops.sqlite3", node)
        if latest["count"] > after and latest["age"] is not None and latest["age"] < 15:
            return latest
        if not alive():
            pytest.fail(f"the stack stopped before writing samples:\n{log()}")
        time.sleep(2)
    pytest.fail(f"no live samples within {SAMPLES_WITHIN_SECONDS} s ({latest}):\n{log()}")


# SparkOps' own way to drop the page cache (collectors.pagecache), run by `manage.py shell`.
DROP_PROBE = """
import json
from collectors import pagecache
command = pagecache.drop_command()
try:
    outcome = str(pagecache.run_drop_helper(command, 60))
except pagecache.DropFailed as error:
    outcome = str(error)
print(json.dumps([command, outcome]))
"""
PROBE_UNIT = "sparkops-drop-probe.service"
PROBE_SCRIPT = "/run/sparkops-drop-probe.py"


def probe_unit(unit_text: str) -> str:
    """The installed unit, sandbox, user, settings and all, running SparkOps' page-cache call
    (DROP_PROBE, on ``manage.py shell``'s standard input) once instead of the stack."""
    text = re.sub(r"^ExecStart=.*$",
                  "ExecStart=/opt/sparkops/venv/bin/python /opt/sparkops/app/manage.py shell\n"
                  f"StandardInput=file:{PROBE_SCRIPT}", unit_text, flags=re.M)
    text = re.sub(r"^Type=simple$", "Type=oneshot", text, flags=re.M)
    return re.sub(r"^Restart(Sec)?=.*\n", "", text, flags=re.M)


def service_main_pid(root: ThrowawayRoot) -> int:
    return int(root.run("systemctl", "show", "--property=MainPID", "--value",
                        "sparkops.service").stdout.strip())


def service_state(root: ThrowawayRoot) -> str:
    return root.run("systemctl", "is-active", "sparkops.service", check=False).stdout.strip()


def journal(root: ThrowawayRoot, unit: str = "sparkops.service") -> str:
    return root.run("journalctl", "--no-pager", "-o", "cat", "-u", unit, check=False).stdout


def drop_through_the_units_sandbox(root: ThrowawayRoot) -> tuple[list[str], str, str]:
    """Run DROP_PROBE as a one-shot copy of the installed unit: the command SparkOps chose, what
    came of it, and everything the probe unit wrote to the journal."""
    root.run("sh", "-c", f"printf '%s' {shlex.quote(DROP_PROBE)} > {PROBE_SCRIPT}")
    unit = probe_unit(root.read("/etc/systemd/system/sparkops.service"))
    root.run("sh", "-c", f"printf '%s' {shlex.quote(unit)} > /etc/systemd/system/{PROBE_UNIT}"
                         " && systemctl daemon-reload")
    root.run("systemctl", "start", PROBE_UNIT, check=False, timeout=120)
    deadline = time.monotonic() + 20
    while True:  # the journal may take a moment to have the probe's last lines
        said = journal(root, PROBE_UNIT)
        printed = [line for line in said.splitlines() if line.startswith("[")]
        if printed or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    root.run("rm", f"/etc/systemd/system/{PROBE_UNIT}", PROBE_SCRIPT)
    root.run("systemctl", "daemon-reload")
    assert printed, f"the probe unit printed no outcome:\n{said[-4000:]}"
    command, outcome = json.loads(printed[-1])
    return command, outcome, said


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_install_start_reinstall_stop_and_uninstall_under_systemd(systemd_root):
    root = systemd_root
    port = free_port()

    # --- install, not started: the unit, the files, the user; nothing has run ------------------
    output = run_installer(root, "install", "--no-start", "--bind", f"127.0.0.1:{port}")
    steps = steps_of(output)
    assert len(steps) == 9 and steps["creating the system user sparkops"] == "done", output
    assert steps["starting sparkops.service"] == "skipped (--no-start)", output
    assert f"Open http://127.0.0.1:{port}/" in output
    assert "/var/lib/sparkops/admin-password" in output
    verify_unit(root)
    found = facts(root)
    assert_installed(root, found)
    assert found["paths"]["/var/lib/sparkops/sparkops.sqlite3"] is None  # nothing started
    assert service_state(root) == "inactive"
    settings = root.read("/etc/sparkops/sparkops.env")
    assert environment_file(settings)["SPARKOPS_BIND"] == f"127.0.0.1:{port}"
    passwd = found["passwd"]

    # --- a reinstall keeps the admin's settings; the Docker access can change ----------------
    edited = settings + "SPARKOPS_TIME_ZONE=Asia/Seoul\n"
    root.run("sh", "-c", f"printf '%s' {shlex.quote(edited)} > /etc/sparkops/sparkops.env")
    root.run("groupadd", "--system", "docker")
    output = run_installer(root, "install", "--no-start", "--bind", "127.0.0.1:1",
                           "--docker-access", "group")
    again = steps_of(output)
    assert again["creating the system user sparkops"] == "kept (already there)"
    assert again["writing the settings /etc/sparkops/sparkops.env"].startswith("kept")
    assert again["setting up Docker access (group)"] == "sparkops joined the docker group"
    assert "warning: the docker group is root-equivalent" in output
    assert "installs no proxy" in output  # the kept settings still name the proxy's socket
    assert root.read("/etc/sparkops/sparkops.env") == edited
    assert "docker" in root.run("id", "-nG", "sparkops").stdout.split()
    unit = unit_settings(root.read("/etc/systemd/system/sparkops.service"))
    assert unit["Service"]["SupplementaryGroups"] == ["docker"]
    assert "sparkops-docker-proxy.service" not in " ".join(unit["Unit"]["After"])
    verify_unit(root)
    output = run_installer(root, "install", "--no-start")
    assert "took sparkops out of the docker group" in output
    assert "docker" not in root.run("id", "-nG", "sparkops").stdout.split()
    assert root.read("/etc/sparkops/sparkops.env") == edited
    assert_installed(root, facts(root))
    assert "SupplementaryGroups" not in unit_settings(
        root.read("/etc/systemd/system/sparkops.service"))["Service"]

    # --- the installer's own start: `install` again enables and starts the service ------------
    output = run_installer(root, "install")
    steps = steps_of(output)
    assert steps["creating the system user sparkops"] == "kept (already there)", output
    assert steps["starting sparkops.service"] == "done", output
    assert root.read("/etc/sparkops/sparkops.env") == edited
    assert root.run("systemctl", "is-enabled", "sparkops.service").stdout.strip() == "enabled"
    node = environment_file(edited)["SPARKOPS_NODE_NAME"]

    def alive() -> bool:
        return service_state(root) in ("active", "activating")

    def log() -> str:
        return journal(root)[-6000:]

    first = wait_for_live_samples(root, node, alive, log)
    wait_for_live_samples(root, node, alive, log, after=first["count"])  # still coming
    tree = assert_the_stack_runs_as_sparkops(root, service_main_pid(root), passwd[2],
                                             passwd[3])
    assert {entry["nnp"] for entry in tree} == {"0"}, tree  # sudo can still become root
    wait_for_port(port, timeout=30)
    assert requests.get(f"http://127.0.0.1:{port}/login/", timeout=10).status_code == 200
    assert "pip install" not in journal(root)  # bin/sparkops took the venv as it is
    password = facts(root)["paths"]["/var/lib/sparkops/admin-password"]
    assert owner_mode(password) == ("sparkops", "sparkops", "0o600")

    # The page-cache helper, through SparkOps' own call, from inside the unit's own sandbox as
    # its user: sudo takes it to root (the helper refuses any other user), so its complaint
    # about the container's read-only /proc/sys (or its figures, where that is writable)
    # shows it ran as root.
    drop, outcome, said = drop_through_the_units_sandbox(root)
    assert drop == ["sudo", "-n", "/usr/local/sbin/sparkops-drop-caches"]
    assert "no new privileges" not in said, said
    assert ("/proc/sys/vm/drop_caches is not writable here" in outcome
            or "DropResult(cached_before=" in outcome), outcome

    # --- a monitor only: the unit turns on the seccomp options (and with them
    # no-new-privileges), and SparkOps still collects under them.
    output = run_installer(root, "install", "--docker-access", "none")
    assert steps_of(output)["starting sparkops.service"] == "done", output
    assert "NoNewPrivileges=yes" in root.read("/etc/systemd/system/sparkops.service")
    # `systemctl restart` has stopped the stack before it returned: what comes now is new.
    before = root.python(LATEST_SAMPLE, "/var/lib/sparkops/sparkops.sqlite3", node)
    wait_for_live_samples(root, node, alive, log, after=before["count"])
    main = service_main_pid(root)
    tree = assert_the_stack_runs_as_sparkops(root, main, passwd[2], passwd[3])
    assert {entry["nnp"] for entry in tree} == {"1"}, tree

    # --- stopped as systemd stops it (KillMode=mixed: SIGTERM to the supervisor alone), the
    # stack ends by itself: the supervisor exits 0 and systemd kills nothing that was left.
    root.run("systemctl", "stop", "sparkops.service", timeout=120)
    shown = dict(line.split("=", 1) for line in root.run(
        "systemctl", "show", "--property=Result,ExecMainCode,ExecMainStatus",
        "sparkops.service").stdout.split())
    assert shown == {"Result": "success", "ExecMainCode": "1", "ExecMainStatus": "0"}, shown
    everything = root.python(PROCESSES)
    assert not {entry["pid"] for entry in tree} & {
        entry["pid"] for entry in everything if not entry["zombie"]}
    killed = re.findall(r"Killing process \d+ \(.*?\) with signal SIGKILL", journal(root))
    assert killed == [], killed  # systemd's line for each process it had to kill

    # --- uninstall keeps the data, the settings and the user ------------------------------------
    output = run_installer(root, "uninstall")
    assert steps_of(output)["stopping sparkops.service"].startswith("stopped and disabled"), (
        output)
    assert "Kept: /var/lib/sparkops" in output and "--purge" in output, output
    assert service_state(root) in ("inactive", "unknown")
    kept = facts(root)
    paths = kept["paths"]
    gone = ["/opt/sparkops", "/usr/local/sbin/sparkops-drop-caches", "/etc/sudoers.d/sparkops",
            "/etc/systemd/system/sparkops.service",
            "/etc/systemd/system/sparkops-docker-proxy.service"]
    assert {path: paths[path] for path in gone} == dict.fromkeys(gone)
    assert owner_mode(paths["/var/lib/sparkops"]) == ("sparkops", "sparkops", "0o700")
    assert paths["/var/lib/sparkops/sparkops.sqlite3"] is not None
    assert root.read("/etc/sparkops/sparkops.env") == edited
    assert kept["passwd"] == passwd

    # --- uninstall --purge removes them too ----------------------------------------------------
    output = run_installer(root, "uninstall", "--purge")
    purged = facts(root)
    assert all(fact is None for fact in purged["paths"].values()), purged["paths"]
    assert purged["passwd"] is None and purged["group"] is None
    assert "removed /var/lib/sparkops, /etc/sparkops, user sparkops" in output, output
