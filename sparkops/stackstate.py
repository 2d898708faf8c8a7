"""Whether the stack runs, read from the files it keeps in the data directory.

``manage.py runstack`` hands its supervisor (``sparkops/supervise.py``) the path of a state file,
``<data dir>/stack-state.json``, which the supervisor rewrites whenever a process starts and
removes when the stack stops: its own pid and each process's name, pid and start. The
one-process stack (``sparkops.onestack``, the default) is its own supervisor: the file names it
alone, with no processes below it, and says ``"layout": "one-process"``. A pid counts as
running only while ``/proc`` shows it alive with the start recorded for it, so a file left behind
by a supervisor that was killed, whose pids are gone or reused, reads as "not running".

The worker also touches ``<data dir>/worker.alive`` every few seconds (``sparkops.stackworker``):
a fresh liveness file means a worker runs on this data directory even where the state file says
nothing (a worker started without ``runstack``).

``manage.py status`` shows both; ``manage.py restore`` refuses while either says the stack runs.
Under systemd, ``systemd_state`` asks for the service's state as well.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

STATE_FILE_NAME = "stack-state.json"
LIVENESS_FILE_NAME = "worker.alive"
SYSTEMD_UNIT = "sparkops"
# The stack's layouts (SPARKOPS_STACK): the one process (sparkops.onestack), or a supervisor and
# its processes (sparkops/supervise.py); the state file names the first, and no layout the second.
ONE_PROCESS = "one-process"
PROCESSES = "processes"
LAYOUTS = (ONE_PROCESS, PROCESSES)


def state_file(data_dir: Path) -> Path:
    return Path(data_dir) / STATE_FILE_NAME


def liveness_file(data_dir: Path) -> Path:
    """The file the stack's worker touches to show it is alive."""
    return Path(data_dir) / LIVENESS_FILE_NAME


@dataclass(frozen=True)
class StackProcess:
    """One process named in the state file, and whether it still runs."""

    name: str
    pid: int
    started_at: datetime | None
    restarts: int
    alive: bool


@dataclass(frozen=True)
class StackState:
    """What the state file says runs. ``supervisor`` is None when there is no state file."""

    supervisor: StackProcess | None
    processes: tuple[StackProcess, ...] = ()
    layout: str = PROCESSES

    @property
    def running(self) -> bool:
        return self.supervisor is not None and self.supervisor.alive


def started_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks after boot; None when it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    if not fields or fields[0] in ("Z", "X"):
        return None
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def _process(entry: dict) -> StackProcess:
    pid = int(entry["pid"])
    ticks = started_ticks(pid)
    recorded = entry.get("started_ticks")
    alive = ticks is not None and (recorded is None or recorded == ticks)
    try:
        started_at = datetime.fromisoformat(entry["started_at"])
    except (KeyError, TypeError, ValueError):
        started_at = None
    return StackProcess(name=str(entry.get("name", "?")), pid=pid, started_at=started_at,
                        restarts=int(entry.get("restarts") or 0), alive=alive)


def read_stack_state(data_dir: Path) -> StackState:
    """The stack as its state file describes it; an absent or unreadable file: nothing runs."""
    try:
        state = json.loads(state_file(data_dir).read_text())
        supervisor = _process(state["supervisor"])
        processes = tuple(_process(entry) for entry in state.get("processes", []))
    except (OSError, ValueError, KeyError, TypeError):
        return StackState(supervisor=None)
    return StackState(supervisor=supervisor, processes=processes,
                      layout=str(state.get("layout") or PROCESSES))


def liveness_age(data_dir: Path) -> float | None:
    """Seconds since the worker last touched its liveness file; None without one."""
    try:
        return max(time.time() - liveness_file(data_dir).stat().st_mtime, 0.0)
    except OSError:
        return None


def running_reason(data_dir: Path, liveness_timeout: float) -> str | None:
    """Why the stack counts as running on ``data_dir``, in words; None when nothing runs."""
    state = read_stack_state(data_dir)
    if state.running:
        which = "one process, pid" if state.layout == ONE_PROCESS else "supervisor pid"
        return f"the stack runs ({which} {state.supervisor.pid}, {state_file(data_dir)})"
    age = liveness_age(data_dir)
    if age is not None and age < liveness_timeout:
        return (f"a worker touched {liveness_file(data_dir)} {age:.0f} s ago "
                f"(less than SPARKOPS_WORKER_LIVENESS_TIMEOUT, {liveness_timeout:g} s)")
    return None


def systemd_state(unit: str = SYSTEMD_UNIT) -> str | None:
    """``systemctl is-active <unit>`` (active, inactive, failed, ...) where systemd runs this
    machine and systemctl is installed; None elsewhere (a container, a machine without it)."""
    systemctl = shutil.which("systemctl")
    if systemctl is None or not Path("/run/systemd/system").is_dir():
        return None
    try:
        result = subprocess.run([systemctl, "is-active", unit], capture_output=True, text=True,
                                timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() or None
