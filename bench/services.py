"""The real servers a benchmark runs: child processes and a private Podman
(:mod:`collectors.podman`). The private PostgreSQL, free ports, polling and the webhook
receiver come from :mod:`sparkops.testing`, which the test suite uses too.

Everything listens on 127.0.0.1 only, lives in a temporary directory of its own and is stopped
by the process id it was started with (never by name), so a benchmark can run next to a test
suite or another benchmark on the same machine.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

from collectors.podman import PodmanError, PrivatePodman

PROJECT = Path(__file__).resolve().parent.parent


def http_ok(url: str, timeout: float = 2.0) -> bool:
    """Does ``url`` answer 2xx now? (Loopback only; used to wait for servers.)"""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310
            return 200 <= response.status < 300
    except (urllib.error.URLError, OSError):
        return False


class Child:
    """A server started by a benchmark, in its own session so that its children stop with it."""

    def __init__(self, name: str, argv: Sequence[str], *, log: Path,
                 env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        self.name = name
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = log.open("ab")
        self.process = subprocess.Popen(
            list(argv), stdout=self._log_file, stderr=subprocess.STDOUT, env=env,
            cwd=cwd, start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def signal(self, signum: int) -> None:
        if self.alive():
            self.process.send_signal(signum)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, then SIGKILL for the whole session it started, after ``timeout``."""
        if self.alive():
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._kill_group()
                self.process.wait(timeout=5)
        self._kill_group()  # stragglers of its session (e.g. a worker's child)
        self._log_file.close()

    def _kill_group(self) -> None:
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


# --- Podman ---------------------------------------------------------------------------------

# Where the private Podman keeps its storage, for phases run as separate processes.
PODMAN_STORAGE_ENV = "BENCH_PODMAN_STORAGE"
BENCH_LABEL = "sparkops.bench=1"


class Podman(PrivatePodman):
    """A :class:`collectors.podman.PrivatePodman` (every state directory under ``storage``, so
    the machine's other containers are never touched), as the tests use it: containers run a
    program from this machine's own file system (``--rootfs /:O``) with host networking."""

    def __init__(self, storage: Path) -> None:
        super().__init__(storage)
        self.storage = storage

    @classmethod
    def from_env(cls) -> Podman:
        return cls(Path(os.environ[PODMAN_STORAGE_ENV]))

    def run(self, name: str, command: Sequence[str], labels: dict[str, str]) -> str:
        """Create and start a container running ``command``; return its id."""
        argv = ["run", "--detach", "--name", name, "--label", BENCH_LABEL,
                "--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096",
                "--network", "host", "--workdir", str(PROJECT)]
        for key, value in labels.items():
            argv += ["--label", f"{key}={value}"]
        return self(*argv, "--rootfs", "/:O", *command)

    def remove_all(self) -> None:
        """Remove every container; retried, since removing many at once can meet a mount that
        is still busy ("device or resource busy"). What is left goes with the service."""
        for attempt in range(3):
            try:
                self("rm", "--force", "--time", "0", "--all", timeout=180)
                return
            except PodmanError as error:
                if attempt == 2:
                    print(f"  (podman: {error}; left to the service's cleanup)", flush=True)
                time.sleep(2)


@contextmanager
def podman_service() -> Iterator[tuple[Podman, str]]:
    """``podman system service`` on a private socket; yields the CLI and the ``unix://`` URL.
    Everything it created is removed afterwards by path (containers, what they left running,
    storage); :class:`collectors.podman.LeftoverError` if a process survives."""
    if not shutil.which("podman"):
        raise RuntimeError("podman is not installed (Debian packages podman and runc)")
    top = Path(tempfile.mkdtemp(prefix="sparkops-bench-podman-"))
    podman = Podman(top / "storage")
    try:
        url = podman.start_service(timeout=20)
        yield podman, url
    finally:
        podman.remove_all()
        podman.destroy()
        shutil.rmtree(top, ignore_errors=True)
