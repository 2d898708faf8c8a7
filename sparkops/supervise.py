"""Start the stack's processes, and stop them all when one exits or when asked to stop.

``manage.py runstack`` builds the command lines with Django (settings, checks) and then replaces
itself with this module, run by path as a plain script (``python -P .../supervise.py SPEC``): it
imports only the standard library, neither Django nor the project, so the process that waits for
the stack is a bare interpreter (about 10 MiB resident) instead of a Django one (about 58 MiB).
Keep it that way: no project or third-party import here.

SPEC is JSON: ``{"processes": [{"name": ..., "argv": [...], "env": {...}}, ...]}`` (``env`` is
optional and added to this process's environment). If any process exits, the others are
stopped (SIGTERM, SIGKILL after a grace period) and this exits 1, so whoever runs the stack
(systemd, a container, a terminal) sees the failure instead of a half-running stack. SIGINT or
SIGTERM stops them all the same way and exits 0.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

GRACE_SECONDS = 15.0
POLL_SECONDS = 0.5


def _start(spec: dict) -> dict[str, subprocess.Popen]:
    processes: dict[str, subprocess.Popen] = {}
    for entry in spec["processes"]:
        env = {**os.environ, **entry["env"]} if entry.get("env") else None
        processes[entry["name"]] = subprocess.Popen(entry["argv"], env=env)
    return processes


def _stop_all(processes: dict[str, subprocess.Popen], grace: float) -> None:
    for process in processes.values():
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + grace
    for process in processes.values():
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def supervise(spec: dict, *, grace: float = GRACE_SECONDS) -> int:
    """Run the processes of ``spec`` until one exits or a stop signal comes; the exit status."""
    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    # Installed before the first child starts: a stop request never finds the default handler.
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    processes = _start(spec)
    exited: str | None = None
    while not stopping and exited is None:
        exited = next((name for name, p in processes.items() if p.poll() is not None), None)
        if exited is None:
            time.sleep(POLL_SECONDS)
    _stop_all(processes, grace)
    if exited is not None:
        code = processes[exited].returncode
        print(f"{exited} exited with status {code}; stopped the others.", file=sys.stderr,
              flush=True)
        return 1
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: supervise.py SPEC (JSON; see the module's docstring)", file=sys.stderr)
        return 2
    return supervise(json.loads(argv[0]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
