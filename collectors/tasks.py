"""Celery tasks: thin adapters that take names, call the domain code and record the result."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from collectors import docker_api, engines
from collectors.gpus import record_gpu_report
from collectors.hostmemory import collect_host_memory as collect_into
from collectors.hostmemory import configured_budget, window_figures
from collectors.ledger import update_ledger
from collectors.models import Node
from collectors.nodes import local_node, local_procfs
from collectors.nvml import read_gpus
from collectors.retention import prune_node, rollup_node
from collectors.sampling import window_seconds
from collectors.signals import collection_finished
from sparkops.celery import COLLECT_ENGINES, COLLECT_HOST_MEMORY, PRUNE_SAMPLES, ROLLUP_SAMPLES

log = logging.getLogger(__name__)


class WrongNodeError(RuntimeError):
    """A node-local task reached a worker on another node (a routing mistake)."""


def _require_local(node_name: str) -> None:
    if node_name != settings.SPARKOPS_NODE_NAME:
        raise WrongNodeError(
            f"work for node {node_name!r} reached the worker of "
            f"{settings.SPARKOPS_NODE_NAME!r}; check that each worker consumes only node.<its name>"
        )


@shared_task(name=COLLECT_HOST_MEMORY, ignore_result=True)
def collect_host_memory(node_name: str) -> int:
    """Watch this node's memory for one interval and store it; returns the collection id."""
    _require_local(node_name)
    node = local_node()
    collection, window = collect_into(
        node,
        local_procfs(),
        duration=window_seconds(settings.SPARKOPS_COLLECT_INTERVAL),
        period=settings.SPARKOPS_DIP_PERIOD,
        budget=configured_budget(),
    )
    if collection.ok:
        update_ledger(node, window_figures(window), collection.at)
    else:
        log.warning("host memory collection failed on %s: %s", node_name, collection.error)
    _announce(node_name, collection.id, collection.ok)
    return collection.id


def _announce(node_name: str, collection_id: int, ok: bool) -> None:
    """Tell whoever listens that a collection is stored (alert evaluation queues itself).

    A receiver that fails is logged and does not fail the collection, which is stored already.
    """
    replies = collection_finished.send_robust(sender=collect_host_memory, node_name=node_name,
                                              collection_id=collection_id, ok=ok)
    for receiver, reply in replies:
        if isinstance(reply, Exception):
            log.error("after the collection on %s, %r failed: %s", node_name, receiver, reply,
                      exc_info=reply)


@shared_task(name=ROLLUP_SAMPLES, ignore_result=True)
def rollup_samples() -> int:
    now = timezone.now()
    return sum(rollup_node(node, now) for node in Node.objects.all())


@shared_task(name=PRUNE_SAMPLES, ignore_result=True)
def prune_samples() -> None:
    now = timezone.now()
    for node in Node.objects.all():
        result = prune_node(
            node, now, settings.SPARKOPS_RAW_RETENTION_DAYS, settings.SPARKOPS_ROLLUP_RETENTION_DAYS
        )
        log.info("pruned %s: %s", node.name, result)


@shared_task(name=COLLECT_ENGINES, ignore_result=True)
def collect_engines(node_name: str) -> int:
    """Discover this node's engines, read GPUs, scrape metrics; returns engines present."""
    _require_local(node_name)
    node = local_node()
    now = timezone.now()
    gpu = read_gpus(host_memory_bytes=node.mem_total_bytes)
    record_gpu_report(node, gpu, now)
    try:
        api, api_error = docker_api.client(), ""
    except docker_api.ContainerEngineError as error:
        api, api_error = None, str(error)
    try:
        return len(engines.collect_engines(node, api, now, gpu=gpu, api_error=api_error))
    finally:
        if api is not None:
            api.close()
