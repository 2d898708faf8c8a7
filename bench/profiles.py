"""How big a run is: the full suite (the issue's figures), ``--quick`` and ``--smoke``.

One frozen dataclass holds every knob, so each benchmark reads its sizes from one place and the
report can say exactly what was run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Profile:
    name: str
    # --- 1. footprint (and the live stack that 3. shares) ---
    live_engines: int
    footprint_minutes: float  # how long both stacks monitor before the last sample
    footprint_sample_every_s: float
    footprint_samples: int  # taken every ``footprint_sample_every_s`` up to the end
    # --- 3. alert latency ---
    alert_trials: int  # allocations; every one is timed on SparkOps and on Prometheus at 5 s
    alert_default_trials: int  # of those, how many also wait for Prometheus at default timings
    prometheus_default_instances: int  # independent default-timing Prometheus servers
    alert_wait_prometheus: bool  # False: smoke only, Prometheus is started but not waited for
    alert_budget_s: float  # no new trial after this long (disturbed trials are repeated)
    # --- 2. collection cost ---
    cost_engine_counts: tuple[int, ...]
    cost_cycles: int
    host_window_runs: int
    # --- 4. chart latency and 5. storage ---
    chart_days: float
    chart_requests: int
    chart_min_requests: int
    chart_budget_s: float  # per endpoint: stop after this long once chart_min_requests are done
    # --- 6. fleet ---
    fleet_nodes: int  # node processes writing into the centre's PostgreSQL
    fleet_engines: int  # engines per node
    fleet_warmup_s: float  # after every node collects, before the window
    fleet_minutes: float  # the measuring window
    fleet_sample_every_s: float  # readings of the processes and the database
    # --- 7. dip recall ---
    dip_trials: int  # real 0.5 s dips per method
    dip_still_s: float  # how long each method watches still memory for its CPU figure

    def as_dict(self) -> dict:
        return asdict(self)


FULL = Profile(
    name="full",
    live_engines=4,
    footprint_minutes=10,
    footprint_sample_every_s=30,
    footprint_samples=11,  # the last 5 minutes
    alert_trials=5,
    alert_default_trials=2,
    prometheus_default_instances=3,
    alert_wait_prometheus=True,
    alert_budget_s=840,
    cost_engine_counts=(1, 4, 16, 64),
    cost_cycles=7,
    host_window_runs=5,
    chart_days=30,
    chart_requests=20,
    chart_min_requests=5,
    chart_budget_s=15,
    fleet_nodes=16,
    fleet_engines=4,
    fleet_warmup_s=60,
    fleet_minutes=5,
    fleet_sample_every_s=30,
    dip_trials=20,
    dip_still_s=30,
)

QUICK = Profile(
    name="quick",
    live_engines=4,
    footprint_minutes=1,
    footprint_sample_every_s=10,
    footprint_samples=5,  # the last 40 s
    alert_trials=5,
    alert_default_trials=1,
    prometheus_default_instances=5,
    alert_wait_prometheus=True,
    alert_budget_s=600,
    cost_engine_counts=(1, 4, 16, 64),
    cost_cycles=5,
    host_window_runs=5,
    chart_days=30,
    chart_requests=20,
    chart_min_requests=5,
    chart_budget_s=10,
    fleet_nodes=16,
    fleet_engines=4,
    fleet_warmup_s=30,
    fleet_minutes=1,
    fleet_sample_every_s=10,
    dip_trials=6,
    dip_still_s=10,
)

SMOKE = Profile(
    name="smoke",
    live_engines=1,
    footprint_minutes=0.3,
    footprint_sample_every_s=2,
    footprint_samples=2,
    alert_trials=1,
    alert_default_trials=0,
    prometheus_default_instances=0,
    alert_wait_prometheus=False,
    alert_budget_s=120,
    cost_engine_counts=(1,),
    cost_cycles=1,
    host_window_runs=1,
    chart_days=0.5,
    chart_requests=1,
    chart_min_requests=1,
    chart_budget_s=5,
    fleet_nodes=2,
    fleet_engines=2,
    fleet_warmup_s=5,
    fleet_minutes=0.3,
    fleet_sample_every_s=6,
    dip_trials=1,
    dip_still_s=2,
)

PROFILES = {profile.name: profile for profile in (FULL, QUICK, SMOKE)}
