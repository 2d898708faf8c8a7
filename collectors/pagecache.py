"""The one way SparkOps drops the node's page cache: the privileged no-argument helper.

``bin/sparkops-drop-caches`` runs ``sync``, writes ``3`` to ``/proc/sys/vm/drop_caches`` and
prints ``Cached before: <n> kB`` and ``Cached after: <n> kB`` (from ``/proc/meminfo``). SparkOps
runs ``SPARKOPS_DROP_CACHES_COMMAND`` through ``sudo -n`` when it is not root, so the only
privilege it needs is that one command without arguments.

Node-side and database-free: whether a drop may happen now (engine stopped, cooldown) and its
audit row are decided by the caller (:mod:`dashboard.restarts.pagecache`). In read-only mode
(``SPARKOPS_READ_ONLY``) the helper is never run: :func:`run_drop_helper` refuses here, whoever
asks.

Compacting memory (:func:`compact_memory`: ``1`` written to ``/proc/sys/vm/compact_memory``, so
that the free pages a drop left scattered become the large blocks a loading engine allocates) is
done only where SparkOps itself runs as root: the helper takes no arguments and does not
compact, and the sudoers rule allows nothing else. Elsewhere it is refused with that reason,
and read-only mode refuses it too.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from collectors.docker_api import READ_ONLY_TEXT, read_only
from sparkops.units import KIB

__all__ = ["DROP_TIMEOUT_SECONDS", "CompactFailed", "DropFailed", "DropResult", "PageCacheError",
           "ReadOnlyRefused", "compact_memory", "drop_command", "run_drop_helper"]

# sync writes back every dirty page first, which can take a while on a busy disk; past this the
# helper is stopped and the drop reported as failed.
DROP_TIMEOUT_SECONDS = 120.0
_CACHED = re.compile(r"^Cached (before|after): (\d+) kB$", re.MULTILINE)
_MAX_REASON = 300


class PageCacheError(Exception):
    """The page cache was not dropped; ``str(error)`` is a one-line reason."""


class DropFailed(PageCacheError):
    """The helper ran (or could not be run) and did not report success."""


class ReadOnlyRefused(DropFailed):
    """SparkOps is in read-only mode: the helper was not run."""


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


def run_drop_helper(command: list[str], timeout_seconds: float) -> DropResult:
    """Run ``command`` (from :func:`drop_command`) with a total timeout; Cached before and after.

    Raises :class:`DropFailed` with a one-line reason when it cannot be run, overruns its time
    (it is then stopped, with its process group) or exits with a non-zero status, and
    :class:`ReadOnlyRefused` (never running it) in read-only mode.
    """
    if read_only():
        raise ReadOnlyRefused(f"the page cache was not dropped: {READ_ONLY_TEXT}")
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
        cached_before=int(found["before"]) * KIB if "before" in found else None,
        cached_after=int(found["after"]) * KIB if "after" in found else None,
    )


class CompactFailed(PageCacheError):
    """Memory was not compacted; ``str(error)`` says why (not root, read-only, the write)."""


COMPACT_FILE = "sys/vm/compact_memory"


def compact_memory(proc_root: Path = Path("/proc")) -> None:
    """Ask the kernel to compact all memory now (``1`` into ``<proc_root>/sys/vm/compact_memory``;
    it returns once compaction ran, a second or so on a large host).

    Raises :class:`CompactFailed` in read-only mode, when SparkOps is not root (the no-argument
    helper cannot compact, and nothing else is allowed through sudo) and when the write fails.
    """
    if read_only():
        raise CompactFailed(f"memory was not compacted: {READ_ONLY_TEXT}")
    if os.geteuid() != 0:
        raise CompactFailed("memory was not compacted: that needs root, and the drop-caches "
                            "helper does not compact")
    try:
        (proc_root / COMPACT_FILE).write_text("1\n")
    except OSError as error:
        raise CompactFailed(f"writing 1 to {proc_root / COMPACT_FILE} failed: "
                            f"{error.strerror or error}") from None


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
