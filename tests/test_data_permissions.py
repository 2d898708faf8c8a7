"""The data directory is private: folders 0700 and files 0600 from their creation, an older
installation made private on start, and another local user reads nothing in it."""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from sparkops.datadir import create_private_file, tighten
from sparkops.testing.ports import free_port, wait_for_port
from tests.conftest import PROJECT, subprocess_env
from tests.processes import stop_group

AS_ROOT = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser"),
                             reason="needs root and runuser, to read as another user")


def _modes(root: Path) -> dict[str, str]:
    """Every entry below ``root`` (itself included, as "."), by relative path: its mode. A
    running stack adds and removes files meanwhile (broker messages consumed, the state file
    replaced): one that is gone between the listing and its ``lstat`` is left out, since there
    is nothing left to judge."""
    found = {".": oct(stat.S_IMODE(root.lstat().st_mode))}
    for path in root.rglob("*"):
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:
            continue
        if not stat.S_ISLNK(mode):
            found[str(path.relative_to(root))] = oct(stat.S_IMODE(mode))
    return found


def _not_private(root: Path) -> dict[str, str]:
    return {name: mode for name, mode in _modes(root).items()
            if mode != ("0o700" if (root / name).is_dir() else "0o600")}


def _nobody_can_read(path: Path) -> bool:
    result = subprocess.run(["runuser", "-u", "nobody", "--", "cat", str(path)],
                            capture_output=True)
    return result.returncode == 0


@pytest.fixture
def open_parent() -> Iterator[Path]:
    """A folder any user may enter (pytest's own temporary tree is root-only, which would hide
    the data directory's own permissions from the test)."""
    top = Path(tempfile.mkdtemp(prefix="sparkops-perm-"))
    top.chmod(0o755)
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _umask_022() -> None:
    os.umask(0o022)  # the usual umask of a root shell or a service manager


# --- the rules on their own ----------------------------------------------------------------------


def test_a_private_file_is_created_0600_whatever_the_umask(tmp_path):
    previous = os.umask(0)
    try:
        assert create_private_file(tmp_path / "secret", "s3cret") is True
        assert create_private_file(tmp_path / "secret", "other") is False  # the first one wins
    finally:
        os.umask(previous)

    assert (tmp_path / "secret").read_text() == "s3cret"
    assert stat.S_IMODE((tmp_path / "secret").stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["secret"]  # no temporary file left


def test_tighten_removes_group_and_other_bits_below_the_root_but_never_follows_links(tmp_path):
    data, outside = tmp_path / "data", tmp_path / "outside"
    (data / "broker" / "queue").mkdir(parents=True)
    outside.mkdir()
    (outside / "shared.txt").write_text("not ours")
    for path, mode in [(data, 0o755), (data / "broker", 0o755), (data / "broker" / "queue", 0o775)]:
        path.chmod(mode)
    (data / "sparkops.sqlite3").write_text("db")
    (data / "sparkops.sqlite3").chmod(0o644)
    (data / "broker" / "queue" / "1.msg").write_text("{}")
    (data / "broker" / "queue" / "1.msg").chmod(0o664)
    (data / "link-out").symlink_to(outside)
    (data / "file-link").symlink_to(outside / "shared.txt")
    (outside / "shared.txt").chmod(0o644)
    outside.chmod(0o755)

    changed = tighten(data)

    assert len(changed) == 5
    assert _not_private(data) == {}
    # What the links point at, outside the data directory, is left alone.
    assert stat.S_IMODE((outside / "shared.txt").stat().st_mode) == 0o644
    assert stat.S_IMODE(outside.stat().st_mode) == 0o755
    assert tighten(data) == []  # nothing left to do


# --- for real ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_an_existing_readable_data_directory_is_made_private_on_start(open_parent):
    data = open_parent / "data"
    (data / "broker" / "queue").mkdir(parents=True)
    for folder in (data, data / "broker", data / "broker" / "queue"):
        folder.chmod(0o755)
    sqlite3.connect(data / "sparkops.sqlite3").close()  # an empty database, as umask 022 left it
    (data / "secret_key").write_text("x" * 60)
    (data / "admin-password").write_text("an-old-generated-password\n")
    (data / "broker" / "queue" / "1.sparkops.msg").write_text("{}")
    for name in ("secret_key", "admin-password", "sparkops.sqlite3", "broker/queue/1.sparkops.msg"):
        (data / name).chmod(0o644)
    env = subprocess_env(SPARKOPS_DATA_DIR=str(data))

    result = subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=PROJECT,
                            env=env, capture_output=True, text=True, timeout=120,
                            preexec_fn=_umask_022)

    assert result.returncode == 0, result.stderr
    assert _not_private(data) == {}
    lines = [line for line in result.stderr.splitlines() if "made the data directory" in line]
    assert len(lines) == 1, result.stderr
    assert re.search(rf"made the data directory {re.escape(str(data))} private \(folders 0700, "
                     r"files 0600\): removed group and other permissions from \d+ entries",
                     lines[0])


@AS_ROOT
@pytest.mark.slow
def test_the_stack_started_as_root_with_umask_022_keeps_its_data_to_itself(open_parent):
    """What `bin/sparkops start` runs, step by step: migrate, bootstrap, collectstatic, then the
    stack itself, until it has written its database, broker messages and beat schedule."""
    data = open_parent / "data"
    port = free_port()
    env = subprocess_env(SPARKOPS_DATA_DIR=str(data), SPARKOPS_NODE_NAME="perm-test",
                         SPARKOPS_BIND=f"127.0.0.1:{port}", SPARKOPS_ADMIN_PASSWORD="")
    for step in (["migrate", "--noinput"], ["bootstrap"],
                 ["collectstatic", "--noinput", "--verbosity", "0"]):
        subprocess.run([sys.executable, "manage.py", *step], cwd=PROJECT, env=env, check=True,
                       capture_output=True, timeout=180, preexec_fn=_umask_022)
    log_path = open_parent / "stack.log"
    with log_path.open("w") as log:
        stack = subprocess.Popen([sys.executable, "manage.py", "runstack"], cwd=PROJECT, env=env,
                                 stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                 preexec_fn=_umask_022)
    try:
        wait_for_port(port, timeout=90)
        # The stack's own files appear as it runs: the beat schedule, SQLite's WAL, the worker's
        # liveness file; a broker message each time beat sends work.
        wanted = ["celerybeat-schedule", "sparkops.sqlite3-wal", "worker.alive", "stack-state.json"]
        deadline = time.monotonic() + 60
        while not all(list(data.glob(name + "*")) for name in wanted):
            assert time.monotonic() < deadline, (wanted, sorted(_modes(data)))
            time.sleep(0.3)
        # Static files (0600 too) are still served: the web server runs as their owner.
        page = requests.get(f"http://127.0.0.1:{port}/login/", timeout=10)
        css = re.search(r'href="(/static/css/sparkops\.[0-9a-f]+\.css)"', page.text).group(1)
        assert requests.get(f"http://127.0.0.1:{port}{css}", timeout=10).status_code == 200

        assert _not_private(data) == {}
        assert oct(stat.S_IMODE(data.stat().st_mode)) == "0o700"
        # SQLite removes the -wal file when its last connection closes (between two requests,
        # two tasks), so it is judged while it exists (above, and by the loop that waited for
        # it), not required to exist now.
        for name in ("sparkops.sqlite3", "secret_key", "admin-password"):
            assert (data / name).exists()
            assert not _nobody_can_read(data / name), name
        listing = subprocess.run(["runuser", "-u", "nobody", "--", "ls", str(data)],
                                 capture_output=True)
        assert listing.returncode != 0
    finally:
        stop_group(stack)
    assert "made the data directory" not in log_path.read_text()  # private from the start
