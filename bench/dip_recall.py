"""Dip recall: does the host window catch a real 0.5 s dip, and what does watching cost?

Per trial, one collection window (``collectors.sampling.watch_host_memory``, the 4.75 s of a
5 s interval, 0.1 s period) runs in this process while a child process, at a random moment of
the window, touches every page of a 1 GiB block, holds it 0.5 s and frees it. The child reads
MemAvailable itself just before allocating and in the middle of the hold: their difference is
the depth made. The window's depth seen is the child's MemAvailable before allocating less the
window's minimum (not the window's last reading: the kernel may keep freed pages on its per-CPU
lists for a while, out of MemFree, so MemAvailable can stay low after the free, and a next
allocation served from those lists lowers it less than its size). A dip is caught when the
minimum was read between the allocation's start and its release and is at least 90 % of the
depth made (32 MiB for a shallow one): a read in the ramp of the touching only, not in the hold,
sees less.

Both ways of pacing the reads run, trial by trial in turn so they share the machine's moments:
``every-period`` (a full meminfo read every 0.1 s, the former way) and ``paced`` (the default:
0.1 s only while MemAvailable falls, 0.25 s while it is still, one-field reads between full
ones a second apart). Then each watches for a minute with no allocation: the CPU time of this
process (the watcher alone; the child is another process) per minute of still memory.

Memory others move on a shared machine deepens a dip or hides one (other work here moves
MemAvailable by gigabytes within seconds), so by default (``--meminfo isolated``) the window and
the allocator read a ``/proc/meminfo`` that only the allocation moves: ``bench.meminfo_view``,
the real file rewritten every 10 ms with MemFree and MemAvailable less the allocator's resident
memory. The allocation, its pages and its timing are real; the window reads that file (a
regular file, opened at each read) instead of /proc. ``--meminfo real`` reads the real
/proc; there a trial someone else disturbed shows as a depth seen far from the depth made.

The still-memory CPU is taken twice: on the view with no allocation (memory truly still; the
one-field reads open the file each time, which costs a little more than on /proc), and on the
real /proc with its kept descriptor, as a node runs, where other work here moves MemAvailable
often enough to set the moving pace part of the time.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.meminfo_view import MeminfoView
from collectors.procfs import Procfs
from collectors.sampling import EVERY_PERIOD, PACED, watch_host_memory, window_seconds

INTERVAL = 5.0
PERIOD = 0.1
GIB = 1024**3
MIB = 1024**2
HOLD_SECONDS = 0.5
CAUGHT_SHARE = 0.9
# What MemAvailable moves by itself between two reads here, at most (a dip seen that much less
# deep than made is still the dip).
NOISE_BYTES = 32 * MIB
METHODS = (EVERY_PERIOD, PACED)

# The child: waits, reads MemAvailable, touches every page of the block, holds it (reading
# MemAvailable halfway), frees it; prints its instants (wall clock) and readings as JSON.
_ALLOCATOR = """
import json, sys, time
size, delay, hold, meminfo = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]

def available():
    with open(meminfo, "rb") as f:
        for line in f:
            if line.startswith(b"MemAvailable:"):
                return int(line.split()[1]) * 1024

time.sleep(delay)
before = available()
started = time.time()
block = bytearray(size)  # calloc: its pages are not resident until written
block[::4096] = b"\\x01" * (size // 4096)
touched = time.time()
time.sleep(hold / 2)
during = available()
time.sleep(max(hold - (time.time() - touched), 0))
del block  # returned to the kernel (munmap) before this returns: held until then
released = time.time()
print(json.dumps({"before": before, "during": during, "started": started,
                  "touched": touched, "released": released}), flush=True)
"""


def dip_trial(method: str, size: int, rng: random.Random, view: MeminfoView | None) -> dict:
    """One window of ``method`` with one dip of ``size`` bytes at a random moment in it, read
    through ``view`` (None: the real /proc)."""
    duration = window_seconds(INTERVAL)
    delay = rng.uniform(0.3, duration - HOLD_SECONDS - 1.0)
    procfs = Procfs(view.root) if view else Procfs()
    child = subprocess.Popen([sys.executable, "-c", _ALLOCATOR, str(size), str(delay),
                              str(HOLD_SECONDS), str(procfs.root / "meminfo")],
                             stdout=subprocess.PIPE, text=True)
    if view:
        view.neighbour_pid = child.pid
    try:
        window = watch_host_memory(procfs, duration=duration, period=PERIOD, method=method)
        output, _ = child.communicate(timeout=30)
    finally:
        child.kill()
        child.wait()
    made = json.loads(output)
    depth_made = made["before"] - made["during"]
    lowest = window.min_available
    seen = None if lowest is None else made["before"] - lowest
    at = window.min_available_at.timestamp() if window.min_available_at else None
    in_dip = at is not None and made["started"] <= at <= made["released"]
    missed_by = max(depth_made * (1 - CAUGHT_SHARE), NOISE_BYTES)
    caught = bool(in_dip and seen is not None and seen >= depth_made - missed_by)
    return {"method": method, "delay": delay, "reads": window.reads, "caught": caught,
            "depth_made": depth_made, "depth_seen": seen, "min_at": at,
            "touch_seconds": made["touched"] - made["started"], **made}


def still_cost(method: str, seconds: float, procfs: Procfs) -> dict:
    """CPU time of back-to-back windows of ``method`` over ``procfs`` for ``seconds`` with no
    allocation of ours: the CPU of this thread, the watcher (not the view's)."""
    duration = window_seconds(INTERVAL)
    windows, reads = 0, 0
    cpu, wall = time.thread_time(), time.monotonic()
    while time.monotonic() - wall < seconds:
        reads += watch_host_memory(procfs, duration=duration, period=PERIOD,
                                   method=method).reads
        windows += 1
    cpu, wall = time.thread_time() - cpu, time.monotonic() - wall
    return {"method": method, "windows": windows, "reads_per_window": reads / windows,
            "cpu_ms_per_minute": cpu * 1000 * 60 / wall, "wall_seconds": wall}


def run(trials: int, size: int, still_seconds: float, seed: int, meminfo: str,
        workdir: Path) -> dict:
    rng = random.Random(seed)
    view = MeminfoView(workdir / "proc") if meminfo == "isolated" else None
    if view:
        view.start()
    try:
        dips = [dip_trial(method, size, rng, view) for _ in range(trials) for method in METHODS]
        if view:
            view.neighbour_pid = None
            still_view = {method: still_cost(method, still_seconds, Procfs(view.root))
                          for method in METHODS}
    finally:
        if view:
            view.stop()  # a daemon thread, ended at its next 10 ms tick
    still = {method: still_cost(method, still_seconds, Procfs()) for method in METHODS}
    summary = {}
    for method in METHODS:
        mine = [d for d in dips if d["method"] == method]
        seen = [d["depth_seen"] for d in mine if d["depth_seen"] is not None]
        summary[method] = {
            "trials": len(mine),
            "caught": sum(d["caught"] for d in mine),
            "recall": sum(d["caught"] for d in mine) / len(mine),
            "depth_made_mib": statistics.median(d["depth_made"] for d in mine) / MIB,
            "depth_seen_mib": statistics.median(seen) / MIB if seen else None,
            "depth_seen_min_mib": min(seen) / MIB if seen else None,
            "reads_per_window_dip": statistics.median(d["reads"] for d in mine),
            **{key: still[method][key] for key in ("cpu_ms_per_minute", "reads_per_window")},
        }
        if view:
            summary[method].update(
                {f"{key}_view": still_view[method][key]
                 for key in ("cpu_ms_per_minute", "reads_per_window")})
    return {"interval": INTERVAL, "period": PERIOD, "size": size, "hold": HOLD_SECONDS,
            "meminfo": meminfo, "summary": summary, "dips": dips, "still": still,
            "still_view": still_view if view else None}


def table(result: dict) -> str:
    """Per method: recall, depths, and the still cost (the view's, when there was one, then
    the real /proc's, where other work moves memory)."""
    viewed = result["still_view"] is not None
    rows = [("method", "recall", "depth made MiB", "depth seen MiB (lowest)", "reads/window dip",
             *(("reads/window still view", "CPU ms/min still view") if viewed else ()),
             "reads/window /proc", "CPU ms/min /proc")]
    for method, s in result["summary"].items():
        seen = "-" if s["depth_seen_mib"] is None else \
            f"{s['depth_seen_mib']:.0f} ({s['depth_seen_min_mib']:.0f})"
        still = (f"{s['reads_per_window_view']:.1f}", f"{s['cpu_ms_per_minute_view']:.1f}") \
            if viewed else ()
        rows.append((method, f"{s['caught']}/{s['trials']} ({s['recall']:.0%})",
                     f"{s['depth_made_mib']:.0f}", seen, f"{s['reads_per_window_dip']:.0f}",
                     *still, f"{s['reads_per_window']:.1f}", f"{s['cpu_ms_per_minute']:.1f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
                     for row in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20, help="dips per method (default 20)")
    parser.add_argument("--size-mib", type=int, default=1024, help="the dip's size (1024)")
    parser.add_argument("--still-seconds", type=float, default=60.0,
                        help="how long each method watches still memory for its CPU figure")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--meminfo", choices=("isolated", "real"), default="isolated",
                        help="the dips' meminfo: a view moved by the allocation alone "
                             "(bench.meminfo_view, default) or the real /proc")
    parser.add_argument("--json", type=Path, default=None, help="write every trial here")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    with tempfile.TemporaryDirectory(prefix="dip-recall-") as workdir:
        result = run(args.trials, args.size_mib * MIB, args.still_seconds, seed, args.meminfo,
                     Path(workdir))
    result["seed"] = seed
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
