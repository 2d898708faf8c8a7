"""Celery tasks: thin adapters that take names, call the domain code and record the result."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from celery import shared_task
from celery.signals import worker_init, worker_ready, worker_shutdown, worker_shutting_down
from django.conf import settings
from django.db import connections
from django.utils import timezone

from collectors import docker_api, engines, kernellog
from collectors.flightrecorder import check_boot, flight_watch, mark_clean_end, node_recorder
from collectors.flightrecorder import record_collection as record_flight
from collectors.gpus import record_gpu_report
from collectors.hostmemory import collect_host_memory as collect_into
from collectors.hostmemory import configured_budget, window_figures
from collectors.ledger import update_ledger
from collectors.models import Collection, Node
from collectors.nodes import local_node, local_procfs
from collectors.nvml import read_gpus
from collectors.procfs import Procfs
from collectors.registration import NodeHeartbeat
from collectors.retention import prune_node, rollup_node
from collectors.sampling import window_seconds
from collectors.signals import collection_finished
from sparkops.celery import (
    CENTRAL_QUEUE,
    COLLECT_ENGINES,
    COLLECT_HOST_MEMORY,
    COLLECT_KERNEL_LOG,
    PRUNE_SAMPLES,
    ROLLUP_SAMPLES,
    node_queue,
)

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
    procfs = flight_watch(local_procfs())  # keeps one reading a second for the flight recorder
    collection, window = collect_into(
        node,
        procfs,
        duration=window_seconds(settings.SPARKOPS_COLLECT_INTERVAL),
        period=settings.SPARKOPS_DIP_PERIOD,
        budget=configured_budget(),
    )
    if collection.ok:
        update_ledger(node, window_figures(window), collection.at)
    else:
        log.warning("host memory collection failed on %s: %s", node_name, collection.error)
    _record_flight(node, procfs, collection, window)
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
        api, api_error = docker_api.kept_client(), ""
    except docker_api.ContainerEngineError as error:
        api, api_error = None, str(error)
    return len(engines.collect_engines(node, api, now, gpu=gpu, api_error=api_error))


# --- the flight recorder (collectors.flightrecorder) ---------------------------------------------
# After every host collection its samples a second and its ledger go to the node's recorder on
# local disk; when the node's worker starts, the boot is compared with the one last recorded;
# when it stops cleanly, the recorder says so.
# Set when a warm stop is asked for (from a signal handler: a plain flag, no lock).
_clean_stop_asked = False


def _record_flight(node: Node, procfs: Procfs, collection: Collection, window: object) -> None:
    """Append the collection to the node's flight recorder; a failure is logged, and the
    collection, stored already, stands."""
    try:
        record_flight(node_recorder(node.name), node, procfs, collection, window)
    except Exception:
        log.exception("the flight recorder of %s could not record collection %s",
                      node.name, collection.id)


def _serves_this_node(worker: Any) -> bool:
    """Whether ``worker`` (a Celery WorkController) consumes this node's queue."""
    try:
        return node_queue(settings.SPARKOPS_NODE_NAME) in worker.app.amqp.queues.consume_from
    except AttributeError:
        return False


@worker_init.connect
def _check_boot_when_the_worker_starts(sender: Any = None, **_: Any) -> None:
    """Before the node's worker takes work: did the host reboot, or SparkOps die, since the
    recorder's last record? Never stops the worker from starting."""
    if not _serves_this_node(sender):
        return
    try:
        found = check_boot(local_node(), node_recorder(settings.SPARKOPS_NODE_NAME),
                           local_procfs(), timezone.now())
        if found.event is not None:
            log.log(logging.INFO if found.event.severity == "info" else logging.WARNING,
                    "%s", found.event.message)
    except Exception:
        log.exception("checking the boot against the flight recorder failed")
    finally:
        # The worker's parent process: children forked later must not share its connection.
        connections.close_all()


@worker_shutting_down.connect
def _note_a_warm_stop(how: str = "", **_: Any) -> None:
    """A warm stop was asked for (SIGTERM, SIGINT): the clean end is written once the running
    tasks are done (``worker_shutdown``). Runs in a signal handler: sets a flag, nothing else."""
    global _clean_stop_asked
    if how == "Warm":
        _clean_stop_asked = True


@worker_shutdown.connect
def _mark_a_clean_stop(sender: Any = None, **_: Any) -> None:
    """The node's worker stopped as asked, its tasks finished: the recorder's clean end."""
    if not _clean_stop_asked or not _serves_this_node(sender):
        return
    try:
        mark_clean_end(node_recorder(settings.SPARKOPS_NODE_NAME), local_procfs(),
                       timezone.now())
    except Exception:
        log.exception("writing the flight recorder's clean end failed")


# --- registration and the heartbeat (collectors.registration) ------------------------------------
# Once the node's worker takes work, a thread of its main process registers the node (its row,
# facts and agent_started_at) and beats; it ends with the worker. One per process: a prefork
# child never starts one (worker_ready is sent in the main process only).
_heartbeat: NodeHeartbeat | None = None


@worker_ready.connect
def _register_and_beat_once_the_worker_is_ready(sender: Any = None, **_: Any) -> None:
    """The node's worker is ready: start its heartbeat thread, which registers the node first.
    Never stops the worker: every failure is the thread's to log and retry."""
    global _heartbeat
    if _heartbeat is not None or not _serves_this_node(sender) or _centre_without_a_host(sender):
        return
    _heartbeat = NodeHeartbeat(settings.SPARKOPS_NODE_NAME).start()


def _centre_without_a_host(worker: Any) -> bool:
    """A central stack whose beat collects no host of its own (its node is not among
    ``SPARKOPS_BEAT_NODES``, e.g. ``none``): its node is no node of the fleet, so it neither
    registers nor beats. An agent (which consumes no central queue) always does."""
    try:
        central = CENTRAL_QUEUE in worker.app.amqp.queues.consume_from
    except AttributeError:
        return False
    return central and settings.SPARKOPS_NODE_NAME not in settings.SPARKOPS_BEAT_NODES


@worker_shutdown.connect
def _stop_the_heartbeat(sender: Any = None, **_: Any) -> None:
    """The worker stops: so does its heartbeat (after the round in progress, if any)."""
    global _heartbeat
    if _heartbeat is not None:
        _heartbeat.stop()
        _heartbeat = None


# --- the kernel log (collectors.kernellog) -------------------------------------------------------
# OOM kills, NVIDIA driver errors, hung tasks and failed allocations from this node's kernel log,
# stored as events; the reader's position is kept beside the database, in the data directory.


@shared_task(name=COLLECT_KERNEL_LOG, ignore_result=True)
def collect_kernel_log(node_name: str) -> int:
    """Read what is new in this node's kernel log (at most ``kernellog.RECORDS_PER_RUN``
    records; the rest wait for the next run) and store its evidence as events; returns the
    events created or added to."""
    _require_local(node_name)
    run = kernellog.collect_kernel_log(
        local_node(), kernellog.state_path(settings.DATA_DIR, node_name),
        proc_root=Path(settings.SPARKOPS_PROCFS))
    if run.lost:
        log.warning("%s: %d kernel log records were overwritten before they were read",
                    node_name, run.lost)
    return run.created + run.folded
