"""Benchmark 4 (chart latency), with 5 (storage), over 30 days of a node with 4 engines.

Run once per database backend (``--backend sqlite`` or ``postgresql``), in two steps that the
runner can separate: ``generate`` migrates an empty database and writes the dataset day by day
while measuring storage (``bench.storage``); ``measure`` fills the minutes since then and times
the overview's and the engine page's JSON endpoints with Django's test client — the whole
server side of a request (middleware, session and auth, the view, JSON encoding), not the
network. Each endpoint is warmed up once (over its shortest range), then requested
``chart_requests`` times (20), or as many as fit in ``chart_budget_s`` once
``chart_min_requests`` (5) are done: a request that takes seconds is a missed target either
way, and twenty of them would not fit the run.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench import dataset, storage
from bench.profiles import PROFILES, Profile
from bench.sparkops_stack import manage, setup_django, stack_env
from bench.stats import summarize

NODE = "bench"
ENGINES = 4
RANGES = ("1h", "24h", "7d", "30d")


def endpoints(engine: str) -> list[tuple[str, str]]:
    """(label, path) of every JSON endpoint the overview and the engine page poll: the
    overview's timeline and headroom, the engine cards' data and the engine page's series."""
    api = f"/api/nodes/{NODE}"
    found = [(f"timeline.json?range={r}", f"{api}/timeline.json?range={r}") for r in RANGES]
    found.append(("headroom.json", f"{api}/headroom.json"))
    found.append(("engines.json", f"{api}/engines.json"))
    found += [(f"engine series.json?range={r}", f"{api}/engines/{engine}/series.json?range={r}")
              for r in RANGES]
    return found


def create_world(days: float) -> tuple[object, list[object], object]:
    """The node, its engines, ``days`` of what the timeline marks (events every few hours, a
    ledger change an hour, two resolved alerts a day) and an admin to log in as."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from collectors.models import Engine, Event, LedgerChange, Node
    from dashboard.alerting.models import Alert

    now = timezone.now()
    node = Node.objects.create(name=NODE, hostname=NODE, mem_total_bytes=int(dataset.MEM_TOTAL))
    engines = [
        Engine.objects.create(
            node=node, name=f"bench-engine-{i}", container_id=f"{i:064x}",
            container_state="running", phase="ready", started_at=now - timedelta(days=31),
            command=["vllm", "serve", f"bench/model-{i}"],
            config={"model": f"bench/model-{i}", "max_num_seqs": 256},
            first_seen=now - timedelta(days=31), last_seen=now)
        for i in range(1, ENGINES + 1)
    ]
    hours = int(days * 24)
    Event.objects.bulk_create([
        Event(node=node, engine=engine, at=now - timedelta(hours=h + i), kind="phase-change",
              severity="info", message=f"{engine.name}: loading → ready")
        for i, engine in enumerate(engines) for h in range(0, hours, 5)
    ])
    LedgerChange.objects.bulk_create([
        LedgerChange(node=node, engine=engines[h % ENGINES], at=now - timedelta(hours=h),
                     component=f"engine:{engines[h % ENGINES].pk}:kv_pool",
                     label=f"{engines[h % ENGINES].name}'s KV pool",
                     before_bytes=(8 + h % 3) * 2**30, after_bytes=(9 + h % 3) * 2**30)
        for h in range(hours)
    ])
    Alert.objects.bulk_create([
        Alert(rule="prefill-squeeze", node=node, engine=engines[0], scope=f"bench:{h}",
              state="resolved", severity="critical", summary="headroom below the prefill need",
              threshold=1.0, started_at=now - timedelta(hours=h, minutes=5),
              fired_at=now - timedelta(hours=h, minutes=4), resolved_at=now - timedelta(hours=h),
              last_evaluated_at=now - timedelta(hours=h))
        for h in range(0, hours, 12)
    ])
    user = get_user_model().objects.create_superuser("admin", "", "bench-admin-password")
    return node, engines, user


def _max_points(payload: dict) -> int:
    return max((len(series.get("x", [])) for series in payload.get("series", [])), default=0)


def time_endpoint(client, path: str, profile: Profile) -> dict:
    """Warm up, then time requests; milliseconds (median, p95, ``max``, the worst of them, and
    ``first``, the first timed request: before it, the chart has kept no settled roll-up rows
    of this range, ``dashboard.settled``), with the longest series returned.

    The warm-up request is the same endpoint over its shortest range (same code path, imports
    and caches), so an endpoint that takes many seconds is not paid for once more untimed.
    """
    warm = client.get(re.sub(r"range=\w+", f"range={RANGES[0]}", path))
    if warm.status_code != 200:
        raise RuntimeError(f"{path} answered {warm.status_code}")
    timings: list[float] = []
    points = 0
    began = time.monotonic()
    while len(timings) < profile.chart_requests:
        start = time.perf_counter()
        response = client.get(path)
        timings.append((time.perf_counter() - start) * 1000)
        if response.status_code != 200:
            raise RuntimeError(f"{path} answered {response.status_code}")
        points = max(points, _max_points(json.loads(response.content)))
        if (len(timings) >= profile.chart_min_requests
                and time.monotonic() - began > profile.chart_budget_s):
            break
    summary = summarize(timings)
    assert summary is not None
    return {**summary.as_dict(), "first": timings[0], "points": points}


def apply_retention(node, now: datetime) -> dict:
    """Run the project's own retention over the dataset, as the hourly prune would: whatever
    it removes, the dataset held beyond what SparkOps keeps (the report says so when not 0)."""
    from django.conf import settings

    from collectors.retention import prune_node

    node.rolled_up_until = now
    node.save(update_fields=["rolled_up_until"])
    result = prune_node(node, now, settings.SPARKOPS_RAW_RETENTION_DAYS,
                        settings.SPARKOPS_ROLLUP_RETENTION_DAYS)
    return {"samples": result.samples, "collections": result.collections,
            "rollups": result.rollups}


def kept_days() -> dict[int, float]:
    """Days each tier is kept (``dataset.RAW`` or a roll-up resolution), from the settings and
    ``collectors.retention.TIERS``."""
    from django.conf import settings

    from collectors.retention import TIERS

    history = settings.SPARKOPS_ROLLUP_RETENTION_DAYS
    keep = {dataset.RAW: settings.SPARKOPS_RAW_RETENTION_DAYS}
    for tier in TIERS:
        days = tier.keep / timedelta(days=1) if tier.keep else history
        keep[tier.resolution] = min(days, history)
    return keep


def _writer(backend: str, database_url: str | None
            ) -> tuple[dataset.SqliteWriter | dataset.PostgresWriter, object]:
    """The bulk writer for this backend, and its timestamp format."""
    from django.conf import settings

    tables = dataset.Tables.from_models()
    if backend == "sqlite":
        return (dataset.SqliteWriter(Path(settings.DATABASES["default"]["NAME"]), tables),
                dataset.sqlite_timestamp)
    return dataset.PostgresWriter(database_url or "", tables), dataset.postgres_timestamp


def _setup(backend: str, workdir: Path, database_url: str | None) -> None:
    env = stack_env(workdir / backend, node=NODE, docker_host=None,
                    database_url=database_url if backend == "postgresql" else None)
    manage(env, "migrate", "--noinput")
    setup_django(env)


def generate(profile: Profile, backend: str, workdir: Path, database_url: str | None) -> dict:
    """Step 1: an empty database, the world, and the dataset written day by day (§5 storage).
    Its timings are not measured, so the runner may run it while other phases run."""
    _setup(backend, workdir, database_url)

    node, engines, _ = create_world(profile.chart_days)
    writer, stamp = _writer(backend, database_url)
    generator = dataset.Generator(node.pk, [e.pk for e in engines], stamp)
    keep = kept_days()
    # Whole hours, so that no roll-up bucket is split between two days.
    end = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    growth = storage.generate_and_measure(
        writer, generator, dataset.day_plan(end, profile.chart_days, keep))
    pruned = apply_retention(node, end)
    writer.settle()
    stored = storage.summarize_storage(growth, writer, keep[dataset.RAW], keep[60])
    stored["pruned_by_retention"] = pruned
    stored["retention_estimates"] = storage.retention_estimates(
        stored, writer.tables.roles(), ENGINES, len(dataset.ENGINE_METRICS),
        {"raw": keep[dataset.RAW], "minute": keep[60], "ten": keep[600], "hour": keep[3600]})
    writer.finish()
    print(f"  {backend}: {stored['days']:.1f} days generated in "
          f"{stored['generation_seconds']:.0f} s, {stored['total_mib']:.0f} MiB", flush=True)
    return {"backend": backend, "storage": stored, "generated_until": end.isoformat()}


def measure(profile: Profile, backend: str, workdir: Path, database_url: str | None,
            generated: dict) -> dict:
    """Step 2: fill the minutes since step 1 up to now, then time every endpoint (§4)."""
    _setup(backend, workdir, database_url)
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client

    from collectors.models import Engine, Node
    from collectors.retention import rollup_node

    node = Node.objects.get(name=NODE)
    engines = list(Engine.objects.filter(node=node).order_by("name"))
    writer, stamp = _writer(backend, database_url)
    generator = dataset.Generator(node.pk, [e.pk for e in engines], stamp, seed=11)
    now = datetime.now(UTC)
    writer.write(generator.span(datetime.fromisoformat(generated["generated_until"]), now,
                                {dataset.RAW}))
    writer.finish()
    rollup_node(node, now)  # the project's own roll-up makes the tiers of the filled stretch
    node.last_collection_at = now
    node.save(update_fields=["last_collection_at"])

    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(get_user_model().objects.get(username="admin"))
    chart = {}
    for label, path in endpoints(engines[0].name):
        chart[label] = time_endpoint(client, path, profile)
        print(f"  {backend} {label}: p95 {chart[label]['p95']:.0f} ms "
              f"(median {chart[label]['median']:.0f}, worst {chart[label]['max']:.0f}, "
              f"n={chart[label]['n']}, {chart[label]['points']} points)", flush=True)
    return {**generated, "chart": chart, "max_points_setting": settings.SPARKOPS_MAX_CHART_POINTS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--profile", choices=PROFILES, default="full")
    parser.add_argument("--backend", choices=("sqlite", "postgresql"), required=True)
    parser.add_argument("--step", choices=("generate", "measure", "all"), default="all")
    parser.add_argument("--generated", type=Path,
                        help="the JSON written by --step generate (for --step measure)")
    parser.add_argument("--database-url")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    profile = PROFILES[args.profile]
    if args.step == "generate":
        result = generate(profile, args.backend, args.workdir, args.database_url)
    elif args.step == "measure":
        if args.generated is None:
            parser.error("--step measure needs --generated")
        result = measure(profile, args.backend, args.workdir, args.database_url,
                         json.loads(args.generated.read_text()))
    else:
        generated = generate(profile, args.backend, args.workdir, args.database_url)
        from django.db import connections

        connections.close_all()
        result = measure(profile, args.backend, args.workdir, args.database_url, generated)
    args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
