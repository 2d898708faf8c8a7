"""Benchmark 6: the centre of a fleet — 16 nodes × 4 engines writing into one central PostgreSQL.

What is measured is the centre, as ``bin/sparkops start`` runs it for a fleet: ``runstack``
(web, the Celery worker with beat in it) with ``DATABASE_URL`` on PostgreSQL and
``CELERY_BROKER_URL`` on a private ``redis-server``. Its beat schedules every node's
collections on that node's queue (``SPARKOPS_BEAT_NODES`` names the fleet's nodes; the centre
collects no host of its own), its worker evaluates each node's alerts after every collection
(``collection_finished`` queues ``evaluate_alerts`` centrally), sweeps the outbox, rolls up and
prunes, and its web server answers one signed-in tab left open on the fleet view.

The write load comes from one process per node, the project's node agent (``manage.py
runagent``, as ``bin/sparkops agent`` runs it), each configured as its node
(``SPARKOPS_NODE_NAME``) and consuming only ``node.<name>``, so the real collection code runs
there exactly as on a node: a collection and its host samples, every engine's samples and row,
the ledger on the node's row, the flight recorder on its own disk, the kernel log, and a
heartbeat (``collectors.heartbeat.beat``) every ``SPARKOPS_HEARTBEAT_SECONDS``. The agents
register themselves, and the centre's scheduler adds registered nodes to its schedule.
Processes, not threads, so the centre's CPU time is read
from its own processes apart from the nodes'. The nodes' cost is reported too, for scale: in a
fleet it is spent on the nodes, here on the same machine (2 cores), which is why the nodes run
at the lowest CPU priority (``nice 19``: they take the time the centre and the database leave)
and are made cheap where that does not change what reaches the centre:

* each node reads its host from a ``/proc`` of its own (``SPARKOPS_PROCFS``): links to this
  machine's entries, except ``meminfo``, written once with a GB10's MemTotal (121.69 GiB) and a
  MemAvailable of its own;
* the engines are emulated vLLM engines in real containers, ``fleet_engines`` of them, and
  every node discovers the same containers through the private Podman service as engines of its
  own. What reaches the centre is the same as with 4 engines per node on 16 hosts: 4 engine
  rows per node, their samples and updates, scraped and written by each node.

Readings, every ``fleet_sample_every_s`` over the window, like the footprint's
(``bench.procs``): every process of the centre (RSS sum, distinct resident pages, CPU time), of
the PostgreSQL server, of Redis and of the node workers, and the database's counters
(``pg_stat_database``, ``pg_stat_user_tables``, the WAL position, the tables' size, the
connections). CPU is CPU time over wall time between the first and the last reading, as a share
of one core (processes that exit hand their time to the parent that reaps them, so the sum is
kept). Latency: the open tab's requests over real HTTP, timed as a client sees them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path

import psutil
import requests

from bench import emulated
from bench.emulated import EngineSpec
from bench.live import held_figures
from bench.procs import MIB, StackSample, sample_stack, sample_tree
from bench.profiles import PROFILES, Profile
from bench.services import PROJECT, Child, Podman
from bench.sparkops_stack import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    SparkOpsStack,
    prepare,
    setup_django,
    stack_env,
)
from bench.stats import summarize
from sparkops.testing.ports import free_port, wait_for, wait_for_port
from sparkops.testing.postgres import postgres_server

log = logging.getLogger(__name__)

CENTRE = "fleet-centre"
NODE_PREFIX = "fleet-node-"
INTERVAL = 5.0  # SparkOps' default SPARKOPS_COLLECT_INTERVAL
CHART_EVERY = 3  # the open tab asks for the chart every third poll, as the overview does
GIB = 1024**3
GB10_MEM_TOTAL = int(121.69 * GIB)  # what vLLM prints on a GB10; never 128
FLEET_DATABASE = "sparkops_fleet"
FLEET_PATH = "/fleet/"
NODE_NICENESS = 19
_MEMINFO_FIELD = re.compile(r"^(MemTotal|MemFree|MemAvailable):\s+\d+ kB$", re.MULTILINE)


def node_names(count: int) -> list[str]:
    return [f"{NODE_PREFIX}{index:02d}" for index in range(1, count + 1)]


# --- each node's /proc ---------------------------------------------------------------------


def gb10_meminfo(real: str, index: int) -> str:
    """This machine's meminfo with MemTotal, MemFree and MemAvailable of a GB10 node: each
    node its own MemAvailable (36–59 GiB), so their rows differ as real nodes' do."""
    available = (36 + index * 7 % 24) * GIB
    values = {"MemTotal": GB10_MEM_TOTAL, "MemAvailable": available,
              "MemFree": available - 12 * GIB}

    def replace(match: re.Match) -> str:
        name = match.group(1)
        return f"{name + ':':<16}{values[name] // 1024:>8} kB"

    return _MEMINFO_FIELD.sub(replace, real)


def build_procfs(root: Path, index: int) -> Path:
    """A ``/proc`` for node ``index``: every entry of this machine's, linked, but process
    directories (SparkOps reads processes through the real ``/proc``) and ``meminfo``, which is
    the node's own (:func:`gb10_meminfo`)."""
    root.mkdir(parents=True, exist_ok=True)
    for name in os.listdir("/proc"):
        if name == "meminfo" or name.isdigit():
            continue
        link = root / name
        if not link.exists() and not link.is_symlink():
            link.symlink_to(f"/proc/{name}")
    (root / "meminfo").write_text(gb10_meminfo(Path("/proc/meminfo").read_text(), index))
    return root


def fleet_engines(count: int) -> list[EngineSpec]:
    """The emulated engines every node discovers as its own (light, like the cost sweep's)."""
    return [EngineSpec(name=f"fleet-engine-{index}", port=free_port(),
                       model=f"bench/fleet-{index}", kv_bytes="16M", weights_bytes="8M",
                       load="0.5:128:32", labels={"sparkops.engine": "vllm"})
            for index in range(1, count + 1)]


# --- the central servers -------------------------------------------------------------------


@contextmanager
def redis_server(workdir: Path) -> Iterator[tuple[str, Child]]:
    """A private ``redis-server`` on a free loopback port, nothing kept on disk (the broker of
    the centre and the nodes); yields its URL and the child."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed (Debian package redis-server)")
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    child = Child("redis", [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                            "--appendonly", "no", "--dir", str(workdir)],
                  log=workdir / "redis.log")
    try:
        wait_for_port(port)
        yield f"redis://127.0.0.1:{port}/0", child
    finally:
        child.stop()


@contextmanager
def fleet_database(cluster_url: str | None) -> Iterator[str]:
    """An empty database for the fleet: ``sparkops_fleet`` in the cluster of ``cluster_url``
    (the runner's PostgreSQL; dropped afterwards), or a private cluster's database when None.
    A database of its own, so that ``pg_stat_database`` counts only the fleet's writes."""
    if cluster_url is None:
        with postgres_server("sparkops-bench-fleet-pg-") as url:
            yield url
        return
    import psycopg

    def drop() -> None:
        with psycopg.connect(cluster_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {FLEET_DATABASE} WITH (FORCE)")

    drop()
    with psycopg.connect(cluster_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {FLEET_DATABASE}")
    try:
        yield f"{cluster_url.rsplit('/', 1)[0]}/{FLEET_DATABASE}"
    finally:
        drop()


class DatabaseProbe:
    """One connection to the fleet's database for the readings (idle between them)."""

    def __init__(self, url: str) -> None:
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)
        self.postmaster_pid = psutil.Process(self.conn.info.backend_pid).ppid()

    def reading(self) -> dict:
        """The database's write counters now. ``pg_stat_*`` counters reach the shared
        statistics when a backend's transaction ends (at most about 10 s late for an idle
        one), so over minutes they are exact to a few per cent; the WAL position is exact."""
        run = self.conn.execute
        commits, inserted, updated, deleted = run(
            "SELECT xact_commit, tup_inserted, tup_updated, tup_deleted FROM pg_stat_database "
            "WHERE datname = current_database()").fetchone()
        tables = {name: (ins, upd, dele) for name, ins, upd, dele in run(
            "SELECT relname, n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables")}
        return {
            "commits": commits, "inserted": inserted, "updated": updated, "deleted": deleted,
            "wal_bytes": float(run("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')")
                               .fetchone()[0]),
            "table_bytes": int(run("SELECT coalesce(sum(pg_total_relation_size(relid)), 0) "
                                   "FROM pg_stat_user_tables").fetchone()[0]),
            "connections": run("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                               "current_database() AND pid <> pg_backend_pid()").fetchone()[0],
            "tables": tables,
        }

    def close(self) -> None:
        self.conn.close()


def write_rate(first: dict, last: dict, seconds: float) -> dict:
    """Rows, commits and bytes per second between two readings, and by table."""
    def per_s(key: str) -> float:
        return (last[key] - first[key]) / seconds

    tables = []
    for name, (ins, upd, dele) in last["tables"].items():
        before = first["tables"].get(name, (0, 0, 0))
        rates = [(now - then) / seconds for now, then in zip((ins, upd, dele), before,
                                                              strict=True)]
        if any(rates):
            tables.append({"table": name, "inserted_per_s": rates[0],
                           "updated_per_s": rates[1], "deleted_per_s": rates[2]})
    tables.sort(key=lambda row: -(row["inserted_per_s"] + row["updated_per_s"]
                                  + row["deleted_per_s"]))
    return {"inserted_per_s": per_s("inserted"), "updated_per_s": per_s("updated"),
            "deleted_per_s": per_s("deleted"), "commits_per_s": per_s("commits"),
            "wal_bytes_per_s": per_s("wal_bytes"), "table_bytes_per_s": per_s("table_bytes"),
            "tables": tables}


# --- the nodes -----------------------------------------------------------------------------


def node_argv() -> list[str]:
    """A node's command line, at the lowest CPU priority (``NODE_NICENESS``): in a fleet its
    work runs on its own host, so here it takes only the CPU time the centre and the database
    leave, instead of delaying their answers on two shared cores."""
    return ["nice", "-n", str(NODE_NICENESS), sys.executable, "manage.py", "runagent"]


def start_nodes(nodes: list[str], workdir: Path, *, database_url: str,
                broker_url: str, docker_host: str) -> list[Child]:
    children = []
    for index, node in enumerate(nodes, start=1):
        home = workdir / "nodes" / node
        env = stack_env(home / "data", node=node, docker_host=docker_host,
                        database_url=database_url, CELERY_BROKER_URL=broker_url,
                        SPARKOPS_PROCFS=str(build_procfs(home / "proc", index)))
        children.append(Child(node, node_argv(), log=home / "worker.log", env=env,
                              cwd=PROJECT))
    return children


def stop_all(children: list[Child]) -> None:
    """SIGTERM to every child first, so that their warm shutdowns (a collection finishing)
    overlap, then wait for each."""
    for child in children:
        child.signal(signal.SIGTERM)
    for child in children:
        child.stop(timeout=20)


class NodesCollecting:
    """The wait for every node to have stored a collection, its engines and a beat; what is
    still missing is kept for the error when the wait times out."""

    def __init__(self, nodes: list[str], engines: int, children: list[Child]) -> None:
        self.nodes, self.engines, self.children = nodes, engines, children
        self.missing: dict[str, list[str]] = {}

    def __call__(self) -> bool:
        """Raises if a node's process has exited (its log's tail says why)."""
        from django.db import connection
        from django.db.models import Count

        from collectors.models import Collection, Engine, Node

        for child in self.children:
            if not child.alive():
                raise RuntimeError(f"node {child.name} exited:\n{child.tail()}")
        try:
            collected = set(Collection.objects.filter(node__name__in=self.nodes, ok=True)
                            .values_list("node__name", flat=True).distinct())
            engines = dict(Engine.objects.filter(node__name__in=self.nodes, present=True)
                           .values_list("node__name").annotate(n=Count("id")))
            beating = set(Node.objects.filter(name__in=self.nodes, heartbeat_at__isnull=False)
                          .values_list("name", flat=True))
            why_not = dict(Node.objects.filter(name__in=self.nodes)
                           .exclude(engine_discovery_error="")
                           .values_list("name", "engine_discovery_error"))
        finally:
            connection.close()
        self.missing = {}
        for node in self.nodes:
            lacks = ([] if node in collected else ["a collection"]) + (
                [] if engines.get(node, 0) >= self.engines
                else [f"its engines ({engines.get(node, 0)} of {self.engines}"
                      + (f": {why_not[node][:200]}" if node in why_not else "") + ")"]) + (
                [] if node in beating else ["a heartbeat"])
            if lacks:
                self.missing[node] = lacks
        return not self.missing

    def wait(self, timeout: float) -> None:
        try:
            wait_for(self, timeout, "every node collecting, with its engines and a beat", 2.0)
        except TimeoutError as error:
            lacking = "; ".join(f"{node}: {', '.join(lacks)}"
                                for node, lacks in self.missing.items())
            raise TimeoutError(f"{error}; still missing: {lacking}") from None


# --- readings ------------------------------------------------------------------------------


class Sampler(threading.Thread):
    """Reads every stack and the database at ``count`` moments ``every`` seconds apart, the
    first at ``start`` (a ``time.monotonic()`` value). Stacks: name → ({root pid: role},
    whether to count distinct resident pages, which reads every page table)."""

    def __init__(self, stacks: dict[str, tuple[dict[int, str], bool]], probe: DatabaseProbe,
                 *, start: float, every: float, count: int) -> None:
        super().__init__(daemon=True)
        self.stacks, self.probe = stacks, probe
        self.moments = [start + every * i for i in range(count)]
        self.readings: list[tuple[float, dict[str, StackSample], dict]] = []
        self.wall: list[datetime] = []  # each reading's moment, for the database's rows

    def run(self) -> None:
        for moment in self.moments:
            time.sleep(max(moment - time.monotonic(), 0))
            now = time.monotonic()
            self.wall.append(datetime.now(UTC))
            stacks = {name: self._read(roots, distinct)
                      for name, (roots, distinct) in self.stacks.items()}
            self.readings.append((now, stacks, self.probe.reading()))
            centre = stacks["centre"]
            print(f"  fleet: centre {centre.rss / MIB:.0f} MiB RSS sum, "
                  f"{(centre.distinct or 0) / MIB:.0f} distinct; "
                  f"{self.readings[-1][2]['connections']} database connections", flush=True)

    @staticmethod
    def _read(roots: dict[int, str], distinct: bool) -> StackSample:
        if distinct:
            return sample_stack(roots)
        return StackSample(tuple(p for pid, role in roots.items()
                                 for p in sample_tree(pid, role)))

    def result(self) -> dict:
        first, last = self.readings[0], self.readings[-1]
        window = last[0] - first[0]
        stacks = {}
        for name, (_, distinct) in self.stacks.items():
            samples = [reading[1][name] for reading in self.readings]
            shares = [100 * (b[1][name].cpu_seconds - a[1][name].cpu_seconds) / (b[0] - a[0])
                      for a, b in zip(self.readings, self.readings[1:], strict=False)
                      if b[0] > a[0]]
            stacks[name] = {
                "cpu_percent_window": 100 * (last[1][name].cpu_seconds
                                             - first[1][name].cpu_seconds) / window,
                "cpu_percent": _dict(summarize(shares)),
                "rss_mib": _dict(summarize(s.rss / MIB for s in samples)),
                "distinct_mib": _dict(summarize(s.distinct / MIB for s in samples
                                                if s.distinct is not None)) if distinct
                else None,
                "processes": len(last[1][name].processes),
            }
        stacks["centre"]["by_process"] = [
            {"role": p.role, "rss_mib": p.rss / MIB, "pss_mib": p.pss / MIB}
            for p in last[1]["centre"].processes]
        database = write_rate(first[2], last[2], window)
        database["connections"] = _dict(summarize(r[2]["connections"] for r in self.readings))
        return {"window_s": window, "readings": len(self.readings), "stacks": stacks,
                "database": database}


def _dict(summary) -> dict | None:
    return summary.as_dict() if summary else None


def signed_in(base_url: str) -> requests.Session:
    """A session signed in as the benchmark's admin through the login form, as a browser."""
    session = requests.Session()
    page = session.get(f"{base_url}/login/", timeout=30)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    session.post(f"{base_url}/login/", timeout=30, data={
        "username": ADMIN_USER, "password": ADMIN_PASSWORD,
        "csrfmiddlewaretoken": token.group(1) if token else "",
    }, headers={"Referer": f"{base_url}/login/"})
    return session


class FleetTab(threading.Thread):
    """One signed-in browser tab left open on the fleet view: the view every interval, a chart
    every third poll; each request timed as the client sees it (loopback HTTP, body read)."""

    def __init__(self, base_url: str, paths: dict[str, str], interval: float = INTERVAL) -> None:
        super().__init__(daemon=True)
        self.base_url, self.paths, self.interval = base_url, paths, interval  # label → path
        self.timings: dict[str, list[float]] = {label: [] for label in paths}
        self.series: dict[str, list[tuple[float, float]]] = {label: [] for label in paths}
        self.began = time.monotonic()
        self.failures: dict[str, list[str]] = {label: [] for label in paths}
        self._halt = threading.Event()

    def run(self) -> None:
        session = signed_in(self.base_url)
        self.began = time.monotonic()
        tick = 0
        while not self._halt.wait(self.interval if tick else 0):
            for label, path in self.paths.items():
                if label == "chart" and tick % CHART_EVERY:
                    continue
                self._time(session, label, path)
            tick += 1

    def stop(self) -> None:
        self._halt.set()

    def _time(self, session: requests.Session, label: str, path: str) -> None:
        began = time.perf_counter()
        try:
            status = session.get(f"{self.base_url}{path}", timeout=30).status_code
        except requests.RequestException as error:
            status, why = None, str(error)
        elapsed = (time.perf_counter() - began) * 1000
        if status == 200:
            self.timings[label].append(elapsed)
            self.series[label].append((round(time.monotonic() - self.began, 1),
                                       round(elapsed, 1)))
        else:
            self.failures[label].append(why if status is None else f"answered {status}")

    def result(self) -> dict:
        return {label: {**(_dict(summarize(values)) or {}), "errors": len(self.failures[label]),
                        "failures": self.failures[label][:5],
                        "series": self.series[label]}  # (seconds into the window, ms)
                for label, values in self.timings.items()}


def server_time(path: str, requests_: int = 5) -> dict:
    """The view's own time, in this process (Django's test client: middleware, session, the
    view, the template; no HTTP, no gunicorn), and its database queries, under the same load:
    what of a slow answer is the view's work and what is waiting for the CPU."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(get_user_model().objects.get(username=ADMIN_USER))
    timings, queries = [], []
    try:
        client.get(path, follow=True)  # untimed: this process's first render loads templates
        for _ in range(requests_):
            with CaptureQueriesContext(connection) as captured:
                began = time.perf_counter()
                response = client.get(path, follow=True)
                timings.append((time.perf_counter() - began) * 1000)
            if response.status_code != 200:
                raise RuntimeError(f"{path} answered {response.status_code} in-process")
            queries.append(len(captured))
    finally:
        connection.close()
    return {**summarize(timings).as_dict(), "queries": max(queries)}


def observed(nodes: list[str], since: datetime, until: datetime) -> dict:
    """What the nodes stored during the window: collections per node and minute, figures
    (samples) per collection in the host readings and per engine and collection in the engine
    readings, and how many nodes beat lately."""
    from datetime import timedelta

    from django.db import connection
    from django.db.models import Count

    from collectors import heartbeat
    from collectors.models import Collection, Node
    from collectors.readings import ENGINE, HOST

    minutes = (until - since).total_seconds() / 60
    window = {"at__gte": since, "at__lt": until}
    try:
        collections = Collection.objects.filter(node__name__in=nodes, **window)
        per_node = dict(collections.values_list("node__name").annotate(n=Count("id")))
        ok = collections.filter(ok=True).count()
        host_figures, _ = held_figures(
            HOST, HOST.model.objects.filter(node__name__in=nodes, **window))
        engine_figures, engine_readings = held_figures(
            ENGINE, ENGINE.model.objects.filter(engine__node__name__in=nodes, **window))
        recent = until - timedelta(seconds=2 * heartbeat.interval_seconds())
        beating = Node.objects.filter(name__in=nodes, heartbeat_at__gte=recent).count()
        node_rows = Node.objects.count()
        centre_collections = Collection.objects.filter(node__name=CENTRE, **window).count()
    finally:
        connection.close()
    return {
        "collections_per_node_minute": _dict(summarize(
            per_node.get(node, 0) / minutes for node in nodes)),
        "collections_expected_per_minute": 60 / INTERVAL,
        "collections_ok": ok, "collections_failed": sum(per_node.values()) - ok,
        "host_samples_per_collection": round(host_figures / ok, 2) if ok else None,
        "engine_samples_per_engine_cycle": round(engine_figures / engine_readings, 2)
        if engine_readings else None,
        "nodes_beating": beating,
        "node_rows": node_rows,
        "centre_collections": centre_collections,
    }


# --- the run -------------------------------------------------------------------------------


def run(profile: Profile, workdir: Path, podman: Podman, docker_host: str,
        cluster_url: str | None) -> dict:
    nodes = node_names(profile.fleet_nodes)
    with ExitStack() as stack:
        broker_url, redis = stack.enter_context(redis_server(workdir / "redis"))
        database_url = stack.enter_context(fleet_database(cluster_url))
        centre_env = stack_env(workdir / "centre", node=CENTRE, docker_host=None,
                               database_url=database_url, CELERY_BROKER_URL=broker_url,
                               SPARKOPS_BEAT_NODES=",".join(nodes))
        prepare(centre_env)  # what `bin/sparkops start` does first: migrate, bootstrap, static
        setup_django(centre_env)
        from django.db import connections

        stack.callback(connections.close_all)  # before the database is dropped
        specs = fleet_engines(profile.fleet_engines)
        stack.callback(podman.remove_all)
        emulated.start(podman, specs)
        emulated.wait_ready(specs)

        centre = SparkOpsStack(centre_env, workdir / "centre")
        stack.callback(centre.stop)
        centre.wait_ready()
        began = time.monotonic()
        children = start_nodes(nodes, workdir, database_url=database_url,
                               broker_url=broker_url, docker_host=docker_host)
        stack.callback(stop_all, children)
        NodesCollecting(nodes, len(specs), children).wait(120 + 15 * len(nodes))
        print(f"  {len(nodes)} node agents collecting after "
              f"{time.monotonic() - began:.0f} s; warming up for {profile.fleet_warmup_s:g} s",
              flush=True)
        path = FLEET_PATH
        chart = f"/api/nodes/{nodes[0]}/timeline.json?range=1h"
        tab = FleetTab(centre.url, {"fleet": path, "chart": chart})
        time.sleep(profile.fleet_warmup_s)

        probe = DatabaseProbe(database_url)
        stack.callback(probe.close)
        count = int(profile.fleet_minutes * 60 / profile.fleet_sample_every_s) + 1
        start = time.monotonic() + 1
        sampler = Sampler(
            {"centre": ({centre.child.pid: "the centre's stack"}, True),
             "postgresql": ({probe.postmaster_pid: "postgres"}, False),
             "redis": ({redis.pid: "redis-server"}, False),
             "nodes": ({child.pid: "node worker" for child in children}, False)},
            probe, start=start, every=profile.fleet_sample_every_s, count=count)
        sampler.start()
        time.sleep(max(start - time.monotonic(), 0))
        tab.start()
        stack.callback(tab.stop)
        sampler.join()
        tab.stop()
        tab.join(timeout=35)
        for child in (centre.child, *children):
            if not child.alive():
                raise RuntimeError(f"{child.name} exited during the window:\n{child.tail()}")
        in_process = server_time(path)  # the nodes still write meanwhile
        result = {
            "nodes": len(nodes), "engines_per_node": len(specs),
            "node_niceness": NODE_NICENESS,
            "warmup_s": profile.fleet_warmup_s, "interval_s": INTERVAL,
            "fleet_path": path, "chart_path": chart,
            "chart_every": CHART_EVERY, "latency": tab.result(), "fleet_in_process": in_process,
            **sampler.result(),
            "observed": observed(nodes, sampler.wall[0], sampler.wall[-1]),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--profile", choices=PROFILES, default="full")
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--database-url",
                        help="a PostgreSQL cluster's URL (the fleet gets a database of its own "
                             "there); without it, a private cluster")
    args = parser.parse_args()
    if args.workdir is None or args.json is None:
        parser.error("--workdir and --json are needed")
    args.workdir.mkdir(parents=True, exist_ok=True)
    result = run(PROFILES[args.profile], args.workdir, Podman.from_env(),
                 os.environ["SPARKOPS_DOCKER_HOST"], args.database_url)
    args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
