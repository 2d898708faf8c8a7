"""``bin/sparkops agent``: a fleet node's worker alone, on its own queue, against the central
database and broker.

The command line and the refusals first; then (slow) the real thing: the agent started against
the session's PostgreSQL and Redis with its own node name, /proc root and data directory,
registering, beating and taking only its own queue's work, and a central ``bin/sparkops start``
whose beat schedules the agent's collections.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from io import StringIO
from pathlib import Path
from types import SimpleNamespace

import psycopg
import pytest
import redis
from celery import Celery
from django.core.management import CommandError, call_command

from collectors.management.commands import runagent, runstack
from sparkops.celery import (
    COLLECT_ENGINES,
    COLLECT_HOST_MEMORY,
    COLLECT_KERNEL_LOG,
    EVALUATE_ALERTS,
    ROLLUP_SAMPLES,
    node_queue,
)
from sparkops.stackworker import FleetNode
from sparkops.testing.ports import free_port
from sparkops.testing.postgres import fresh_database
from tests.conftest import FIXTURES, PROJECT, subprocess_env
from tests.processes import stop_group

SCRIPT = PROJECT / "bin" / "sparkops"
AGENT = "agent-test-b"
ELSEWHERE = "agent-test-elsewhere"
CENTRAL = "agent-test-central"
GB10_MEMTOTAL_BYTES = 127600468 * 1024  # tests/fixtures/procfs/meminfo-gb10


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


# --- the command line -----------------------------------------------------------------------


def test_the_agent_is_one_worker_on_its_node_queue_without_beat():
    commands = runagent.agent_commands("n1")

    assert list(commands) == ["worker"]
    worker = commands["worker"]
    assert worker[:3] == [sys.executable, "-m", "sparkops.runworker"]
    assert _option(worker, "--queues") == "node.n1"
    assert _option(worker, "--hostname") == "n1@%h"
    assert "--beat-thread" not in worker and "--schedule-filename" not in worker
    assert _option(worker, "--liveness-file") == runstack.stack_heartbeats()["worker"]["path"]


def test_the_agent_and_the_stack_build_their_worker_the_same_way():
    stack = runstack.stack_commands(bind="127.0.0.1:9", node="n1", worker_concurrency=3,
                                    beat=False)["worker"]
    agent = runagent.agent_commands("n1", worker_concurrency=3)["worker"]

    assert _option(stack, "--queues") == "node.n1,sparkops,notify"
    # The same command line but for the queues, and what a fleet node leaves out.
    fleet_only = ["--without-heartbeat", "--fleet-node"]
    assert agent[-2:] == fleet_only and not set(fleet_only) & set(stack)
    assert stack == [*agent[:agent.index("--queues") + 1], "node.n1,sparkops,notify",
                     *agent[agent.index("--queues") + 2:-2]]
    prefork = runagent.agent_commands("n1", worker_pool="prefork")["worker"]
    assert _option(prefork, "--pool") == "prefork" and _option(prefork, "--concurrency") == "4"


def test_a_fleet_node_worker_shares_no_unacked_hash_and_runs_no_remote_control(settings):
    settings.SPARKOPS_NODE_NAME = "spark-b"
    agent_app = Celery("agent-probe", set_as_current=False)
    agent_app.conf.broker_transport_options = {"socket_timeout": 5}
    stack_app = Celery("stack-probe", set_as_current=False)

    FleetNode(SimpleNamespace(app=agent_app), fleet_node=True)
    FleetNode(SimpleNamespace(app=stack_app))

    assert agent_app.conf.worker_enable_remote_control is False
    assert agent_app.conf.broker_transport_options == {
        "socket_timeout": 5, "unacked_key": "unacked.node.spark-b",
        "unacked_index_key": "unacked_index.node.spark-b",
        "unacked_mutex_key": "unacked_mutex.node.spark-b"}
    assert stack_app.conf.worker_enable_remote_control is True
    assert not stack_app.conf.broker_transport_options


def test_the_embedded_defaults_are_refused_in_words():
    sqlite = {"ENGINE": "django.db.backends.sqlite3", "NAME": "/var/lib/sparkops/db.sqlite3"}
    postgresql = {"ENGINE": "django.db.backends.postgresql", "NAME": "sparkops"}

    both = runagent.embedded_defaults(sqlite, "filesystem://")
    assert len(both) == 2
    assert "SQLite (/var/lib/sparkops/db.sqlite3)" in both[0] and "DATABASE_URL" in both[0]
    assert "file-system broker" in both[1] and "CELERY_BROKER_URL" in both[1]
    assert runagent.embedded_defaults(postgresql, "filesystem://")[0].count("CELERY_BROKER_URL")
    assert runagent.embedded_defaults(postgresql, "rediss://node-b@centre:6379/0") == []


def test_the_command_refuses_before_it_starts_anything(tmp_path, settings):
    # The test settings are the embedded defaults: SQLite and the file-system broker.
    with pytest.raises(CommandError, match="DATABASE_URL.*CELERY_BROKER_URL"):
        call_command("runagent")


def test_the_least_privilege_it_prints_names_only_the_node_sides_tables_and_keys(settings):
    settings.SPARKOPS_NODE_NAME = "spark-b"
    out = StringIO()
    call_command("runagent", "--least-privilege", stdout=out)
    text = out.getvalue()

    assert "CREATE ROLE sparkops_node_spark_b LOGIN;" in text
    for secret in ("auth_user", "django_session", "dashboard_channel", "dashboard_alert",
                   "axes_"):
        assert secret not in text
    assert "DELETE" not in text and "TRUNCATE" not in text and "ALL" not in text
    assert "redis-cli ACL SETUSER spark-b reset on '#PASSWORD_SHA256' 'resetchannels'" in text
    rules = runagent.broker_acl_rules("spark-b")
    keys = [rule for rule in rules if "~" in rule]
    assert all("spark-b" in key or "sparkops" in key for key in keys)
    assert not [rule for rule in rules if rule.startswith("&") or rule.endswith("~*")]
    assert [key for key in keys if "sparkops" in key and not key.startswith("(")] == [
        "%W~sparkops", "%W~_kombu.binding.sparkops", "%W~_kombu.binding_permanent.sparkops"]


@pytest.mark.django_db
def test_a_migrated_database_has_no_schema_problem():
    assert runagent.schema_problems() == []


# --- for real (slow) -------------------------------------------------------------------------


@pytest.mark.slow
def test_bin_sparkops_agent_refuses_the_embedded_defaults(tmp_path):
    result = subprocess.run([str(SCRIPT), "agent"], capture_output=True, text=True, timeout=120,
                            env=subprocess_env(SPARKOPS_DATA_DIR=str(tmp_path / "data")))

    assert result.returncode == 1
    assert "an agent runs against the central SparkOps, not on its own" in result.stderr
    assert "DATABASE_URL" in result.stderr and "CELERY_BROKER_URL" in result.stderr
    assert not (tmp_path / "data" / "stack-state.json").exists()


@pytest.mark.slow
def test_bin_sparkops_agent_migrates_nothing_and_says_the_schema_is_not_current(
        tmp_path, postgres_url, redis_url):
    url = fresh_database(postgres_url, "agent_unmigrated")
    result = subprocess.run([str(SCRIPT), "agent"], capture_output=True, text=True, timeout=120,
                            env=subprocess_env(SPARKOPS_DATA_DIR=str(tmp_path / "data"),
                                               DATABASE_URL=url, CELERY_BROKER_URL=redis_url))

    assert result.returncode == 1
    assert "the central database lacks" in result.stderr
    assert "migrate it from the central SparkOps" in result.stderr
    with psycopg.connect(url) as database:
        tables = database.execute("select count(*) from information_schema.tables "
                                  "where table_schema = 'public'").fetchone()[0]
    assert tables == 0  # not even django_migrations: nothing was migrated


def _fake_proc(root: Path) -> Path:
    """A GB10's /proc for the agent: the fixture meminfo, its own kernel release, host name,
    VM settings and boot id."""
    files = {
        "meminfo": (FIXTURES / "procfs" / "meminfo-gb10").read_text(),
        "sys/kernel/osrelease": "6.11.0-1016-nvidia\n",
        "sys/kernel/hostname": "spark-b\n",
        "sys/kernel/random/boot_id": f"{uuid.uuid4()}\n",
        "sys/vm/swappiness": "60\n",
        "sys/vm/min_free_kbytes": "67584\n",
        "sys/vm/overcommit_memory": "0\n",
        "sys/vm/watermark_scale_factor": "10\n",
    }
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    if Path("/proc/pressure").is_dir():
        (root / "pressure").symlink_to("/proc/pressure")
    return root


class Fleet:
    """The session's PostgreSQL (a fresh database, migrated as the centre does) and Redis (a
    database of its own), and the processes started on them."""

    def __init__(self, tmp_path: Path, postgres_url: str, redis_url: str) -> None:
        self.tmp_path = tmp_path
        self.database_url = fresh_database(postgres_url, "fleet")
        self.broker_url = redis_url.rsplit("/", 1)[0] + "/7"
        self.processes: list[subprocess.Popen] = []

    def env(self, **extra: str) -> dict[str, str]:
        return subprocess_env(DATABASE_URL=self.database_url, CELERY_BROKER_URL=self.broker_url,
                              **extra)

    def migrate(self) -> None:
        subprocess.run([str(PROJECT / ".venv" / "bin" / "python"), "manage.py", "migrate",
                        "--noinput"], cwd=PROJECT, check=True, capture_output=True, timeout=300,
                       env=self.env(SPARKOPS_DATA_DIR=str(self.tmp_path / "migrate-data")))

    def start(self, name: str, command: str, **extra: str) -> subprocess.Popen:
        log = (self.tmp_path / f"{name}.log").open("w")
        process = subprocess.Popen([str(SCRIPT), command], env=self.env(**extra), stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.processes.append(process)
        return process

    def log(self, name: str) -> str:
        return (self.tmp_path / f"{name}.log").read_text()[-4000:]

    def query(self, sql: str, *params: object) -> tuple | None:
        with psycopg.connect(self.database_url) as database:
            return database.execute(sql, params).fetchone()

    def collections(self, node: str) -> int:
        return self.query("select count(*) from collectors_collection c join collectors_node n "
                          "on n.id = c.node_id where n.name = %s and c.ok", node)[0]

    def wait_for(self, condition, what: str, seconds: float = 180) -> object:
        deadline = time.monotonic() + seconds
        while True:
            for process in self.processes:
                assert process.poll() is None, f"a process exited before {what}:\n" + \
                    "\n".join(self.log(p.stem) for p in self.tmp_path.glob("*.log"))
            found = condition()
            if found:
                return found
            assert time.monotonic() < deadline, f"{what} within {seconds} s:\n" + \
                "\n".join(self.log(p.stem) for p in self.tmp_path.glob("*.log"))
            time.sleep(0.3)

    def stop(self) -> None:
        for process in reversed(self.processes):
            stop_group(process)
        redis.Redis.from_url(self.broker_url).flushdb()


def _queued(broker_url: str, queue: str) -> list[str]:
    """The names of the tasks waiting in ``queue`` (kombu's Redis list of that name)."""
    messages = redis.Redis.from_url(broker_url).lrange(queue, 0, -1)
    return [json.loads(message)["headers"]["task"] for message in messages]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_agent_registers_beats_and_takes_only_its_own_queue(tmp_path, postgres_url,
                                                               redis_url):
    fleet = Fleet(tmp_path, postgres_url, redis_url)
    fleet.migrate()
    agent_data = tmp_path / "agent-data"
    try:
        agent = fleet.start(
            "agent", "agent", SPARKOPS_NODE_NAME=AGENT, SPARKOPS_DATA_DIR=str(agent_data),
            SPARKOPS_PROCFS=str(_fake_proc(tmp_path / "proc")),
            SPARKOPS_SYSFS=str(FIXTURES / "sysfs" / "dgx-spark"),
            SPARKOPS_HEARTBEAT_SECONDS="1", SPARKOPS_COLLECT_INTERVAL="2")

        # It registers its node: the row, MemTotal from its /proc root, the facts.
        row = fleet.wait_for(lambda: fleet.query(
            "select hostname, mem_total_bytes, facts, heartbeat_at from collectors_node "
            "where name = %s and agent_started_at is not null and heartbeat_at is not null",
            AGENT), "the agent's registration")
        hostname, mem_total, facts, first_beat = row
        assert hostname == "spark-b" and mem_total == GB10_MEMTOTAL_BYTES
        assert facts["items"]["kernel"]["value"] == "6.11.0-1016-nvidia"
        assert facts["items"]["swappiness"]["value"] == "60"
        assert {port["name"] for port in facts["interconnect"]} >= {"enp1s0f0np0",
                                                                    "rocep1s0f0/1"}
        # It beats, every second here.
        fleet.wait_for(lambda: fleet.query(
            "select 1 from collectors_node where name = %s and heartbeat_at > %s",
            AGENT, first_beat), "a second heartbeat")

        # Work for another node and for the centre stays queued; its own is done.
        probe = Celery("probe", broker=fleet.broker_url, set_as_current=False)
        try:
            probe.send_task(COLLECT_HOST_MEMORY, args=(ELSEWHERE,), queue=node_queue(ELSEWHERE))
            probe.send_task(ROLLUP_SAMPLES, queue="sparkops")
            probe.send_task(COLLECT_HOST_MEMORY, args=(AGENT,), queue=node_queue(AGENT))
        finally:
            probe.close()
        # The collection is stored before the agent hands its evaluation over: both awaited.
        fleet.wait_for(lambda: fleet.collections(AGENT) >= 1
                       and EVALUATE_ALERTS in _queued(fleet.broker_url, "sparkops"),
                       "the agent's own collection and the evaluation it hands over")
        assert _queued(fleet.broker_url, node_queue(ELSEWHERE)) == [COLLECT_HOST_MEMORY]
        # The centre's work waits for the centre: the probe, and the alert evaluation the
        # agent's collection handed over.
        assert sorted(_queued(fleet.broker_url, "sparkops")) == [ROLLUP_SAMPLES, EVALUATE_ALERTS]
        assert fleet.query("select 1 from collectors_node where name = %s", ELSEWHERE) is None
        assert fleet.collections(AGENT) == 1  # the agent runs no beat of its own

        # Supervised as the stack's worker is: one worker, its liveness file, the state file.
        state = json.loads((agent_data / "stack-state.json").read_text())
        assert state["supervisor"]["pid"] == agent.pid
        assert [p["name"] for p in state["processes"]] == ["worker"]
        assert (agent_data / "worker.alive").exists()
        assert "agent of node agent-test-b is starting" in fleet.log("agent")
        assert "node agent-test-b registered" in fleet.log("agent")

        # The central stack's beat schedules the agent's collections on the agent's queue.
        fleet.start("central", "start", SPARKOPS_NODE_NAME=CENTRAL,
                    SPARKOPS_DATA_DIR=str(tmp_path / "central-data"),
                    SPARKOPS_BIND=f"127.0.0.1:{free_port()}",
                    SPARKOPS_ADMIN_PASSWORD="fleet-test-password-1",
                    SPARKOPS_COLLECT_INTERVAL="2")
        fleet.wait_for(lambda: fleet.collections(AGENT) >= 3,
                       "collections of the agent's node scheduled by the central beat")
        fleet.wait_for(lambda: fleet.collections(CENTRAL) >= 1, "the central node's own")
        assert _queued(fleet.broker_url, node_queue(ELSEWHERE)) == [COLLECT_HOST_MEMORY]
    finally:
        fleet.stop()
    assert not (agent_data / "stack-state.json").exists()  # the supervisor stopped cleanly


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_agent_runs_on_the_least_privilege_it_prints(tmp_path, postgres_url, redis_url):
    """The PostgreSQL role and the Redis ACL user of ``runagent --least-privilege`` are all an
    agent needs: it registers, beats, collects and hands the centre its alert evaluation, and
    neither server refuses it anything; what they refuse it stays refused."""
    node = f"lp-{uuid.uuid4().hex[:6]}"
    fleet = Fleet(tmp_path, postgres_url, redis_url)
    fleet.broker_url = redis_url.rsplit("/", 1)[0] + "/8"
    fleet.migrate()
    database = fleet.database_url.rsplit("/", 1)[1]
    with psycopg.connect(fleet.database_url, autocommit=True) as owner:
        for statement in runagent.database_grants(node, database):
            owner.execute(statement)
        owner.execute(f"ALTER ROLE {runagent.node_role(node)} PASSWORD 'node-db-password'")
    admin = redis.Redis.from_url(fleet.broker_url)
    admin.execute_command("ACL", "SETUSER", node, "reset", "on", ">node-broker-password",
                          *runagent.broker_acl_rules(node))
    admin.execute_command("ACL", "LOG", "RESET")
    server = fleet.broker_url.split("://", 1)[1]
    node_env = {
        "DATABASE_URL": fleet.database_url.replace(
            "postgres@", f"{runagent.node_role(node)}:node-db-password@"),
        "CELERY_BROKER_URL": f"redis://{node}:node-broker-password@{server}",
    }
    try:
        probe = Celery("probe", broker=fleet.broker_url, set_as_current=False)
        try:
            for task in (COLLECT_HOST_MEMORY, COLLECT_ENGINES, COLLECT_KERNEL_LOG):
                probe.send_task(task, args=(node,), queue=node_queue(node))
        finally:
            probe.close()
        agent = subprocess.Popen(
            [str(SCRIPT), "agent"], stdout=(tmp_path / "agent.log").open("w"),
            stderr=subprocess.STDOUT, start_new_session=True,
            env=subprocess_env(**node_env, SPARKOPS_NODE_NAME=node,
                               SPARKOPS_DATA_DIR=str(tmp_path / "agent-data"),
                               SPARKOPS_PROCFS=str(_fake_proc(tmp_path / "proc")),
                               SPARKOPS_HEARTBEAT_SECONDS="1", SPARKOPS_COLLECT_INTERVAL="2"))
        fleet.processes.append(agent)
        fleet.wait_for(lambda: fleet.query(
            "select 1 from collectors_node where name = %s and heartbeat_at is not null "
            "and gpu_read_at is not null and facts <> '{}'", node)
            and fleet.collections(node) >= 1 and not admin.llen(node_queue(node))
            # stored before the agent hands its evaluation over: that is awaited too
            and _queued(fleet.broker_url, "sparkops"),
            "the node's registration, beats, its three tasks and the evaluation it hands over")
        assert _queued(fleet.broker_url, "sparkops") == [EVALUATE_ALERTS]
        stop_group(agent)
        log = (tmp_path / "agent.log").read_text()
        assert "raised unexpected" not in log and "permission denied" not in log, log[-3000:]
        assert admin.execute_command("ACL", "LOG") == []
        as_node = redis.Redis.from_url(node_env["CELERY_BROKER_URL"])
        for refused in (lambda: as_node.lrange("sparkops", 0, -1),
                        lambda: as_node.lpush(node_queue("another-node"), "x"),
                        lambda: as_node.hgetall("unacked"),
                        lambda: as_node.publish("/0.celery.pidbox", "x")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                refused()
        with psycopg.connect(node_env["DATABASE_URL"]) as as_role, \
                pytest.raises(psycopg.errors.InsufficientPrivilege):
            as_role.execute("select password from auth_user")
    finally:
        fleet.stop()
        admin.execute_command("ACL", "DELUSER", node)
