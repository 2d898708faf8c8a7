"""Benchmark 1: resident memory (and CPU) of SparkOps next to the Prometheus trio.

Both stacks monitor the same emulated engines and the same node at the same interval, in the
same run. A sampler reads every process of each stack at fixed moments ending
``footprint_minutes`` after both were started (every 30 s over the last 5 minutes of 10 by
default); the figures are the median and min–max of those readings, as RSS sum, PSS sum and
distinct resident pages (see ``bench.procs``). CPU is the CPU time each stack used between two
readings, as a share of one core.
"""

from __future__ import annotations

import threading
import time

from bench.procs import MIB, StackSample, sample_stack
from bench.stats import summarize


class FootprintSampler(threading.Thread):
    """Samples each stack at ``count`` moments, ``every`` seconds apart, the last one
    ``minutes`` after ``started`` (a ``time.monotonic()`` value)."""

    def __init__(self, stacks: dict[str, dict[int, str]], *, started: float, minutes: float,
                 every: float, count: int) -> None:
        super().__init__(daemon=True)
        self.stacks = stacks
        end = started + minutes * 60
        self.moments = [end - every * (count - 1 - i) for i in range(count)]
        self.readings: list[tuple[float, dict[str, StackSample]]] = []

    @property
    def done_at(self) -> float:
        return self.moments[-1]

    def run(self) -> None:
        for moment in self.moments:
            time.sleep(max(moment - time.monotonic(), 0))
            now = time.monotonic()
            reading = {name: sample_stack(roots) for name, roots in self.stacks.items()}
            self.readings.append((now, reading))
            print("  footprint: " + ", ".join(
                f"{name} {sample.rss / MIB:.0f} MiB RSS sum, {sample.pss / MIB:.0f} PSS, "
                f"{(sample.distinct or 0) / MIB:.0f} distinct"
                for name, sample in reading.items()), flush=True)

    def result(self) -> dict:
        """Per stack: RSS, PSS, USS and distinct-page summaries (MiB), CPU share summary (% of
        one core), the breakdown by process at the last reading, and the first and last RSS."""
        figures = {}
        for name in self.stacks:
            samples = [reading[name] for _, reading in self.readings]
            cpu = [
                100 * (b[name].cpu_seconds - a[name].cpu_seconds) / (tb - ta)
                for (ta, a), (tb, b) in zip(self.readings, self.readings[1:], strict=False)
                if tb > ta and _same_processes(a[name], b[name])
            ]
            last = samples[-1] if samples else None
            figures[name] = {
                "rss_mib": _dict(summarize(s.rss / MIB for s in samples)),
                "pss_mib": _dict(summarize(s.pss / MIB for s in samples)),
                "uss_mib": _dict(summarize(s.uss / MIB for s in samples)),
                "distinct_mib": _dict(summarize(s.distinct / MIB for s in samples
                                                if s.distinct is not None)),
                "cpu_percent": _dict(summarize(cpu)),
                "first_rss_mib": samples[0].rss / MIB if samples else None,
                "last_rss_mib": last.rss / MIB if last else None,
                "first_distinct_mib": (samples[0].distinct or 0) / MIB if samples else None,
                "last_distinct_mib": (last.distinct or 0) / MIB if last else None,
                "processes": [
                    {"role": p.role, "pid": p.pid, "rss_mib": p.rss / MIB, "pss_mib": p.pss / MIB}
                    for p in (last.processes if last else ())
                ],
            }
        return {"stacks": figures, "samples": len(self.readings)}


def _same_processes(a: StackSample, b: StackSample) -> bool:
    """CPU time is comparable between two readings only if no process came or went."""
    return {p.pid for p in a.processes} == {p.pid for p in b.processes}


def _dict(summary) -> dict | None:
    return summary.as_dict() if summary else None
