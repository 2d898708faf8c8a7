"""The Celery application and its beat schedule, kept in code.

Node-local work (collection and restarts) goes to the queue ``node.<name>`` that only the
worker on that node consumes; fleet-wide housekeeping (roll-up, prune, alert evaluation) goes to
``sparkops``; notification delivery goes to ``notify``, so that waiting on receivers is kept
apart from collection and evaluation (a fleet can give it a worker of its own; the stack's one
worker consumes all three, see ``worker_queues``).
"""

from __future__ import annotations

import os

from celery import Celery
from celery.signals import task_postrun, task_prerun

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sparkops.settings")

app = Celery("sparkops")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@task_prerun.connect
@task_postrun.connect
def _close_old_connections(**_: object) -> None:
    """Django's request rule around every task (``CELERY_DB_REUSE_MAX`` keeps Celery's fixup
    from closing every connection): close this thread's connections that broke or outlived
    ``CONN_MAX_AGE``, keep the rest."""
    from django.db import close_old_connections

    close_old_connections()


# Every task's name, pinned: a message carries the name, and messages queued before an upgrade
# must still find their task, wherever its module moved. The names are the module paths the
# tasks had when they were first deployed; each task's decorator takes its name from here.
COLLECT_HOST_MEMORY = "collectors.tasks.collect_host_memory"
COLLECT_ENGINES = "collectors.tasks.collect_engines"
COLLECT_KERNEL_LOG = "collectors.tasks.collect_kernel_log"
ROLLUP_SAMPLES = "collectors.tasks.rollup_samples"
PRUNE_SAMPLES = "collectors.tasks.prune_samples"
EVALUATE_ALERTS = "dashboard.alerting.tasks.evaluate_alerts"
DELIVER_NOTIFICATIONS = "dashboard.notify.tasks.deliver_notifications"
DISPATCH_DUE_RESTARTS = "dashboard.restarts.tasks.dispatch_due_restarts"
RECOVER_INTERRUPTED_RESTARTS = "dashboard.restarts.tasks.recover_interrupted_restarts"
RUN_RESTART = "dashboard.restarts.tasks.run_restart_task"
WATCH_NODES = "dashboard.alerting.tasks.watch_nodes"
TASK_NAMES = (COLLECT_HOST_MEMORY, COLLECT_ENGINES, ROLLUP_SAMPLES, PRUNE_SAMPLES,
              EVALUATE_ALERTS, DELIVER_NOTIFICATIONS, DISPATCH_DUE_RESTARTS,
              RECOVER_INTERRUPTED_RESTARTS, RUN_RESTART, COLLECT_KERNEL_LOG, WATCH_NODES)

CENTRAL_QUEUE = "sparkops"
NOTIFY_QUEUE = "notify"
# Tasks that do not go to the central queue, by name (beat entries and ``delay()`` alike).
TASK_QUEUES = {DELIVER_NOTIFICATIONS: NOTIFY_QUEUE}
app.conf.task_routes = {task: {"queue": queue} for task, queue in TASK_QUEUES.items()}


def node_queue(node_name: str) -> str:
    return f"node.{node_name}"


def worker_queues(node_name: str) -> list[str]:
    """Every queue the worker of ``node_name`` consumes when it does all the work."""
    return [node_queue(node_name), CENTRAL_QUEUE, NOTIFY_QUEUE]


def agent_queues(node_name: str) -> list[str]:
    """The queues of a fleet node's agent (``bin/sparkops agent``): its own node's only."""
    return [node_queue(node_name)]


def fleet_node_unacked_keys(node_name: str) -> dict[str, str]:
    """kombu's Redis transport options that keep the messages a fleet node's agent has taken
    but not yet acknowledged under keys of its own (``unacked.node.<name>``, ...) instead of
    the ``unacked`` hash every worker of the broker shares (``sparkops.stackworker.FleetNode``)."""
    return {option: f"{option.removesuffix('_key')}.node.{node_name}"
            for option in ("unacked_key", "unacked_index_key", "unacked_mutex_key")}


# The scheduler of the stack's beat: the node-local collections of SPARKOPS_BEAT_NODES and of
# every node whose own worker registered it (an agent), re-read from the database as agents come
# and go. Named by path: this package imports none of the apps.
FLEET_SCHEDULER = "collectors.fleetbeat:FleetScheduler"


def _entry(task: str, every: float, queue: str, args: tuple = ()) -> dict:
    # Each entry expires after about one period: if workers fall behind, stale runs are dropped
    # instead of piling up and running back to back.
    return {"task": task, "schedule": every, "args": args,
            "options": {"queue": queue, "expires": every}}


# Fleet-wide housekeeping on the central queue: (name, task, period in seconds). A notice is
# delivered on the commit that queued it and a plan nudges the dispatcher when it is saved, so
# these two sweeps only catch what that missed: a retry (the first backoff is 10 s), a notice
# queued while another delivery ran, a scheduled time arriving (a restart starts up to 15 s
# after it, against a startup of minutes). Every 15 s rather than every collection: a third
# of the messages, for about 0.1 % of a core on a node.
CENTRAL_SCHEDULE = [
    ("deliver-notifications", DELIVER_NOTIFICATIONS, 15.0),
    ("dispatch-due-restarts", DISPATCH_DUE_RESTARTS, 15.0),
    ("recover-interrupted-restarts", RECOVER_INTERRUPTED_RESTARTS, 30.0),
    ("rollup-samples", ROLLUP_SAMPLES, 60.0),
    ("prune-samples", PRUNE_SAMPLES, 3600.0),
]
# The centre's look at nodes gone silent runs every heartbeat interval (beat_schedule's
# ``heartbeat_interval``): a silent node is reported within one interval of its bound.
WATCH_ENTRY = "watch-nodes"
# Node-local collection, one entry per node on that node's queue.
NODE_TASKS = [
    ("collect-host-memory", COLLECT_HOST_MEMORY),
    ("collect-engines", COLLECT_ENGINES),
    ("collect-kernel-log", COLLECT_KERNEL_LOG),
]


def node_schedule(nodes: list[str], collect_interval: float) -> dict[str, dict]:
    """The node-local collections of every node in ``nodes``, each on that node's queue."""
    return {
        f"{name}:{node}": _entry(task, collect_interval, node_queue(node), (node,))
        for node in nodes
        for name, task in NODE_TASKS
    }


def beat_schedule(nodes: list[str], collect_interval: float,
                  heartbeat_interval: float = 10.0) -> dict[str, dict]:
    """The node-local collections of every node, plus the central housekeeping."""
    schedule = node_schedule(nodes, collect_interval)
    schedule.update({name: _entry(task, every, TASK_QUEUES.get(task, CENTRAL_QUEUE))
                     for name, task, every in CENTRAL_SCHEDULE})
    schedule[WATCH_ENTRY] = _entry(WATCH_NODES, heartbeat_interval, CENTRAL_QUEUE)
    return schedule


@app.on_after_finalize.connect
def _install_beat_schedule(sender: Celery, **_: object) -> None:
    from django.conf import settings

    sender.conf.beat_schedule = beat_schedule(
        settings.SPARKOPS_BEAT_NODES, settings.SPARKOPS_COLLECT_INTERVAL,
        settings.SPARKOPS_HEARTBEAT_SECONDS,
    )
