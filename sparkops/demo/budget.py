"""Demo mode: a memory budget of the demo's own, so that other programs' memory does not move the
story.

At the largest scale the neighbour's growth is 1 GiB of real memory and the room either side of
the squeeze is ~192 MiB, while any other program on the machine moves MemAvailable by as much
whenever it allocates. Many GB10 admins confine their engines to a memory cgroup (a systemd
slice with ``MemoryMax=``, a cgroup parent for containers); then the room a prefill can get is
the smaller of MemAvailable and the budget's room, and SparkOps reads both
(``SPARKOPS_MEMORY_BUDGET_CGROUP``). The demo does the same: it creates a memory cgroup of its
own (:func:`create_budget`), runs the engine containers with it as their cgroup parent, and
points the stack's collectors at it. Inside it only the engines hold memory, so the squeeze is
measured against their own growth.

The limit (:func:`budget_limit`) is the story's peak at the scale (128 GiB of the story: both
engines with the neighbour grown and both prefill buffers at once, more than a GB10 holds, so
the engines never reach it and the kernel never has to OOM-kill one), plus the default margin
and hysteresis of the ``prefill-squeeze`` rule (so that, with the rule's settings put back after
the story, no squeeze is reported while the engines keep running), plus what the engines' own
programs hold.

Where the cgroup cannot be made (not root, no memory controller), :func:`create_budget` raises
:class:`BudgetUnavailable` with the reason and the demo uses the host's headroom. The demo
removes its cgroup once its containers are gone (:func:`remove_budget`), in every hierarchy
where the container runtime made one of that name.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

from dashboard.alerting.settings import rule_defaults
from sparkops.demo.node import ENGINES, Scale
from sparkops.units import GIB, MIB

CGROUP_ROOT = Path("/sys/fs/cgroup")
BUDGET_ENV = "SPARKOPS_MEMORY_BUDGET_CGROUP"
SQUEEZE_RULE = "prefill-squeeze"
# What each engine holds besides its (scaled) reservations, charged to the budget too: the
# emulator is a Python program of ~30 MiB resident (measured: VmRSS of an idle emulator with
# 1 MiB reservations), plus the page cache its files bring in and its share of conmon.
PROGRAM_BYTES_PER_ENGINE = 128 * MIB
# How long a removal waits for processes that are exiting to leave the cgroups (a container's
# monitor outlives its removal by a moment).
EXIT_WAIT_SECONDS = 10.0


class BudgetUnavailable(RuntimeError):
    """The demo cannot make a memory cgroup here; the message says why."""


@dataclass(frozen=True)
class DemoBudget:
    """A memory cgroup the demo made: ``path`` its directory (what SparkOps reads),
    ``parent`` the cgroup path containers are created under (Podman's ``--cgroup-parent``),
    ``limit`` in bytes, ``version`` 1 or 2."""

    name: str
    path: Path
    parent: str
    limit: int
    version: int

    def describe(self) -> str:
        """The story's line about it."""
        return (f"The engines run in a memory budget of {self.limit / GIB:.2f} GiB here "
                f"({self.path}, cgroup v{self.version}): the story's peak at this scale, the "
                "prefill-squeeze rule's default margin and the engines' own programs — as if on "
                "a GB10 of their own, so other programs' memory does not move the story. "
                "SparkOps measures the headroom within it.")


def budget_name(data_dir: Path) -> str:
    """The demo's cgroup name, after its data directory (like its Podman storage), so that two
    demos on one machine have one each and a killed demo's is taken over by the next."""
    return f"sparkops-demo-{hashlib.sha256(str(data_dir).encode()).hexdigest()[:10]}"


def budget_limit(scale: Scale) -> int:
    """The limit for the story at ``scale``, in bytes (see the module docstring)."""
    rule = rule_defaults(SQUEEZE_RULE)
    margin = rule.threshold_spec("margin_gib").default + \
        rule.threshold_spec("hysteresis_gib").default
    return scale.peak_bytes + int(margin * GIB) + len(ENGINES) * PROGRAM_BYTES_PER_ENGINE


def create_budget(name: str, limit: int, root: Path = CGROUP_ROOT) -> DemoBudget:
    """Make (or take over, after a demo that was killed) the memory cgroup ``name`` with
    ``limit`` bytes: under the v1 memory controller where there is one (``root/memory``), else
    under cgroup v2 (``root``). Raises :class:`BudgetUnavailable` with the reason."""
    if (root / "memory" / "memory.limit_in_bytes").exists():
        version, path, limit_file = 1, root / "memory" / name, "memory.limit_in_bytes"
    elif _v2_memory(root):
        version, path, limit_file = 2, root / name, "memory.max"
    else:
        raise BudgetUnavailable(f"no memory controller to make a cgroup in under {root}")
    try:
        path.mkdir(exist_ok=True)
    except PermissionError:
        raise BudgetUnavailable(f"making {path} needs root") from None
    except OSError as error:
        raise BudgetUnavailable(f"cannot make {path}: {error.strerror or error}") from None
    try:
        if version == 1 and (path / "memory.use_hierarchy").read_text().strip() != "1":
            # Without it, a v1 parent's limit does not cover the containers below it.
            (path / "memory.use_hierarchy").write_text("1")
        (path / limit_file).write_text(str(limit))
    except OSError as error:
        with contextlib.suppress(OSError):
            path.rmdir()
        raise BudgetUnavailable(f"cannot set the limit of {path}: {error.strerror or error}"
                                ) from None
    return DemoBudget(name=name, path=path, parent=f"/{name}", limit=limit, version=version)


def _v2_memory(root: Path) -> bool:
    """Whether ``root`` is a cgroup v2 hierarchy whose children get the memory controller."""
    try:
        controllers = (root / "cgroup.controllers").read_text().split()
        enabled = (root / "cgroup.subtree_control").read_text().split()
    except OSError:
        return False
    return "memory" in controllers and "memory" in enabled


def remove_budget(name: str, root: Path = CGROUP_ROOT,
                  wait: float = EXIT_WAIT_SECONDS) -> list[str]:
    """Remove the cgroup ``name`` from every hierarchy (the runtime makes one in each, with
    children such as ``conmon``), deepest first; what could not be removed, with why.

    Call it once the containers are gone. A cgroup with processes in it cannot be removed
    (EBUSY): a container's monitor may still be exiting when its removal returns, so busy
    cgroups are tried again for up to ``wait`` seconds, then reported, never left silently.
    """
    deadline = time.monotonic() + wait
    while True:
        left = _remove_once(name, root)
        if not any(busy for _, busy in left) or time.monotonic() >= deadline:
            return [text for text, _ in left]
        time.sleep(0.1)


def _remove_once(name: str, root: Path) -> list[tuple[str, bool]]:
    """One pass of :func:`remove_budget`: (what is left and why, whether it was busy)."""
    tops = [root / name, *(hierarchy / name for hierarchy in _hierarchies(root))]
    left = []
    for top in tops:
        if not top.is_dir():
            continue
        folders = [p for p in top.rglob("*") if p.is_dir()] + [top]
        for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
            try:
                folder.rmdir()
            except FileNotFoundError:
                continue
            except OSError as error:
                busy = error.errno == errno.EBUSY
                why = "processes still run in it" if busy else error.strerror or str(error)
                left.append((f"{folder} ({why})", busy))
    return left


def _hierarchies(root: Path) -> list[Path]:
    """The cgroup hierarchies mounted below ``root`` (v1 controllers, ``unified``, ``systemd``)."""
    try:
        return [entry for entry in root.iterdir() if entry.is_dir() and not entry.is_symlink()]
    except OSError:
        return []
