"""Benchmark 2: CPU time of one collection cycle for 1, 4, 16 and 64 engines.

A cycle is what the worker does every interval, here called in-process so that each part can be
timed on its own (CPU: ``time.process_time()``, i.e. every thread of this process, plus any
reaped children; wall: ``time.perf_counter()``):

* **engines** — the ``collect_engines`` task body: NVML, the Docker API (list, inspect and
  stats of every container), every ``/metrics`` scraped in parallel, rates, rows written;
* **ledger** — ``update_ledger`` on the node's row as the host collection task reads it
  (``local_node``): the process table, the engines' shares, ledger changes;
* **alerts** — the ``evaluate_alerts`` task body: the node's row, every rule evaluated, alert
  rows moved, outbox written;
* **host window** — ``collect_host_memory`` watching MemAvailable for the whole interval
  (0.1 s reads) and storing the collection; its wall time is the interval by design, and it
  does not depend on the engine count, so it is measured once.

A startup log is re-read once a minute per engine; those cycles are timed separately and the
per-cycle figure amortizes them (1 in 12 cycles at the 5 s interval).

Engines are emulator processes, one container each, discovered through the Docker API of the
private Podman service.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

from bench import emulated
from bench.emulated import EngineSpec
from bench.profiles import PROFILES, Profile
from bench.services import Podman
from bench.sparkops_stack import manage, setup_django, stack_env
from bench.stats import summarize

NODE = "bench-cost"
INTERVAL = 5.0
CYCLES_PER_LOG_REFRESH = 12  # LOG_REFRESH (60 s) / the 5 s interval


def cpu_seconds() -> float:
    """CPU time of this process (all threads) and of its reaped children."""
    times = os.times()
    return time.process_time() + times.children_user + times.children_system


def timed(call: Callable[[], object]) -> tuple[float, float]:
    """(CPU ms, wall ms) of one call."""
    cpu, wall = cpu_seconds(), time.perf_counter()
    call()
    return (cpu_seconds() - cpu) * 1000, (time.perf_counter() - wall) * 1000


class Cycle:
    """One collection cycle of ``node``, part by part (Django must be set up)."""

    def __init__(self, node_name: str) -> None:
        from collectors.nodes import local_node

        self.node_name = node_name
        self.node = local_node()

    def engines(self) -> None:
        from collectors.tasks import collect_engines

        collect_engines(self.node_name)  # a Celery task called directly runs in-process

    def figures(self) -> dict:
        """Host figures of a short window, for the ledger (not timed)."""
        from collectors.hostmemory import collect_host_memory, window_figures
        from collectors.nodes import local_procfs

        _, window = collect_host_memory(self.node, local_procfs(), duration=0.2, period=0.1)
        return window_figures(window)

    def ledger(self, figures: dict) -> None:
        from django.utils import timezone

        from collectors.ledger import update_ledger
        from collectors.nodes import local_node

        update_ledger(local_node(), figures, timezone.now())

    def alerts(self) -> None:
        from dashboard.alerting.tasks import evaluate_alerts

        evaluate_alerts(self.node_name)  # a Celery task called directly runs in-process

    def host_window(self) -> None:
        from django.conf import settings

        from collectors.hostmemory import collect_host_memory
        from collectors.nodes import local_procfs
        from collectors.sampling import window_seconds

        collect_host_memory(self.node, local_procfs(),
                            duration=window_seconds(settings.SPARKOPS_COLLECT_INTERVAL),
                            period=settings.SPARKOPS_DIP_PERIOD)

    def force_log_refresh(self) -> None:
        from collectors.models import Engine

        Engine.objects.filter(node=self.node).update(logs_read_at=None)


def measure_size(cycle: Cycle, engines: int, cycles: int) -> dict:
    """Time ``cycles`` ordinary cycles and ``cycles`` log re-read cycles at this size."""
    parts: dict[str, list[float]] = {"engines": [], "ledger": [], "alerts": [],
                                     "engines_wall": [], "cycle_wall": [], "engines_logs": []}
    for _ in range(2):  # warm-up: discovery, first log parse, first rates
        cycle.engines()
        cycle.ledger(cycle.figures())
        cycle.alerts()
    for _ in range(cycles):
        time.sleep(1.0)
        engines_cpu, engines_wall = timed(cycle.engines)
        figures = cycle.figures()
        ledger_cpu, ledger_wall = timed(lambda f=figures: cycle.ledger(f))
        alerts_cpu, alerts_wall = timed(cycle.alerts)
        parts["engines"].append(engines_cpu)
        parts["ledger"].append(ledger_cpu)
        parts["alerts"].append(alerts_cpu)
        parts["engines_wall"].append(engines_wall)
        parts["cycle_wall"].append(engines_wall + ledger_wall + alerts_wall)
    for _ in range(cycles):
        cycle.force_log_refresh()
        parts["engines_logs"].append(timed(cycle.engines)[0])
    queries = count_queries(cycle)
    summaries = {name: summarize(values) for name, values in parts.items()}
    per_cycle = [e + (logs - e) / CYCLES_PER_LOG_REFRESH + ledger + alerts
                 for e, logs, ledger, alerts in zip(parts["engines"], parts["engines_logs"],
                                                    parts["ledger"], parts["alerts"],
                                                    strict=True)]
    result = {name: s.as_dict() for name, s in summaries.items() if s}
    result["cycle_cpu"] = summarize(per_cycle).as_dict()
    result["engines_present"] = engines
    result["queries"] = queries
    print(f"  {engines:3d} engines: cycle {result['cycle_cpu']['median']:.1f} ms CPU "
          f"(engines {result['engines']['median']:.1f}, ledger {result['ledger']['median']:.1f},"
          f" alerts {result['alerts']['median']:.1f}); engine collection wall "
          f"{result['engines_wall']['median']:.0f} ms; queries {queries['engines']} + "
          f"{queries['ledger']} + {queries['alerts']}", flush=True)
    return result


def count_queries(cycle: Cycle) -> dict[str, int]:
    """The database queries of one more cycle, part by part (not timed: counting them turns
    on Django's query log, which costs CPU of its own)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    figures = cycle.figures()
    counts = {}
    for name, call in (("engines", cycle.engines), ("ledger", lambda: cycle.ledger(figures)),
                       ("alerts", cycle.alerts)):
        with CaptureQueriesContext(connection) as captured:
            call()
        counts[name] = len(captured.captured_queries)
    return counts


def growth_exponent(sizes: dict[int, dict]) -> float | None:
    """Slope of log(cycle CPU) over log(engines) between the smallest size above 1 and the
    largest: 1.0 is linear growth, below 1 is better than linear."""
    ordered = sorted(n for n in sizes if n > 1)
    if len(ordered) < 2:
        return None
    low, high = ordered[0], ordered[-1]
    a, b = sizes[low]["cycle_cpu"]["median"], sizes[high]["cycle_cpu"]["median"]
    return math.log(b / a) / math.log(high / low) if a > 0 and b > 0 else None


def run(profile: Profile, workdir: Path, podman: Podman, docker_host: str) -> dict:
    env = stack_env(workdir / "sparkops", node=NODE, docker_host=docker_host)
    manage(env, "migrate", "--noinput")
    setup_django(env)
    cycle = Cycle(NODE)

    windows = [timed(cycle.host_window) for _ in range(profile.host_window_runs)]
    host_window = {"cpu": summarize(c for c, _ in windows).as_dict(),
                   "wall": summarize(w for _, w in windows).as_dict()}
    print(f"  host window: {host_window['cpu']['median']:.1f} ms CPU over "
          f"{host_window['wall']['median'] / 1000:.2f} s", flush=True)

    specs: list[EngineSpec] = []
    sizes: dict[int, dict] = {}
    for count in profile.cost_engine_counts:
        new = emulated.small_engines(len(specs) + 1, count - len(specs))
        emulated.start(podman, new)
        specs += new
        emulated.wait_ready(specs, timeout=300)
        sizes[count] = measure_size(cycle, count, profile.cost_cycles)
    podman.remove_all()
    return {"host_window": host_window, "sizes": {str(n): v for n, v in sizes.items()},
            "growth_exponent": growth_exponent(sizes),
            "cycles_per_log_refresh": CYCLES_PER_LOG_REFRESH}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--profile", choices=PROFILES, default="full")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    result = run(PROFILES[args.profile], args.workdir, Podman.from_env(),
                 os.environ["SPARKOPS_DOCKER_HOST"])
    args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
