"""The host window's pace: fast while MemAvailable (or a budget's room) falls, slow while it is
still, one-field reads between full ones a second apart; and a real 0.5 s dip still caught.

The pace tests drive a window over a procfs fixture tree whose meminfo the clock's sleep rewrites
before each read (the window's own pace drives the script); the clock's monotonic time advances
by what the window asks to sleep, so every wait it chose is on record.
"""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from collectors import flightrecorder as fr
from collectors.meminfo import parse_meminfo
from collectors.procfs import Procfs
from collectors.sampling import (
    DIP_SECONDS,
    EVERY_PERIOD,
    FALL_BYTES,
    Clock,
    still_period,
    watch_host_memory,
)
from tests.stillmemory import held, hold_block, wait_until_memory_is_still

FIXTURES = Path(__file__).parent / "fixtures" / "procfs"
MIB = 1024**2
GIB = 1024**3
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
STILL = 50 * GIB


def _meminfo(available: int) -> str:
    text = (FIXTURES / "meminfo-gb10").read_text()
    return re.sub(r"^MemAvailable:.*$", f"MemAvailable:   {available // 1024} kB", text,
                  flags=re.M)


class ScriptedWindow:
    """A fixture tree whose MemAvailable is ``script(read)`` at each read, and a clock that
    advances by each sleep the window asks for (kept in ``sleeps``)."""

    def __init__(self, root: Path, script, budget: Path | None = None, room_script=None,
                 oversleep: dict[int, float] | None = None):
        root.mkdir(parents=True)
        (root / "pressure").mkdir()
        self.root, self.script, self.budget, self.room_script = root, script, budget, room_script
        self.oversleep = oversleep or {}  # sleep number -> seconds it lasts longer than asked
        self.now = 0.0
        self.sleeps: list[float] = []
        self._write(0)
        self.clock = Clock(wall=lambda: T0 + timedelta(seconds=self.now),
                           mono=lambda: self.now, sleep=self._sleep)

    def _write(self, read: int) -> None:
        (self.root / "meminfo").write_text(_meminfo(self.script(read)))
        if self.budget is not None:
            (self.budget / "memory.current").write_text(f"{8 * GIB - self.room_script(read)}\n")

    def _sleep(self, seconds: float) -> None:
        self.sleeps.append(round(seconds, 6))
        # Rounded, so that ten sleeps of 0.1 s make a second, as on a real clock.
        self.now = round(self.now + seconds + self.oversleep.get(len(self.sleeps), 0.0), 9)
        self._write(len(self.sleeps))

    def watch(self, procfs: Procfs | None = None, **options):
        duration = options.pop("duration", 4.75)
        return watch_host_memory(procfs or Procfs(self.root), duration=duration, period=0.1,
                                 clock=self.clock, budget=self.budget, **options)


def test_still_memory_is_read_at_the_still_pace_of_half_the_promised_dip(tmp_path):
    window = ScriptedWindow(tmp_path / "proc", lambda read: STILL)

    reading = window.watch()

    assert still_period(0.1) == DIP_SECONDS / 2 == 0.25
    assert set(window.sleeps[:-1]) == {0.25}  # the last sleep ends at the deadline
    assert reading.reads == 20
    assert reading.min_available == STILL and reading.last.mem_available == STILL


def test_a_fall_switches_to_the_fast_pace_for_a_second_then_back(tmp_path):
    # Still, then from the 4th read on 1 GiB lower (a buffer allocated between two reads),
    # back up from the 12th.
    def script(read: int) -> int:
        return STILL - GIB if 4 <= read < 12 else STILL

    window = ScriptedWindow(tmp_path / "proc", script)

    reading = window.watch()

    sleeps = window.sleeps
    assert sleeps[:4] == [0.25] * 4  # reads 0-3 still; read 4 sees the fall
    # After the fall: 0.1 s for a second (MOVING_HOLD_SECONDS), then the still pace again.
    assert sleeps[4:14] == [0.1] * 10
    assert sleeps[14] == 0.25
    assert reading.min_available == STILL - GIB
    assert reading.min_available_at == T0 + timedelta(seconds=1.0)  # read 4, at 4 × 0.25 s
    assert reading.last.mem_available == STILL


def test_a_small_fall_is_not_moving_memory(tmp_path):
    window = ScriptedWindow(tmp_path / "proc",
                            lambda read: STILL - (FALL_BYTES - MIB) * (read % 2))

    reading = window.watch()

    assert set(window.sleeps[:-1]) == {0.25}
    assert reading.min_available == STILL - (FALL_BYTES - MIB)


def test_a_dip_read_between_full_reads_is_the_minimum_and_full_reads_come_once_a_second(
        tmp_path):
    window = ScriptedWindow(tmp_path / "proc", lambda read: STILL - GIB if read == 2 else STILL)
    # Keeps every full text the window reads (the flight recorder keeps one a second of them).
    procfs = fr.SampledProcfs(window.root, samples=fr.SecondSamples(every=0.0))

    reading = window.watch(procfs)

    kept = [parse_meminfo(text).mem_available for _, text in procfs.samples.kept]
    assert reading.min_available == STILL - GIB  # read 2 was a one-field read
    assert STILL - GIB not in kept
    # The first and the last read, and one a second between: 0, 1, 2, 3, 4 s and 4.75 s.
    assert len(kept) == 6 and reading.reads > len(kept)
    assert reading.last.mem_available == STILL


def test_the_former_method_reads_everything_every_period(tmp_path):
    window = ScriptedWindow(tmp_path / "proc", lambda read: STILL)
    procfs = fr.SampledProcfs(window.root, samples=fr.SecondSamples(every=0.0))

    reading = window.watch(procfs, method=EVERY_PERIOD)

    assert set(window.sleeps[:-1]) == {0.1}
    assert reading.reads == len(procfs.samples.kept) == 49
    with pytest.raises(ValueError, match="unknown dip capture method"):
        window.watch(method="sometimes")


def test_a_fall_of_the_budget_s_room_switches_to_the_fast_pace(tmp_path):
    budget = tmp_path / "budget"
    budget.mkdir()
    (budget / "memory.max").write_text(f"{8 * GIB}\n")
    (budget / "memory.stat").write_text("anon 0\ninactive_file 0\n")
    window = ScriptedWindow(tmp_path / "proc", lambda read: STILL, budget=budget,
                            room_script=lambda read: 2 * GIB if read == 3 else 6 * GIB)

    reading = window.watch()

    assert window.sleeps[:3] == [0.25] * 3 and window.sleeps[3:13] == [0.1] * 10
    assert reading.min_budget_room == 2 * GIB and reading.budget.room == 6 * GIB


def test_a_sleep_past_the_deadline_ends_the_window_on_a_full_read(tmp_path):
    # The second sleep lasts 0.2 s longer than asked, past the deadline: the read after it,
    # due to be a one-field one, is the last, so a full one.
    window = ScriptedWindow(tmp_path / "proc", lambda read: STILL, oversleep={2: 0.2})
    procfs = fr.SampledProcfs(window.root, samples=fr.SecondSamples(every=0.0))

    reading = window.watch(procfs, duration=0.6)

    assert window.sleeps == [0.25, 0.25]
    assert len(procfs.samples.kept) == 2 and reading.reads == 3  # the first and the last full
    assert reading.last.mem_available == STILL


def test_the_read_at_the_deadline_is_a_full_one(tmp_path):
    window = ScriptedWindow(tmp_path / "proc", lambda read: STILL)
    procfs = fr.SampledProcfs(window.root, samples=fr.SecondSamples(every=0.0))

    reading = window.watch(procfs, duration=0.6)

    assert window.sleeps == [0.25, 0.25, 0.1]
    assert len(procfs.samples.kept) == 2 and reading.reads == 4


def test_a_window_over_a_tree_without_meminfo_fails_at_its_end(tmp_path):
    root = tmp_path / "proc"
    root.mkdir()

    reading = watch_host_memory(Procfs(root), duration=0.3, period=0.1)

    assert reading.last is None and "meminfo does not exist" in reading.error
    assert reading.min_available is None


# --- the one-field reader -----------------------------------------------------------------------


def test_the_one_field_reader_reads_like_the_parser(tmp_path):
    root = tmp_path / "proc"
    root.mkdir()
    meminfo = root / "meminfo"
    with Procfs(root).meminfo_field("MemAvailable") as available:
        meminfo.write_text(_meminfo(STILL))
        assert available.read() == STILL == parse_meminfo(meminfo.read_text()).mem_available
        # A file replaced by a rename (as a rewritten copy is) is read afresh.
        replacement = root / "meminfo.new"
        replacement.write_text(_meminfo(STILL - GIB))
        os.replace(replacement, meminfo)
        assert available.read() == STILL - GIB
        meminfo.write_text("MemTotal: 1 kB\nMemAvailable: 4096\nMemAvailable: 8 kB\n")
        assert available.read() == 4096  # no unit: bytes; the first line counts
        meminfo.write_text("MemAvailable: n/a kB\nMemAvailable: 8 kB\n")
        assert available.read() is None  # garbled, as parse_meminfo calls it unknown
        meminfo.write_text("MemFree: 8 kB\n")
        assert available.read() is None
        meminfo.unlink()
        assert available.read() is None
        meminfo.write_text("x" * 20000 + "\nMemAvailable: 9 kB\n")  # longer than its buffer
        assert available.read() == 9 * 1024


@pytest.mark.slow
@pytest.mark.alone  # judged against the machine's own MemAvailable
def test_the_one_field_reader_follows_the_real_meminfo():
    """On /proc (a file the kernel makes afresh at each read) the descriptor is kept, and every
    read is a new reading: a real 2 GiB allocation shows in the next read. (2 GiB: the kernel
    may serve part of a block from pages freed a moment ago that it has not counted free.)"""
    wait_until_memory_is_still()
    with Procfs().meminfo_field("MemAvailable") as available:
        before = available.read()
        block = bytearray(2 * GIB)
        block[::4096] = b"\x01" * (2 * GIB // 4096)
        during = available.read()
        del block
    assert before - during >= GIB


# --- a real dip ---------------------------------------------------------------------------------



# Seconds from the holder's start to the window's end: Python's start, the block's touch and the
# 0.5 s it is held, with room to spare.
_DIP_LASTS = 4.5


@pytest.mark.slow
@pytest.mark.alone  # the dip is judged against the machine's own MemAvailable
@pytest.mark.parametrize("delay", [0.4, 1.7, 3.1])
def test_a_real_half_second_dip_is_the_interval_minimum_at_the_paced_method(delay):
    """A 1 GiB block touched, held 0.5 s and freed at some moment of a paced window: its depth
    (as the allocator itself read it) is the window's minimum, read while it was held.

    The window lasts until :data:`_DIP_LASTS` after the holder's start: a machine that hands out
    pages slowly (a small virtual machine touches 1 GiB in up to 2.5 s) still ends the dip inside
    it."""
    wait_until_memory_is_still()
    holder = hold_block(GIB, delay, hold=DIP_SECONDS)
    try:
        reading = watch_host_memory(Procfs(), duration=delay + _DIP_LASTS, period=0.1)
        made = held(holder)
    finally:
        holder.kill()
        holder.wait()
    depth_made = made["before"] - made["during"]
    depth_seen = made["before"] - reading.min_available
    assert made["released"] <= reading.finished_at.timestamp(), (
        f"the block was held until {made['released'] - made['started']:.2f} s after its "
        f"allocation began, past the window's end: this machine touches pages too slowly")
    assert made["started"] <= reading.min_available_at.timestamp() <= made["released"]
    assert depth_seen >= depth_made - max(depth_made // 10, 32 * MIB)
