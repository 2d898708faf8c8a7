"""The Celery application and its beat schedule, kept in code.

Node-local work (collection now, restarts later) goes to the queue ``node.<name>`` that only the
worker on that node consumes; fleet-wide housekeeping (roll-up, prune) goes to ``sparkops``.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sparkops.settings")

app = Celery("sparkops")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def node_queue(node_name: str) -> str:
    return f"node.{node_name}"


def beat_schedule(nodes: list[str], collect_interval: float) -> dict[str, dict]:
    """One collection entry per node on that node's queue, plus the central housekeeping.

    Each entry expires after about one interval: if workers fall behind, stale collections are
    dropped instead of piling up and running back to back.
    """
    schedule: dict[str, dict] = {}
    for name in nodes:
        schedule[f"collect-host-memory:{name}"] = {
            "task": "collectors.tasks.collect_host_memory",
            "schedule": collect_interval,
            "args": (name,),
            "options": {"queue": node_queue(name), "expires": collect_interval},
        }
        schedule[f"collect-engines:{name}"] = {
            "task": "collectors.tasks.collect_engines",
            "schedule": collect_interval,
            "args": (name,),
            "options": {"queue": node_queue(name), "expires": collect_interval},
        }
    schedule["deliver-notifications"] = {
        "task": "dashboard.notify.tasks.deliver_notifications",
        "schedule": 5.0,
        "options": {"queue": "sparkops", "expires": 5.0},
    }
    schedule["dispatch-due-restarts"] = {
        "task": "dashboard.restarts.tasks.dispatch_due_restarts",
        "schedule": 5.0,
        "options": {"queue": "sparkops", "expires": 5.0},
    }
    schedule["recover-interrupted-restarts"] = {
        "task": "dashboard.restarts.tasks.recover_interrupted_restarts",
        "schedule": 30.0,
        "options": {"queue": "sparkops", "expires": 30.0},
    }
    schedule["rollup-samples"] = {
        "task": "collectors.tasks.rollup_samples",
        "schedule": 60.0,
        "options": {"queue": "sparkops", "expires": 60.0},
    }
    schedule["prune-samples"] = {
        "task": "collectors.tasks.prune_samples",
        "schedule": 3600.0,
        "options": {"queue": "sparkops", "expires": 3600.0},
    }
    return schedule


@app.on_after_finalize.connect
def _install_beat_schedule(sender: Celery, **_: object) -> None:
    from django.conf import settings

    sender.conf.beat_schedule = beat_schedule(
        settings.SPARKOPS_BEAT_NODES, settings.SPARKOPS_COLLECT_INTERVAL
    )
