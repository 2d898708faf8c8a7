"""A fleet for real: one central SparkOps and three node agents, each its own process tree.

The centre is `bin/sparkops start` (web, its own worker with beat, alert evaluation, delivery);
nodes fleet-a, fleet-b and fleet-c are `bin/sparkops agent`, each with its own node name, /proc
root (a GB10's meminfo, its own kernel release and boot id), data directory and containers,
all on one real PostgreSQL database and one real Redis. The containers are emulated vLLM
engines in the session's Podman; each agent sees only its own through
``SPARKOPS_ENGINE_LABEL_SELECTOR``, as if each ran on its own machine.

What the fleet must do, in order: every node's collections arrive (each from its own queue:
only its agent consumes it) and show on the fleet view; a restart planned on fleet-b is run by
fleet-b's agent and by nobody else; fleet-c's agent killed with SIGKILL and its engines stopped
with it (a node that lost power) is one ``node-unreachable`` alert within the stated bound and
no ``engine-down`` for its engines; fleet-c's agent back resolves it.
"""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from sparkops.testing.ports import free_port, wait_for_port
from sparkops.testing.postgres import fresh_database
from tests.conftest import FIXTURES, PROJECT, subprocess_env
from tests.containers import podman, run_container
from tests.processes import sign_in, stop_group
from tests.test_squeeze_scenario import VLLM

pytestmark = pytest.mark.slow
SCRIPT = PROJECT / "bin" / "sparkops"
PASSWORD = "fleet-test-password-1"
CENTRE, NODES = "fleet-centre", ("fleet-a", "fleet-b", "fleet-c")
KERNELS = {"fleet-a": "6.11.0-1016-nvidia", "fleet-b": "6.11.0-1016-nvidia",
           "fleet-c": "6.14.0-1013-nvidia"}
HEARTBEAT_SECONDS = 1.0
UNREACHABLE_AFTER_BEATS = 3
# The promise the test holds the centre to: a silent node is reported within the heartbeat
# bound (3 beats), one watch interval (the centre's check runs every beat) and the evaluation,
# here given 10 s on a machine that runs other tests beside this one.
REPORT_BOUND_SECONDS = HEARTBEAT_SECONDS * UNREACHABLE_AFTER_BEATS + HEARTBEAT_SECONDS + 10


def _procfs(root: Path, kernel: str) -> Path:
    """A node's /proc: a GB10's meminfo and pressure, its kernel release, its own boot."""
    (root / "pressure").mkdir(parents=True)
    (root / "sys" / "kernel" / "random").mkdir(parents=True)
    (root / "meminfo").write_text((FIXTURES / "procfs" / "meminfo-gb10").read_text())
    (root / "pressure" / "memory").write_text(
        (FIXTURES / "procfs" / "pressure-memory").read_text())
    (root / "sys" / "kernel" / "osrelease").write_text(kernel + "\n")
    (root / "sys" / "kernel" / "random" / "boot_id").write_text(str(uuid.uuid4()) + "\n")
    return root


class Fleet:
    """The fleet's processes, its database and what the test asks of it."""

    def __init__(self, tmp_path: Path, database: str, broker: str, docker_host: str) -> None:
        self.tmp, self.database, self.run = tmp_path, database, uuid.uuid4().hex[:8]
        self.port = free_port()
        common = dict(
            DATABASE_URL=database, CELERY_BROKER_URL=broker, SPARKOPS_DOCKER_HOST=docker_host,
            SPARKOPS_HEARTBEAT_SECONDS=f"{HEARTBEAT_SECONDS:g}",
            SPARKOPS_UNREACHABLE_AFTER_BEATS=str(UNREACHABLE_AFTER_BEATS),
            SPARKOPS_COLLECT_INTERVAL="2", SPARKOPS_RESTART_DRAIN_TIMEOUT_SECONDS="0",
            SPARKOPS_RESTART_MIN_DEADLINE_SECONDS="300",
        )
        self.env = {CENTRE: subprocess_env(
            **common, SPARKOPS_NODE_NAME=CENTRE, SPARKOPS_BEAT_NODES=CENTRE,
            SPARKOPS_DATA_DIR=str(tmp_path / CENTRE), SPARKOPS_ADMIN_PASSWORD=PASSWORD,
            SPARKOPS_BIND=f"127.0.0.1:{self.port}",
            SPARKOPS_PROCFS=str(_procfs(tmp_path / "proc" / CENTRE, "6.11.0-1016-nvidia")),
            SPARKOPS_ENGINE_LABEL_SELECTOR=f"sparkops.fleet={self.run},sparkops.node={CENTRE}",
        )}
        for name in NODES:
            self.env[name] = subprocess_env(
                **common, SPARKOPS_NODE_NAME=name, SPARKOPS_DATA_DIR=str(tmp_path / name),
                SPARKOPS_PROCFS=str(_procfs(tmp_path / "proc" / name, KERNELS[name])),
                SPARKOPS_ENGINE_LABEL_SELECTOR=f"sparkops.fleet={self.run},sparkops.node={name}",
            )
        self.processes: dict[str, subprocess.Popen] = {}

    # --- processes ---------------------------------------------------------------------------

    def start(self, name: str) -> None:
        command = "start" if name == CENTRE else "agent"
        log = open(self.tmp / f"{name}.log", "a")  # noqa: SIM115 - the child holds it
        self.processes[name] = subprocess.Popen(
            [str(SCRIPT), command], env=self.env[name], stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
        log.close()

    def kill(self, name: str) -> None:
        """SIGKILL to the agent's whole process group: no shutdown code runs."""
        stop_group(self.processes.pop(name), signal.SIGKILL)

    def stop_all(self) -> None:
        for process in self.processes.values():
            stop_group(process)
        self.processes.clear()

    def log(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else "(not started)"

    def signed_in_get(self, path: str) -> str:
        """A page of the centre, signed in as its admin."""
        base = f"http://127.0.0.1:{self.port}"
        return sign_in(base, PASSWORD, node=None).get(f"{base}{path}", timeout=30).text

    # --- containers --------------------------------------------------------------------------

    def engine(self, node: str, model: str, *, managed: bool = False) -> str:
        """An emulated vLLM engine of ``node``: its container name."""
        name, port = f"{node}-{model}-{self.run}", free_port()
        run_container(name, [VLLM, "serve", f"org/{model}", "--port", str(port),
                             "--kv-cache-memory-bytes", "64M", "--gpu-memory-utilization",
                             "0.05", "--emulator-weights-bytes", "32M",
                             "--emulator-load-seconds", "0.5",
                             "--emulator-profile-seconds", "0.2",
                             "--emulator-graph-seconds", "0.2"],
                      labels={"sparkops.engine": "vllm", "sparkops.fleet": self.run,
                              "sparkops.node": node,
                              **({"sparkops.manage": "true"} if managed else {})})
        return name

    # --- the central database ----------------------------------------------------------------

    def query(self, sql: str, *args: object) -> list[tuple]:
        with psycopg.connect(self.database) as connection:
            return connection.execute(sql, args).fetchall()

    def until(self, check: Callable[[], object], seconds: float, what: str) -> object:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if found := check():
                return found
            time.sleep(0.5)
        raise AssertionError(f"{what} not within {seconds:g} s; logs:\n" + "\n".join(
            f"--- {name}\n{self.log(name)[-3000:]}" for name in (CENTRE, *NODES)))

    def collections(self, node: str) -> int:
        return self.query("select count(*) from collectors_collection c join collectors_node n"
                          " on n.id = c.node_id where n.name = %s and c.ok", node)[0][0]

    def ready_engines(self, node: str) -> set[str]:
        return {row[0] for row in self.query(
            "select e.name from collectors_engine e join collectors_node n on n.id = e.node_id"
            " where n.name = %s and e.present and e.phase = 'ready'", node)}

    def alerts(self, rule: str, node: str) -> list[tuple]:
        """(started_at, resolved_at) of ``rule``'s alerts of ``node``."""
        return self.query(
            "select a.started_at, a.resolved_at from dashboard_alert a join collectors_node n"
            " on n.id = a.node_id where a.rule = %s and n.name = %s order by a.id", rule, node)

    def manage(self, *args: str) -> str:
        result = subprocess.run([str(PROJECT / ".venv" / "bin" / "python"), "manage.py", *args],
                                cwd=PROJECT, env=self.env[CENTRE], capture_output=True,
                                text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        return result.stdout


@pytest.fixture
def fleet(tmp_path, postgres_url, redis_url, docker_host) -> Iterator[Fleet]:
    built = Fleet(tmp_path, fresh_database(postgres_url, "fleet"), redis_url, docker_host)
    built.manage("migrate", "--noinput", "--verbosity", "0")
    # engine-down at once, not after its minute: a storm would show in seconds.
    built.manage("shell", "-c", "from dashboard.alerting.models import RuleSetting; "
                 "RuleSetting.objects.create(rule='engine-down', for_seconds=0)")
    try:
        yield built
    finally:
        built.stop_all()


PLAN = """
from django.utils import timezone
from dashboard.restarts.models import Restart
from collectors.models import Engine
engine = Engine.objects.get(node__name=%(node)r, name=%(name)r)
now = timezone.now()
restart = Restart.objects.create(node=engine.node, engine=engine, kind="planned",
                                 status="scheduled", requested_at=now, scheduled_for=now,
                                 expected_startup_seconds=3)
print(restart.pk)
"""


def test_a_central_stack_and_three_agents_are_one_fleet(fleet):
    engines = {"fleet-a": [fleet.engine("fleet-a", "gemma")],
               "fleet-b": [fleet.engine("fleet-b", "qwen", managed=True)],
               "fleet-c": [fleet.engine("fleet-c", "nemotron"), fleet.engine("fleet-c", "glm")]}
    fleet.start(CENTRE)
    for name in NODES:
        fleet.start(name)
    wait_for_port(fleet.port, timeout=180)

    # 1. Every node registers, beats, and its collections and engines arrive.
    for name in NODES:
        fleet.until(lambda name=name: fleet.collections(name) >= 2
                    and fleet.ready_engines(name) == set(engines[name]),
                    120, f"{name}'s collections and ready engines")
    facts = dict(fleet.query("select name, facts from collectors_node"))
    assert {name: facts[name]["items"]["kernel"]["value"] for name in NODES} == KERNELS
    base = f"http://127.0.0.1:{fleet.port}"
    session = sign_in(base, PASSWORD, node=None)
    page = session.get(f"{base}/fleet/", timeout=30).text
    for name in (CENTRE, *NODES):
        assert f'data-node="{name}"' in page, name
    assert all(engine in page for names in engines.values() for engine in names)

    # 2. A restart planned on fleet-b runs on fleet-b's agent only.
    said = fleet.manage("shell", "-c", PLAN % {"node": "fleet-b", "name": engines["fleet-b"][0]})
    restart = int(said.split()[-1])
    status, worker = fleet.until(
        lambda: next((row for row in fleet.query(
            "select status, worker from dashboard_restart where id = %s", restart)
            if row[0] not in ("scheduled", "running")), None),
        240, "the restart's end")
    assert status == "succeeded", (status, fleet.query(
        "select outcome from dashboard_restart where id = %s", restart))
    assert worker.startswith("worker:fleet-b@"), worker

    # 3. fleet-c loses power: its agent killed outright, its engines gone with it.
    fleet.until(lambda: fleet.query("select heartbeat_at from collectors_node where name = %s",
                                    "fleet-c")[0][0], 30, "fleet-c's heartbeat")
    fleet.kill("fleet-c")
    for container in engines["fleet-c"]:
        podman("stop", "--time", "0", container)
    [(last_beat,)] = fleet.query("select heartbeat_at from collectors_node where name = %s",
                                 "fleet-c")
    fired = fleet.until(lambda: fleet.alerts("node-unreachable", "fleet-c"),
                        REPORT_BOUND_SECONDS + 30, "node-unreachable for fleet-c")
    assert len(fired) == 1
    assert (fired[0][0] - last_beat).total_seconds() <= REPORT_BOUND_SECONDS
    # A few more rounds of the centre's watch and of the other nodes' evaluations: still one
    # alert for fleet-c, and none per engine.
    rounds = fleet.collections("fleet-a")
    fleet.until(lambda: fleet.collections("fleet-a") >= rounds + 3, 60, "three more rounds")
    assert len(fleet.alerts("node-unreachable", "fleet-c")) == 1
    assert fleet.alerts("engine-down", "fleet-c") == []
    assert all(fleet.alerts("node-unreachable", name) == [] for name in ("fleet-a", "fleet-b"))
    page = session.get(f"{base}/fleet/", timeout=30).text
    assert 'data-node="fleet-c" data-contact="unreachable"' in page

    # 4. fleet-c back (its engines too): the alert resolves, and still no engine-down.
    for container in engines["fleet-c"]:
        podman("start", container)
    fleet.start("fleet-c")
    fleet.until(lambda: fleet.alerts("node-unreachable", "fleet-c")[0][1], 120,
                "node-unreachable resolved")
    assert len(fleet.alerts("node-unreachable", "fleet-c")) == 1
    assert fleet.alerts("engine-down", "fleet-c") == []
