"""The kernel's own log as evidence: OOM kills, NVIDIA driver errors, hung tasks and failed page
allocations, read live on the node and stored as :class:`~collectors.models.Event` rows, and the
same recognition over a previous boot's log for the post-mortem.

On a GB10 the CPU and the GPU share one memory, so running out of it rarely ends in a clean CUDA
error: the kernel kills a process, the NVIDIA driver logs ``NV_ERR_NO_MEMORY``, tasks hang, and
the host may stop answering altogether. The kernel log is where that shows first, and often the
only place it shows at all. This module owns reading it:

* **Where from.** ``/dev/kmsg`` (the kernel's ring buffer, read non-blocking from the reader's
  position; every record carries a sequence number, remembered between runs so that nothing is
  read twice) and, where ``/dev/kmsg`` cannot be opened, the journal
  (``journalctl -k -o json --after-cursor ...``, its cursor remembered the same way). Which one
  was read, and why not the other, is told once per change as a ``kernel-log-source`` event
  (``info``; ``warning`` when neither can be read). Records the ring buffer overwrote before
  they were read (a sequence gap, or ``EPIPE`` from ``read``) are told as a ``kernel-log-gap``
  event: what they said is lost, and the timeline says so instead of staying silent.
* **What it recognises** (:func:`classify`), each line's format from its source (the Linux
  source file, or the public report a line was taken from: see ``tests/fixtures/kernel/``):
  OOM kills (``kernel-oom-kill``, critical), NVIDIA ``Xid`` errors (``kernel-nvidia-xid``,
  critical for the Xids that need a GPU reset or mean lost data, warning for the rest),
  the NVIDIA driver out of memory (``kernel-no-memory``, critical: on a GB10 it comes before the
  whole-host wedges reported in NVIDIA/open-gpu-kernel-modules#1358), hung tasks
  (``kernel-hung-task``, warning) and failed page allocations (``kernel-allocation-failure``,
  warning: memory short, or fragmented after long uptimes).
* **Whose it is.** The victim's cgroup (an OOM kill's ``task_memcg``, or ``/proc/<pid>/cgroup``
  while that very process still runs: its start time and name must match the line) gives the
  Docker or Podman container id (``collectors.procfs``), and the container id the engine row
  (:func:`engine_for_container`). A line whose process is gone says so; nothing is guessed.
* **When.** A kernel record's time is microseconds since boot; the boot's wall-clock time comes
  from ``/proc/uptime`` (or ``/proc/stat`` ``btime``), and every time written is in UTC.
* **A previous boot** (:func:`previous_boot_evidence`): ``journalctl -k -b -1 -o json`` and the
  crash records the kernel left in pstore (``/sys/fs/pstore/dmesg-*``, or where
  ``systemd-pstore`` archived them), read with the same recognition, returned as plain
  :class:`Evidence` for the post-mortem. Nothing is stored there.

Every read is bounded: at most ``limit`` new records per run (the rest wait for the next run),
a journal read has a deadline and a byte cap, pstore files a size cap. The reader state (boot
id, source, sequence number or journal cursor) lives in a small JSON file under the data
directory, written after the events are committed and guarded by a lock so two runs never read
the same records at once.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import selectors
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.db import transaction
from django.db.models import Max

from collectors.models import Engine, EngineStart, Event, Node
from collectors.procfs import container_id_for_pid, container_id_in_cgroup_path
from sparkops.filelock import only_run
from sparkops.timetext import moment_text

log = logging.getLogger(__name__)

KMSG_PATH = Path("/dev/kmsg")
JOURNALCTL = "journalctl"
# Where a previous boot's crash records are: the kernel's pstore file system, and the folder
# systemd-pstore moves them to at boot (Storage=external, its default), one folder per record.
PSTORE_ROOTS = (Path("/sys/fs/pstore"), Path("/var/lib/systemd/pstore"))

# New records handled per run at most; the rest wait for the next run (every collection
# interval), so a flood of kernel messages never makes one run long.
RECORDS_PER_RUN = 1000
# One read(2) of /dev/kmsg returns exactly one record and fails with EINVAL when the buffer is
# shorter than it; records are at most a few KiB (a message and its dictionary).
_KMSG_READ_BYTES = 16384
# Reads per run at most, skipped records included (a fresh reader starts at the oldest record
# still in the ring buffer and skips what was read before): a bound on a pathological device.
_KMSG_MAX_READS = 200_000
JOURNAL_DEADLINE_SECONDS = 10.0
JOURNAL_MAX_BYTES = 32 * 1024 * 1024
PREVIOUS_BOOT_RECORDS = 500_000
PSTORE_MAX_BYTES = 4 * 1024 * 1024

KIND_OOM_KILL = "kernel-oom-kill"
KIND_XID = "kernel-nvidia-xid"
KIND_NO_MEMORY = "kernel-no-memory"
KIND_HUNG_TASK = "kernel-hung-task"
KIND_ALLOCATION_FAILURE = "kernel-allocation-failure"
KIND_SOURCE = "kernel-log-source"
KIND_GAP = "kernel-log-gap"
EVIDENCE_KINDS = (KIND_OOM_KILL, KIND_XID, KIND_NO_MEMORY, KIND_HUNG_TASK,
                  KIND_ALLOCATION_FAILURE)

INFO, WARNING, CRITICAL = (Event.Severity.INFO.value, Event.Severity.WARNING.value,
                           Event.Severity.CRITICAL.value)

# Xids that need a GPU reset or a reboot, or mean memory contents were lost or the GPU is gone
# (NVIDIA's Xid catalog, docs.nvidia.com/deploy/xid-errors): critical. The others (13, 31, 43,
# 45, 109, ...) are most often one application's fault and end that application: warning.
CRITICAL_XIDS = frozenset({48, 62, 64, 74, 79, 94, 95, 119, 120, 140, 154})
XID_MEANINGS = {
    13: "graphics engine exception", 31: "GPU memory page fault",
    43: "GPU stopped processing", 45: "preemptive cleanup after an earlier error",
    48: "double-bit ECC error", 62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping event", 64: "row remapping failure",
    74: "NVLink error", 79: "GPU has fallen off the bus", 92: "high single-bit ECC error rate",
    94: "contained ECC error", 95: "uncontained ECC error", 109: "context switch timeout",
    119: "GSP RPC timeout", 120: "GSP error", 154: "GPU recovery action changed",
}

# Repeated lines of one burst (the driver logs NV_ERR_NO_MEMORY hundreds of times before a
# wedge) fold into the first event of the burst when they come within this window of it.
REPEAT_WINDOW = timedelta(seconds=60)
# The two lines of one OOM kill (the "oom-kill:" summary and "Killed process") are one event.
PAIR_WINDOW = timedelta(seconds=10)
# Read again from its start (a lost state file), a line already stored (in an event from a
# folding window before it to this much after it) is not stored or counted again.
DEDUPE_WINDOW = timedelta(seconds=2)


class KernelLogError(Exception):
    """The kernel log could not be read, or a record was not in the expected form."""


# --- records ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelRecord:
    """One kernel log message, from whichever source.

    ``seq`` is the /dev/kmsg sequence number (None elsewhere), ``usec`` the kernel's timestamp
    in microseconds since boot (None when the source lacks it), ``level`` the syslog level
    (0 emergency … 7 debug), ``facility`` 0 for the kernel itself (user space may write to
    /dev/kmsg too; it gets facility 1, "user", unless it names another), ``fields`` the record's
    dictionary (``SUBSYSTEM``, ``DEVICE``, ...). ``realtime`` is the wall-clock time the source
    itself recorded (the journal's), when it has one.
    """

    message: str
    seq: int | None = None
    usec: int | None = None
    level: int | None = None
    facility: int | None = 0
    fields: dict[str, str] = field(default_factory=dict)
    source: str = "kmsg"
    cursor: str | None = None
    realtime: datetime | None = None


_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")


def unescape_kmsg(text: bytes) -> str:
    """The text of a /dev/kmsg field: ``\\xNN`` escapes (the kernel writes every byte below
    0x20, from 0x7f, and the backslash itself that way) become bytes again, decoded as UTF-8
    (an invalid sequence becomes U+FFFD)."""
    return _ESCAPE.sub(lambda match: bytes((int(match.group(1), 16),)), text).decode(
        "utf-8", "replace")


def parse_kmsg_record(raw: bytes) -> KernelRecord:
    """One record as ``read(2)`` returns it from /dev/kmsg (Documentation/ABI/testing/dev-kmsg):
    ``prio,seq,usec,flags[,more...];message`` then dictionary lines, each starting with a space,
    ``KEY=value``. Raises :class:`KernelLogError` for anything else."""
    header, separator, rest = raw.partition(b";")
    if not separator:
        raise KernelLogError(f"kmsg record without ';': {raw[:80]!r}")
    parts = header.split(b",")
    try:
        prio, seq, usec = int(parts[0]), int(parts[1]), int(parts[2])
    except (IndexError, ValueError):
        raise KernelLogError(f"kmsg record header not prio,seq,usec: {header[:80]!r}") from None
    lines = rest.rstrip(b"\n").split(b"\n")
    fields: dict[str, str] = {}
    for line in lines[1:]:
        if line.startswith(b" ") and b"=" in line:
            key, _, value = line[1:].partition(b"=")
            fields[unescape_kmsg(key)] = unescape_kmsg(value)
    return KernelRecord(message=unescape_kmsg(lines[0]), seq=seq, usec=usec, level=prio & 7,
                        facility=prio >> 3, fields=fields)


# --- /dev/kmsg ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class KmsgBatch:
    """What one drain of /dev/kmsg read: the new records, the sequence number of the last one
    (or the cursor it started from when none was new), the sequence ranges that were
    overwritten before they could be read, how many times ``read`` said so (``EPIPE``), and
    whether records were left for the next run."""

    records: list[KernelRecord]
    last_seq: int | None
    lost: list[tuple[int, int]]
    overwritten_reads: int = 0
    malformed: int = 0
    more: bool = False

    @property
    def lost_count(self) -> int:
        return sum(last - first + 1 for first, last in self.lost)


def drain_kmsg(read_one: Callable[[], bytes], *, after_seq: int | None, limit: int) -> KmsgBatch:
    """Read records through ``read_one`` (one ``read(2)`` of a non-blocking /dev/kmsg) until
    none is left (``EAGAIN``) or ``limit`` new ones were read.

    Records up to ``after_seq`` are skipped (read before); a jump in the sequence numbers after
    it is a range the ring buffer overwrote before it was read. ``EPIPE`` means the same from
    the kernel's side: the record at the reader's position was overwritten, and the next read
    returns the oldest one still there. Cost: one read per record still in the buffer at most
    (skipped ones included), bounded by ``_KMSG_MAX_READS``.
    """
    records: list[KernelRecord] = []
    lost: list[tuple[int, int]] = []
    last, overwritten, malformed = after_seq, 0, 0
    for _ in range(_KMSG_MAX_READS):
        try:
            raw = read_one()
        except BlockingIOError:
            return KmsgBatch(records, last, lost, overwritten, malformed)
        except OSError as error:
            if error.errno == errno.EPIPE:
                overwritten += 1
                continue
            raise
        if not raw:
            break
        try:
            record = parse_kmsg_record(raw)
        except KernelLogError:
            malformed += 1
            continue
        if last is not None and record.seq <= last:
            continue
        if last is not None and record.seq > last + 1:
            lost.append((last + 1, record.seq - 1))
        records.append(record)
        last = record.seq
        if len(records) >= limit:
            return KmsgBatch(records, last, lost, overwritten, malformed, more=True)
    return KmsgBatch(records, last, lost, overwritten, malformed)


class KmsgReader:
    """An open, non-blocking /dev/kmsg. A new reader starts at the oldest record still in the
    ring buffer; each read moves it on by one record. Raises OSError when it cannot be opened
    (it needs root, or ``kernel.dmesg_restrict=0``)."""

    def __init__(self, path: Path = KMSG_PATH) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self.last_seq: int | None = None

    def read_one(self) -> bytes:
        return os.read(self.fd, _KMSG_READ_BYTES)

    def drain(self, after_seq: int | None, limit: int) -> KmsgBatch:
        batch = drain_kmsg(self.read_one, after_seq=after_seq, limit=limit)
        self.last_seq = batch.last_seq
        return batch

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


# One open reader per device and boot in this process: a worker that keeps it goes on from its
# position instead of skipping the whole ring buffer again at every run. A reader whose position
# is not the stored cursor (another process read meanwhile) is replaced by a fresh one.
_READERS: dict[tuple[str, str | None], KmsgReader] = {}


def _kmsg_batch(path: Path, boot_id: str | None, after_seq: int | None, limit: int
                ) -> KmsgBatch:
    key = (str(path), boot_id)
    reader = _READERS.get(key)
    if reader is not None and (after_seq is None or reader.last_seq != after_seq):
        reader.close()
        reader = None
    if reader is None:
        for other in [k for k in _READERS if k[0] == key[0]]:
            _READERS.pop(other).close()
        reader = KmsgReader(path)
        _READERS[key] = reader
    try:
        return reader.drain(after_seq, limit)
    except OSError:
        _READERS.pop(key, None)
        reader.close()
        raise


# --- the journal --------------------------------------------------------------------------------


def _journal_text(value: object) -> str | None:
    """A journal field as journalctl's JSON writes it: a string, an array of byte values (when
    not valid UTF-8), or null (too large to show)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(b, int) and 0 <= b < 256 for b in value):
        return bytes(value).decode("utf-8", "replace")
    return None


def _journal_int(value: object) -> int | None:
    text = _journal_text(value)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def parse_journal_entry(entry: dict, source: str = "journal") -> KernelRecord | None:
    """One entry of ``journalctl -o json`` (fields per systemd.journal-fields(7)) as a record;
    None when it has no message text. ``_SOURCE_MONOTONIC_TIMESTAMP`` is the kernel's own
    timestamp of a kernel message (microseconds since boot), ``__REALTIME_TIMESTAMP`` when the
    journal received it (microseconds since the epoch)."""
    message = _journal_text(entry.get("MESSAGE"))
    if message is None:
        return None
    realtime_usec = _journal_int(entry.get("__REALTIME_TIMESTAMP"))
    realtime = (datetime.fromtimestamp(realtime_usec / 1e6, tz=UTC)
                if realtime_usec is not None else None)
    fields = {key: text for key in ("_KERNEL_SUBSYSTEM", "_KERNEL_DEVICE", "_BOOT_ID")
              if (text := _journal_text(entry.get(key))) is not None}
    return KernelRecord(
        message=message, usec=_journal_int(entry.get("_SOURCE_MONOTONIC_TIMESTAMP")),
        level=_journal_int(entry.get("PRIORITY")),
        facility=_journal_int(entry.get("SYSLOG_FACILITY")), fields=fields, source=source,
        cursor=_journal_text(entry.get("__CURSOR")), realtime=realtime)


def parse_journal_json(text: str, source: str = "journal") -> list[KernelRecord]:
    """Every record of ``journalctl -o json`` output (one JSON object a line); a line that is
    not a JSON object (a cut-off last line) is skipped."""
    records = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(entry, dict) and (record := parse_journal_entry(entry, source)):
            records.append(record)
    return records


@dataclass(frozen=True)
class JournalBatch:
    records: list[KernelRecord]
    cursor: str | None
    more: bool


def read_journal(*, boot: str = "0", after_cursor: str | None = None, limit: int,
                 journalctl: str = JOURNALCTL, deadline: float = JOURNAL_DEADLINE_SECONDS,
                 max_bytes: int = JOURNAL_MAX_BYTES) -> JournalBatch:
    """The kernel messages of boot ``boot`` (``0`` this one, ``-1`` the one before) from the
    journal, after ``after_cursor``, at most ``limit`` of them.

    Runs ``journalctl -k -b <boot> -o json`` and stops reading (and the program) at ``limit``
    entries, ``max_bytes`` or ``deadline`` seconds, whichever comes first; ``more`` says it
    stopped early. Raises :class:`KernelLogError` with the reason when journalctl is missing or
    fails before it printed anything.
    """
    argv = [journalctl, "-k", "-b", boot, "-o", "json", "--no-pager", "-q"]
    if after_cursor:
        argv += ["--after-cursor", after_cursor]
    try:
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   stdin=subprocess.DEVNULL)
    except OSError as error:
        raise KernelLogError(f"{journalctl} cannot be run: {error.strerror or error}") from None
    lines, stopped = _read_lines(process, limit=limit, deadline=deadline, max_bytes=max_bytes)
    if stopped:
        process.kill()
    stderr = b""
    try:
        _, stderr = process.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
    if process.returncode not in (0, None) and not stopped and not lines:
        reason = stderr.decode("utf-8", "replace").strip() or f"exit status {process.returncode}"
        raise KernelLogError(f"journalctl -k -b {boot} failed: {reason}")
    records = parse_journal_json(b"\n".join(lines).decode("utf-8", "replace"),
                                 source=f"journal (journalctl -k -b {boot})")
    cursor = next((r.cursor for r in reversed(records) if r.cursor), after_cursor)
    return JournalBatch(records, cursor, more=stopped)


def _read_lines(process: subprocess.Popen, *, limit: int, deadline: float, max_bytes: int
                ) -> tuple[list[bytes], bool]:
    """Complete lines from ``process``'s stdout until EOF, ``limit`` lines, ``max_bytes`` or the
    deadline; the lines and whether it stopped before EOF."""
    assert process.stdout is not None
    end = time.monotonic() + deadline
    lines: list[bytes] = []
    pending = b""
    read = 0
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while True:
            left = end - time.monotonic()
            if left <= 0 or not selector.select(timeout=left):
                return lines, True
            chunk = os.read(process.stdout.fileno(), 65536)
            if not chunk:
                if pending:
                    lines.append(pending)
                return lines[:limit], len(lines) > limit
            read += len(chunk)
            *complete, pending = (pending + chunk).split(b"\n")
            lines.extend(line for line in complete if line)
            if len(lines) >= limit or read >= max_bytes:
                return lines[:limit], True


# --- pstore ---------------------------------------------------------------------------------------

# A line of a pstore dmesg record: kmsg_dump_get_buffer(..., syslog=true) writes
# "<prio>[seconds.micros] text" (with CONFIG_PRINTK_CALLER a "[T123]" or "[C1]" after the time);
# fs/pstore/platform.c puts a "Panic#1 Part1" header first.
_PSTORE_LINE = re.compile(
    r"^(?:<(?P<prio>\d+)>)?\[\s*(?P<sec>\d+)\.(?P<frac>\d+)\](?:\[\s*[CT]\d+\])?\s?(?P<text>.*)$")
_PSTORE_HEADER = re.compile(r"^(?P<why>[A-Za-z]+)#(?P<count>\d+) Part(?P<part>\d+)$")


def parse_pstore_text(text: str, source: str) -> list[KernelRecord]:
    """The kernel messages of one pstore dmesg record (``dmesg-ramoops-N``, ``dmesg-efi-N``,
    systemd-pstore's ``dmesg.txt``): one record per timestamped line, in file order. The
    header and lines without a timestamp (a cut-off first line) are skipped."""
    records = []
    for line in text.splitlines():
        if _PSTORE_HEADER.match(line):
            continue
        match = _PSTORE_LINE.match(line)
        if not match:
            continue
        prio = match.group("prio")
        micros = int(match.group("frac").ljust(6, "0")[:6])
        records.append(KernelRecord(
            message=match.group("text"), usec=int(match.group("sec")) * 1_000_000 + micros,
            level=int(prio) & 7 if prio else None, facility=int(prio) >> 3 if prio else None,
            source=source))
    return records


@dataclass(frozen=True)
class PstoreFile:
    path: Path
    dumped_at: datetime  # when the record was written: pstore gives the file that time
    records: list[KernelRecord]


def read_pstore(roots: Iterable[Path] = PSTORE_ROOTS, *, since: datetime | None = None,
                notes: list[str] | None = None) -> list[PstoreFile]:
    """The dmesg records under ``roots`` (searched recursively: systemd-pstore keeps one folder
    per record), written at or after ``since`` when given. Compressed records pstore could not
    decompress (``*.enc.z``), unreadable and oversized files are skipped, each with a line in
    ``notes``."""
    found = []
    for root in roots:
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("dmesg*")):
            if not path.is_file():
                continue
            if path.name.endswith(".enc.z"):
                _note(notes, f"{path}: compressed, not decompressed by the kernel; not read")
                continue
            try:
                stat = path.stat()
                if stat.st_size > PSTORE_MAX_BYTES:
                    _note(notes, f"{path}: {stat.st_size} bytes, more than read; not read")
                    continue
                text = path.read_bytes().decode("utf-8", "replace")
            except OSError as error:
                _note(notes, f"{path}: {error.strerror or error}")
                continue
            dumped_at = datetime.fromtimestamp(stat.st_mtime, tz=UTC)
            if since is not None and dumped_at < since:
                continue
            found.append(PstoreFile(path, dumped_at, parse_pstore_text(text, f"pstore {path}")))
    return found


def _note(notes: list[str] | None, text: str) -> None:
    if notes is not None:
        notes.append(text)


# --- when: the kernel's microseconds since boot on the wall clock -------------------------------


@dataclass(frozen=True)
class BootClock:
    """When this boot began on the wall clock (UTC), and how that was found (or why not)."""

    booted_at: datetime | None
    basis: str

    def wall(self, usec: int | None) -> datetime | None:
        if self.booted_at is None or usec is None:
            return None
        return self.booted_at + timedelta(microseconds=usec)


def boot_clock(proc_root: Path = Path("/proc"), now: Callable[[], float] = time.time
               ) -> BootClock:
    """The boot's wall-clock time from ``/proc/uptime`` (seconds since boot, to the hundredth)
    read beside the clock, else ``/proc/stat``'s ``btime`` (whole seconds). Kernel timestamps
    do not count time spent suspended, so after a suspend they land early by that much."""
    try:
        uptime = float((proc_root / "uptime").read_text().split()[0])
        return BootClock(datetime.fromtimestamp(now() - uptime, tz=UTC), "/proc/uptime")
    except (OSError, ValueError, IndexError):
        pass
    try:
        for line in (proc_root / "stat").read_text().splitlines():
            if line.startswith("btime "):
                return BootClock(datetime.fromtimestamp(int(line.split()[1]), tz=UTC),
                                 "/proc/stat btime")
    except (OSError, ValueError, IndexError):
        pass
    return BootClock(None, f"neither {proc_root}/uptime nor {proc_root}/stat could be read")


def boot_id(proc_root: Path = Path("/proc")) -> str | None:
    """This boot's id (``/proc/sys/kernel/random/boot_id``): /dev/kmsg sequence numbers start
    again at every boot, so a cursor is only good for the boot that wrote it."""
    try:
        return (proc_root / "sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


# --- recognition ---------------------------------------------------------------------------------

# mm/oom_kill.c dump_oom_victim(): "oom-kill:constraint=%s,nodemask=%*pbl", then
# cpuset_print_current_mems_allowed() ",cpuset=%s,mems_allowed=%*pbl", then
# mm/memcontrol.c mem_cgroup_print_oom_context() ",oom_memcg=<path>" or ",global_oom" and
# ",task_memcg=<path>", then ",task=%s,pid=%d,uid=%d". One record (pr_cont joins the parts).
_OOM_SUMMARY = re.compile(r"oom-kill:constraint=(?P<constraint>[A-Z_]+)(?P<context>.*)"
                          r",task=(?P<task>.*),pid=(?P<pid>\d+),uid=(?P<uid>\d+)")
_TASK_MEMCG = re.compile(r",task_memcg=(?P<path>[^,]*)")
_OOM_MEMCG = re.compile(r",oom_memcg=(?P<path>[^,]*)")
# mm/oom_kill.c __oom_kill_process(): "%s: Killed process %d (%s) total-vm:%lukB, ..." with
# "Out of memory" or "Memory cgroup out of memory"; kernels before 5.x wrote the line without
# the prefix ("Killed process %d (%s), UID %u, total-vm:...").
_OOM_KILLED = re.compile(r"(?:(?P<why>[^:]*out of memory[^:]*): )?"
                         r"Killed process (?P<pid>\d+) \((?P<name>.*?)\)(?=[ ,]|$)",
                         re.IGNORECASE)
# NVIDIA's driver: "NVRM: Xid (PCI:0000:01:00): 31, pid=1234, name=python3, ..." (older
# drivers: "NVRM: Xid (0000:03:00): 14, Channel 00000001"); pid='<unknown>' when it has none.
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<gpu>[0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+"
                  r"(?:\.[0-9A-Fa-f])?)\): (?P<xid>\d+),?\s*(?P<rest>.*)")
_XID_PROCESS = re.compile(r"pid='?(?P<pid>\d+|<unknown>)'?, name=(?P<name>[^,]*)")
# The driver's resource manager out of memory: "NVRM: nvCheckOkFailedNoLog: Check failed: Out
# of memory [NV_ERR_NO_MEMORY] (0x00000051) returned from ..." and its relatives.
_NO_MEMORY = re.compile(r"NVRM:.*(?:NV_ERR_NO_MEMORY|out of memory)", re.IGNORECASE)
# kernel/hung_task.c hung_task_info(): "INFO: task %s:%d blocked for more than %ld seconds."
_HUNG = re.compile(r"INFO: task (?P<name>.+):(?P<pid>\d+) blocked for more than "
                   r"(?P<seconds>\d+) seconds\.")
# mm/page_alloc.c warn_alloc(): "%s: %pV, mode:%#x(%pGg), nodemask=%*pbl" with "page allocation
# failure: order:%u" (older kernels: "page allocation failure. order:%d"), and mm/vmalloc.c's
# "vmalloc error: size %lu, ..." (older: "vmalloc: allocation failure, ...") through it.
_ALLOCATION = re.compile(
    r"^(?P<name>.+?): (?:page allocation failure[.:] order:(?P<order>\d+)"
    r"|(?P<vmalloc>vmalloc(?: error|: allocation failure)))"
    r".*?, mode:(?P<mode>0x[0-9a-fA-F]+)(?:\((?P<flags>[^)]*)\))?")


@dataclass(frozen=True)
class Finding:
    """What one kernel line means: its event kind and severity, what happened in words
    (``what``, and ``detail`` after whose it was), and the process (``pid``, ``name``) and
    cgroup it names, when it names them (None where the line does not, or says "<unknown>")."""

    kind: str
    severity: str
    what: str
    detail: str = ""
    pid: int | None = None
    name: str | None = None
    cgroup: str | None = None
    # How repeats are folded: "pair" (the two lines of one OOM kill, by pid), "repeat" (a burst
    # of the same line), or "" (every line its own event).
    fold: str = ""


def classify(message: str) -> Finding | None:
    """What a kernel message is evidence of, or None for every other line."""
    if match := _OOM_SUMMARY.search(message):
        return _oom_summary(match)
    if (match := _OOM_KILLED.search(message)) and "oom_reaper" not in message:
        memcg = (match.group("why") or "").lower().startswith("memory cgroup")
        pid = int(match.group("pid"))
        return Finding(
            KIND_OOM_KILL, CRITICAL, f"OOM kill: the kernel killed {match.group('name')} "
            f"(pid {pid})", detail=(" because its memory cgroup reached its limit" if memcg
                                    else " because memory ran out"),
            pid=pid, name=match.group("name"), fold="pair")
    if match := _XID.search(message):
        return _xid(match)
    if _NO_MEMORY.search(message):
        code = " (NV_ERR_NO_MEMORY)" if "NV_ERR_NO_MEMORY" in message else ""
        return Finding(KIND_NO_MEMORY, CRITICAL,
                       f"The NVIDIA driver could not allocate memory{code}",
                       detail="; on a GB10 this has come before the whole host stopped answering",
                       fold="repeat")
    if match := _HUNG.search(message):
        pid = int(match.group("pid"))
        return Finding(KIND_HUNG_TASK, WARNING,
                       f"Hung task: {match.group('name')} (pid {pid}) blocked for more than "
                       f"{match.group('seconds')} s", pid=pid, name=match.group("name"),
                       fold="repeat")
    if match := _ALLOCATION.search(message):
        return _allocation(match)
    return None


def _oom_summary(match: re.Match[str]) -> Finding:
    context = match.group("context")
    task_memcg = _TASK_MEMCG.search(context)
    oom_memcg = _OOM_MEMCG.search(context)
    constraint = match.group("constraint")
    if oom_memcg:
        why = f" because memory cgroup {oom_memcg.group('path')} reached its limit"
    elif constraint == "CONSTRAINT_NONE":
        why = " because the host ran out of memory"
    else:
        why = f" because memory ran out ({constraint})"
    pid = int(match.group("pid"))
    return Finding(KIND_OOM_KILL, CRITICAL,
                   f"OOM kill: the kernel killed {match.group('task')} (pid {pid})", detail=why,
                   pid=pid, name=match.group("task"),
                   cgroup=task_memcg.group("path") if task_memcg else None, fold="pair")


def _xid(match: re.Match[str]) -> Finding:
    xid = int(match.group("xid"))
    meaning = XID_MEANINGS.get(xid)
    process = _XID_PROCESS.search(match.group("rest"))
    pid = name = None
    if process:
        pid = int(process.group("pid")) if process.group("pid").isdigit() else None
        name = process.group("name").strip() or None
    who = f", process {name} (pid {pid})" if pid is not None else ""
    return Finding(KIND_XID, CRITICAL if xid in CRITICAL_XIDS else WARNING,
                   f"NVIDIA Xid {xid}{f' ({meaning})' if meaning else ''} on GPU "
                   f"{match.group('gpu')}{who}", pid=pid,
                   name=None if name == "<unknown>" else name, fold="repeat")


def _allocation(match: re.Match[str]) -> Finding:
    name, order = match.group("name"), match.group("order")
    flags = match.group("flags") or match.group("mode")
    if order is not None:
        what = (f"Page allocation failure: {name} could not get 2^{order} contiguous pages "
                f"(order {order}, {flags})")
        detail = ("; memory is short, or fragmented" if int(order) > 0
                  else "; memory is short")
    else:
        what = f"Allocation failure: {name} could not get virtually contiguous memory ({flags})"
        detail = "; memory is short"
    return Finding(KIND_ALLOCATION_FAILURE, WARNING, what, detail=detail, name=name,
                   fold="repeat")


# --- whose: container and engine ---------------------------------------------------------------


@dataclass(frozen=True)
class Owner:
    """The container a finding's process ran in, and how that was found (or why not)."""

    container_id: str | None
    basis: str


def owner_of(finding: Finding, record: KernelRecord, proc_root: Path = Path("/proc")) -> Owner:
    """The container of the process a finding names: from the OOM line's ``task_memcg``, else
    from ``/proc/<pid>/cgroup`` while that process still runs (its name and start time must fit
    the line: a PID is reused once its process is gone)."""
    if finding.cgroup is not None:
        found = container_id_in_cgroup_path(finding.cgroup)
        if found:
            return Owner(found, "its task_memcg")
        return Owner(None, f"not in a Docker or Podman container (task_memcg {finding.cgroup})")
    if finding.pid is None:
        return Owner(None, "")
    if not _still_that_process(finding.pid, finding.name, record.usec, proc_root):
        return Owner(None, f"its container is unknown: process {finding.pid} is no longer "
                           "running")
    found = container_id_for_pid(finding.pid, proc_root)
    if found:
        return Owner(found, f"/proc/{finding.pid}/cgroup")
    return Owner(None, f"not in a Docker or Podman container (/proc/{finding.pid}/cgroup)")


def _still_that_process(pid: int, name: str | None, usec: int | None, proc_root: Path) -> bool:
    """Does ``/proc/<pid>`` still describe the process the line named? Its name (comm) must be
    the line's, and it must have started before the line was written."""
    try:
        stat = (proc_root / str(pid) / "stat").read_text()
    except OSError:
        return False
    comm = stat[stat.find("(") + 1:stat.rfind(")")]
    if name and comm != name:
        return False
    if usec is None:
        return True
    fields = stat.rpartition(")")[2].split()
    try:
        started_ticks = int(fields[19])
    except (IndexError, ValueError):
        return False
    ticks_per_second = os.sysconf("SC_CLK_TCK")
    return started_ticks <= usec * ticks_per_second // 1_000_000 + 1


def engine_for_container(node: Node, container_id: str) -> Engine | None:
    """The engine row of ``node`` whose container this is: now (``Engine.container_id``), or at
    an earlier start of it (an ``EngineStart`` with that container id: the container may have
    been recreated since). A model router's container is its router's row, not one of its
    models'. None when no engine ran in it."""
    engines = sorted(Engine.objects.filter(node=node, container_id=container_id),
                     key=lambda engine: (bool((engine.config or {}).get("router")), engine.name))
    if engines:
        return engines[0]
    start = (EngineStart.objects.filter(node=node, identity__startswith=f"{container_id}@")
             .select_related("engine").order_by("-seen_at").first())
    return start.engine if start else None


# --- a previous boot --------------------------------------------------------------------------


@dataclass(frozen=True)
class Evidence:
    """One recognised line of a kernel log: what it means (``kind``, ``severity``,
    ``headline``), the line itself (``raw``), where it was read (``source``), when (``at`` in
    UTC and how that is known, ``at_basis``; ``usec_since_boot`` is the kernel's own time), and
    the process and container it names, when it names them."""

    kind: str
    severity: str
    headline: str
    raw: str
    source: str
    usec_since_boot: int | None
    at: datetime | None
    at_basis: str
    pid: int | None = None
    process: str | None = None
    container_id: str | None = None


@dataclass(frozen=True)
class PreviousBoot:
    """What :func:`previous_boot_report` found: the recognised lines, oldest first where their
    times are known, and a line per source that was not read or was read only in part."""

    evidence: list[Evidence]
    notes: list[str]


def evidence_from(record: KernelRecord, *, at: datetime | None, at_basis: str
                  ) -> Evidence | None:
    """A record as :class:`Evidence` when :func:`classify` recognises it. The container comes
    only from the line itself (an OOM kill's ``task_memcg``): a previous boot's PIDs name
    nothing now."""
    finding = classify(record.message)
    if finding is None:
        return None
    container = container_id_in_cgroup_path(finding.cgroup) if finding.cgroup else None
    return Evidence(kind=finding.kind, severity=finding.severity,
                    headline=finding.what + finding.detail, raw=record.message,
                    source=record.source, usec_since_boot=record.usec, at=at, at_basis=at_basis,
                    pid=finding.pid, process=finding.name, container_id=container)


def previous_boot_report(*, journalctl: str | None = JOURNALCTL,
                         pstore_roots: Iterable[Path] = PSTORE_ROOTS,
                         since: datetime | None = None) -> PreviousBoot:
    """The kernel evidence the previous boot left: the journal's kernel messages of boot -1
    (``journalctl -k -b -1 -o json``, when ``journalctl`` is given and the journal is kept
    across boots) and the pstore dmesg records (written at or after ``since``, when given).

    A journal line's time is when the journal received it; a pstore line's wall-clock time is
    unknown (pstore keeps the kernel's seconds since that boot, and when the record was
    written, which ``at_basis`` gives). Lines read from both (the journal had them and the crash
    dump too) are returned once, the journal's. Cost: one journalctl run (at most
    ``JOURNAL_DEADLINE_SECONDS``, ``JOURNAL_MAX_BYTES``) and a read of each pstore file.
    """
    notes: list[str] = []
    evidence: list[Evidence] = []
    seen: set[tuple[int | None, str]] = set()
    if journalctl:
        try:
            batch = read_journal(boot="-1", limit=PREVIOUS_BOOT_RECORDS, journalctl=journalctl,
                                 deadline=3 * JOURNAL_DEADLINE_SECONDS,
                                 max_bytes=4 * JOURNAL_MAX_BYTES)
        except KernelLogError as error:
            notes.append(f"journal: {error}")
        else:
            if batch.more:
                notes.append("journal: read only in part (too long to read whole)")
            for record in batch.records:
                found = evidence_from(record, at=record.realtime,
                                      at_basis="when the journal received it")
                if found:
                    evidence.append(found)
                    seen.add((record.usec, record.message))
    for dump in read_pstore(pstore_roots, since=since, notes=notes):
        for record in dump.records:
            if (record.usec, record.message) in seen:
                continue
            seen.add((record.usec, record.message))
            found = evidence_from(record, at=None, at_basis=(
                f"unknown: pstore keeps {record.usec / 1e6:.6f} s after that boot's start; "
                f"the record was written {moment_text(dump.dumped_at, UTC)}"))
            if found:
                evidence.append(found)
    evidence.sort(key=lambda item: (item.at is None, item.at or datetime.min.replace(tzinfo=UTC),
                                    item.usec_since_boot or 0))
    return PreviousBoot(evidence, notes)


def previous_boot_evidence(*, journalctl: str | None = JOURNALCTL,
                           pstore_roots: Iterable[Path] = PSTORE_ROOTS,
                           since: datetime | None = None) -> list[Evidence]:
    """The recognised kernel lines of the previous boot (:func:`previous_boot_report` without
    its notes on what could not be read)."""
    return previous_boot_report(journalctl=journalctl, pstore_roots=pstore_roots,
                                since=since).evidence


# --- the reader's state between runs -----------------------------------------------------------


@dataclass(frozen=True)
class ReaderState:
    """Where the last run stopped: the boot it read, the source it used and why, the source's
    position (/dev/kmsg sequence number or journal cursor), and, while a log is read from its
    start because no position was known (until it catches up), the last event stored before
    that read began (``rereading_after``): lines found may be in those events already."""

    boot_id: str | None = None
    source: str = ""
    source_note: str = ""
    kmsg_seq: int | None = None
    journal_cursor: str | None = None
    rereading_after: int | None = None


def state_path(data_dir: Path, node_name: str) -> Path:
    return Path(data_dir) / f"kernel-log-{node_name}.json"


def load_state(path: Path) -> ReaderState:
    """The stored state, or a fresh one when there is none or it cannot be read (the next run
    then reads the whole ring buffer again, without storing a line twice)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return ReaderState()
    if not isinstance(data, dict):
        return ReaderState()
    seq = data.get("kmsg_seq")
    return ReaderState(
        boot_id=data.get("boot_id") if isinstance(data.get("boot_id"), str) else None,
        source=str(data.get("source", "")), source_note=str(data.get("source_note", "")),
        kmsg_seq=seq if isinstance(seq, int) else None,
        journal_cursor=data.get("journal_cursor")
        if isinstance(data.get("journal_cursor"), str) else None,
        rereading_after=data.get("rereading_after")
        if isinstance(data.get("rereading_after"), int) else None)


def save_state(path: Path, state: ReaderState) -> None:
    """Write ``state`` whole or not at all (a temporary file renamed into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(asdict(state), indent=1))
    os.replace(temporary, path)


# --- one run: read what is new, store it as events ---------------------------------------------


@dataclass(frozen=True)
class KernelLogRun:
    """What one run did: the source it read (``kmsg``, ``journal``, ``none``, or ``busy`` when
    another run held the lock), the records it read, the events it created and those it added a
    repeat or the second line of an OOM kill to, records lost before they were read, and
    whether more records wait."""

    source: str
    records: int = 0
    created: int = 0
    folded: int = 0
    lost: int = 0
    more: bool = False
    note: str = ""


@dataclass
class _Read:
    source: str
    note: str
    records: list[KernelRecord]
    kmsg_seq: int | None = None
    journal_cursor: str | None = None
    lost: list[tuple[int, int]] = field(default_factory=list)
    overwritten_reads: int = 0
    more: bool = False
    fresh: bool = False  # read without a cursor: lines may have been stored before


def collect_kernel_log(node: Node, path: Path, *, proc_root: Path = Path("/proc"),
                       kmsg: Path = KMSG_PATH, journalctl: str | None = JOURNALCTL,
                       limit: int = RECORDS_PER_RUN,
                       now: Callable[[], float] = time.time) -> KernelLogRun:
    """Read what is new in this node's kernel log and store what it recognises as events.

    1. Take the lock beside the state file ``path`` (another run holding it: return "busy").
    2. Load the state; a new boot (its id changed) starts from the beginning of its log.
    3. Read at most ``limit`` new records from /dev/kmsg, or from the journal when /dev/kmsg
       cannot be opened (``journalctl`` None: never).
    4. In one transaction: tell a change of source (``kernel-log-source``) and lost records
       (``kernel-log-gap``), and store each recognised line (:func:`store_finding`); while a
       log is read again from its start (no position was known) until it catches up, a line
       stored already is neither stored nor counted again.
    5. Save the new position. A crash between 4 and 5 reads the same records again next time:
       nothing is lost; an OOM kill's lines are found stored already, a repeated line (a burst)
       is counted once more.

    Cost: one read per record (a fresh reader also skips those read before), one or two
    queries per recognised line, one small file written. A run that finds nothing new (most
    of them) opens no transaction and leaves the state file as it is.
    """
    with only_run(path.with_name(f"{path.name}.lock")) as held:
        if not held:
            return KernelLogRun("busy", note="another run is reading the kernel log")
        state = load_state(path)
        current_boot = boot_id(proc_root)
        if current_boot != state.boot_id:
            state = ReaderState(boot_id=current_boot, source=state.source,
                                source_note=state.source_note)
        read = _read_new(state, current_boot, kmsg=kmsg, journalctl=journalctl, limit=limit)
        clock = boot_clock(proc_root, now)
        read_at = datetime.fromtimestamp(now(), tz=UTC)
        created = folded = 0
        stored_before = state.rereading_after
        if read.fresh and stored_before is None:
            stored_before = Event.objects.aggregate(last=Max("pk"))["last"] or 0
        source_changed = (read.source, read.note) != (state.source, state.source_note)
        if source_changed or read.lost or read.overwritten_reads or read.records:
            with transaction.atomic():
                if source_changed:
                    _tell_source(node, read, read_at)
                if read.lost or read.overwritten_reads:
                    _tell_gap(node, read, read_at)
                for record in read.records:
                    finding = classify(record.message)
                    if finding is None:
                        continue
                    outcome = store_finding(node, finding, record, clock, proc_root=proc_root,
                                            read_at=read_at, stored_before=stored_before)
                    created += outcome == "created"
                    folded += outcome == "folded"
        new_state = replace(
            state, source=read.source, source_note=read.note,
            kmsg_seq=read.kmsg_seq if read.source == "kmsg" else state.kmsg_seq,
            journal_cursor=(read.journal_cursor if read.source == "journal"
                            else state.journal_cursor),
            rereading_after=stored_before if read.more else None)
        if new_state != state or not path.exists():
            save_state(path, new_state)
    lost = sum(last - first + 1 for first, last in read.lost)
    return KernelLogRun(read.source, len(read.records), created, folded, lost, read.more,
                        read.note)


def _read_new(state: ReaderState, current_boot: str | None, *, kmsg: Path,
              journalctl: str | None, limit: int) -> _Read:
    try:
        batch = _kmsg_batch(kmsg, current_boot, state.kmsg_seq, limit)
    except OSError as error:
        kmsg_reason = f"{kmsg} could not be opened: {error.strerror or error}"
    else:
        return _Read("kmsg", f"read from {kmsg}, the kernel's own ring buffer (the journal is "
                     "read only where it cannot be opened)", batch.records,
                     kmsg_seq=batch.last_seq,
                     lost=batch.lost, overwritten_reads=batch.overwritten_reads,
                     more=batch.more, fresh=state.kmsg_seq is None)
    if journalctl is None:
        return _Read("none", f"{kmsg_reason}; the journal is not tried here", [])
    cursor = state.journal_cursor
    try:
        try:
            journal = read_journal(boot="0", after_cursor=cursor, limit=limit,
                                   journalctl=journalctl)
        except KernelLogError:
            if cursor is None:
                raise
            # A cursor the journal no longer knows (rotated away, or a journal reset): read the
            # boot from its start, without storing a line twice.
            cursor = None
            journal = read_journal(boot="0", limit=limit, journalctl=journalctl)
    except KernelLogError as error:
        return _Read("none", f"{kmsg_reason}; the journal cannot be read either: {error}", [])
    return _Read("journal", f"read from the journal (journalctl -k), because {kmsg_reason}",
                 journal.records, journal_cursor=journal.cursor, more=journal.more,
                 fresh=cursor is None)


def _tell_source(node: Node, read: _Read, at: datetime) -> None:
    if read.source == "none":
        message = (f"The kernel log is not read: {read.note}. OOM kills and NVIDIA driver errors "
                   "will not appear on the timeline (run SparkOps as root, or give it "
                   "kernel.dmesg_restrict=0 or membership of the systemd-journal group).")
        severity = WARNING
    else:
        message = f"Kernel log {read.note}."
        severity = INFO
    told = (Event.objects.filter(node=node, kind=KIND_SOURCE).order_by("-at", "-pk")
            .values_list("message", flat=True).first())
    if told == message:
        return  # said already (the state file, which remembers it, was lost)
    log.log(logging.WARNING if severity == WARNING else logging.INFO, "%s: %s", node.name,
            message)
    Event.objects.create(node=node, at=at, kind=KIND_SOURCE, severity=severity, message=message)


def _tell_gap(node: Node, read: _Read, at: datetime) -> None:
    parts = []
    if read.lost:
        count = sum(last - first + 1 for first, last in read.lost)
        ranges = ", ".join(str(first) if first == last else f"{first}–{last}"
                           for first, last in read.lost[:5])
        more = ", …" if len(read.lost) > 5 else ""
        parts.append(f"{count} kernel log record(s) (sequence {ranges}{more}) were overwritten "
                     "in the kernel's ring buffer before SparkOps read them")
    if read.overwritten_reads:
        parts.append(f"reading, the kernel reported {read.overwritten_reads} time(s) that the "
                     "next record had been overwritten (EPIPE)")
    message = "; ".join(parts)
    message = f"{message[0].upper()}{message[1:]}. What they said is lost."
    log.warning("%s: %s", node.name, message)
    Event.objects.create(node=node, at=at, kind=KIND_GAP, severity=WARNING, message=message)


_REPEATED = re.compile(r"\nRepeated (?P<count>\d+) more times?, last at [^\n]*$")


def store_finding(node: Node, finding: Finding, record: KernelRecord, clock: BootClock, *,
                  proc_root: Path = Path("/proc"), read_at: datetime,
                  stored_before: int | None = None) -> str:
    """Store one recognised line as an event of ``node``: "created", "folded" (a repeat within
    ``REPEAT_WINDOW`` of a burst's first event, or the second line of an OOM kill, added to the
    event already there) or "skipped": the log is read again (``stored_before``, the last event
    before that read began) and an event up to that one holds the line already.

    The event's message is the headline (what, whose, why), then the kernel line itself with its
    time in UTC and seconds since boot; a repeat adds its count and last line.
    """
    at, when = _when(record, clock, read_at)
    owner = owner_of(finding, record, proc_root)
    engine = engine_for_container(node, owner.container_id) if owner.container_id else None
    headline = finding.what + _whose(owner, engine) + finding.detail + "."
    evidence = f"Kernel log, {when}: {record.message}{_origin(record)}"
    # An event holds its first line's time: a line read again may be a repeat it counted.
    if stored_before is not None and Event.objects.filter(
            node=node, kind=finding.kind, pk__lte=stored_before,
            at__gte=at - max(REPEAT_WINDOW, PAIR_WINDOW), at__lte=at + DEDUPE_WINDOW,
            message__contains=record.message).exists():
        return "skipped"
    if finding.fold == "pair" and finding.pid is not None:
        first = (Event.objects.filter(node=node, kind=finding.kind, at__gte=at - PAIR_WINDOW,
                                      at__lte=at + PAIR_WINDOW,
                                      message__contains=f"(pid {finding.pid})")
                 .order_by("at").first())
        if first is not None:
            if record.message not in first.message:
                first.message = f"{first.message}\n{evidence}"
            if first.engine_id is None and engine is not None:
                first.engine = engine
            first.save(update_fields=["message", "engine"])
            return "folded"
    if finding.fold == "repeat":
        first = (Event.objects.filter(node=node, kind=finding.kind, at__gte=at - REPEAT_WINDOW,
                                      at__lte=at, message__startswith=headline + "\n")
                 .order_by("-at").first())
        if first is not None:
            repeated = _REPEATED.search(first.message)
            count = int(repeated.group("count")) + 1 if repeated else 1
            body = first.message[:repeated.start()] if repeated else first.message
            first.message = (f"{body}\nRepeated {count} more time{'s' if count > 1 else ''}, "
                             f"last at {when}: {record.message}")
            first.save(update_fields=["message"])
            return "folded"
    Event.objects.create(node=node, engine=engine, at=at, kind=finding.kind,
                         severity=finding.severity, message=f"{headline}\n{evidence}")
    return "created"


def _when(record: KernelRecord, clock: BootClock, read_at: datetime) -> tuple[datetime, str]:
    """The event's time and how it is written: the kernel's own timestamp (this boot's
    microseconds) on the wall clock, else the time the journal recorded, else the time the line
    was read, said so."""
    since_boot = f"{record.usec / 1e6:.6f} s after boot" if record.usec is not None else ""
    at = clock.wall(record.usec)
    if at is not None:
        return at, f"{moment_text(at, UTC)} ({since_boot})"
    if record.realtime is not None:
        return record.realtime, f"{moment_text(record.realtime, UTC)} (when the journal got it)"
    why = clock.basis if clock.booted_at is None else "the record has no timestamp"
    stamp = f"{since_boot}; " if since_boot else ""
    return read_at, f"time unknown ({stamp}{why}), read at {moment_text(read_at, UTC)}"


def _whose(owner: Owner, engine: Engine | None) -> str:
    if engine is not None:
        return f" in engine {engine.name} (container {owner.container_id[:12]}, from {owner.basis})"
    if owner.container_id:
        return (f" in container {owner.container_id[:12]} (from {owner.basis}), which is no "
                "engine SparkOps knows")
    return f" ({owner.basis})" if owner.basis else ""


def _origin(record: KernelRecord) -> str:
    if record.facility not in (0, None):
        return (f" [written to the kernel log by user space (syslog facility "
                f"{record.facility}), not by the kernel]")
    return ""
