"""A private Podman: the podman CLI and its Docker-API service over state of their own, removed
by path afterwards, without touching any other container on the machine.

Podman keeps state in several places, and a flag for each: ``--root`` (images, containers, the
libpod database), ``--runroot`` (mounts, pid files), ``--tmpdir`` (the "alive" marker, exit
files and events: ``/run/libpod`` for root by default, shared by every rootful Podman that does
not name its own), ``--volumepath`` and ``--network-config-dir``. A :class:`PrivatePodman` names
all of them under one folder, so ``podman system reset`` is never needed: that command, even
with a private ``--root``/``--runroot``, deletes the shared temp directory, after which the
admin's running containers show as "Created" and cannot be restarted.

Removal (:meth:`PrivatePodman.destroy`) is, in order: remove its containers, stop its service,
kill what its containers left running (found by their cgroups, ``libpod-<id>``, and by any
process whose command line names this folder, such as a ``conmon`` podman lost track of),
unmount what is mounted under the folder, delete the containers' empty cgroups and runtime state,
then delete the folder. It raises :class:`LeftoverError` naming what is still there.

Containers run with ``--runtime runc --cgroup-manager cgroupfs``: the default crun runtime fails
on this kind of machine's hybrid cgroups ("cgroups in hybrid mode not supported").
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from collectors.procfs import cgroup_entries

RUNTIME_FLAGS = ["--runtime", "runc", "--cgroup-manager", "cgroupfs"]
CONTAINER_ID = re.compile(r"^[0-9a-f]{64}$")
CGROUP_ROOT = Path("/sys/fs/cgroup")
# How long killed processes get to disappear; they hold no lock we wait for, only the kernel's
# reaping of their memory.
KILL_GRACE_SECONDS = 10.0


class PodmanError(RuntimeError):
    """A podman command failed or did not finish; the message says which and why."""


class LeftoverError(PodmanError):
    """Something a private Podman started is still running or mounted after its removal."""


class PrivatePodman:
    """The podman CLI with every state directory under ``base`` (see the module docstring)."""

    def __init__(self, base: Path) -> None:
        self.base = Path(base)
        self.socket = self.base / "podman.sock"
        self.argv = ["podman", *RUNTIME_FLAGS,
                     "--root", str(self.base / "root"), "--runroot", str(self.base / "run"),
                     "--tmpdir", str(self.base / "tmp"),
                     "--volumepath", str(self.base / "volumes"),
                     "--network-config-dir", str(self.base / "networks"),
                     "--events-backend", "file"]
        self.service: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def __call__(self, *args: str, timeout: float = 60) -> str:
        """Run ``podman <args>``; its standard output, or :class:`PodmanError`."""
        try:
            result = subprocess.run([*self.argv, *args], capture_output=True, text=True,
                                    timeout=timeout)
        except subprocess.TimeoutExpired:
            raise PodmanError(f"podman {args[0]} did not finish within {timeout:.0f} s") from None
        if result.returncode != 0:
            raise PodmanError(f"podman {' '.join(args[:2])} failed: {result.stderr.strip()}")
        return result.stdout.strip()

    def start_service(self, *, log: Path | None = None, timeout: float = 30) -> str:
        """Start ``podman system service`` on ``base/podman.sock``; its ``unix://`` URL.

        The service runs in its own session, so a Ctrl-C in the terminal reaches the caller,
        which removes the containers before it stops the service.
        """
        self.base.mkdir(parents=True, exist_ok=True)
        output = log.open("ab") if log is not None else subprocess.DEVNULL
        try:
            self.service = subprocess.Popen(
                [*self.argv, "system", "service", "--time=0", self.url],
                stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            if log is not None:
                output.close()
        deadline = time.monotonic() + timeout
        while not self.socket.exists():
            if self.service.poll() is not None or time.monotonic() > deadline:
                text = log.read_text(errors="replace").strip()[-800:] if log else ""
                self.stop_service()
                raise PodmanError(f"podman system service did not start within {timeout:.0f} s"
                                  f"{': ' + text if text else ''}")
            time.sleep(0.1)
        return self.url

    def stop_service(self) -> None:
        """Stop the service this object started (SIGTERM, then SIGKILL after 10 s)."""
        if self.service is None or self.service.poll() is not None:
            return
        self.service.terminate()
        try:
            self.service.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.service.kill()
            self.service.wait(timeout=10)

    def container_ids(self) -> set[str]:
        """Ids of every container in this storage: podman's list, and the storage's folders
        (which survive a database podman can no longer read)."""
        found: set[str] = set()
        with contextlib.suppress(PodmanError, OSError):
            found.update(self("ps", "--all", "--quiet", "--no-trunc", timeout=30).split())
        for store in ("root", "run"):
            folder = self.base / store / "overlay-containers"
            with contextlib.suppress(OSError):
                found.update(entry.name for entry in folder.iterdir())
        return {name for name in found if CONTAINER_ID.match(name)}

    def processes(self, container_ids: set[str]) -> list[int]:
        """Live processes in a cgroup of one of ``container_ids``, or whose command line names
        this storage (``conmon``, the service, podman's cleanup commands); not this process."""
        marks = [f"libpod-{cid}" for cid in container_ids]
        base = f"{self.base}/"
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                    continue  # exited, waiting to be reaped: holds nothing
                argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                    errors="replace")
            except (OSError, IndexError):
                continue  # gone meanwhile
            cgroups = cgroup_entries(int(entry.name))
            if cgroups is None:
                continue  # gone meanwhile
            if any(mark in cgroup.path for cgroup in cgroups for mark in marks) or base in argv:
                found.append(int(entry.name))
        return sorted(found)

    def kill_leftovers(self, container_ids: set[str]) -> list[int]:
        """SIGKILL every process of :meth:`processes`; those still alive after the grace."""
        for pid in self.processes(container_ids):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + KILL_GRACE_SECONDS
        while (left := self.processes(container_ids)) and time.monotonic() < deadline:
            time.sleep(0.1)
        return left

    def mounts(self) -> list[Path]:
        """Mount points under ``base`` in this mount namespace, deepest first."""
        prefix = f"{self.base}/"
        points = []
        with contextlib.suppress(OSError):
            for line in Path("/proc/self/mountinfo").read_text().splitlines():
                point = _unescape(line.split()[4])
                if point.startswith(prefix):
                    points.append(Path(point))
        return sorted(points, key=lambda p: len(p.parts), reverse=True)

    def destroy(self) -> None:
        """Remove everything this storage holds and started (see the module docstring); gone
        already is fine. Raises :class:`LeftoverError` if a process or a mount survives (the
        folder is then kept: deleting through a mount of ``/`` would reach the host's files)."""
        ids = self.container_ids()
        if ids:
            with contextlib.suppress(PodmanError, OSError):
                self("rm", "--force", "--all", "--time", "0", timeout=120)
        self.stop_service()
        survivors = self.kill_leftovers(ids)
        for point in self.mounts():
            subprocess.run(["umount", "--lazy", str(point)], capture_output=True, timeout=30)
        mounted = self.mounts()
        for cid in ids:
            _remove_cgroups(cid)
            _remove_runtime_state(cid)
        if survivors or mounted:
            raise LeftoverError(
                f"podman storage {self.base} still has processes {survivors} and mounts "
                f"{[str(p) for p in mounted]} after removal")
        shutil.rmtree(self.base, ignore_errors=True)


def _unescape(field: str) -> str:
    # /proc/self/mountinfo writes space, tab, newline and backslash as octal escapes.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _remove_cgroups(container_id: str) -> None:
    """Delete the empty cgroups of a container that cgroupfs left (one per hierarchy)."""
    for pattern in (f"*/libpod_parent/libpod-{container_id}*", f"libpod_parent/libpod-"
                                                               f"{container_id}*"):
        for folder in sorted(CGROUP_ROOT.glob(pattern), key=lambda p: len(p.parts),
                             reverse=True):
            with contextlib.suppress(OSError):
                folder.rmdir()


def _remove_runtime_state(container_id: str) -> None:
    """runc keeps each container's state under its own root, named by the container's id;
    a container killed behind podman's back leaves it there."""
    root = Path("/run/runc") if os.geteuid() == 0 else \
        Path(os.environ.get("XDG_RUNTIME_DIR", f"/run/user/{os.geteuid()}")) / "runc"
    shutil.rmtree(root / container_id, ignore_errors=True)
