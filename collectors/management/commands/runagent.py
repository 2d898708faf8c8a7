"""Run a fleet node's agent: this node's Celery worker alone, against the central SparkOps.

``bin/sparkops agent`` ends here. A fleet is one central SparkOps (``bin/sparkops start``: web,
worker, beat, on PostgreSQL and Redis) and, on every other GB10, an agent: the Celery worker
of the queue ``node.<SPARKOPS_NODE_NAME>`` and of nothing else (no web server, no beat, not the
central ``sparkops`` or ``notify`` queues). It runs that node's collectors and its restarts'
runbook, which are routed to that queue, and stores what it reads in the central database. Its
worker registers the node and beats (``collectors.registration``, from ``worker_ready``); the
central beat then schedules the node's collections (``collectors.fleetbeat``).

Before it starts, the agent refuses, in words, what would make it a node on its own:

* the embedded defaults: a SQLite database (no central SparkOps reads it) or the file-system
  broker (no central beat reaches it); ``DATABASE_URL`` and ``CELERY_BROKER_URL`` must name
  the centre's PostgreSQL and Redis;
* a database that does not answer, or whose schema is not this release's: the agent migrates
  nothing (the centre does, ``manage.py migrate``), so it says which migrations are missing, or
  that the database is newer than this release.

Then it replaces itself (``os.execv``) with the same plain supervisor as ``runstack``
(``sparkops/supervise.py``), with the worker built by ``runstack.worker_command``, the same
environment, liveness heartbeat and state file (``<data dir>/stack-state.json``, which
``bin/sparkops status`` reads). The worker runs with ``--fleet-node`` and without Celery's event
heartbeats: no remote control, and its unacknowledged messages under its own node's keys
(``sparkops.stackworker.FleetNode``), so that its broker user shares as little as it can.
The data directory keeps what is this node's alone: the flight recorder, the kernel log's
position, the worker's liveness file.

``--least-privilege`` prints, instead, what the centre's admin runs to give this node its own
credentials (``database_grants``, ``broker_acl_rules``): a PostgreSQL role allowed only the
node side's tables, and a Redis ACL user allowed only the commands kombu's Redis transport uses
for this worker and the keys of this node's queue, plus write-only access to the central queue
it hands alert evaluations to (docs/DEPLOY.md, "A fleet", says what stays shared and why).

Defaults: supervisor (~11 MiB) + one Celery worker with 8 threads (~85 MiB).
"""

from __future__ import annotations

import os
import sys

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor

from collectors.management.commands.runstack import (
    add_worker_arguments,
    stack_env,
    stack_heartbeats,
    state_file,
    supervisor_argv,
    worker_command,
)
from sparkops.backends import (
    check_database,
    describe_broker,
    describe_database,
    is_file_broker,
    is_sqlite,
)
from sparkops.celery import CENTRAL_QUEUE, agent_queues, fleet_node_unacked_keys, node_queue
from sparkops.version import VERSION

# How many missing migrations the refusal names (the rest are counted).
NAMED_MIGRATIONS = 5

# --- least privilege ---------------------------------------------------------------------------
# What the node side does in the central database (collections, engines, the kernel log, the
# registration and heartbeat, a restart's runbook and its audit rows), table by table; checked
# by tests/test_agent.py with an agent running under exactly these grants. Nothing else: not
# the users, sessions, channels (their secrets), alerts or the audit log's contents.
NODE_TABLES_READ = (
    "django_migrations", "collectors_modelarchitecture", "dashboard_restartwindow",
    "dashboard_rulesetting",
)
NODE_TABLES_WRITTEN = (  # read, inserted into and updated, never deleted from
    "collectors_node", "collectors_collection", "collectors_hostreading", "collectors_engine",
    "collectors_enginestart", "collectors_enginereading", "collectors_gpusample",
    "collectors_event", "collectors_ledgerchange", "dashboard_restart", "dashboard_restartstep",
)
# Inserted into only; INSERT ... RETURNING "id" needs that one column readable.
NODE_TABLES_APPENDED = ("dashboard_auditentry",)
# kombu's separator between a queue's name and its priority (its lists for priorities 3, 6, 9).
KOMBU_PRIORITY_SEPARATOR = "\x06\x16"
_SEPARATOR_IN_BASH = "$'\\x06\\x16'"
# The Redis commands kombu's transport issues for a worker that consumes one queue, publishes
# to another, acknowledges late (its unacked hash, index and restore mutex, released by a
# script) and runs no remote control or event heartbeats (``--fleet-node``).
BROKER_COMMANDS = (
    "hello", "auth", "ping", "select", "brpop", "llen", "lpush", "rpush", "multi", "exec",
    "watch", "unwatch", "discard", "sadd", "hset", "hget", "hdel", "zadd", "zrem", "zrange",
    "set", "get", "del", "evalsha", "script|load", "script|exists",
)


def node_role(node: str) -> str:
    """The PostgreSQL role of ``node`` (a slug: '-' is not a plain identifier's)."""
    return "sparkops_node_" + node.replace("-", "_")


def database_grants(node: str, database: str = "sparkops") -> list[str]:
    """The SQL that gives ``node``'s role the node side's privileges, one statement each (its
    password is set apart, ``ALTER ROLE ... PASSWORD``)."""
    role = node_role(node)
    read = ", ".join(NODE_TABLES_READ + NODE_TABLES_WRITTEN)
    return [
        f"CREATE ROLE {role} LOGIN",
        f'GRANT CONNECT ON DATABASE "{database}" TO {role}',
        f"GRANT USAGE ON SCHEMA public TO {role}",
        f"GRANT SELECT ON {read} TO {role}",
        f"GRANT INSERT, UPDATE ON {', '.join(NODE_TABLES_WRITTEN)} TO {role}",
        *[f"GRANT INSERT, SELECT (id) ON {table} TO {role}" for table in NODE_TABLES_APPENDED],
    ]


def broker_acl_rules(node: str, central_queue: str = CENTRAL_QUEUE) -> list[str]:
    """``ACL SETUSER <user>`` rules (after the user and its password) for ``node``'s agent: the
    commands of ``BROKER_COMMANDS`` on its queue (and its priority lists), that queue's binding
    sets and its own unacknowledged-message keys; write-only on the central queue and its
    binding sets, with its length readable through a selector. No channel, no other key."""
    separator = KOMBU_PRIORITY_SEPARATOR
    queue = node_queue(node)
    own = [queue, f"{queue}{separator}*", f"_kombu.binding.{queue}",
           f"_kombu.binding_permanent.{queue}", *fleet_node_unacked_keys(node).values()]
    central = [central_queue, f"_kombu.binding.{central_queue}",
               f"_kombu.binding_permanent.{central_queue}"]
    return ["resetchannels", "-@all", *[f"+{command}" for command in BROKER_COMMANDS],
            *[f"~{key}" for key in own], *[f"%W~{key}" for key in central],
            f"(+llen ~{central_queue} ~{central_queue}{separator}*)"]


def least_privilege_text(node: str, database: str) -> list[str]:
    """What ``--least-privilege`` prints: the SQL, then a redis-cli command (bash quoting)."""
    def shell_word(rule: str) -> str:
        return _SEPARATOR_IN_BASH.join(f"'{part}'" for part in rule.split(KOMBU_PRIORITY_SEPARATOR))

    return [
        f"-- PostgreSQL, as the owner of the central database {database!r} (psql):",
        *[f"{statement};" for statement in database_grants(node, database)],
        f"ALTER ROLE {node_role(node)} PASSWORD 'choose-a-password';",
        "",
        "# Redis, as its admin on the centre (bash), then ACL SAVE to keep it in the aclfile;",
        "# PASSWORD_SHA256: printf %s 'the password' | sha256sum",
        " ".join(["redis-cli", "ACL", "SETUSER", node, "reset", "on", "'#PASSWORD_SHA256'",
                  *[shell_word(rule) for rule in broker_acl_rules(node)]]),
    ]


def embedded_defaults(database: dict, broker_url: str) -> list[str]:
    """Why an agent on this database and broker would not be part of a fleet, one sentence
    each; empty when both are central (anything but SQLite and the file-system broker)."""
    reasons = []
    if is_sqlite(database):
        reasons.append(
            f"the database is SQLite ({database['NAME']}), which only this node would read: "
            "set DATABASE_URL to the central SparkOps' PostgreSQL "
            "(postgresql://USER:PASSWORD@HOST:5432/sparkops?sslmode=verify-full)")
    if is_file_broker(broker_url):
        reasons.append(
            f"the broker is the {describe_broker(broker_url)}, which the central beat never "
            "reaches: set CELERY_BROKER_URL to the central SparkOps' Redis "
            "(rediss://USER:PASSWORD@HOST:6379/0?ssl_cert_reqs=required)")
    return reasons


def schema_problems(alias: str = "default") -> list[str]:
    """Why the database's schema is not this release's, one sentence each; empty when it is
    current. Reads ``django_migrations`` and changes nothing. DatabaseError when the database
    cannot be read."""
    executor = MigrationExecutor(connections[alias])
    loader = executor.loader
    problems = []
    missing = [f"{migration.app_label}.{migration.name}"
               for migration, _ in executor.migration_plan(loader.graph.leaf_nodes())]
    if missing:
        named = ", ".join(missing[:NAMED_MIGRATIONS])
        more = f" and {len(missing) - NAMED_MIGRATIONS} more" if len(missing) > \
            NAMED_MIGRATIONS else ""
        problems.append(
            f"the central database lacks {len(missing)} migration(s) of this release ({named}"
            f"{more}): migrate it from the central SparkOps (bin/sparkops start does, or "
            "manage.py migrate with its DATABASE_URL); an agent migrates nothing")
    unknown = sorted(f"{app}.{name}" for app, name in loader.applied_migrations
                     if app in loader.migrated_apps and (app, name) not in loader.graph.nodes)
    if unknown:
        problems.append(
            f"the central database has {len(unknown)} migration(s) this release does not know "
            f"({', '.join(unknown[:NAMED_MIGRATIONS])}): the centre runs a newer SparkOps; "
            f"upgrade this node's SparkOps ({VERSION}) to the centre's release")
    return problems


def agent_commands(node: str, *, worker_pool: str = "threads",
                   worker_concurrency: int | None = None,
                   log_level: str = "INFO") -> dict[str, list[str]]:
    """The agent's one process, by name: the worker of ``node``'s queue, without beat, event
    heartbeats or remote control (``worker_command``'s ``fleet_node``)."""
    return {"worker": worker_command(node=node, queues=agent_queues(node),
                                     worker_pool=worker_pool,
                                     worker_concurrency=worker_concurrency, beat=False,
                                     log_level=log_level, fleet_node=True)}


def summary_lines(node: str) -> list[str]:
    """The agent's start-up summary, one line each."""
    level = settings.SPARKOPS_LOG_LEVEL
    return [
        f"SparkOps {VERSION} agent of node {node} is starting (the worker of queue "
        f"{node_queue(node)} only: no web server, no beat); Ctrl-C stops it.",
        f"  database: {describe_database()}",
        f"  broker:   {describe_broker()}",
        f"  data:     {settings.DATA_DIR} (this node's flight recorder and kernel-log position)",
        f"  logs:     {level}: failures, registration and heartbeat trouble"
        + ("; SPARKOPS_LOG_LEVEL=DEBUG adds every task" if level == "INFO" else ""),
    ]


class Command(BaseCommand):
    help = ("Run this node's agent for a fleet: its Celery worker on queue node.<name> only, "
            "against the central database and broker, supervised (see the module's docstring).")

    def add_arguments(self, parser: CommandParser) -> None:
        add_worker_arguments(parser)
        parser.add_argument("--least-privilege", action="store_true",
                            help="print the PostgreSQL grants and the Redis ACL user this node "
                                 "needs, for the centre's admin, and exit")

    def handle(self, *args, **options) -> None:
        if options["least_privilege"]:
            database = settings.DATABASES["default"].get("NAME") or "sparkops"
            if is_sqlite():
                database = "sparkops"
            for line in least_privilege_text(settings.SPARKOPS_NODE_NAME, str(database)):
                self.stdout.write(line)
            return
        reasons = embedded_defaults(settings.DATABASES["default"], settings.CELERY_BROKER_URL)
        if reasons:
            raise CommandError("an agent runs against the central SparkOps, not on its own: "
                               + "; and ".join(reasons) + ".")
        try:
            problems = schema_problems()
        except DatabaseError:
            # The check's own words: one line, the password masked.
            raise CommandError(f"the central database cannot be read: "
                               f"{check_database().reason}") from None
        finally:
            connections.close_all()
        if problems:
            raise CommandError("; and ".join(problems) + ".")
        node = settings.SPARKOPS_NODE_NAME
        commands = agent_commands(node, worker_pool=options["worker_pool"],
                                  worker_concurrency=options["worker_concurrency"],
                                  log_level=settings.SPARKOPS_LOG_LEVEL)
        env = {"worker": stack_env(os.environ)["worker"]}
        for line in summary_lines(node):
            self.stdout.write(line)
        self.stdout.flush()
        sys.stderr.flush()
        argv = supervisor_argv(commands, env, stack_heartbeats(), state_file())
        os.execv(argv[0], argv)
