"""Drop the node's page cache before an engine starts, through the privileged no-argument helper.

On a GB10, CUDA sees MemFree, not MemAvailable: page cache left in place makes a starting engine
find too little free memory and refuse to start (BRIEF, "Page cache and restart order"). The
drop is legitimate but costly for everything else on the node (RELIABILITY finding 10), so it is
gated three ways:

* it is only ever asked for one engine whose container is *not running* (dropping while the
  engine is up leaves its share uncounted and the restart goes ahead short of room);
* at most once per ``SPARKOPS_DROP_CACHES_COOLDOWN_SECONDS`` per node, counted from the last
  successful drop recorded in the audit log;
* the privileged part is ``bin/sparkops-drop-caches``, which takes no arguments; SparkOps runs
  ``SPARKOPS_DROP_CACHES_COMMAND`` through ``sudo -n`` when it is not root.

Every attempt writes an :class:`~dashboard.restarts.models.AuditEntry` ("drop-caches"): refused
ones with ``allowed=False``, the others with Cached before and after.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import docker
from django.conf import settings
from django.utils import timezone

from collectors.docker_api import ContainerEngineError, container_status
from collectors.models import Engine
from dashboard.restarts.audit import audit
from dashboard.restarts.models import AuditEntry, Restart

__all__ = ["DROP_ACTION", "DropFailed", "DropRefused", "DropResult", "PageCacheError",
           "drop_command", "drop_page_cache", "last_successful_drop"]

DROP_ACTION = "drop-caches"
# sync writes back every dirty page first, which can take a while on a busy disk; past this the
# helper is stopped and the drop reported as failed.
DROP_TIMEOUT_SECONDS = 120.0
_CACHED = re.compile(r"^Cached (before|after): (\d+) kB$", re.MULTILINE)
_MAX_REASON = 300


class PageCacheError(Exception):
    """The page cache was not dropped; ``str(error)`` is a one-line reason."""


class DropRefused(PageCacheError):
    """SparkOps refused to drop (engine running, cooldown); the helper was not run."""


class DropFailed(PageCacheError):
    """The helper ran (or could not be run) and did not report success."""


@dataclass(frozen=True)
class DropResult:
    """Cached (from /proc/meminfo) before and after the drop, in bytes; None if not printed."""

    cached_before: int | None
    cached_after: int | None

    @property
    def freed(self) -> int | None:
        if self.cached_before is None or self.cached_after is None:
            return None
        return self.cached_before - self.cached_after


def drop_command() -> list[str]:
    """The configured helper, behind ``sudo -n`` (never prompt, fail instead) unless root."""
    command = list(settings.SPARKOPS_DROP_CACHES_COMMAND)
    return command if os.geteuid() == 0 else ["sudo", "-n", *command]


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
    after; a helper that fails, times out or cannot be run raises :class:`DropFailed`. Either way
    one audit row is written.
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
        result = _run_helper(command, timeout_seconds)
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


def _run_helper(command: list[str], timeout_seconds: float) -> DropResult:
    try:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, start_new_session=True)
    except OSError as error:
        raise DropFailed(f"cannot run {command[0]}: {error.strerror or error}") from None
    try:
        stdout, stderr = process.communicate(timeout=timeout_seconds)
    except subprocess.TimeoutExpired:
        _stop(process)
        raise DropFailed(f"{_name(command)} did not finish within {timeout_seconds:g} s") \
            from None
    if process.returncode != 0:
        reason = _one_line(stderr) or _one_line(stdout) or "no reason given"
        raise DropFailed(f"{_name(command)} exited with status {process.returncode}: {reason}")
    found = dict(_CACHED.findall(stdout))
    return DropResult(
        cached_before=int(found["before"]) * 1024 if "before" in found else None,
        cached_after=int(found["after"]) * 1024 if "after" in found else None,
    )


def _stop(process: subprocess.Popen[str]) -> None:
    """End a helper that overran its time without waiting on its pipes: a ``sync`` it started
    may hold them open (and may be unkillable) until the disk catches up."""
    for sig, grace in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 2.0)):
        # The whole group: sudo relays SIGTERM to the helper; as root, the helper's children.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue
    for pipe in (process.stdout, process.stderr):
        if pipe is not None:
            pipe.close()


def _name(command: list[str]) -> str:
    return os.path.basename(command[-1]) if command else "the helper"


def _one_line(text: str | None) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1][:_MAX_REASON] if lines else ""


def _summary(result: DropResult) -> str:
    before, after = result.cached_before, result.cached_after
    if before is None or after is None:
        return "dropped (Cached not reported)"
    mib = 1024**2
    return f"dropped: Cached {before / mib:.0f} MiB → {after / mib:.0f} MiB"
