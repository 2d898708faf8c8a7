"""Watch host memory across one collection interval, keeping the interval's minimum.

A prefill buffer lives for seconds; a 5-second snapshot would usually miss it. So one collection
reads ``/proc/meminfo`` every ``period`` seconds for the whole interval and keeps the lowest
MemAvailable it saw and when. With the default 0.1 s period, any dip of 0.5 s or longer is seen
several times. Cost: one ~2 KB file read and parse per period (about 40 µs), i.e. well under 0.1 %
of one core.

When the node's engines run inside a memory budget (a memory cgroup, see
:func:`collectors.procfs.read_memory_budget`), the budget is read right after meminfo in the same
period, and its lowest room is kept the same way: a prefill buffer that dips the budget's room is
caught like one that dips MemAvailable. That costs another ~80 µs per period.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from collectors.meminfo import MemInfo, MemoryPressure, parse_meminfo, parse_pressure
from collectors.procfs import BudgetReading, Procfs, ProcfsError, read_memory_budget


@dataclass(frozen=True)
class Clock:
    """Wall and monotonic time, injectable for tests."""

    wall: Callable[[], datetime] = lambda: datetime.now(UTC)
    mono: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


@dataclass
class WindowReading:
    """What one collection interval saw.

    ``last`` is the final full reading; ``min_available`` and ``min_available_at`` are the lowest
    MemAvailable read during the window (None when MemAvailable was unknown throughout).
    ``error`` is set when meminfo could not be read at the end of the window; then the
    collection failed and ``last`` is None. ``budget`` is the memory budget's final reading
    (None when no budget is watched); ``min_budget_room`` and ``min_budget_room_at`` its lowest
    room in the window (None when the room was unknown or unlimited throughout).
    """

    started_at: datetime
    finished_at: datetime
    reads: int
    last: MemInfo | None
    pressure: MemoryPressure | None
    min_available: int | None
    min_available_at: datetime | None
    error: str | None = None
    budget: BudgetReading | None = None
    min_budget_room: int | None = None
    min_budget_room_at: datetime | None = None


def watch_host_memory(
    procfs: Procfs, duration: float, period: float, clock: Clock | None = None,
    budget: Path | None = None,
) -> WindowReading:
    """Read meminfo every ``period`` s for ``duration`` s; return the last reading and the minimum.

    A read error mid-window is tolerated (the next read may succeed); the collection fails only
    when the final read fails, so a gap in the chart always means "we could not read it now".
    With ``budget`` (a memory cgroup directory) its room is read in the same period and its
    minimum kept; an unreadable budget never fails the collection, its figures are unknown.
    """
    clock = clock or Clock()
    started_at = clock.wall()
    deadline = clock.mono() + duration
    reads = 0
    minimum: tuple[int, datetime] | None = None
    last: MemInfo | None = None
    error: str | None = None
    budget_reading: BudgetReading | None = None
    budget_minimum: tuple[int, datetime] | None = None
    while True:
        try:
            last, error = parse_meminfo(procfs.meminfo()), None
        except ProcfsError as failure:
            last, error = None, str(failure)
        reads += 1
        available = last.mem_available if last is not None else None
        if available is not None and (minimum is None or available < minimum[0]):
            minimum = (available, clock.wall())
        if budget is not None:
            budget_reading = read_memory_budget(budget)
            room = budget_reading.room
            if room is not None and (budget_minimum is None or room < budget_minimum[0]):
                budget_minimum = (room, clock.wall())
        remaining = deadline - clock.mono()
        if remaining <= 0:
            break
        clock.sleep(min(period, remaining))
    return WindowReading(
        started_at=started_at,
        finished_at=clock.wall(),
        reads=reads,
        last=last,
        pressure=parse_pressure(procfs.memory_pressure()) if last is not None else None,
        min_available=minimum[0] if minimum else None,
        min_available_at=minimum[1] if minimum else None,
        error=error,
        budget=budget_reading,
        min_budget_room=budget_minimum[0] if budget_minimum else None,
        min_budget_room_at=budget_minimum[1] if budget_minimum else None,
    )


def window_seconds(interval: float) -> float:
    """How long one collection watches: the interval less a margin for scheduling and the write.

    The margin keeps one collection from overlapping the next; the gap it leaves (~0.25 s) is
    shorter than the 0.5 s dip we promise to catch.
    """
    return max(interval - 0.25, interval * 0.5)


def stale_after(interval: float) -> float:
    """Seconds after which a node's latest collection no longer describes it: three missed
    intervals plus scheduling slack. Past it the worker or beat is not running, and a figure
    from that collection is too old to show as current or to act on."""
    return 3 * interval + 5
