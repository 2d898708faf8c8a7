"""The live phase: benchmarks 1 (footprint) and 3 (alert latency) on one running world.

Started by the runner as ``python -m bench.live`` with the private Podman service in its
environment. It starts the emulated engines, SparkOps (``runstack``, defaults: 5 s interval,
SQLite, file-system broker) with one overview tab open, and next to it the Prometheus trio at
the same 5 s interval plus the Prometheus servers at documented default timings; samples the
footprint while the alert trials run; and writes its figures as JSON. By default the monitors
read host memory through the isolated view of ``bench.meminfo_view`` (``--meminfo real``: the
machine's own /proc/meminfo).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path

from bench import emulated
from bench.alert_latency import (
    PROM_5S_PATH,
    PROM_DEFAULT_PATH,
    SPARKOPS_PATH,
    AlertLatencyBench,
    Memory,
    SparkOpsSide,
    summarize_trials,
)
from bench.footprint import FootprintSampler
from bench.meminfo_view import MeminfoView
from bench.profiles import PROFILES, Profile
from bench.promstack import Alertmanager, NodeExporter, Prometheus
from bench.services import Podman
from bench.sparkops_stack import OverviewTab, SparkOpsStack, prepare, setup_django, stack_env
from sparkops.testing.ports import wait_for
from sparkops.testing.webhooks import WebhookReceiver

NODE = "bench"
INTERVAL = 5.0  # SparkOps' default SPARKOPS_COLLECT_INTERVAL
GIB = 1024**3
# Engine 1's prefill need: 8192 batched tokens × 32 KiB = 256 MiB (the label).
PREFILL_BYTES_PER_TOKEN = 32 * 1024
ALLOCATION_BYTES = 4 * GIB  # the neighbour: 2 GiB above the threshold before, 2 below after


def held_figures(layout, readings) -> tuple[int, int]:
    """(figures, readings) of ``readings`` (a queryset of ``layout``'s model,
    ``collectors.readings.HOST`` or ``ENGINE``): the figures they hold — their figure columns
    that are not NULL, counted in the database — and how many readings there are."""
    from django.db.models import Count

    columns = [layout.column(metric) for metric in layout.metrics]
    counts = readings.aggregate(readings=Count("pk"),
                                **{f"held_{column}": Count(column) for column in columns})
    return sum(counts[f"held_{column}"] for column in columns), counts["readings"]


def observed_shape(node_name: str) -> dict:
    """Figures SparkOps wrote per collection in the last minutes (a host reading and a reading
    per engine each): the dataset of benchmarks 4 and 5 is generated with this shape, so the
    live run checks it."""
    from django.utils import timezone

    from collectors.models import Collection
    from collectors.readings import ENGINE, HOST

    since = timezone.now() - timedelta(minutes=3)
    collections = Collection.objects.filter(node__name=node_name, at__gte=since)
    ok = collections.filter(ok=True).count()
    host_figures, _ = held_figures(
        HOST, HOST.model.objects.filter(node__name=node_name, at__gte=since))
    engine_figures, engine_readings = held_figures(
        ENGINE, ENGINE.model.objects.filter(engine__node__name=node_name, at__gte=since))
    return {
        "collections_ok": ok,
        "collections_failed": collections.count() - ok,
        "host_samples_per_collection": round(host_figures / ok, 2) if ok else None,
        "engine_samples_per_engine_cycle": round(engine_figures / engine_readings, 2)
        if engine_readings else None,
    }


def run(profile: Profile, workdir: Path, podman: Podman, docker_host: str,
        meminfo: str = "isolated") -> dict:
    view = MeminfoView(workdir / "procfs") if meminfo == "isolated" else None
    extra = {"SPARKOPS_PROCFS": str(view.root)} if view else {}
    env = stack_env(workdir / "sparkops", node=NODE, docker_host=docker_host, **extra)
    specs = emulated.live_engines(profile.live_engines, PREFILL_BYTES_PER_TOKEN)
    emulated.start(podman, specs)
    emulated.wait_ready(specs)
    prepare(env)
    setup_django(env)
    targets = [f"127.0.0.1:{spec.port}" for spec in specs]

    with ExitStack() as stack, WebhookReceiver() as receiver:
        if view is not None:
            view.start()
            stack.callback(view.stop)
        sparkops = SparkOpsSide(NODE, specs[0].name)
        sparkops.add_webhook(receiver.url(SPARKOPS_PATH))

        node_exporter = NodeExporter(workdir, procfs=view.root if view else None)
        am_5s = Alertmanager("alertmanager-5s", workdir, receiver.url(PROM_5S_PATH))
        ams = [am_5s]
        if profile.prometheus_default_instances:
            ams.append(Alertmanager("alertmanager-default", workdir,
                                    receiver.url(PROM_DEFAULT_PATH)))
        for server in (node_exporter, *ams):
            server.start()
            stack.callback(server.child.stop)
        for server in (node_exporter, *ams):
            server.wait_ready()
        prom_5s = Prometheus("prom-5s", workdir, INTERVAL, am_5s.port, targets,
                             node_exporter.port)
        prom_default = [Prometheus(f"prom-default-{i}", workdir, None, ams[-1].port, targets,
                                   node_exporter.port)
                        for i in range(1, profile.prometheus_default_instances + 1)]
        sparkops_stack = SparkOpsStack(env, workdir)
        stack.callback(sparkops_stack.stop)
        for server in (prom_5s, *prom_default):
            server.start()
            stack.callback(server.child.stop)
        for server in (prom_5s, *prom_default):
            server.wait_ready()
        sparkops_stack.wait_ready()
        started = time.monotonic()
        print(f"  both stacks up; monitoring {len(specs)} engines", flush=True)

        tab = OverviewTab(sparkops_stack.url, NODE, INTERVAL)
        tab.start()
        stack.callback(tab.stop)
        sampler = FootprintSampler(
            {"sparkops": {sparkops_stack.child.pid: "runstack supervisor"},
             "prometheus": {prom_5s.child.pid: "prometheus",
                            node_exporter.child.pid: "node_exporter",
                            am_5s.child.pid: "alertmanager"}},
            started=started, minutes=profile.footprint_minutes,
            every=profile.footprint_sample_every_s, count=profile.footprint_samples)
        sampler.start()

        wait_for(sparkops.ready, 120, "SparkOps' ledger with the engines", 1.0)
        bench = AlertLatencyBench(
            receiver=receiver, sparkops=sparkops, prom_5s=prom_5s, prom_default=prom_default,
            allocation_bytes=ALLOCATION_BYTES, interval=INTERVAL,
            wait_prometheus=profile.alert_wait_prometheus, budget_s=profile.alert_budget_s,
            memory=Memory(view))
        trials = bench.run(profile.alert_trials, profile.alert_default_trials)
        sampler.join()
        shape = observed_shape(NODE)
        if not sparkops_stack.child.alive():
            raise RuntimeError(f"SparkOps exited early:\n{sparkops_stack.child.tail()}")
        result = {
            "engines": len(specs),
            "minutes": profile.footprint_minutes,
            "footprint": sampler.result(),
            "alerts": summarize_trials(trials, bench.stopped),
            "allocation_gib": ALLOCATION_BYTES / GIB,
            "meminfo": meminfo,
            "prometheus_default_instances": len(prom_default),
            "overview_tab": {"requests": tab.requests, "errors": tab.errors},
            "observed_shape": shape,
        }
    podman.remove_all()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--profile", choices=PROFILES, default="full")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--meminfo", choices=("isolated", "real"), default="isolated",
                        help="what the monitors read as /proc/meminfo (see bench.meminfo_view)")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    result = run(PROFILES[args.profile], args.workdir, Podman.from_env(),
                 os.environ["SPARKOPS_DOCKER_HOST"], args.meminfo)
    args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
