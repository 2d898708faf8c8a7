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

The guarded start (:func:`drop_while_starting`) is the one drop allowed while the engine's
container runs: during its start, before it allocated its KV pool, when MemFree fell below the
floor the runbook computed (:func:`dashboard.restarts.fit.guard_floor`). Its share is not left
uncounted then: the runbook compares MemFree with what the engine still has to allocate. It
drops and compacts memory (:func:`collectors.pagecache.compact_memory`, only where SparkOps
runs as root), within the cooldown counted from the node's last drop other than this restart's
own ``drop_caches`` step (:func:`last_drop_before_guard`: that one emptied the cache before the
load that refills it), and is audited like every drop, with ``details["guarded_start"]``.
Read-only mode refuses it (audited, ``allowed=False``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import docker
from django.conf import settings
from django.utils import timezone

from collectors.docker_api import READ_ONLY_TEXT, ContainerEngineError, container_status, read_only
from collectors.models import Engine
from collectors.pagecache import (
    DROP_TIMEOUT_SECONDS,
    CompactFailed,
    DropFailed,
    DropResult,
    PageCacheError,
    compact_memory,
    drop_command,
    run_drop_helper,
)
from dashboard.audit.models import AuditEntry
from dashboard.audit.records import audit
from dashboard.restarts.models import Restart
from sparkops.units import MIB, size_text

__all__ = ["DROP_ACTION", "DROP_TIMEOUT_SECONDS", "DropRefused", "GuardedDrop", "PageCacheError",
           "cooldown_refusal", "drop_page_cache", "drop_while_starting", "last_drop_before_guard",
           "last_successful_drop"]

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
    return cooldown_refusal(last_successful_drop(engine.node_id), now)


def cooldown_refusal(last: datetime | None, now: datetime) -> str:
    """Why a drop within the cooldown of the one at ``last`` must wait ("" when it may run)."""
    cooldown = timedelta(seconds=settings.SPARKOPS_DROP_CACHES_COOLDOWN_SECONDS)
    if last is not None and now - last < cooldown:
        wait = (last + cooldown - now).total_seconds()
        return (f"the page cache was dropped {(now - last).total_seconds():.0f} s ago; the "
                f"cooldown is {cooldown.total_seconds():.0f} s (next in {wait:.0f} s)")
    return ""


# --- the guarded start ------------------------------------------------------------------------


@dataclass(frozen=True)
class GuardedDrop:
    """What one intervention of the guarded start did: the drop's Cached before and after
    (``result``, None when it failed: ``drop_error`` says why) and whether memory was
    compacted (``compact_error`` says why not)."""

    result: DropResult | None
    drop_error: str
    compacted: bool
    compact_error: str

    def words(self) -> str:
        """E.g. "dropped the page cache (Cached 2.1 GiB → 80 MiB); compacted memory"."""
        if self.result is not None:
            dropped = f"dropped the page cache ({_cached_text(self.result)})"
        else:
            dropped = f"the page cache was not dropped ({self.drop_error})"
        compacted = "compacted memory" if self.compacted else \
            f"not compacted ({self.compact_error})"
        return f"{dropped}; {compacted}"


def last_drop_before_guard(node_id: int, restart: Restart) -> datetime | None:
    """The node's last successful drop that holds a guarded start back: any but the one of
    ``restart``'s own ``drop_caches`` step (its interventions count). Cost: one query."""
    entries = AuditEntry.objects.filter(action=DROP_ACTION, node_id=node_id, allowed=True,
                                        details__ok=True).order_by("-at")[:5]
    for entry in entries:
        if entry.restart_id == restart.pk and not (entry.details or {}).get("guarded_start"):
            continue
        return entry.at
    return None


def drop_while_starting(*, engine: Engine, restart: Restart, actor: str, why: str,
                        proc_root: Path = Path("/proc"),
                        timeout_seconds: float = DROP_TIMEOUT_SECONDS) -> GuardedDrop:
    """The guarded start's intervention while ``engine`` starts: drop the page cache, then
    compact memory; ``why`` (the MemFree that fell below the floor) goes into the audit row.

    The caller checked the floor and the limits (:func:`last_drop_before_guard`,
    :func:`cooldown_refusal`). Read-only mode refuses it (:class:`DropRefused`, audited with
    ``allowed=False``); otherwise one audit row says what was done, whatever failed.
    """
    context: dict[str, Any] = {"node": engine.node, "engine": engine, "restart": restart,
                               "actor": actor}
    if read_only():
        audit(DROP_ACTION, allowed=False, outcome=f"guarded start: refused: {READ_ONLY_TEXT}",
              details={"ok": False, "guarded_start": True, "why": why}, **context)
        raise DropRefused(f"the page cache was not dropped: {READ_ONLY_TEXT}")
    command = drop_command()
    result, drop_error = None, ""
    try:
        result = run_drop_helper(command, timeout_seconds)
    except DropFailed as error:
        drop_error = str(error)
    compacted, compact_error = False, ""
    try:
        compact_memory(proc_root)
        compacted = True
    except CompactFailed as error:
        compact_error = str(error)
    done = GuardedDrop(result, drop_error, compacted, compact_error)
    audit(DROP_ACTION, allowed=True,
          outcome=f"guarded start: {why}; {done.words()}" if result is not None
          else f"failed: guarded start: {why}; {done.words()}",
          details={"ok": result is not None, "guarded_start": True, "why": why,
                   "command": command,
                   "cached_before_bytes": result.cached_before if result else None,
                   "cached_after_bytes": result.cached_after if result else None,
                   "compacted": compacted, "compact_error": compact_error}, **context)
    return done


def _summary(result: DropResult) -> str:
    before, after = result.cached_before, result.cached_after
    if before is None or after is None:
        return "dropped (Cached not reported)"
    return f"dropped: Cached {before / MIB:.0f} MiB → {after / MIB:.0f} MiB"


def _cached_text(result: DropResult) -> str:
    if result.cached_before is None or result.cached_after is None:
        return "Cached not reported"
    return f"Cached {size_text(result.cached_before)} → {size_text(result.cached_after)}"
