"""The demo, the tests and the benchmark touch only the Podman state they created.

A Podman of "the admin" runs a container with its own storage but the machine's default temp
directory (``/run/libpod`` for root; here a folder named by a private ``containers.conf``, so the
machine's real one is never touched). Then the demo's, the test suite's and the benchmark's
Podman clean-ups run, and the admin's container must still be running and manageable. Their
teardown must also stop whatever their own containers left running, even processes podman has
lost track of, and say so loudly when it cannot.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.services import podman_service
from collectors import podman as podman_module
from collectors.podman import RUNTIME_FLAGS, PrivatePodman
from sparkops.demo.node import DEMO_LABEL, PodmanService
from tests.containers import run_container, start_podman, stop_podman, unique_name

pytestmark = pytest.mark.slow
SLEEPER = ["sleep", "600"]
FLAGS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", "--network", "host"]


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder with a short path: a Podman socket's path must fit 108 bytes."""
    folder = Path(tempfile.mkdtemp(prefix="sparkops-iso-"))
    yield folder
    PrivatePodman(folder).destroy()


@pytest.fixture
def admin_podman(tmp_path: Path, monkeypatch, short_dir: Path) -> Iterator[list[str]]:
    """The admin's podman: storage of its own, the machine's default temp directory."""
    host_tmp = tmp_path / "host-libpod"
    conf = tmp_path / "containers.conf"
    conf.write_text(f'[engine]\ntmp_dir = "{host_tmp}"\n')
    # Every podman started from here on (the code under test's too) takes this as the
    # machine's default temp directory, in place of /run/libpod.
    monkeypatch.setenv("CONTAINERS_CONF", str(conf))
    admin = short_dir / "admin"
    argv = ["podman", *RUNTIME_FLAGS, "--root", str(admin / "root"),
            "--runroot", str(admin / "run")]
    yield argv
    podman_module.subprocess.run([*argv, "rm", "--force", "--all", "--time", "0"],
                                 capture_output=True, timeout=120)
    PrivatePodman(admin).destroy()


def admin(argv: list[str], *args: str) -> str:
    result = podman_module.subprocess.run([*argv, *args], capture_output=True, text=True,
                                          timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def clean_up_demo(base: Path) -> None:
    service = PodmanService(base / "demo-data")
    service.start()
    service.containers.run(unique_name("demo"), SLEEPER, {DEMO_LABEL: "1"})
    service.stop()


def clean_up_test_run(base: Path) -> None:
    private = PrivatePodman(base / "tests")
    start_podman(private)
    run_container(unique_name("test"), SLEEPER, private=private)
    stop_podman(private)


def clean_up_bench(base: Path) -> None:
    with podman_service() as (podman, _url):
        podman.run(unique_name("bench"), SLEEPER, {})


@pytest.mark.parametrize("cleanup", [clean_up_demo, clean_up_test_run, clean_up_bench],
                         ids=["demo", "tests", "bench"])
def test_cleanup_leaves_the_admins_running_container_alone(admin_podman, short_dir, cleanup):
    admin_id = admin(admin_podman, "run", "--detach", "--name", "admin-engine", *FLAGS,
                     "--rootfs", "/:O", *SLEEPER)

    cleanup(short_dir)

    assert admin(admin_podman, "inspect", "--format", "{{.State.Status}}", admin_id) == "running"
    assert admin(admin_podman, "ps", "--format", "{{.Names}} {{.State}}") \
        .startswith("admin-engine Up")
    # Its own podman can still stop and restart it.
    admin(admin_podman, "stop", "--time", "0", admin_id)
    assert admin(admin_podman, "inspect", "--format", "{{.State.Status}}", admin_id) == "exited"
    admin(admin_podman, "start", admin_id)
    assert admin(admin_podman, "inspect", "--format", "{{.State.Status}}", admin_id) == "running"


def test_teardown_kills_what_a_container_left_after_podman_lost_track_of_it(short_dir):
    private = PrivatePodman(short_dir)
    start_podman(private)
    container = run_container(unique_name("orphan"), ["sh", "-c", "sleep 600 & sleep 600"],
                              private=private)
    # What `podman system reset` did to the shared temp directory: podman now believes the
    # machine rebooted, shows the container as "Created" and its kill reaches nothing.
    shutil.rmtree(short_dir / "tmp")
    assert private.processes({container}), "the container should be running"

    stop_podman(private)

    assert private.processes({container}) == []
    assert not short_dir.exists()
    # Read independently of the code under test; an exited process not yet reaped holds
    # nothing and is no leftover.
    left = [pid for pid in os.listdir("/proc") if pid.isdigit()
            and f"libpod-{container}".encode() in _read(Path("/proc", pid, "cgroup"))
            and b") Z " not in _read(Path("/proc", pid, "stat"))]
    assert left == []


def test_teardown_fails_loudly_when_a_process_survives(short_dir, monkeypatch):
    private = PrivatePodman(short_dir)
    start_podman(private)
    container = run_container(unique_name("stubborn"), SLEEPER, private=private)
    private("rm", "--force", "--time", "0", container)  # nothing of it is left to kill
    private.service.kill()  # the service "survives": its kill is suppressed below
    private.service.wait()
    # A process naming the storage on its command line, as a conmon does.
    stubborn = podman_module.subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)", f"{short_dir}/"])
    monkeypatch.setattr(podman_module.os, "kill", lambda pid, sig: None)
    monkeypatch.setattr(podman_module, "KILL_GRACE_SECONDS", 0.0)
    try:
        with pytest.raises(pytest.fail.Exception, match=rf"left processes behind.*{stubborn.pid}"):
            stop_podman(private)
    finally:
        monkeypatch.undo()
        stubborn.kill()
        stubborn.wait()


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""
