"""Celery adapters for planned restarts: take ids, call the runbook, record the result.

* :func:`dispatch_due_restarts` (central queue, beat every ~15 s, and nudged when a plan is
  made) hands each node's oldest due restart to that node's queue, with ``expires``: a message
  that waited in a queue too long is dropped instead of firing late, and handed again.
* :func:`run_restart_task` (the node's queue) carries one restart out on the node whose
  containers and ``/proc`` it needs; it refuses work for another node.
* :func:`recover_interrupted_restarts` (central queue, beat every ~30 s, and once whenever a
  worker starts) marks restarts whose worker died as ``interrupted``.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

import docker
from celery import shared_task
from celery.signals import worker_ready
from django.conf import settings
from django.db import connections
from django.utils import timezone

from collectors import docker_api
from collectors.tasks import WrongNodeError
from dashboard.audit.records import audit
from dashboard.restarts.dispatch import (
    REDISPATCH_SECONDS,
    interrupt_stale_restarts,
    restarts_to_dispatch,
)
from dashboard.restarts.models import Restart
from dashboard.restarts.runbook import run_restart
from sparkops.celery import (
    DISPATCH_DUE_RESTARTS,
    RECOVER_INTERRUPTED_RESTARTS,
    RUN_RESTART,
    node_queue,
)

log = logging.getLogger(__name__)


@shared_task(name=RUN_RESTART, ignore_result=True)
def run_restart_task(restart_id: int) -> str:
    """Run the restart's runbook on this node (blocks for the whole restart); its final status.

    Raises :class:`WrongNodeError` (audited, the restart left as it is) when the restart
    belongs to another node's worker: a routing mistake, never carried out from here.
    """
    restart = Restart.objects.select_related("node", "engine").filter(pk=restart_id).first()
    if restart is None:
        return "gone"
    here = settings.SPARKOPS_NODE_NAME
    if restart.node.name != here:
        reason = (f"restart #{restart.pk} of node {restart.node.name!r} reached the worker of "
                  f"{here!r}; check that each worker consumes only node.<its name>")
        audit("run-restart", allowed=False, actor=f"worker:{socket.gethostname()}",
              node=restart.node, engine=restart.engine, restart=restart,
              outcome=f"refused: {reason}")
        raise WrongNodeError(reason)
    api, api_error = _client()
    try:
        # The worker as Celery names it (<node>@<host>): in a fleet, which node's agent ran it.
        return run_restart(restart_id, api=api, api_error=api_error,
                           worker=f"{here}@{socket.gethostname()}").status
    finally:
        if api is not None:
            api.close()


@shared_task(name=DISPATCH_DUE_RESTARTS, ignore_result=True)
def dispatch_due_restarts() -> int:
    """Hand each node's oldest due restart to the node's queue; how many were handed."""
    handed = restarts_to_dispatch(timezone.now())
    for restart in handed:
        run_restart_task.apply_async(args=(restart.pk,), queue=node_queue(restart.node.name),
                                     expires=REDISPATCH_SECONDS)
    return len(handed)


@shared_task(name=RECOVER_INTERRUPTED_RESTARTS, ignore_result=True)
def recover_interrupted_restarts() -> int:
    """Mark running restarts whose heartbeat went stale as interrupted; how many were marked.

    The container's state is read live for restarts of this worker's node, and taken from the
    last collection for other nodes.
    """
    return len(_recover())


@worker_ready.connect
def _recover_when_a_worker_starts(sender: Any = None, **_: Any) -> None:
    """A worker that starts may be the one that died mid-restart: look at its node at once
    rather than at the next beat. Never stops the worker from starting."""
    try:
        marked = _recover(node_name=settings.SPARKOPS_NODE_NAME)
        if marked:
            log.warning("marked %d interrupted restart(s) on worker start", len(marked))
    except Exception:
        log.exception("recovering interrupted restarts on worker start failed")
    finally:
        # This runs in the worker's parent process: children forked later must not share its
        # database connection.
        connections.close_all()


def _recover(node_name: str | None = None) -> list[Restart]:
    api, api_error = _client()
    try:
        return interrupt_stale_restarts(timezone.now(), local_node=settings.SPARKOPS_NODE_NAME,
                                        api=api, api_error=api_error, node_name=node_name)
    finally:
        if api is not None:
            api.close()


def _client() -> tuple[docker.DockerClient | None, str]:
    try:
        return docker_api.client(), ""
    except docker_api.ContainerEngineError as error:
        return None, str(error)
