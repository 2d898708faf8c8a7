"""Real containers for tests: Podman's Docker-compatible API service on a private socket.

Containers run a program from this machine's own file system (``--rootfs /:O``, an overlay, so
nothing is written back) with host networking, since no image registry is reachable.
``--runtime runc --cgroup-manager cgroupfs`` and the low ulimits are what this kind of machine
accepts (the default crun runtime fails with "cgroups in hybrid mode not supported").
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parent.parent
# A storage root of this test run's own: containers of another run on the same machine (or of
# the admin) are neither seen nor touched.
STORAGE = Path(tempfile.gettempdir()) / f"sparkops-podman-{os.getpid()}"
PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs",
          "--root", str(STORAGE / "root"), "--runroot", str(STORAGE / "run")]
TEST_LABEL = "sparkops.test=1"


@pytest.fixture(scope="session")
def docker_host() -> Iterator[str]:
    """Start ``podman system service`` on a private socket; yield its ``unix://`` URL."""
    if not shutil.which("podman"):
        pytest.fail("podman is not installed (Debian packages podman and runc)")
    folder = Path(tempfile.mkdtemp(prefix="sparkops-podman-"))
    socket_path = folder / "podman.sock"
    service = subprocess.Popen(
        [*PODMAN, "system", "service", "--time=0", f"unix://{socket_path}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while not socket_path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    if not socket_path.exists():
        service.kill()
        pytest.fail("podman system service did not create its socket within 20 s")
    try:
        yield f"unix://{socket_path}"
    finally:
        subprocess.run([*PODMAN, "rm", "--force", "--time", "0", "--filter",
                        f"label={TEST_LABEL}", "--all"], capture_output=True)
        service.terminate()
        service.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)
        subprocess.run([*PODMAN, "system", "reset", "--force"], capture_output=True)
        shutil.rmtree(STORAGE, ignore_errors=True)


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def run_container(name: str, command: list[str], *, labels: dict[str, str] | None = None,
                  volumes: list[str] | None = None, env: dict[str, str] | None = None) -> str:
    """Create and start a container running ``command`` from the host file system; its id."""
    argv = [*PODMAN, "run", "--detach", "--name", name, "--label", TEST_LABEL,
            "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
            "--network", "host", "--workdir", str(PROJECT)]
    for key, value in (labels or {}).items():
        argv += ["--label", f"{key}={value}"]
    for volume in volumes or []:
        argv += ["--volume", volume]
    for key, value in (env or {}).items():
        argv += ["--env", f"{key}={value}"]
    argv += ["--rootfs", "/:O", *command]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise RuntimeError(f"podman run failed: {result.stderr.strip()}")
    return result.stdout.strip()


def podman(*args: str, timeout: float = 60) -> str:
    result = subprocess.run([*PODMAN, *args], capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout.strip()
