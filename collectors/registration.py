"""A node's worker says who it is: registration, its facts, and the heartbeat thread.

Every worker that serves this node's queue (``bin/sparkops agent`` on a fleet node, the one
worker of a one-node stack) registers the node once it is ready (Celery's ``worker_ready``,
connected in ``collectors.tasks``): it reads the node and upserts its ``Node`` row with the
host name, MemTotal, ``agent_started_at`` (the database's clock, the centre's) and
``Node.facts``. A row with ``agent_started_at`` is *agent-backed*: its node's own worker runs
against the central database and broker, so the central beat schedules its collections
(``collectors.fleetbeat``) and its heartbeat says whether it is reachable
(``collectors.heartbeat``). :func:`is_agent_backed` and :func:`agent_node_names` are what the
centre asks.

**Facts** (:func:`read_facts`) are what an admin compares between nodes before blaming a model
for a difference (the drift between two GB10s that should be alike)::

    {"read_at": "2025-10-01T12:00:00+00:00",          # the node's clock, UTC
     "items": {key: {"value": "6.11.0-1016-nvidia",   # text, or None
                     "source": "where it was read",
                     "unknown": "why not"}},           # only when value is None
     "interconnect": [port, ...]}                      # collectors.sysfs.Port.as_dict()

with the keys of ``FACT_KEYS``. Each is read where it lives, through the seam of its world:
``/proc`` through ``Procfs`` (``SPARKOPS_PROCFS``), ``/sys`` through ``Sysfs``
(``SPARKOPS_SYSFS``), the driver through NVML (``collectors.nvml``), ``/etc`` as this process
sees it (in a container, the container's own files). A fact that cannot be read is None with
why, never a guess. Engine images, their versions and NCCL settings are not facts: they are on
the ``Engine`` rows already.

**The heartbeat** (:class:`NodeHeartbeat`): a daemon thread of the worker's main process
(started from ``worker_ready``, so never in a prefork child, and stopped at
``worker_shutdown``). It has the node registered, in a thread of its own that is started again
each interval until it succeeds (a database that is down at start is not a node that never
registers, and a driver that hangs NVML must not hold the beats up), calls
``heartbeat.beat`` every ``heartbeat.interval_seconds()``, and every
``INTERCONNECT_REFRESH_SECONDS`` re-reads the ports into ``facts["interconnect"]`` (a link that
went down shows within a minute; the other facts change only with a reboot or an upgrade, which
restarts the worker and so registers again; ``facts["read_at"]`` stays the registration's).
After each round it closes its database connection, so an idle thread holds none. A failure is
logged (the first of a run with its traceback) and the thread carries on.

Cost: a registration reads about fifteen small files and opens NVML once (up to a second or two
on a node without the persistence daemon), in the heartbeat thread, never in a task; a beat is
three small queries; a port refresh about six reads a port and one row update.
"""

from __future__ import annotations

import logging
import re
import shlex
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pynvml
from django.conf import settings
from django.db import connection, transaction
from django.db.models.functions import Now

from collectors import heartbeat
from collectors.meminfo import parse_meminfo
from collectors.models import Node
from collectors.nvml import read_gpus
from collectors.procfs import Procfs, ProcfsError
from collectors.sysfs import Sysfs, SysfsError, interconnect, local_sysfs
from sparkops.version import VERSION

log = logging.getLogger(__name__)

FACT_KEYS = (
    "hostname", "kernel", "os", "dgx_os", "driver", "cuda", "firmware", "swappiness",
    "min_free_kbytes", "overcommit_memory", "watermark_scale_factor", "transparent_hugepage",
    "sparkops_version",
)
VM_SETTINGS = ("swappiness", "min_free_kbytes", "overcommit_memory", "watermark_scale_factor")
INTERCONNECT_REFRESH_SECONDS = 60.0
# Files that say "this process runs in a container" (Docker's, Podman's).
CONTAINER_MARKERS = (Path("/.dockerenv"), Path("/run/.containerenv"))
# "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.95.05  Release Build ..."
_NVRM_VERSION = re.compile(r"NVRM version:.*?\s(\d+\.\d+(?:\.\d+)*)\s")


@dataclass(frozen=True)
class Fact:
    """One fact: its text (None when unknown), where it was read, and why not."""

    value: str | None
    source: str
    unknown: str = ""

    def as_dict(self) -> dict[str, str | None]:
        item: dict[str, str | None] = {"value": self.value, "source": self.source}
        if self.value is None:
            item["unknown"] = self.unknown or "not read"
        return item


# --- what the centre asks ---------------------------------------------------------------------


def is_agent_backed(node: Node) -> bool:
    """Whether ``node``'s own worker registered it against this database (an agent, or the
    worker of a one-node stack): its heartbeat then says whether it is reachable."""
    return node.agent_started_at is not None


def agent_node_names() -> list[str]:
    """The names of every agent-backed node, sorted."""
    return list(Node.objects.filter(agent_started_at__isnull=False)
                .order_by("name").values_list("name", flat=True))


def fact_text(facts: dict[str, Any], key: str) -> str:
    """A fact for people: its value, or "unknown — <why>" (also for a node never
    registered)."""
    item = (facts or {}).get("items", {}).get(key)
    if not item:
        return "unknown — this node's worker has not registered it"
    if item.get("value") is None:
        return f"unknown — {item.get('unknown') or 'not read'}"
    return str(item["value"])


# --- reading the facts ------------------------------------------------------------------------


def read_facts(procfs: Procfs, sysfs: Sysfs, *, etc: Path = Path("/etc"), nvml: Any = pynvml,
               now: datetime | None = None) -> dict[str, Any]:
    """The node's facts in ``Node.facts``' shape (module docstring). Never raises."""
    items = {
        "hostname": _hostname(procfs),
        "kernel": _procfs_fact(procfs, "sys/kernel/osrelease"),
        "os": _os_release(etc),
        "dgx_os": _dgx_release(etc),
        **_driver_and_cuda(procfs, nvml),
        "firmware": _firmware(sysfs),
        **{name: _procfs_fact(procfs, f"sys/vm/{name}") for name in VM_SETTINGS},
        "transparent_hugepage": _transparent_hugepage(sysfs),
        "sparkops_version": Fact(VERSION, "sparkops/version.py (the release this worker runs)"),
    }
    read_at = (now or datetime.now(UTC)).astimezone(UTC).isoformat(timespec="seconds")
    return {"read_at": read_at,
            "items": {key: items[key].as_dict() for key in FACT_KEYS},
            "interconnect": interconnect(sysfs)}


def _procfs_fact(procfs: Procfs, relative: str) -> Fact:
    source = str(procfs.root / relative)
    try:
        return Fact(procfs.read_text(relative).strip(), source)
    except ProcfsError as error:
        return Fact(None, source, str(error))


def _hostname(procfs: Procfs) -> Fact:
    relative = "sys/kernel/hostname"
    where = (f"{procfs.root / relative} (the host name of this process's UTS namespace: in a "
             "container, the container's unless it shares the host's)")
    try:
        return Fact(procfs.read_text(relative).strip(), where)
    except ProcfsError as error:
        name = socket.gethostname()
        return Fact(name or None, f"gethostname() of this process, since {error}",
                    "the kernel gives no host name")


def in_container() -> bool:
    """Whether this process runs in a Docker or Podman container (their marker files)."""
    return any(marker.exists() for marker in CONTAINER_MARKERS)


def parse_assignments(text: str) -> dict[str, list[str]]:
    """``KEY=value`` lines (os-release(5): shell quoting, comments), each key's values in
    order (``/etc/dgx-release`` repeats keys as each OTA update appends its lines)."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, equals, raw = line.strip().partition("=")
        if not equals or not key or key.startswith("#"):
            continue
        try:
            words = shlex.split(raw)
        except ValueError:
            words = [raw.strip().strip("\"'")]
        found.setdefault(key.strip(), []).append(" ".join(words))
    return found


def _read_etc(path: Path) -> tuple[str | None, str, bool]:
    """The file's text, or None with why and whether it is missing (rather than unreadable)."""
    try:
        return path.read_text(errors="replace"), "", False
    except FileNotFoundError:
        return None, f"{path} does not exist", True
    except OSError as error:
        return None, f"{path}: {error.strerror or error}", False


def _os_release(etc: Path) -> Fact:
    path = etc / "os-release"
    seen = ("SparkOps runs in a container, so this is the container's system, not the host's"
            if in_container() else "as this process sees it; in a container it would be the "
            "container's system, not the host's")
    source = f"PRETTY_NAME of {path} ({seen})"
    text, why, _ = _read_etc(path)
    if text is None:
        return Fact(None, source, why)
    names = parse_assignments(text).get("PRETTY_NAME")
    if not names or not names[-1]:
        return Fact(None, source, f"{path} has no PRETTY_NAME")
    return Fact(names[-1], source)


def _dgx_release(etc: Path) -> Fact:
    path = etc / "dgx-release"
    text, why, missing = _read_etc(path)
    if text is None:
        if missing:
            why += (" (SparkOps runs in a container that does not mount it)"
                    if in_container() else ": not DGX OS")
        return Fact(None, str(path), why)
    values = parse_assignments(text)
    # Each OTA update appends its DGX_OTA_VERSION: the last one is what runs now.
    for key in ("DGX_OTA_VERSION", "DGX_SWBUILD_VERSION"):
        if values.get(key) and values[key][-1]:
            return Fact(values[key][-1], f"{key} of {path}")
    return Fact(None, str(path), f"{path} has neither DGX_OTA_VERSION nor DGX_SWBUILD_VERSION")


def _driver_and_cuda(procfs: Procfs, nvml: Any) -> dict[str, Fact]:
    report = read_gpus(nvml)
    why_not = report.reason or "; ".join(f"{k}: {v}" for k, v in report.errors.items()) \
        or "NVML did not give it"
    if report.driver_version:
        driver = Fact(report.driver_version, "NVML (nvmlSystemGetDriverVersion)")
    else:
        driver = _driver_from_procfs(procfs, why_not)
    if report.cuda_driver_version:
        cuda = Fact(report.cuda_driver_version,
                    "NVML (nvmlSystemGetCudaDriverVersion: the newest CUDA this driver runs)")
    else:
        cuda = Fact(None, "NVML (nvmlSystemGetCudaDriverVersion)", why_not)
    return {"driver": driver, "cuda": cuda}


def _driver_from_procfs(procfs: Procfs, nvml_why: str) -> Fact:
    """The kernel module's version from ``<procfs>/driver/nvidia/version``, where NVML gave
    none (its library missing from a container, say)."""
    relative = "driver/nvidia/version"
    source = str(procfs.root / relative)
    try:
        text = procfs.read_text(relative)
    except ProcfsError as error:
        return Fact(None, f"NVML, then {source}", f"{nvml_why}; {error}")
    match = _NVRM_VERSION.search(text)
    if match is None:
        return Fact(None, source, f"{source} has no NVRM version line")
    return Fact(match.group(1), f"{source} (the kernel module's version; NVML: {nvml_why})")


def _firmware(sysfs: Sysfs) -> Fact:
    relative = "class/dmi/id/bios_version"
    source = str(sysfs.path(relative))
    try:
        version = sysfs.read_line(relative)
    except SysfsError as error:
        return Fact(None, source, f"{error} (no firmware tables the kernel exports without "
                                  "privileges on this machine)")
    return Fact(version or None, source, "the firmware gives an empty version")


def _transparent_hugepage(sysfs: Sysfs) -> Fact:
    relative = "kernel/mm/transparent_hugepage/enabled"
    source = f"{sysfs.path(relative)} (the bracketed choice)"
    try:
        text = sysfs.read_line(relative)
    except SysfsError as error:
        return Fact(None, source, str(error))
    chosen = re.search(r"\[([^\]]+)\]", text)
    if chosen is None:
        return Fact(None, source, f"no choice in brackets in {text[:60]!r}")
    return Fact(chosen.group(1), source)


# --- writing the row --------------------------------------------------------------------------


def mem_total_bytes(procfs: Procfs) -> int | None:
    """MemTotal in bytes, or None when meminfo cannot be read."""
    try:
        return parse_meminfo(procfs.meminfo()).get("MemTotal")
    except ProcfsError:
        return None


def register(node_name: str | None = None, *, procfs: Procfs | None = None,
             sysfs: Sysfs | None = None, etc: Path = Path("/etc"),
             nvml: Any = pynvml) -> Node:
    """Read this node and upsert its row: host name, MemTotal (left as it was when meminfo
    cannot be read: never None over a known figure), facts, and ``agent_started_at`` on the
    database's clock. Returns the row as stored."""
    name = node_name or settings.SPARKOPS_NODE_NAME
    procfs = procfs or Procfs(Path(settings.SPARKOPS_PROCFS))
    sysfs = sysfs or local_sysfs()
    facts = read_facts(procfs, sysfs, etc=etc, nvml=nvml)
    defaults: dict[str, Any] = {
        "hostname": facts["items"]["hostname"]["value"] or socket.gethostname(),
        "facts": facts,
    }
    total = mem_total_bytes(procfs)
    if total is not None:
        defaults["mem_total_bytes"] = total
    with transaction.atomic():
        node, _ = Node.objects.update_or_create(name=name, defaults=defaults)
        Node.objects.filter(pk=node.pk).update(agent_started_at=Now())
    node.refresh_from_db()
    return node


def refresh_interconnect(node_name: str, sysfs: Sysfs | None = None) -> bool:
    """Re-read the ports into the node's ``facts["interconnect"]``, nothing else of the row;
    False when the node has no facts yet (not registered)."""
    ports = interconnect(sysfs or local_sysfs())
    with transaction.atomic():
        node = Node.objects.select_for_update().filter(name=node_name).first()
        if node is None or not node.facts:
            return False
        node.facts = {**node.facts, "interconnect": ports}
        node.save(update_fields=["facts"])
    return True


# --- the heartbeat thread ---------------------------------------------------------------------


class NodeHeartbeat:
    """Registers the node and beats every ``interval`` seconds, refreshing its ports every
    ``refresh_every`` seconds, in daemon threads, until :meth:`stop` (module docstring).

    The registration runs in a thread of its own, started again each round until it succeeds:
    it reads the driver through NVML, which can hang on a GPU that fell off the bus, and a beat
    must not wait for that (a node whose GPU is lost is still a node that answers). A beat
    before the first registration of a new node finds no row and writes nothing.

    ``register``, ``beat`` and ``refresh`` default to this module's and ``heartbeat.beat``;
    ``clock`` is a monotonic clock in seconds.
    """

    def __init__(self, node_name: str, *, interval: float | None = None,
                 refresh_every: float = INTERCONNECT_REFRESH_SECONDS,
                 register: Callable[[str], object] = register,
                 beat: Callable[[str], object] = heartbeat.beat,
                 refresh: Callable[[str], object] = refresh_interconnect,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.node_name = node_name
        self.interval = interval if interval is not None else heartbeat.interval_seconds()
        self.refresh_every = refresh_every
        self._register, self._beat, self._refresh = register, beat, refresh
        self._clock = clock
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._registering: threading.Thread | None = None
        self.registered = False
        self.beats = 0
        self.failures = 0
        self.registration_failures = 0
        self._refreshed_at = 0.0

    def start(self) -> NodeHeartbeat:
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{self.node_name}",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the thread to end and wait up to ``timeout`` seconds for a round in progress
        (a registration in progress is left to finish on its own)."""
        self._stopping.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=timeout)

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        while not self._stopping.is_set():
            self.round()
            self._stopping.wait(self.interval)

    def round(self) -> None:
        """One round: start the registration if it is not done nor under way, beat, refresh
        the ports when due. Never raises; closes this thread's database connection after."""
        self._ensure_registration()
        try:
            self._beat(self.node_name)
            self.beats += 1
            self._recovered()
        except Exception as error:  # noqa: BLE001 - logged; the next round tries again
            self.failures += 1
            self._log_failure("heartbeat", self.failures, error)
        else:
            self._refresh_when_due()
        finally:
            _close_connection()

    def _ensure_registration(self) -> None:
        if self.registered or (self._registering is not None and self._registering.is_alive()):
            return
        self._registering = threading.Thread(target=self._register_once, daemon=True,
                                             name=f"registration-{self.node_name}")
        self._registering.start()

    def _register_once(self) -> None:
        try:
            self._register(self.node_name)
        except Exception as error:  # noqa: BLE001 - logged; the next round tries again
            self.registration_failures += 1
            self._log_failure("registration", self.registration_failures, error)
        else:
            self._refreshed_at = self._clock()
            self.registered = True
            log.info("node %s registered", self.node_name)
        finally:
            _close_connection()

    def _refresh_when_due(self) -> None:
        if not self.registered or self._clock() - self._refreshed_at < self.refresh_every:
            return
        self._refreshed_at = self._clock()
        try:
            self._refresh(self.node_name)
        except Exception:
            log.exception("re-reading the ports of node %s failed", self.node_name)

    def _log_failure(self, what: str, count: int, error: Exception) -> None:
        if count == 1:
            log.exception("the %s of node %s failed; trying again every %g s", what,
                          self.node_name, self.interval)
        else:
            log.warning("the %s of node %s failed again (%d in a row): %s", what,
                        self.node_name, count, error)

    def _recovered(self) -> None:
        if self.failures:
            log.warning("the heartbeat of node %s is back after %d failed rounds",
                        self.node_name, self.failures)
            self.failures = 0


def _close_connection() -> None:
    """Close this thread's database connection, unless a caller's transaction holds it."""
    if not connection.in_atomic_block:
        connection.close()
