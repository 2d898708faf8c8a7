"""The gate in front of dropping a node's page cache before an engine starts, and its audit.

On a GB10, CUDA sees MemFree, not MemAvailable: page cache left in place makes a starting engine
find too little free memory and refuse to start (NVIDIA's DGX Spark advice is to drop the cache
before starting one). The drop is legitimate but costly for everything else on the node: every
other process then reads its files from disk again. So it is gated three ways:

* it is only ever asked for one engine whose container is *not running* (dropping while the
  engine is up leaves its share uncounted and the restart goes ahead short of room);
* at most once per ``SPARKOPS_DROP_CACHES_COOLDOWN_SECONDS`` per node, counted from the last
  successful drop recorded in the audit log;
* the privileged part is ``bin/sparkops-drop-caches``, which takes no arguments, run on the
  node through :mod:`collectors.pagecache`.

Every attempt writes an :class:`~dashboard.audit.models.AuditEntry` ("drop-caches"): refused
ones with ``allowed=False``, the others with Cached before and after.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import docker
from django.conf import settings
from django.utils import timezone

from collectors.docker_api import ContainerEngineError, container_status
from collectors.models import Engine
from collectors.pagecache import (
    DROP_TIMEOUT_SECONDS,
    DropFailed,
    DropResult,
    PageCacheError,
    drop_command,
    run_drop_helper,
)
from dashboard.audit.models import AuditEntry
from dashboard.audit.records import audit
from dashboard.restarts.models import Restart
from sparkops.units import MIB

__all__ = ["DROP_ACTION", "DROP_TIMEOUT_SECONDS", "DropRefused", "PageCacheError",
           "drop_page_cache", "last_successful_drop"]

DROP_ACTION = "drop-caches"


class DropRefused(PageCacheError):
    """SparkOps refused to drop (engine running, cooldown); the helper was not run."""


def last_successful_drop(node_id: int) -> datetime | None:
    """When the page cache of the node was last dropped successfully, from the audit log."""
    entry = AuditEntry.objects.filter(action=DROP_ACTION, node_id=node_id, allowed=True,
                                      details__ok=True).order_by("-at").first()
    return entry.at if entry is not None else None


def drop_page_cache(*, engine: Engine, restart: Restart | None, actor: str,
                    api: docker.DockerClient, now: datetime | None = None,
                    timeout_seconds: float = DROP_TIMEOUT_SECONDS) -> DropResult:
    """Drop the page cache of ``engine``'s node, for starting ``engine`` next.

    Refuses (:class:`DropRefused`, audited with ``allowed=False``) while the engine's container
    runs or cannot be inspected, and within the cooldown of the last successful drop. Otherwise
    runs the helper with a total timeout of ``timeout_seconds`` and returns Cached before and
    after; a helper that fails, times out or cannot be run raises
    :class:`~collectors.pagecache.DropFailed`. Either way one audit row is written.
    """
    now = now or timezone.now()
    context: dict[str, Any] = {"node": engine.node, "engine": engine, "restart": restart,
                               "actor": actor}
    refusal = _refusal(engine, api, now)
    if refusal:
        audit(DROP_ACTION, allowed=False, outcome=refusal, details={"ok": False}, **context)
        raise DropRefused(refusal)
    command = drop_command()
    try:
        result = run_drop_helper(command, timeout_seconds)
    except DropFailed as error:
        audit(DROP_ACTION, allowed=True, outcome=f"failed: {error}",
              details={"ok": False, "command": command}, **context)
        raise
    audit(DROP_ACTION, allowed=True, outcome=_summary(result),
          details={"ok": True, "command": command, "cached_before_bytes": result.cached_before,
                   "cached_after_bytes": result.cached_after}, **context)
    return result


def _refusal(engine: Engine, api: docker.DockerClient, now: datetime) -> str:
    """Why the drop must not happen now ("" when it may)."""
    try:
        status = container_status(api, engine.container_id)
    except ContainerEngineError as error:
        # Not knowing whether the engine runs is as bad as knowing it does.
        return f"cannot tell whether {engine.name} is running ({error}); not dropping"
    if status.running:
        return (f"{engine.name} is running: dropping the page cache while it is up leaves its "
                "share uncounted; stop it first")
    last = last_successful_drop(engine.node_id)
    cooldown = timedelta(seconds=settings.SPARKOPS_DROP_CACHES_COOLDOWN_SECONDS)
    if last is not None and now - last < cooldown:
        wait = (last + cooldown - now).total_seconds()
        return (f"the page cache was dropped {(now - last).total_seconds():.0f} s ago; the "
                f"cooldown is {cooldown.total_seconds():.0f} s (next in {wait:.0f} s)")
    return ""


def _summary(result: DropResult) -> str:
    before, after = result.cached_before, result.cached_after
    if before is None or after is None:
        return "dropped (Cached not reported)"
    return f"dropped: Cached {before / MIB:.0f} MiB → {after / MIB:.0f} MiB"
