"""The node's collection cycle run in the test's own process, as the beat runs it on a worker:
engines, host memory (and the memory budget, where the test runs its engines in one), the
ledger, alerts. For container tests that wait for what SparkOps makes of real engines."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from django.utils import timezone

from collectors.engines import collect_engines
from collectors.hostmemory import collect_host_memory, configured_budget, window_figures
from collectors.ledger import update_ledger
from collectors.models import Node
from collectors.procfs import Procfs
from dashboard.alerting.pipeline import run_alerts


class CollectionCycle:
    """``cycle()`` runs one collection; ``cycle.until(condition)`` runs them until
    ``condition()`` holds, or fails after ``timeout`` seconds with the ledger it reached."""

    def __init__(self, node: Node, api) -> None:
        self.node, self.api = node, api

    def __call__(self) -> None:
        collect_engines(self.node, self.api, timezone.now())
        _, window = collect_host_memory(self.node, Procfs(), duration=0.5, period=0.1,
                                        budget=configured_budget())
        update_ledger(self.node, window_figures(window), timezone.now())
        run_alerts(self.node, timezone.now())
        self.node.refresh_from_db()

    def until(self, condition: Callable[[], object], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"not reached within {timeout} s; ledger: "
                                     f"{json.dumps(self.node.ledger)[:1200]}")
            self()


def ledger_shares(node: Node) -> dict[str, dict]:
    """The node's ledger entries of its engines, by engine name."""
    return {share["name"]: share for share in (node.ledger or {}).get("engines", [])}


def collect_engines_until(node: Node, api, condition: Callable[[dict], object],
                          timeout: float = 40.0) -> dict:
    """Collect the node's engines, once a second, until ``condition(engines by name)`` holds;
    the engines then. Fails after ``timeout`` seconds with what each engine was."""
    deadline = time.monotonic() + timeout
    while True:
        engines = {e.name: e for e in collect_engines(node, api, timezone.now())}
        if condition(engines):
            return engines
        if time.monotonic() > deadline:
            seen = [(e.name, e.kind, e.phase, e.last_scrape_error) for e in engines.values()]
            raise AssertionError(f"condition not met within {timeout} s: {seen}")
        time.sleep(1.0)  # the emulated engines move on a scale of seconds
