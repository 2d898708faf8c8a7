"""Real dips for the tests that judge them against the machine's own MemAvailable: a wait for
memory that is not moving, and a process that holds a real block for a while."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from collectors.procfs import Procfs

MIB = 1024**2


def wait_until_memory_is_still(within: int = 32 * MIB, over: float = 1.0,
                               give_up_after: float = 30.0) -> None:
    """Return once the machine's MemAvailable has stayed within ``within`` bytes for ``over``
    seconds. Memory a moment ago freed (a test's block, a container that stopped) reaches the
    free count over the next second or so; a window opened while it still rises reads its lowest
    value at its first read, whatever dip comes later."""
    with Procfs().meminfo_field("MemAvailable") as available:
        deadline = time.monotonic() + give_up_after
        recent: list[tuple[float, int]] = []
        while time.monotonic() < deadline:
            now = time.monotonic()
            recent = [(at, value) for at, value in recent if now - at <= over]
            recent.append((now, available.read()))
            values = [value for _, value in recent]
            if now - recent[0][0] >= over * 0.9 and max(values) - min(values) <= within:
                return
            time.sleep(0.1)
    pytest.fail(f"the machine's MemAvailable moved by more than {within // MIB} MiB in every "
                f"{over:g} s for {give_up_after:g} s: a dip cannot be judged against it")


_HOLDER = """
import json, sys, time
def available():
    with open("/proc/meminfo") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("MemAvailable:"))
size, delay, hold = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
time.sleep(delay)
before = available()
started = time.time()
block = bytearray(size)
block[::4096] = b"\\x01" * (size // 4096)  # every page touched: really resident
touched = time.time()
time.sleep(0.25)
during = available()
time.sleep(max(hold - (time.time() - touched), 0))
del block  # returned to the kernel (munmap) before this returns: held until then
released = time.time()
print(json.dumps({"before": before, "during": during, "started": started,
                  "released": released}), flush=True)
"""


def hold_block(size: int, delay: float, hold: float) -> subprocess.Popen:
    """A process that, ``delay`` s after it starts, touches a block of ``size`` bytes, holds it
    ``hold`` s after the last page and frees it; its output is one JSON line: MemAvailable as it
    read it ``before`` and ``during`` the hold, when the block was ``started`` and ``released``
    (epoch seconds)."""
    return subprocess.Popen([sys.executable, "-c", _HOLDER, str(size), str(delay), str(hold)],
                            stdout=subprocess.PIPE, text=True)


def held(holder: subprocess.Popen) -> dict:
    """What the holder read and when, once it ended."""
    return json.loads(holder.communicate(timeout=20)[0])
