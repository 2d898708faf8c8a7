"""The rescue reserve audit: what keeps a GB10 reachable and honest when memory runs out.

On a GB10 running out of memory does not end in a clean CUDA OOM: the host wedges or powers off
and takes every monitor with it (BRIEF.md; NVIDIA/open-gpu-kernel-modules#1358), so what is in
place *before* that moment decides whether an admin can still log in. The audit reads, on the
node itself, each thing that helps and says for each what was found, whether it is fine and
what to do, in words:

1. **Swap** (``/proc/swaps``): room for idle services' memory to move out, and the early sign
   the headroom-floor alert watches. No reserve for the engines: 16 GiB of swap did not prevent
   a wedge in open-gpu-kernel-modules#1358. zram swap lives in memory itself.
2. **An OOM daemon** (``/proc/*/comm``: earlyoom, systemd-oomd, oomd) that ends a process
   while the host can still answer; earlyoom's ``--prefer``/``--avoid`` are read from its
   command line.
3. **Who would go first** (``/proc/<pid>/oom_score``): the kernel's OOM killer and earlyoom both
   take the highest score. GPU allocations are not charged to a process's RSS, so an engine
   can score below a database that holds far less.
4. **A protected reserve for sshd and systemd** (cgroup v2 ``memory.min`` / ``memory.low`` of
   ``system.slice`` and its ssh unit): a child's protection is bounded by its parent's, so the
   slice needs one of its own. Operators report ``MemoryMin`` kept a box reachable.
5. **``vm.min_free_kbytes``** against the kernel's own default, ``sqrt(16 × lowmem KiB)``
   clamped to 128–262144 KiB (Linux ``mm/page_alloc.c``, ``calculate_min_free_kbytes``; lowmem
   is close to MemTotal on 64-bit machines). Raising it to make room during weight loads broke
   vLLM's own free-memory check in operators' reports.
6. **Each engine container's /dev/shm and memory lock**: what the kernel applies, read from
   the container's first process (``/proc/<pid>/mountinfo``, ``/proc/<pid>/limits``).
   ``collectors.docker_api.EngineContainer`` keeps no ``HostConfig.ShmSize``, ``IpcMode`` or
   ``Ulimits``, so the inspect data cannot be asked. Docker's default /dev/shm is 64 MiB, which
   NVIDIA's NGC containers warn may be too small for PyTorch (they advise ``--ipc=host``);
   locked pages (NGC advises ``--ulimit memlock=-1``) cannot be swapped or reclaimed: one
   report found 61.5 GiB mlocked shmem in a killed scheduler
   (MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks#193).
7. **Page cache** from the node's stored samples (any node): an engine that starts sees MemFree
   (``cudaMemGetInfo`` follows it on GB10), so a routinely large cache is room it cannot count.

Items 1–6 read the node's ``/proc`` and ``/sys`` and are only true on the node itself; asked
elsewhere (a central web process), :func:`audit_for_page` gives them as unknown, with why.
Nothing here writes anything. Cost: one pass over ``/proc`` reading three small files per
process (about 10 ms for 300 processes), a handful of cgroup files, and two indexed queries.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from statistics import median
from typing import Any, Literal

from django.conf import settings

from collectors.meminfo import parse_meminfo
from collectors.models import Engine, Metric, Node, Rollup
from collectors.nodes import local_procfs
from collectors.procfs import (
    CGROUP_ROOT,
    Procfs,
    ProcfsError,
    container_id_for_pid,
    process_ids,
)
from collectors.readings import HOST
from sparkops.units import KIB, MIB, size_text

Status = Literal["ok", "warn", "info", "unknown"]

OOM_DAEMONS = ("earlyoom", "systemd-oomd", "oomd")
SSH_UNITS = ("ssh.service", "sshd.service")
# Docker's /dev/shm when --shm-size is not given (docker run reference: "the system uses 64m").
DOCKER_DEFAULT_SHM = 64 * MIB
# The kernel's own min_free_kbytes: sqrt(16 × lowmem KiB), clamped (mm/page_alloc.c).
MIN_FREE_KBYTES_RANGE = (128, 262144)
# A value this far below the kernel's default was lowered on purpose (lowmem, which the kernel
# uses, is a little below MemTotal, which this compares with).
MIN_FREE_LOWERED_BELOW = 0.9
# Page cache counts as routinely large when its median over the look-back is at least this
# share of MemTotal: ~12 GiB on a GB10, room an engine starting then would not see.
PAGE_CACHE_LARGE_SHARE = 0.10
PAGE_CACHE_LOOKBACK = timedelta(days=7)
_SIZE_OPTION = re.compile(r"^size=(\d+)([kmgKMG%]?)$")


@dataclass(frozen=True)
class Finding:
    """One item of the audit: what was found, whether it is fine (``status``), what to do
    (``advice``, "" when nothing), and the figures behind it (bytes; None when unknown)."""

    key: str
    title: str
    status: Status
    found: str
    advice: str = ""
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RescueAudit:
    """The audit of one node at one instant. ``read_on_node`` is False when the node-side
    items could not be read here; ``note`` then says why."""

    node: str
    at: datetime
    read_on_node: bool
    findings: tuple[Finding, ...]
    note: str = ""

    def finding(self, key: str) -> Finding:
        return next(found for found in self.findings if found.key == key)

    @property
    def counts(self) -> dict[str, int]:
        """How many findings have each status."""
        counts = {"ok": 0, "warn": 0, "info": 0, "unknown": 0}
        for found in self.findings:
            counts[found.status] += 1
        return counts

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, for an API."""
        return {"node": self.node, "at": self.at.isoformat(), "read_on_node": self.read_on_node,
                "note": self.note, "findings": [asdict(found) for found in self.findings]}


# --- node-side reads --------------------------------------------------------------------------

@dataclass(frozen=True)
class SwapArea:
    """One line of ``/proc/swaps`` (sizes in bytes)."""

    name: str
    kind: str
    size: int
    used: int

    @property
    def in_memory(self) -> bool:
        """zram keeps what it swaps compressed in memory."""
        return "/zram" in self.name


def parse_swaps(text: str) -> list[SwapArea]:
    """The areas of a ``/proc/swaps`` text (its header and malformed lines skipped). Names with
    spaces are written with ``\\040`` and have no space here."""
    areas = []
    for line in text.splitlines()[1:]:
        parts = line.rsplit(None, 4)
        if len(parts) == 5 and parts[2].isdigit() and parts[3].isdigit():
            areas.append(SwapArea(parts[0], parts[1], int(parts[2]) * KIB,
                                  int(parts[3]) * KIB))
    return areas


@dataclass(frozen=True)
class ProcessEntry:
    """One process as the audit sees it: its name, OOM score and container (None: none)."""

    pid: int
    comm: str
    oom_score: int | None
    container_id: str | None


def scan_processes(root: Path) -> list[ProcessEntry]:
    """Every process under ``root`` (a /proc) with its ``comm``, ``oom_score`` and container;
    processes that exit meanwhile are left out, unreadable scores are None."""
    found = []
    for pid in process_ids(root):
        try:
            comm = (root / str(pid) / "comm").read_text().strip()
        except OSError:
            continue
        try:
            score: int | None = int((root / str(pid) / "oom_score").read_text())
        except (OSError, ValueError):
            score = None
        found.append(ProcessEntry(pid, comm, score, container_id_for_pid(pid, root)))
    return found


def _command_line(root: Path, pid: int) -> list[str]:
    try:
        raw = (root / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [word.decode("utf-8", "replace") for word in raw.split(b"\0") if word]


def _option(words: list[str], *names: str) -> str | None:
    """The value of the first of ``names`` in a command line (``--x v`` or ``--x=v``)."""
    for position, word in enumerate(words):
        for name in names:
            if word == name and position + 1 < len(words):
                return words[position + 1]
            if word.startswith(name + "="):
                return word[len(name) + 1:]
    return None


def shm_mount(root: Path, pid: int) -> tuple[int | None, str]:
    """The size of ``/dev/shm`` as process ``pid`` sees it (bytes; None when it has no size
    option, i.e. tmpfs' default of half of RAM, or could not be read) and how it reads."""
    try:
        text = (root / str(pid) / "mountinfo").read_text()
    except OSError as error:
        return None, f"{root / str(pid) / 'mountinfo'}: {error.strerror or error}"
    for line in text.splitlines():
        fields, _, tail = line.partition(" - ")
        parts, super_parts = fields.split(), tail.split()
        if len(parts) < 5 or parts[4] != "/dev/shm" or len(super_parts) < 3:
            continue
        for option in super_parts[2].split(","):
            match = _SIZE_OPTION.match(option)
            if match and match[2] != "%":
                factor = {"": 1, "k": KIB, "m": MIB, "g": 1024 * MIB}[match[2].lower()]
                return int(match[1]) * factor, f"{super_parts[0]} {option}"
        return None, f"{super_parts[0]} without a size (tmpfs' default: half of RAM)"
    return None, "no /dev/shm mount"


def memlock_limit(root: Path, pid: int) -> tuple[int | None, bool, str]:
    """``(soft limit in bytes, unlimited, why unknown)`` of "Max locked memory" in
    ``/proc/<pid>/limits``."""
    try:
        text = (root / str(pid) / "limits").read_text()
    except OSError as error:
        return None, False, f"{root / str(pid) / 'limits'}: {error.strerror or error}"
    for line in text.splitlines():
        if line.startswith("Max locked memory"):
            soft = line[len("Max locked memory"):].split()[0]
            if soft == "unlimited":
                return None, True, ""
            if soft.isdigit():
                return int(soft), False, ""
    return None, False, "no 'Max locked memory' line in its limits"


# memory.min or memory.low written "max": all of the cgroup's memory is protected.
PROTECT_ALL = 2**63 - 1


def protection_text(value: int | None) -> str:
    return "max (all of it)" if value == PROTECT_ALL else size_text(value)


@dataclass(frozen=True)
class CgroupMemory:
    """memory.min, memory.low and memory.current of one cgroup v2 directory (None: absent;
    :data:`PROTECT_ALL` for a protection written "max")."""

    path: str
    exists: bool
    min: int | None = None
    low: int | None = None
    current: int | None = None

    @property
    def protected(self) -> int:
        return max(self.min or 0, self.low or 0)


def unified_root(cgroup_root: Path) -> Path | None:
    """The cgroup v2 hierarchy: ``cgroup_root`` itself (unified mode) or its ``unified``
    directory (systemd's hybrid mode); None when there is none."""
    for candidate in (cgroup_root, cgroup_root / "unified"):
        if (candidate / "cgroup.controllers").is_file():
            return candidate
    return None


def read_cgroup_memory(directory: Path) -> CgroupMemory:
    def number(name: str) -> int | None:
        try:
            text = (directory / name).read_text().strip()
        except OSError:
            return None
        if text == "max" and name != "memory.current":
            return PROTECT_ALL
        return int(text) if text.isdigit() else None

    if not directory.is_dir():
        return CgroupMemory(str(directory), exists=False)
    return CgroupMemory(str(directory), exists=True, min=number("memory.min"),
                        low=number("memory.low"), current=number("memory.current"))


# --- the findings -----------------------------------------------------------------------------

def swap_finding(procfs: Procfs) -> Finding:
    title = "Swap"
    try:
        areas = parse_swaps(procfs.read_text("swaps"))
    except ProcfsError as error:
        return Finding("swap", title, "unknown", f"unknown — {error}")
    size, used = sum(a.size for a in areas), sum(a.used for a in areas)
    figures = {"swap_bytes": size, "swap_used_bytes": used,
               "areas": [asdict(area) for area in areas]}
    if not areas:
        return Finding("swap", title, "warn", "No swap: /proc/swaps lists no area.", (
            "Add a swap file (fallocate, mkswap, swapon, and a line in /etc/fstab), so that "
            "idle services' memory can move out before the host runs short and growing swap "
            "use raises the headroom-floor alert early. It is no reserve for the engines: "
            "16 GiB of swap did not prevent a wedge (open-gpu-kernel-modules#1358)."), figures)
    names = ", ".join(f"{a.kind} {a.name} ({size_text(a.size)})" for a in areas)
    found = f"{size_text(size)} of swap, {size_text(used)} in use: {names}."
    if all(area.in_memory for area in areas):
        return Finding("swap", title, "info", found, (
            "This swap is zram, compressed in memory itself: it stretches memory but adds no "
            "room outside it. A swap file on disk gives idle services somewhere to go."),
            figures)
    return Finding("swap", title, "ok", found, figures=figures)


def oom_daemon_finding(root: Path, processes: list[ProcessEntry]) -> Finding:
    title = "OOM daemon"
    running = [p for p in processes if p.comm in OOM_DAEMONS]
    figures: dict[str, Any] = {"daemons": [{"pid": p.pid, "name": p.comm} for p in running]}
    if not processes:
        return Finding("oom-daemon", title, "unknown",
                       f"unknown — no process could be read under {root}")
    if not running:
        return Finding("oom-daemon", title, "warn", (
            "No OOM daemon runs (no earlyoom, systemd-oomd or oomd among the processes): when "
            "memory runs out, the kernel's OOM killer acts late or not at all, and a GB10 "
            "wedges."), (
            "Install earlyoom (apt install earlyoom) and set EARLYOOM_ARGS in "
            "/etc/default/earlyoom with --prefer matching the engines' processes and --avoid "
            "matching sshd, systemd, the database and SparkOps, so that an engine is ended "
            "while the host can still answer."), figures)
    parts, advice = [], ""
    for process in running:
        if process.comm == "earlyoom":
            words = _command_line(root, process.pid)
            prefer, avoid = _option(words, "--prefer"), _option(words, "--avoid")
            figures.update(earlyoom_prefer=prefer, earlyoom_avoid=avoid)
            parts.append(f"earlyoom (pid {process.pid}; --prefer {shlex.quote(prefer)}"
                         if prefer else f"earlyoom (pid {process.pid}; no --prefer")
            parts[-1] += f", --avoid {shlex.quote(avoid)})" if avoid else ", no --avoid)"
            if not prefer:
                advice = ("Give earlyoom --prefer matching the engines' processes, so that it "
                          "ends an engine before the database or the chat backend.")
        else:
            parts.append(f"{process.comm} (pid {process.pid})")
            if process.comm == "systemd-oomd" and not advice:
                advice = ("systemd-oomd acts only on units with ManagedOOMMemoryPressure=kill "
                          "(or ManagedOOMSwap=kill): set it on the slice the engines' "
                          "containers run in.")
    status: Status = "ok" if any(p.comm == "earlyoom" for p in running) else "info"
    return Finding("oom-daemon", title, status, f"Running: {'; '.join(parts)}.", advice, figures)


def oom_victim_finding(root: Path, processes: list[ProcessEntry],
                       engines_by_container: dict[str, str]) -> Finding:
    title = "Who would be ended first"
    scored = [p for p in processes if p.oom_score is not None]
    if not scored:
        return Finding("oom-victim", title, "unknown",
                       f"unknown — no oom_score could be read under {root}")
    top = max(scored, key=lambda p: (p.oom_score, -p.pid))
    engine_processes = [p for p in scored if p.container_id in engines_by_container]

    def describe(process: ProcessEntry) -> str:
        engine = engines_by_container.get(process.container_id or "")
        owner = f", engine {engine}" if engine else ""
        return f"{process.comm} (pid {process.pid}{owner}, oom_score {process.oom_score})"

    figures: dict[str, Any] = {"pid": top.pid, "name": top.comm, "oom_score": top.oom_score,
                               "engine": engines_by_container.get(top.container_id or "")}
    found = f"Highest oom_score: {describe(top)}."
    if not engines_by_container:
        return Finding("oom-victim", title, "info", found + " No engine is known on this node.",
                       figures=figures)
    if not engine_processes:
        return Finding("oom-victim", title, "info", found + (
            " No process of an engine container was found: are the engines running, and "
            "does SparkOps see the host's processes?"), figures=figures)
    if top in engine_processes:
        return Finding("oom-victim", title, "ok", found + " An engine goes first.",
                       figures=figures)
    best_engine = max(engine_processes, key=lambda p: (p.oom_score, -p.pid))
    figures["engine_oom_score"] = best_engine.oom_score
    return Finding("oom-victim", title, "warn", (
        f"{found} The kernel and earlyoom would end it before any engine (highest engine "
        f"process: {describe(best_engine)}): GPU allocations are not charged to a process's "
        "resident memory, which the score counts."), (
        "Start the engine containers with a positive --oom-score-adj (oom_score_adj in "
        "compose), or give earlyoom --prefer for them, so that an engine is ended first."),
        figures)


def reserve_finding(cgroup_root: Path) -> Finding:
    title = "Protected memory for sshd and systemd"
    unified = unified_root(cgroup_root)
    if unified is None:
        return Finding("reserve", title, "warn", (
            f"No cgroup v2 hierarchy under {cgroup_root}: memory.min cannot protect sshd "
            "(cgroup v1 has no memory protection)."), (
            "Boot with the unified cgroup hierarchy (systemd.unified_cgroup_hierarchy=1, the "
            "default on Ubuntu since 21.10), then set MemoryMin= on system.slice."))
    try:
        controllers = (unified / "cgroup.controllers").read_text().split()
    except OSError as error:
        return Finding("reserve", title, "unknown", f"unknown — {error}")
    if "memory" not in controllers:
        v1 = (cgroup_root / "memory" / "memory.limit_in_bytes").is_file()
        return Finding("reserve", title, "warn", (
            f"The cgroup v2 hierarchy ({unified}) has no memory controller"
            + (": memory is managed by cgroup v1 here, which has no memory.min" if v1 else "")
            + ", so nothing protects sshd's memory."), (
            "Boot with the unified cgroup hierarchy (systemd.unified_cgroup_hierarchy=1, the "
            "default on Ubuntu since 21.10), then set MemoryMin= on system.slice."))
    slice_ = read_cgroup_memory(unified / "system.slice")
    if not slice_.exists:
        return Finding("reserve", title, "unknown", (
            f"unknown — no system.slice under {unified} (not systemd, or this process sees a "
            "cgroup namespace of its own)"))
    ssh = next((read_cgroup_memory(unified / "system.slice" / unit) for unit in SSH_UNITS
                if (unified / "system.slice" / unit).is_dir()), None)
    figures = {"system_slice": asdict(slice_), "ssh_unit": asdict(ssh) if ssh else None}
    holds = size_text(slice_.current)
    found = (f"system.slice: memory.min {protection_text(slice_.min)}, memory.low "
             f"{protection_text(slice_.low)}, holding {holds} now")
    if ssh is not None:
        found += (f"; {Path(ssh.path).name}: memory.min {protection_text(ssh.min)}, "
                  f"memory.low {protection_text(ssh.low)}")
    set_it = (f"systemctl set-property system.slice MemoryMin=<at least what it holds now, "
              f"{holds}>: what sshd, journald and the other system services need stays theirs "
              "when the engines take the rest.")
    if slice_.protected > 0:
        short = slice_.current is not None and slice_.protected < slice_.current
        return Finding("reserve", title, "ok", found + (
            ". Less is protected than it holds now: the rest can be reclaimed." if short
            else "."), figures=figures)
    if ssh is not None and ssh.protected > 0:
        return Finding("reserve", title, "warn", found + (
            f". {Path(ssh.path).name} asks for protection, but a cgroup's protection is bounded "
            "by its parent's, and system.slice has none: it gets none."), set_it, figures)
    return Finding("reserve", title, "warn", found + ": nothing is protected.", set_it, figures)


def kernel_min_free_kbytes(lowmem_kbytes: int) -> int:
    """The kernel's own ``min_free_kbytes`` for ``lowmem_kbytes`` (mm/page_alloc.c)."""
    low, high = MIN_FREE_KBYTES_RANGE
    return min(max(math.isqrt(lowmem_kbytes * 16), low), high)


def min_free_finding(procfs: Procfs) -> Finding:
    title = "vm.min_free_kbytes"
    try:
        text = procfs.read_text("sys/vm/min_free_kbytes").strip()
    except ProcfsError as error:
        return Finding("min-free", title, "unknown", f"unknown — {error}")
    if not text.isdigit():
        return Finding("min-free", title, "unknown",
                       f"unknown — vm.min_free_kbytes reads {text[:40]!r}")
    value = int(text)
    figures: dict[str, Any] = {"min_free_kbytes": value, "kernel_default_kbytes": None}
    found = f"{value} KiB ({size_text(value * KIB)}) kept free for the kernel's own allocations"
    try:
        total = parse_meminfo(procfs.meminfo()).get("MemTotal")
    except ProcfsError:
        total = None
    if total is None:
        return Finding("min-free", title, "info",
                       found + "; the kernel's default is unknown: MemTotal could not be read.",
                       figures=figures)
    default = figures["kernel_default_kbytes"] = kernel_min_free_kbytes(total // KIB)
    if value < MIN_FREE_LOWERED_BELOW * default:
        return Finding("min-free", title, "warn", (
            f"{found}: below the kernel's own default of about {default} KiB for this "
            "MemTotal, so it was lowered, and atomic allocations (a network driver's under "
            "pressure) have less to draw on."), (
            f"Put the kernel's default back (remove the vm.min_free_kbytes override in "
            f"/etc/sysctl.d; about {default} KiB here)."), figures)
    if value > default / MIN_FREE_LOWERED_BELOW:
        return Finding("min-free", title, "ok", (
            f"{found}: above the kernel's default of about {default} KiB for this MemTotal "
            "(transparent huge pages raise it, as can a setting)."), (
            "Leave it there rather than raising it further: raising it to make room during "
            "weight loads broke vLLM's own free-memory check in operators' reports."), figures)
    return Finding("min-free", title, "ok",
                   f"{found}: the kernel's default for this MemTotal (about {default} KiB).",
                   figures=figures)


def engine_findings(root: Path, processes: list[ProcessEntry],
                    engines_by_container: dict[str, str]) -> list[Finding]:
    """One finding per engine container: its /dev/shm and memory lock, read from its first
    process (the lowest PID in its cgroup)."""
    first: dict[str, int] = {}
    for process in processes:  # sorted by PID
        if process.container_id in engines_by_container:
            first.setdefault(process.container_id, process.pid)
    findings = []
    for container_id, name in sorted(engines_by_container.items(), key=lambda item: item[1]):
        key, title = f"engine:{name}", f"Engine {name}: /dev/shm and memory lock"
        pid = first.get(container_id)
        if pid is None:
            findings.append(Finding(key, title, "unknown", (
                "unknown — no process of its container was found (not running, or SparkOps "
                "does not see the host's processes)")))
            continue
        findings.append(_engine_finding(root, pid, key, title))
    return findings


def _engine_finding(root: Path, pid: int, key: str, title: str) -> Finding:
    shm, shm_how = shm_mount(root, pid)
    locked, unlimited, lock_why = memlock_limit(root, pid)
    figures = {"pid": pid, "shm_bytes": shm, "memlock_bytes": locked,
               "memlock_unlimited": unlimited}
    shm_text = size_text(shm) if shm is not None else "size unknown"
    lock_text = "unlimited" if unlimited else size_text(locked) if locked is not None \
        else f"unknown — {lock_why}"
    found = f"/dev/shm {shm_text} ({shm_how}); may lock {lock_text} (pid {pid})."
    advice: list[str] = []
    status: Status = "ok"
    if shm is not None and shm <= DOCKER_DEFAULT_SHM:
        status = "warn"
        advice.append("/dev/shm is Docker's default 64 MiB, which NVIDIA's NGC containers warn "
                      "may be too small for PyTorch's worker processes: start it with "
                      "--ipc=host or --shm-size.")
    if unlimited:
        status = "info" if status == "ok" else status
        advice.append("It may lock all the memory it maps (NVIDIA's advice for its containers "
                      "is --ulimit memlock=-1): locked pages cannot be swapped or reclaimed, "
                      "only ending the process frees them; count them out of any swap plan.")
    if shm is None and locked is None and not unlimited:
        status = "unknown"
    return Finding(key, title, status, found, " ".join(advice), figures)


# --- from the stored samples ------------------------------------------------------------------

def page_cache_finding(node: Node, now: datetime) -> Finding:
    """Whether the reclaimable page cache is routinely large: its median share of MemTotal over
    the last week, from the ten-minute roll-ups, or the raw samples when there are none yet.
    Two indexed queries (three without roll-ups)."""
    title = "Page cache"
    since = now - PAGE_CACHE_LOOKBACK
    total = node.mem_total_bytes
    rows = list(Rollup.objects.filter(node=node, metric=Metric.PAGE_CACHE_RECLAIMABLE,
                                      resolution=600, start__gte=since)
                .values_list("mean", flat=True))
    source = "ten-minute roll-ups of the last 7 days"
    if not rows:
        rows = list(HOST.holding(Metric.PAGE_CACHE_RECLAIMABLE)
                    .filter(node=node, at__gte=since).values_list("value", flat=True))
        source = "samples of the last 7 days"
    if not rows:
        return Finding("page-cache", title, "unknown",
                       "unknown — no stored sample of reclaimable page cache in the last 7 days")
    if not total:
        return Finding("page-cache", title, "unknown",
                       "unknown — the node's MemTotal is not known")
    typical = median(rows)
    figures = {"median_bytes": typical, "max_bytes": max(rows), "share": typical / total,
               "points": len(rows)}
    found = (f"Reclaimable page cache: median {size_text(typical)} "
             f"({typical / total:.0%} of MemTotal), at most {size_text(max(rows))}, over "
             f"{len(rows)} {source}.")
    if typical / total < PAGE_CACHE_LARGE_SHARE:
        return Finding("page-cache", title, "ok", found, figures=figures)
    return Finding("page-cache", title, "warn", found + (
        " An engine that starts sees MemFree (cudaMemGetInfo follows it on GB10), not this."), (
        "Drop the page cache between stopping and starting an engine (SparkOps' restarts do: "
        "stop, drop, start); before a start outside SparkOps, run sync; echo 3 > "
        "/proc/sys/vm/drop_caches after the stop."), figures)


# --- the audit --------------------------------------------------------------------------------

def engine_containers(node: Node) -> dict[str, str]:
    """container id -> engine name(s) of the node's present engines (a model router's models
    share its container)."""
    names: dict[str, list[str]] = {}
    for container_id, name in Engine.objects.filter(node=node, present=True) \
            .exclude(container_id="").order_by("name").values_list("container_id", "name"):
        names.setdefault(container_id, []).append(name)
    return {container_id: ", ".join(found) for container_id, found in names.items()}


NODE_SIDE = (("swap", "Swap"), ("oom-daemon", "OOM daemon"),
             ("oom-victim", "Who would be ended first"),
             ("reserve", "Protected memory for sshd and systemd"),
             ("min-free", "vm.min_free_kbytes"))


def audit_node(node: Node, now: datetime, procfs: Procfs | None,
               cgroup_root: Path = CGROUP_ROOT, not_read_because: str = "") -> RescueAudit:
    """Audit ``node``: the node-side items from ``procfs`` and ``cgroup_root`` (this machine's
    /proc and /sys, or fixture trees), or, with ``procfs`` None, as unknown with
    ``not_read_because``; the page cache from the stored samples either way."""
    findings: list[Finding] = []
    if procfs is None:
        findings += [Finding(key, title, "unknown", f"unknown — {not_read_because}")
                     for key, title in NODE_SIDE]
    else:
        root = procfs.root
        processes = scan_processes(root)
        engines = engine_containers(node)
        findings += [swap_finding(procfs), oom_daemon_finding(root, processes),
                     oom_victim_finding(root, processes, engines), reserve_finding(cgroup_root),
                     min_free_finding(procfs)]
        findings += engine_findings(root, processes, engines)
    findings.append(page_cache_finding(node, now))
    return RescueAudit(node=node.name, at=now, read_on_node=procfs is not None,
                       findings=tuple(findings), note=not_read_because)


def audit_for_page(node: Node, now: datetime) -> RescueAudit:
    """The audit as a page of this process shows it: read here when this process runs on
    ``node`` (``SPARKOPS_NODE_NAME``), else the node-side items are unknown, with why."""
    if node.name == settings.SPARKOPS_NODE_NAME:
        return audit_node(node, now, local_procfs())
    return audit_node(node, now, None, not_read_because=(
        f"read on the node itself, and this page is served by {settings.SPARKOPS_NODE_NAME}, "
        f"not {node.name}"))
