"""Waiting for a still machine: tests that judge a real dip against the machine's own
MemAvailable start from memory that is not moving."""

from __future__ import annotations

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
