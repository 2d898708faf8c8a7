"""Start the stack's processes, restart one that crashes or falls silent, and stop them together.

``manage.py runstack`` builds the command lines with Django (settings, checks) and then replaces
itself with this module, run by path as a plain script (``python -P .../supervise.py SPEC``): it
imports only the standard library, neither Django nor the project, so the process that waits for
the stack is a bare interpreter (about 10 MiB resident) instead of a Django one (about 58 MiB).
Keep it that way: no project or third-party import here.

SPEC is JSON::

    {"processes": [{"name": ..., "argv": [...], "env": {...},
                    "heartbeat": {"path": ..., "timeout": 60, "startup": 180}}, ...],
     "restart": {"initial": 1, "max": 60, "stable": 120, "crashes": 5, "window": 300},
     "state": "/path/to/stack-state.json"}

``env`` (added to this process's environment), ``heartbeat``, ``restart`` and ``state`` are
optional; ``restart`` defaults to ``RESTART_POLICY``. The contract:

1. A process that exits (whatever its status) is restarted after a delay that starts at
   ``initial`` seconds and doubles with each consecutive crash up to ``max``; once a process has
   run ``stable`` seconds, its next crash starts again from ``initial``.
2. A process with a ``heartbeat`` must keep touching the file at ``path``: the file is removed
   before each start, and a process whose file is older than ``timeout`` seconds (or absent
   ``startup`` seconds after its start) is stopped (SIGKILL, with its descendants: a stopped or
   wedged process would ignore SIGTERM) and restarted as a crash.
3. When one process has crashed ``crashes`` times within ``window`` seconds, restarting is not
   helping: all are stopped (SIGTERM, SIGKILL after a grace period) and this exits 1, so
   whoever runs the stack (systemd, a container, a terminal) sees the failure.
4. SIGINT or SIGTERM stops them all the same way and this exits 0.
5. With ``state``, what runs is kept in that file (JSON, mode 0600, replaced whole on every
   start of a process, removed when the stack stops): this supervisor and each process, by name,
   with its pid, its start (UTC, ISO 8601), its start in clock ticks after boot (field 22 of
   ``/proc/<pid>/stat``, so that a reader can tell a pid reused by another process) and its
   restarts. ``manage.py status`` and ``restore`` read it (``sparkops/stackstate.py``); a file
   left by a supervisor that was killed names pids that are gone, or taken by others. Once the
   processes are stopped, their heartbeat files are removed too.

Each crash, restart and heartbeat kill is one line on stderr.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

GRACE_SECONDS = 15.0
POLL_SECONDS = 0.5
# 1 s doubling to 60 s: a crash loop costs a few starts a minute, not a Django import per second.
# Five crashes within five minutes mean the cause is not transient (a broken setting, a database
# that is gone): the stack stops and says so.
RESTART_POLICY = {"initial": 1.0, "max": 60.0, "stable": 120.0, "crashes": 5, "window": 300.0}


def _say(message: str) -> None:
    print(f"supervise: {message}", file=sys.stderr, flush=True)


def _started_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks after boot (``/proc/<pid>/stat`` field 22)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def process_entry(name: str, pid: int, started_at: str, restarts: int) -> dict:
    """One process as the state file names it (contract point 5)."""
    return {"name": name, "pid": pid, "started_at": started_at,
            "started_ticks": _started_ticks(pid), "restarts": restarts}


class StateFile:
    """The file that says what runs (contract point 5); does nothing without a path."""

    def __init__(self, path: str | None) -> None:
        self.path = Path(path) if path else None
        self.started_at = datetime.now(UTC).isoformat(timespec="seconds")

    def write(self, children: list[Child]) -> None:
        self.write_entries(
            process_entry("supervisor", os.getpid(), self.started_at, 0),
            [process_entry(child.name, child.process.pid, child.started_at, child.starts - 1)
             for child in children if child.process is not None])

    def write_entries(self, supervisor: dict, processes: list[dict], **extra: object) -> None:
        """Replace the file with ``supervisor``, ``processes`` (``process_entry``) and the keys
        of ``extra``: this supervisor's stack, or the one-process stack (``sparkops.onestack``),
        which is its own supervisor."""
        if self.path is None:
            return
        state = {"supervisor": supervisor, "processes": processes, **extra}
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(descriptor, "w") as file:
                json.dump(state, file)
            os.replace(temporary, self.path)
        except OSError as error:  # a full disk must not stop the stack; status then says less
            _say(f"cannot write the state file {self.path}: {error}")

    def remove(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)


def _descendants(pid: int) -> list[int]:
    """The pids below ``pid`` (Linux /proc), deepest last; empty once it is gone."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split():
                    found += [int(child), *_descendants(int(child))]
    return found


class Child:
    """One process of the stack: its command line, its current run and its crash record."""

    def __init__(self, entry: dict, policy: dict) -> None:
        self.name: str = entry["name"]
        self.argv: list[str] = entry["argv"]
        self.env = {**os.environ, **entry["env"]} if entry.get("env") else None
        self.heartbeat: dict | None = entry.get("heartbeat")
        self.policy = policy
        self.process: subprocess.Popen | None = None
        self.started = 0.0
        self.started_at = ""
        self.starts = 0
        self.restart_at: float | None = None
        self.consecutive = 0
        self.crashes: collections.deque[float] = collections.deque()

    def start(self) -> None:
        if self.heartbeat:
            Path(self.heartbeat["path"]).unlink(missing_ok=True)  # a file of the last run
        self.started = time.monotonic()
        self.started_at = datetime.now(UTC).isoformat(timespec="seconds")
        self.restart_at = None
        self.starts += 1
        self.process = subprocess.Popen(self.argv, env=self.env)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def silent_for(self) -> float | None:
        """Seconds past its heartbeat bound, or None while its heartbeat is fresh enough."""
        if not self.heartbeat or not self.running():
            return None
        try:
            age = time.time() - os.stat(self.heartbeat["path"]).st_mtime
            bound = float(self.heartbeat["timeout"])
        except FileNotFoundError:
            age = time.monotonic() - self.started
            bound = float(self.heartbeat.get("startup", self.heartbeat["timeout"]))
        return age if age > bound else None

    def kill(self) -> None:
        """SIGKILL the process and everything it started; a stopped process dies of it too."""
        assert self.process is not None
        for pid in [self.process.pid, *_descendants(self.process.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait()

    def crashed(self, now: float) -> bool:
        """Record an exit; schedule the restart, or return False when it is time to give up."""
        if now - self.started >= self.policy["stable"]:
            self.consecutive = 0
        self.crashes.append(now)
        while self.crashes and now - self.crashes[0] > self.policy["window"]:
            self.crashes.popleft()
        if len(self.crashes) >= self.policy["crashes"]:
            return False
        delay = min(self.policy["initial"] * 2 ** self.consecutive, self.policy["max"])
        self.consecutive += 1
        self.restart_at = now + delay
        _say(f"{self.name} exited with status {self.process.returncode}; "
             f"restarting it in {delay:g} s")
        return True


def _stop_all(children: list[Child], grace: float) -> None:
    running = [child.process for child in children if child.running()]
    for process in running:
        process.terminate()
    deadline = time.monotonic() + grace
    for process in running:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def supervise(spec: dict, *, grace: float = GRACE_SECONDS) -> int:
    """Run the processes of ``spec`` (see the module's docstring) until asked to stop or until
    one keeps crashing; the exit status: 0 when asked to stop, 1 when it gave up."""
    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    # Installed before the first child starts: a stop request never finds the default handler.
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    policy = {**RESTART_POLICY, **spec.get("restart", {})}
    children = [Child(entry, policy) for entry in spec["processes"]]
    state = StateFile(spec.get("state"))
    try:
        return _run(children, policy, state, grace, lambda: stopping)
    finally:
        # Nothing runs any more: neither file may say otherwise (``manage.py restore`` reads both).
        state.remove()
        for child in children:
            if child.heartbeat:
                Path(child.heartbeat["path"]).unlink(missing_ok=True)


def _run(children: list[Child], policy: dict, state: StateFile, grace: float,
         stopping: Callable[[], bool]) -> int:
    for child in children:
        child.start()
    state.write(children)
    while not stopping():
        now = time.monotonic()
        for child in children:
            if child.restart_at is not None:
                if now >= child.restart_at:
                    child.start()
                    state.write(children)
                continue
            silent = child.silent_for()
            if silent is not None:
                _say(f"{child.name} sent no heartbeat for {silent:.0f} s; killing it")
                child.kill()
            if child.running():
                continue
            if not child.crashed(now):
                _say(f"{child.name} exited with status {child.process.returncode}, "
                     f"{len(child.crashes)} times within {policy['window']:g} s; "
                     "stopping the stack")
                _stop_all(children, grace)
                return 1
        pending = [c.restart_at - now for c in children if c.restart_at is not None]
        time.sleep(max(min([POLL_SECONDS, *pending]), 0.01))
    _stop_all(children, grace)
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: supervise.py SPEC (JSON; see the module's docstring)", file=sys.stderr)
        return 2
    return supervise(json.loads(argv[0]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
