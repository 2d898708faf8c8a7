"""Watch host memory across one collection interval, keeping the interval's minimum.

A prefill buffer lives for seconds, and on a GB10 one is allocated and freed within half a
second; a 5-second snapshot would usually miss it. So one collection reads ``/proc/meminfo``
for the whole interval and keeps the lowest MemAvailable it saw and when.

Reads are paced by what memory does: every ``period`` seconds (0.1 s by default) while
MemAvailable falls and for a second after, every :func:`still_period` (0.25 s) while it is still
(half the 0.5 s dip every window promises to catch, so such a dip is read at its depth even when
it falls between two reads all at once). Most reads look at the one field
(:class:`collectors.procfs.MeminfoField`, a kept buffer and, on /proc, a kept descriptor);
once a second, and at the window's start and end, meminfo is read and parsed whole, so the last
reading and the flight recorder's text a second are full ones. The waking up costs more than
the one-field read itself. :data:`EVERY_PERIOD` keeps the former way: a full read every
``period``, whatever memory does.

A pressure trigger (PSI, ``/proc/pressure/memory``) is not used to wake the window: a dip on a
machine with memory to spare stalls nothing and raises no trigger, and the still pace is what
catches it.

When the node's engines run inside a memory budget (a memory cgroup, see
:func:`collectors.procfs.read_memory_budget`), the budget is read right after meminfo at every
read, and its lowest room is kept the same way (a fall of the room also sets the moving pace):
a prefill buffer that dips the budget's room is caught like one that dips MemAvailable. That
costs another ~80 µs per read.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from collectors.meminfo import MemInfo, MemoryPressure, parse_meminfo, parse_pressure
from collectors.procfs import BudgetReading, Procfs, ProcfsError, read_memory_budget

# How a window paces its reads (see watch_host_memory).
PACED = "paced"
EVERY_PERIOD = "every-period"
# The shortest dip every window promises to catch at its depth, in seconds.
DIP_SECONDS = 0.5
# While memory is still, reads come this many times less often than while it moves.
STILL_SLOWDOWN = 2.5
# A fall of MemAvailable (or of the budget's room) between two reads that counts as moving:
# well above what page cache and small allocations move in a tenth of a second.
FALL_BYTES = 64 * 1024**2
# How long the window keeps its moving pace after the last such fall: a prefill buffer is
# allocated in steps, and the dip's bottom comes after its first fall.
MOVING_HOLD_SECONDS = 1.0
# Seconds between two full reads of meminfo at the paced method: the flight recorder keeps one
# full text a second (collectors.flightrecorder), and "last" is a full reading.
FULL_READ_SECONDS = 1.0


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
    budget: Path | None = None, method: str = PACED,
) -> WindowReading:
    """Watch meminfo for ``duration`` s; return the last reading and the lowest MemAvailable.

    ``method`` is how often it reads: :data:`PACED` (the default) every ``period`` s while
    memory moves and every :func:`still_period` s while it is still, one full read a second
    and a one-field read (:meth:`Procfs.meminfo_field`) in between; :data:`EVERY_PERIOD` a
    full read every ``period`` s. Either way the first read and the last (the one at the
    deadline) are full, ``last`` is the last one, and every read counts for the minimum and in
    ``reads``.

    A read error mid-window is tolerated (the next read may succeed); the collection fails only
    when the final read fails, so a gap in the chart always means "we could not read it now".
    With ``budget`` (a memory cgroup directory) its room is read with every read and its
    minimum kept; an unreadable budget never fails the collection, its figures are unknown.
    """
    if method not in (PACED, EVERY_PERIOD):
        raise ValueError(f"unknown dip capture method {method!r}")
    clock = clock or Clock()
    started_at = clock.wall()
    now = clock.mono()
    deadline = now + duration
    paced = method == PACED
    still = still_period(period) if paced else period
    reads = 0
    minimum: tuple[int, datetime] | None = None
    last: MemInfo | None = None
    error: str | None = None
    budget_reading: BudgetReading | None = None
    budget_minimum: tuple[int, datetime] | None = None
    previous: tuple[int | None, int | None] = (None, None)  # MemAvailable, room: last read
    full_due = moving_until = now  # the first read is a full one
    with procfs.meminfo_field("MemAvailable") as one_field:
        while True:
            final = now >= deadline
            full = final or not paced or now >= full_due
            if full:
                try:
                    last, error = parse_meminfo(procfs.meminfo()), None
                except ProcfsError as failure:
                    last, error = None, str(failure)
                available = last.mem_available if last is not None else None
                full_due = now + FULL_READ_SECONDS
            else:
                available = one_field.read()
            reads += 1
            if available is not None and (minimum is None or available < minimum[0]):
                minimum = (available, clock.wall())
            room = None
            if budget is not None:
                budget_reading = read_memory_budget(budget)
                room = budget_reading.room
                if room is not None and (budget_minimum is None or room < budget_minimum[0]):
                    budget_minimum = (room, clock.wall())
            if final:
                break
            if _fell(previous[0], available) or _fell(previous[1], room):
                moving_until = now + MOVING_HOLD_SECONDS
            previous = (available, room)
            pace = period if now < moving_until else still
            clock.sleep(min(pace, deadline - now))
            now = clock.mono()
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


def still_period(period: float) -> float:
    """Seconds between two reads while memory is still, for a window whose moving pace is
    ``period``: :data:`STILL_SLOWDOWN` times slower, but at most half of :data:`DIP_SECONDS`, so
    a dip held that long is read at least once at its depth even when nothing was seen falling
    before it (and never faster than ``period``)."""
    return max(period, min(period * STILL_SLOWDOWN, DIP_SECONDS / 2))


def _fell(before: int | None, after: int | None) -> bool:
    return before is not None and after is not None and before - after >= FALL_BYTES


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
