"""Run the web server and the Celery worker (with beat) of this node: one process, or several.

``bin/sparkops start`` ends here. This command loads Django to read the settings and run the
system checks, prints the start-up summary, and then replaces itself (same pid) with the stack
in the layout ``--stack`` names (default ``SPARKOPS_STACK``, itself ``one-process``):

* **one-process** (the default): ``python -m sparkops.onestack``, one Django process holding the
  Celery worker of this node (main thread; thread pool, its queues, beat as a thread) and
  waitress (``--web-threads`` threads, WhiteNoise as below) in a thread of its own, with a
  watchdog thread. It is its own supervisor: when the web server's thread ends or its loop
  stalls, when the beat thread ends or when the worker stops touching its liveness file for
  ``SPARKOPS_WORKER_LIVENESS_TIMEOUT`` seconds, it exits 1, for its own supervisor (systemd's
  ``Restart=on-failure``, a container's restart policy) to start it again; SIGTERM and Ctrl-C
  stop it cleanly and it exits 0 (see ``sparkops/onestack.py``). No plain-Python supervisor
  wraps it, even at a terminal: that would cost another process (about 11 MiB) to restart what
  systemd and containers restart already; at a terminal, the admin sees it exit and why.
  ``--web-workers`` and ``--worker-pool prefork`` need more processes than one, and are refused.
* **processes** (``SPARKOPS_STACK=processes``): the layout below, each part a process of its
  own under ``sparkops/supervise.py``, a plain-Python supervisor that imports nothing of Django
  or the project. A process that exits is restarted with a growing delay (1 s doubling to
  60 s); the worker also touches a liveness file in the data directory, and one that stops
  touching it for ``SPARKOPS_WORKER_LIVENESS_TIMEOUT`` seconds (stopped, frozen) is killed and
  restarted. Only a process that crashes again and again (five times in five minutes) stops the
  whole stack, which then exits non-zero, so its own supervisor (systemd, a container) sees the
  failure. A SIGSTOP of the whole one process is what only this layout's supervisor notices.

The layout is a setting rather than only an option because the service unit and the image run
``bin/sparkops start`` with fixed arguments: an admin switches in the environment file (or
compose's ``env_file``), as for every other setting, without editing them.

The parts are chosen for memory: every Django process costs about 55–85 MiB resident, and the
work is I/O bound (sleeps, sockets, SQLite), so the stack runs as few of them as it can (in the
processes layout; the one process runs the same worker, and waitress in place of gunicorn):

* **web**: gunicorn, one worker with ``--web-threads`` threads (gthread; static files served
  by WhiteNoise). Each thread has its own database connection, as Django does per thread.
  ``--web-workers N`` adds processes (each a full copy of Django). gunicorn's control socket is
  off: its default path is one per user (``~/.gunicorn/gunicorn.ctl``), so two stacks of one
  user would share it, and one stopping would remove the other's.
* **worker**: the Celery worker of this node (its queue ``node.<name>`` and the central
  ``sparkops`` queue) with a pool of ``--worker-concurrency`` threads (default 8). A host-memory
  collection holds a slot for most of its 5 s interval and a planned restart for its whole
  runbook (~10 min), so eight leave room for a late collection, engine scrapes, alerts, mail,
  roll-up and prune at once. Celery's Django fixup closes each thread's database connections
  around every task. ``--worker-pool prefork`` runs the tasks in processes instead (default
  concurrency 4, about 75 MiB each), for tasks that need isolation from each other.
* **beat** runs as a thread of the worker (``sparkops.stackworker``); ``--no-beat`` leaves it
  out, for a fleet where only the central host runs beat. Its scheduler
  (``collectors.fleetbeat``) also publishes the collections of every fleet node whose agent
  registered it.

``manage.py runagent`` (``bin/sparkops agent``, a fleet node's side) runs the worker alone, on
its node's queue only, built by the same ``worker_command`` and supervised the same way.

What runs is kept in ``<data dir>/stack-state.json`` by the supervisor (its pid, each process's
pid and start; removed when the stack stops), or by the one process (its own pid and start,
``"layout": "one-process"``), for ``manage.py status`` and ``restore`` (``sparkops.stackstate``).

Logs: before the processes start, a summary (``sparkops.startup``: release, address, node,
database, broker, where the generated admin password is while it is still valid). Then only what
an admin needs: failures, deliveries, the worker's "ready". The web server (gunicorn, or
waitress in the one process) logs warnings and errors, without an access log; the worker runs
without Celery's banner and with ``--quiet-tasks`` (no line per task).
``SPARKOPS_LOG_LEVEL=DEBUG`` brings the banner, the access log and the per-task lines back.

Every Django process (the one, or both) gets ``MALLOC_ARENA_MAX=2`` unless it is set: glibc
would give each allocating thread an arena of its own (up to 8 per core), each keeping what it
freed.

Defaults, resident after a minute with the overview open (RSS sum): the one process ~95 MiB;
the processes layout ~200 MiB (supervisor ~12 + gunicorn master ~24 and worker ~76 + Celery
worker with beat ~89), against about 660 MiB for the layout before it (Django supervisor, 2 sync
web workers, 4 prefork children, a separate beat).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from sparkops import stackstate, supervise
from sparkops.address import bind_argument
from sparkops.celery import worker_queues
from sparkops.startup import summary_lines

SUPERVISOR = Path(supervise.__file__).resolve()
WORKER_POOLS = ("threads", "prefork")
DEFAULT_WORKER_CONCURRENCY = {"threads": 8, "prefork": 4}
# A worker that has not touched its liveness file this long after its start is wedged in its
# start-up (a Django import on a busy node takes seconds, not minutes).
LIVENESS_STARTUP_SECONDS = 180.0


def liveness_file() -> Path:
    """The file the stack's worker touches to show it is alive (in the data directory)."""
    return stackstate.liveness_file(Path(settings.DATA_DIR))


def state_file() -> Path:
    """The file the supervisor keeps what runs in (in the data directory)."""
    return stackstate.state_file(Path(settings.DATA_DIR))


def liveness_interval(timeout: float) -> float:
    """Seconds between two touches: a few per timeout, so one late tick is not a kill."""
    return min(5.0, timeout / 4)


def worker_arguments(*, node: str, queues: list[str], worker_pool: str = "threads",
                     worker_concurrency: int | None = None, beat: bool = False,
                     log_level: str = "INFO", fleet_node: bool = False) -> list[str]:
    """The arguments of ``celery worker`` (``[--quiet] worker ...``, run by
    ``sparkops.stackworker.run_worker``) that run a node's worker consuming ``queues``, with
    beat in it when ``beat``: the stack's worker (``sparkops.runworker``), the agent's
    (``runagent``) and the one process's (``sparkops.onestack``) alike. ``log_level`` is
    ``SPARKOPS_LOG_LEVEL``: below DEBUG, no line per task. ``fleet_node`` (the agent) leaves
    out Celery's event heartbeats and remote control, which nothing of SparkOps reads, and keeps
    its unacknowledged messages under its own keys (``sparkops.stackworker.FleetNode``), so
    that the node's broker user shares as little as kombu allows with other nodes."""
    concurrency = worker_concurrency or DEFAULT_WORKER_CONCURRENCY[worker_pool]
    verbose = log_level == "DEBUG"
    worker = [
        *([] if verbose else ["--quiet"]),
        "worker", "--loglevel", log_level,
        *([] if verbose else ["--quiet-tasks"]),
        "--queues", ",".join(queues), "--hostname", f"{node}@%h",
        "--pool", worker_pool, "--concurrency", str(concurrency),
        "--without-mingle", "--without-gossip",
        "--liveness-file", str(liveness_file()),
        "--liveness-interval",
        f"{liveness_interval(settings.SPARKOPS_WORKER_LIVENESS_TIMEOUT):g}",
    ]
    if beat:
        worker += ["--beat-thread", "--schedule-filename", settings.CELERY_BEAT_SCHEDULE_FILENAME]
    if fleet_node:
        worker += ["--without-heartbeat", "--fleet-node"]
    return worker


def worker_command(**arguments) -> list[str]:
    """The command line of a node's Celery worker as a process of its own (``runstack
    --stack processes``, ``runagent``); ``arguments`` as ``worker_arguments``'."""
    return [sys.executable, "-m", "sparkops.runworker", *worker_arguments(**arguments)]


def stack_commands(*, bind: str, node: str, web_workers: int = 1, web_threads: int = 4,
                   worker_pool: str = "threads", worker_concurrency: int | None = None,
                   beat: bool = True, log_level: str = "INFO") -> dict[str, list[str]]:
    """The command line of each process of the stack, by name. ``log_level`` is
    ``SPARKOPS_LOG_LEVEL``: below DEBUG, no line per request or per task."""
    python = sys.executable
    verbose = log_level == "DEBUG"
    worker = worker_command(node=node, queues=worker_queues(node), worker_pool=worker_pool,
                            worker_concurrency=worker_concurrency, beat=beat,
                            log_level=log_level)
    web = [
        python, "-m", "gunicorn", "sparkops.wsgi:application", "--bind", bind,
        "--workers", str(web_workers), "--worker-class", "gthread",
        "--threads", str(web_threads), "--graceful-timeout", "10", "--no-control-socket",
        # gunicorn's INFO is its start-up (the summary says it) and a line per worker boot.
        "--log-level", "info" if verbose else "warning",
        *(["--access-logfile", "-"] if verbose else []),
    ]
    return {"web": web, "worker": worker}


def one_process_command(*, bind: str, node: str, web_threads: int = 4, beat: bool = True,
                        worker_concurrency: int | None = None,
                        log_level: str = "INFO") -> list[str]:
    """The command line of the one-process stack (``sparkops.onestack``): waitress with
    ``web_threads`` threads on ``bind`` and the node's worker (thread pool, with beat in it
    when ``beat``), watched with the supervisor's heartbeat bounds (``stack_heartbeats``)."""
    heartbeat = stack_heartbeats()["worker"]
    worker = worker_arguments(node=node, queues=worker_queues(node), worker_pool="threads",
                              worker_concurrency=worker_concurrency, beat=beat,
                              log_level=log_level)
    return [
        sys.executable, "-m", "sparkops.onestack", "--bind", bind,
        "--web-threads", str(web_threads),
        *(["--access-log"] if log_level == "DEBUG" else []),
        "--name", "stack (web, worker" + (" with beat" if beat else "") + ", one process)",
        "--state-file", str(state_file()),
        "--liveness-file", heartbeat["path"],
        "--liveness-timeout", f"{heartbeat['timeout']:g}",
        "--liveness-startup", f"{heartbeat['startup']:g}",
        "--watch-interval", f"{liveness_interval(heartbeat['timeout']):g}",
        "--", *worker,
    ]


def stack_env(environ: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """What each process's environment adds to this one's."""
    # glibc gives each thread that allocates its own malloc arena (up to 8 per core), and each
    # arena keeps what it freed: two are plenty for processes whose threads mostly wait.
    threaded = {} if "MALLOC_ARENA_MAX" in environ else {"MALLOC_ARENA_MAX": "2"}
    # This command has just run the system checks; the worker need not run them again (they
    # import every view and URL module, which the worker never uses).
    return {"web": threaded, "worker": {**threaded, "CELERY_SKIP_CHECKS": "1"}}


def stack_heartbeats() -> dict[str, dict[str, object]]:
    """The heartbeat the supervisor watches, by process (see ``sparkops/supervise.py``)."""
    return {"worker": {"path": str(liveness_file()),
                       "timeout": settings.SPARKOPS_WORKER_LIVENESS_TIMEOUT,
                       "startup": max(LIVENESS_STARTUP_SECONDS,
                                      settings.SPARKOPS_WORKER_LIVENESS_TIMEOUT)}}


def supervisor_argv(commands: dict[str, list[str]],
                    env: dict[str, dict[str, str]] | None = None,
                    heartbeats: dict[str, dict[str, object]] | None = None,
                    state: Path | None = None) -> list[str]:
    """The command line that runs ``commands`` under ``sparkops/supervise.py``, keeping what
    runs in ``state`` when given."""
    spec: dict[str, object] = {
        "processes": [{"name": name, "argv": argv, "env": (env or {}).get(name, {})}
                      for name, argv in commands.items()]}
    for entry in spec["processes"]:
        if entry["name"] in (heartbeats or {}):
            entry["heartbeat"] = heartbeats[entry["name"]]
    if state is not None:
        spec["state"] = str(state)
    # -P: the script's folder (sparkops/) is not put on sys.path, so nothing there can shadow a
    # module of the standard library.
    return [sys.executable, "-P", str(SUPERVISOR), json.dumps(spec)]


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def add_worker_arguments(parser: CommandParser) -> None:
    """The worker's options, ``--worker-pool`` and ``--worker-concurrency`` (``runstack`` and
    ``runagent`` alike)."""
    parser.add_argument("--worker-pool", choices=WORKER_POOLS, default="threads",
                        help="Celery pool: threads (default) or prefork (one process per slot)")
    parser.add_argument("--worker-concurrency", type=_positive, default=None,
                        help="Celery pool slots (default 8 threads, or 4 prefork processes)")


class Command(BaseCommand):
    help = ("Run the web server and the Celery worker of this node with beat in it: one process "
            "(default) or gunicorn and the worker under a supervisor (see the module's "
            "docstring).")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--bind", type=bind_argument, default=settings.SPARKOPS_BIND,
                            help="address of the web server, HOST or HOST:PORT (SPARKOPS_BIND)")
        parser.add_argument("--stack", choices=stackstate.LAYOUTS, default=settings.SPARKOPS_STACK,
                            help="one-process (default): web server and worker in one process; "
                                 "processes: gunicorn and the worker under a supervisor "
                                 "(SPARKOPS_STACK)")
        parser.add_argument("--web-workers", type=_positive, default=None,
                            help="gunicorn worker processes (default 1; --stack processes)")
        parser.add_argument("--web-threads", type=_positive, default=4,
                            help="web server threads (per gunicorn worker; default 4)")
        add_worker_arguments(parser)
        parser.add_argument("--no-beat", action="store_true",
                            help="for a fleet: only one node (or the central host) runs beat")

    def handle(self, *args, **options) -> None:
        one_process = options["stack"] == stackstate.ONE_PROCESS
        if one_process:
            wrong = [option for option, value in (("--web-workers", options["web_workers"]),
                                                  ("--worker-pool prefork",
                                                   options["worker_pool"] == "prefork"))
                     if value]
            if wrong:
                raise CommandError(f"{' and '.join(wrong)}: more processes than one; run "
                                   "them with --stack processes (SPARKOPS_STACK=processes)")
        parts = "web, worker" + ("" if options["no_beat"] else " with beat")
        for line in summary_lines(bind=options["bind"], parts=parts):
            self.stdout.write(line)
        self.stdout.flush()
        sys.stderr.flush()
        env = stack_env(os.environ)
        if one_process:
            argv = one_process_command(
                bind=options["bind"], node=settings.SPARKOPS_NODE_NAME,
                web_threads=options["web_threads"], beat=not options["no_beat"],
                worker_concurrency=options["worker_concurrency"],
                log_level=settings.SPARKOPS_LOG_LEVEL)
            os.execve(argv[0], argv, {**os.environ, **env["worker"]})
        commands = stack_commands(
            bind=options["bind"], node=settings.SPARKOPS_NODE_NAME,
            web_workers=options["web_workers"] or 1, web_threads=options["web_threads"],
            worker_pool=options["worker_pool"], worker_concurrency=options["worker_concurrency"],
            beat=not options["no_beat"], log_level=settings.SPARKOPS_LOG_LEVEL,
        )
        argv = supervisor_argv(commands, env, stack_heartbeats(), state_file())
        os.execv(argv[0], argv)
