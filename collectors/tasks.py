"""Celery tasks: thin adapters that take names, call the domain code and record the result."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from collectors.hostmemory import collect_host_memory as collect_into
from collectors.models import Node
from collectors.nodes import local_node, local_procfs
from collectors.retention import prune_node, rollup_node
from collectors.sampling import window_seconds

log = logging.getLogger(__name__)


class WrongNodeError(RuntimeError):
    """A node-local task reached a worker on another node (a routing mistake)."""


@shared_task(ignore_result=True)
def collect_host_memory(node_name: str) -> int:
    """Watch this node's memory for one interval and store it; returns the collection id."""
    if node_name != settings.SPARKOPS_NODE_NAME:
        raise WrongNodeError(
            f"collection for node {node_name!r} reached the worker of "
            f"{settings.SPARKOPS_NODE_NAME!r}; check that each worker consumes only node.<its name>"
        )
    collection = collect_into(
        local_node(),
        local_procfs(),
        duration=window_seconds(settings.SPARKOPS_COLLECT_INTERVAL),
        period=settings.SPARKOPS_DIP_PERIOD,
    )
    if not collection.ok:
        log.warning("host memory collection failed on %s: %s", node_name, collection.error)
    return collection.id


@shared_task(ignore_result=True)
def rollup_samples() -> int:
    now = timezone.now()
    return sum(rollup_node(node, now) for node in Node.objects.all())


@shared_task(ignore_result=True)
def prune_samples() -> None:
    now = timezone.now()
    for node in Node.objects.all():
        result = prune_node(
            node, now, settings.SPARKOPS_RAW_RETENTION_DAYS, settings.SPARKOPS_ROLLUP_RETENTION_DAYS
        )
        log.info("pruned %s: %s", node.name, result)
