"""The flight recorder: a node's last minutes of memory on its own disk, and what SparkOps makes
of them when it starts again.

On a GB10 (CPU and GPU share one unified memory) running out of memory does not end in a CUDA
OOM: the host wedges or powers off, and every record still in memory or in a database
transaction goes with it. So after every host-memory collection the worker appends that
interval to a small file store under the data directory (``<data dir>/flight-recorder/<node>/``),
one recorder per node name:

* one **sample** record per second of the interval (MemAvailable, MemFree, swap in use, the
  reclaimable page cache), kept from the collection's own readings of ``/proc/meminfo``
  (:class:`SampledProcfs`: the sampling loop is not changed, its procfs keeps one text a second);
* one **interval** record: the collection's outcome, the interval's lowest MemAvailable, the
  ledger written after it (``Node.ledger``) and each present engine's phase and prefill rate;
* a **start** record when the node's worker starts and a **clean-end** record when it stops
  cleanly (a warm shutdown asked for by SIGTERM or SIGINT, the supervisor's normal stop).

Every record names the boot it was written in (``/proc/sys/kernel/random/boot_id``, read through
the collectors' procfs root so tests can change it).

**Format.** Append-only segment files (``segment-<n>.rec``), each record framed as
``MAGIC | length (4 bytes, big-endian) | CRC32 of the payload (4 bytes) | payload`` (compact
JSON). Each collection's records are written with one ``write`` and ``fsync``ed before the next
interval, so a power loss costs at most the interval being written. A record cut short (a torn
tail) or whose checksum fails is skipped and reported, never fatal: the reader looks for the
next frame that checks out (:func:`decode`). The first append of a process cuts a torn tail off
the newest segment, so new records never follow the garbage.

**Size.** The current segment is closed once it spans ``SPARKOPS_FLIGHT_RECORDER_MINUTES``
(default 15) or would pass its byte cap (:func:`segment_bytes`); a new one starts and every
segment but the one just closed is removed. So the store always holds at least the last minutes
(unless the byte cap cut a segment short) and never more than two segments: at most twice the cap
plus one interval's records.

Cost: one ``write`` and one ``fsync`` of a few KiB per collection interval, one query of the
node's engines, and one read of the newest segment the first time a process appends.

**Boot tracking** (:func:`check_boot`, when the node's worker starts, before it takes work):
the current boot id is compared with the boot of the last record. A changed boot id after a
last record that is no clean end is an ``unexpected-reboot`` Event (critical) at the last
recorded moment, not at start-up; its message says what the last minutes show (lowest headroom,
who held what, which engine was loading or prefilling) and names the post-mortem, a JSON file
beside the recorder holding those minutes' records (:class:`PostMortem`; the Event model has only
a message). A changed boot id after a clean end is an info Event ``host-rebooted``. The same boot
id after an unclean end (SparkOps' worker was killed, the host lived on) is a warning Event
``sparkops-unclean-stop`` at the last recorded moment, with the same post-mortem. When either boot
id cannot be read, whether the host rebooted is unknown and said so; an unclean end is still the
warning.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings

from collectors.kernellog import previous_boot_report
from collectors.ledger import LOADING_PHASES
from collectors.meminfo import parse_meminfo
from collectors.models import Engine, Event, Node
from collectors.procfs import Procfs, ProcfsError
from sparkops.prepared import PreparedRead
from sparkops.timetext import moment_text
from sparkops.units import bytes_text, tps_text

log = logging.getLogger(__name__)

# --- the record format ---------------------------------------------------------------------------

MAGIC = b"SF"
HEADER = struct.Struct(">2sII")  # magic, payload length, CRC32 of the payload
# No record comes near this (an interval with its ledger is a few KiB); a length past it is a
# damaged header, not a record.
MAX_RECORD_BYTES = 1024 * 1024

START = "start"
SAMPLE = "sample"
INTERVAL = "interval"
CLEAN_END = "clean-end"

# One host sample a second out of the collection's readings (every 0.1 s by default).
SAMPLE_SECONDS = 1.0
# A segment's byte cap: room for a minute of samples and ledgers many times over (a minute is
# about 60 samples of ~200 bytes and 12 intervals of a few KiB), and never under 4 MiB.
SEGMENT_BYTES_PER_MINUTE = 256 * 1024
MIN_SEGMENT_BYTES = 4 * 1024 * 1024
# Post-mortems kept beside the recorder, newest first; older ones are removed.
POSTMORTEMS_KEPT = 20

BOOT_ID = "sys/kernel/random/boot_id"
_BOOT_ID_FORM = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_SEGMENT_NAME = re.compile(r"^segment-(\d{8})\.rec$")


def encode(record: dict[str, Any]) -> bytes:
    """One framed record: header (magic, length, CRC32) and the record as compact JSON."""
    payload = json.dumps(record, separators=(",", ":"), default=_json_default).encode()
    if len(payload) > MAX_RECORD_BYTES:
        raise ValueError(f"a flight record of {len(payload)} bytes is over "
                         f"{MAX_RECORD_BYTES} bytes")
    return HEADER.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON")


@dataclass(frozen=True)
class Skipped:
    """Bytes the reader could not take as records: where, how many, and why.

    ``reason`` is "torn" (the data ends inside a frame: a write cut short) or "corrupt" (a
    frame whose magic, length, checksum or payload does not check out)."""

    segment: str
    offset: int
    length: int
    reason: str

    def text(self) -> str:
        what = "a torn record" if self.reason == "torn" else "damaged bytes"
        return f"{what} ({self.length} bytes at byte {self.offset} of {self.segment})"


@dataclass
class Decoded:
    """What one segment's bytes hold: its records in order, what was skipped, and where its
    last good record ends (``valid_end``)."""

    records: list[dict[str, Any]]
    skipped: list[Skipped]
    valid_end: int


def decode(data: bytes, segment: str = "") -> Decoded:
    """The records framed in ``data``; damaged or cut bytes are skipped (never raised).

    After a bad frame the reader moves to the next offset holding a frame that checks out, so a
    record damaged in the middle costs only itself, and bytes after a torn tail are still read.
    Cost: one pass and a CRC32 per record; a damaged stretch costs a search for the magic.
    """
    records: list[dict[str, Any]] = []
    skipped: list[Skipped] = []
    position = valid_end = 0
    while position < len(data):
        record, end, problem = _frame_at(data, position)
        if record is not None:
            records.append(record)
            position = valid_end = end
            continue
        resume = _next_frame(data, position + 1)
        stop = len(data) if resume is None else resume
        torn = problem == "torn" and resume is None
        skipped.append(Skipped(segment, position, stop - position, "torn" if torn else "corrupt"))
        position = stop
    return Decoded(records, skipped, valid_end)


def _frame_at(data: bytes, position: int) -> tuple[dict[str, Any] | None, int, str]:
    """The record framed at ``position`` and where it ends, or None and what is wrong:
    "torn" (the data ends first) or "corrupt"."""
    header = data[position:position + HEADER.size]
    if len(header) < HEADER.size:
        return None, position, "torn" if MAGIC.startswith(header[:len(MAGIC)]) else "corrupt"
    magic, length, checksum = HEADER.unpack(header)
    if magic != MAGIC or length > MAX_RECORD_BYTES:
        return None, position, "corrupt"
    start = position + HEADER.size
    payload = data[start:start + length]
    if len(payload) < length:
        return None, position, "torn"
    if zlib.crc32(payload) != checksum:
        return None, position, "corrupt"
    try:
        record = json.loads(payload)
    except ValueError:
        return None, position, "corrupt"
    if not isinstance(record, dict):
        return None, position, "corrupt"
    return record, start + length, ""


def _next_frame(data: bytes, start: int) -> int | None:
    """The first offset at or after ``start`` where a whole, checked frame begins."""
    position = data.find(MAGIC, start)
    while position != -1:
        if _frame_at(data, position)[0] is not None:
            return position
        position = data.find(MAGIC, position + 1)
    return None


def record_time(record: dict[str, Any]) -> datetime | None:
    """A record's ``at`` as an aware datetime; None when it has none that parses."""
    try:
        at = datetime.fromisoformat(record["at"])
    except (KeyError, TypeError, ValueError):
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


# --- the segment files ---------------------------------------------------------------------------


def segment_bytes(minutes: float) -> int:
    """The byte cap of one segment for a recorder that keeps ``minutes``."""
    return max(MIN_SEGMENT_BYTES, int(minutes * SEGMENT_BYTES_PER_MINUTE))


@dataclass
class Recording:
    """Everything a recorder holds, oldest first, and what its reader had to skip."""

    records: list[dict[str, Any]]
    skipped: list[Skipped]


class FlightRecorder:
    """The segment files of one node's recorder in ``directory``: append, rotate, read.

    Safe for the threads of one process and for several processes (a prefork pool): every
    append and read holds an exclusive ``flock`` on ``directory/lock``. ``boot`` is the boot id
    this process writes into its records (set by :func:`check_boot`, else read on first use).
    """

    def __init__(self, directory: Path, minutes: float, max_segment_bytes: int | None = None,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.directory = directory
        self.minutes = minutes
        self.max_segment_bytes = max_segment_bytes or segment_bytes(minutes)
        self.clock = clock
        self.boot: str | None = None
        self.boot_note = ""
        self.boot_read = False
        self._thread_lock = threading.Lock()
        self._repaired = False
        self._segment_started: dict[str, datetime | None] = {}

    def segments(self) -> list[Path]:
        """The segment files, oldest first."""
        if not self.directory.is_dir():
            return []
        found = [(int(match[1]), path) for path in self.directory.iterdir()
                 if (match := _SEGMENT_NAME.match(path.name))]
        return [path for _, path in sorted(found)]

    def append(self, records: list[dict[str, Any]]) -> None:
        """Append ``records`` with one write and ``fsync`` them; rotate first when due."""
        data = b"".join(encode(record) for record in records)
        if not data:
            return
        with self._locked():
            segments = self.segments()
            if not self._repaired:
                if segments:
                    self._cut_torn_tail(segments[-1])
                self._repaired = True
            current = segments[-1] if segments else None
            if current is None or self._due(current, len(data)):
                current = self._rotate(segments)
            descriptor = os.open(current, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(descriptor, view):]
                os.fsync(descriptor)
            finally:
                os.close(descriptor)

    def read(self) -> Recording:
        """Every record of every segment, oldest first, and what was skipped."""
        with self._locked():
            records: list[dict[str, Any]] = []
            skipped: list[Skipped] = []
            for path in self.segments():
                try:
                    data = path.read_bytes()
                except FileNotFoundError:
                    continue
                decoded = decode(data, path.name)
                records += decoded.records
                skipped += decoded.skipped
        return Recording(records, skipped)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._thread_lock:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            descriptor = os.open(self.directory / "lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX)
                yield
            finally:
                os.close(descriptor)  # releases the flock

    def _due(self, segment: Path, incoming: int) -> bool:
        """Whether ``segment`` is closed before ``incoming`` more bytes: it would pass its cap,
        or its first record is ``minutes`` old."""
        size = segment.stat().st_size
        if size == 0:
            return False
        if size + incoming > self.max_segment_bytes:
            return True
        started = self._started(segment)
        return started is not None and \
            self.clock() - started >= timedelta(minutes=self.minutes)

    def _started(self, segment: Path) -> datetime | None:
        """The time of ``segment``'s first record (read once, then remembered)."""
        if segment.name not in self._segment_started:
            with segment.open("rb") as file:
                head = file.read(HEADER.size)
                first = None
                if len(head) == HEADER.size:
                    _, length, _ = HEADER.unpack(head)
                    if length <= MAX_RECORD_BYTES:
                        first, _, _ = _frame_at(head + file.read(length), 0)
            self._segment_started[segment.name] = record_time(first) if first else None
        return self._segment_started[segment.name]

    def _rotate(self, segments: list[Path]) -> Path:
        """Start a new segment; keep only the one before it."""
        number = int(_SEGMENT_NAME.match(segments[-1].name)[1]) + 1 if segments else 1
        path = self.directory / f"segment-{number:08d}.rec"
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        for old in segments[:-1]:
            old.unlink(missing_ok=True)
            self._segment_started.pop(old.name, None)
        _fsync_directory(self.directory)
        return path

    def _cut_torn_tail(self, segment: Path) -> None:
        """Cut what follows the last good record of ``segment`` (a write cut short)."""
        data = segment.read_bytes()
        end = decode(data, segment.name).valid_end
        if end == len(data):
            return
        log.warning("flight recorder: cutting %d bytes after the last good record of %s",
                    len(data) - end, segment)
        with segment.open("r+b") as file:
            file.truncate(end)
            os.fsync(file.fileno())


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


_RECORDERS: dict[Path, FlightRecorder] = {}
_RECORDERS_LOCK = threading.Lock()


def recorder_directory(node_name: str) -> Path:
    """Where the recorder of ``node_name`` keeps its files, under the data directory."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", node_name).lstrip(".") or "_"
    return Path(settings.DATA_DIR) / "flight-recorder" / safe


def node_recorder(node_name: str) -> FlightRecorder:
    """This process's one recorder of ``node_name`` (``SPARKOPS_FLIGHT_RECORDER_MINUTES``)."""
    directory = recorder_directory(node_name)
    minutes = settings.SPARKOPS_FLIGHT_RECORDER_MINUTES
    with _RECORDERS_LOCK:
        recorder = _RECORDERS.get(directory)
        if recorder is None or recorder.minutes != minutes:
            recorder = _RECORDERS[directory] = FlightRecorder(directory, minutes)
        return recorder


# --- what a collection writes --------------------------------------------------------------------


class SecondSamples:
    """One meminfo text a second, out of the texts a collection reads (timed as offered)."""

    def __init__(self, every: float = SAMPLE_SECONDS,
                 wall: Callable[[], datetime] = lambda: datetime.now(UTC),
                 mono: Callable[[], float] = time.monotonic) -> None:
        self.every, self.wall, self.mono = every, wall, mono
        self.kept: list[tuple[datetime, str]] = []
        self._next: float | None = None

    def offer(self, text: str) -> None:
        now = self.mono()
        if self._next is None or now >= self._next:
            self.kept.append((self.wall(), text))
            self._next = now + self.every


@dataclass(frozen=True)
class SampledProcfs(Procfs):
    """A procfs that keeps one of its meminfo texts a second for the flight recorder."""

    samples: SecondSamples = field(default_factory=SecondSamples)

    def meminfo(self) -> str:
        text = super().meminfo()
        self.samples.offer(text)
        return text


def flight_watch(procfs: Procfs) -> SampledProcfs:
    """``procfs`` keeping one meminfo text a second: hand it to the collection."""
    return SampledProcfs(procfs.root)


def sample_record(at: datetime, text: str, boot: str | None) -> dict[str, Any]:
    info = parse_meminfo(text)
    return {"type": SAMPLE, "at": at.isoformat(), "boot": boot,
            "mem_available": info.mem_available, "mem_free": info.get("MemFree"),
            "swap_used": info.swap_used(), "page_cache": info.page_cache_reclaimable()}


# Each present engine's name, phase, state and rates, by name (a prepared read: every
# collection records them).
_ENGINE_STATES = PreparedRead(lambda node_id: Engine.objects.filter(node_id=node_id, present=True)
                              .order_by("name")
                              .values_list("name", "phase", "container_state", "rates"))


def interval_record(node: Node, collection: Any, window: Any, boot: str | None
                    ) -> dict[str, Any]:
    """The collection's outcome, its lowest MemAvailable, the ledger written after it (None
    when the collection failed) and each present engine's phase and prefill rate."""
    engines = _ENGINE_STATES(node.pk)
    lowest_at = getattr(window, "min_available_at", None)
    return {
        "type": INTERVAL, "at": collection.at.isoformat(), "boot": boot,
        "collection_id": collection.id, "ok": collection.ok, "error": collection.error or "",
        "mem_available_min": getattr(window, "min_available", None),
        "mem_available_min_at": lowest_at.isoformat() if lowest_at else None,
        "ledger": (node.ledger or None) if collection.ok else None,
        "engines": [{"name": name, "phase": phase, "container_state": state,
                     "prefill_tokens_per_s": (rates or {}).get("prefill_tokens_per_s")}
                    for name, phase, state, rates in engines],
    }


def record_collection(recorder: FlightRecorder, node: Node, procfs: Procfs, collection: Any,
                      window: Any) -> int:
    """Append one collection to the recorder: its samples a second (when ``procfs`` kept them)
    and its interval, written and ``fsync``ed together. Returns the records written."""
    boot = process_boot(recorder, procfs)
    kept = procfs.samples.kept if isinstance(procfs, SampledProcfs) else []
    records = [sample_record(at, text, boot) for at, text in kept]
    records.append(interval_record(node, collection, window, boot))
    recorder.append(records)
    return len(records)


def process_boot(recorder: FlightRecorder, procfs: Procfs) -> str | None:
    """The boot id this process writes (read once: a process does not outlive its boot)."""
    if not recorder.boot_read:
        recorder.boot, recorder.boot_note = read_boot_id(procfs)
        recorder.boot_read = True
    return recorder.boot


def read_boot_id(procfs: Procfs) -> tuple[str | None, str]:
    """This boot's id (``/proc/sys/kernel/random/boot_id``) and "", or None and why not."""
    try:
        text = procfs.read_text(BOOT_ID).strip()
    except ProcfsError as error:
        return None, str(error)
    if not _BOOT_ID_FORM.match(text):
        return None, f"{procfs.root / BOOT_ID} holds no boot id ({text[:40]!r})"
    return text, ""


def mark_clean_end(recorder: FlightRecorder, procfs: Procfs, now: datetime) -> None:
    """Record that SparkOps' worker stopped cleanly: the next start judges no crash."""
    recorder.append([{"type": CLEAN_END, "at": now.isoformat(),
                      "boot": process_boot(recorder, procfs)}])


# --- the post-mortem -----------------------------------------------------------------------------


UNEXPECTED_REBOOT = "unexpected-reboot"
HOST_REBOOTED = "host-rebooted"
UNCLEAN_STOP = "sparkops-unclean-stop"


@dataclass
class PostMortem:
    """The last recorded minutes before an end that was not clean, and what they show."""

    kind: str
    node: str
    boot_before: str | None
    boot_after: str | None
    last_at: datetime
    found_at: datetime
    minutes: float
    samples: list[dict[str, Any]]
    intervals: list[dict[str, Any]]
    skipped: list[Skipped]
    findings: list[str]
    # The previous boot's kernel log (collectors.kernellog.previous_boot_report), for an
    # unexpected reboot: the recognised lines, and what could not be read.
    kernel_evidence: list[dict[str, Any]] = field(default_factory=list)
    kernel_notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "node": self.node, "boot_before": self.boot_before,
            "boot_after": self.boot_after, "last_at": self.last_at.isoformat(),
            "found_at": self.found_at.isoformat(), "minutes": self.minutes,
            "findings": self.findings,
            "skipped": [{"segment": s.segment, "offset": s.offset, "length": s.length,
                         "reason": s.reason} for s in self.skipped],
            "samples": self.samples, "intervals": self.intervals,
            "kernel_evidence": self.kernel_evidence, "kernel_notes": self.kernel_notes,
        }


def post_mortem(kind: str, node_name: str, recording: Recording, boot_before: str | None,
                boot_after: str | None, last_at: datetime, minutes: float, found_at: datetime
                ) -> PostMortem:
    """The records of ``boot_before`` (of every boot when it is unknown) in the ``minutes``
    up to ``last_at``, the last recorded moment, and the findings they support."""
    since = last_at - timedelta(minutes=minutes)
    chosen = [r for r in recording.records
              if (boot_before is None or r.get("boot") == boot_before)
              and (at := record_time(r)) is not None and since <= at <= last_at]
    samples = [r for r in chosen if r.get("type") == SAMPLE]
    intervals = [r for r in chosen if r.get("type") == INTERVAL]
    findings = [_lowest_headroom(samples, intervals), _holders(intervals),
                _loading_or_prefilling(intervals)]
    if recording.skipped:
        findings.append("skipped: " + "; ".join(s.text() for s in recording.skipped[-3:]))
    return PostMortem(kind, node_name, boot_before, boot_after, last_at, found_at, minutes,
                      samples, intervals, recording.skipped, findings)


def _when(text: str | None) -> str:
    at = record_time({"at": text}) if text else None
    return moment_text(at, UTC) if at else "an unrecorded moment"


def _lowest_headroom(samples: list[dict], intervals: list[dict]) -> str:
    """The lowest room seen: the ledgers' headroom (host or memory budget, with the interval's
    minimum) and the samples' MemAvailable."""
    seen: list[tuple[int, str, str]] = []  # bytes, moment, what it is
    for interval in intervals:
        ledger = interval.get("ledger") or {}
        if ledger.get("headroom") is not None:
            source = ledger.get("headroom_source") or "host"
            at = interval.get("mem_available_min_at") if source == "host" else None
            seen.append((ledger["headroom"], at or interval.get("at"),
                         "the memory budget's room" if source == "budget" else "MemAvailable"))
        elif interval.get("mem_available_min") is not None:
            seen.append((interval["mem_available_min"],
                         interval.get("mem_available_min_at") or interval.get("at"),
                         "MemAvailable"))
    seen += [(s["mem_available"], s.get("at"), "MemAvailable") for s in samples
             if s.get("mem_available") is not None]
    if not seen:
        return "lowest headroom: unknown — no MemAvailable was recorded"
    # The lowest figure, at the first moment it was seen (ISO moments of one zone sort as text).
    lowest, at, what = min(seen, key=lambda item: (item[0], item[1] or ""))
    last = samples[-1].get("mem_available") if samples else None
    end = f"; {bytes_text(last)} at the last sample" if last is not None else ""
    return f"lowest headroom {bytes_text(lowest)} ({what}) at {_when(at)}{end}"


def _holders(intervals: list[dict]) -> str:
    """Who held what in the last recorded ledger: engines, page cache, the largest processes."""
    last = next((i for i in reversed(intervals) if i.get("ledger")), None)
    if last is None:
        return "who held what: unknown — no ledger was recorded"
    ledger = last["ledger"]
    parts = []
    for share in ledger.get("engines") or []:
        if share.get("actual") is not None:
            parts.append(f"{share['name']} {bytes_text(share['actual'])}")
        elif share.get("reserved") is not None:
            parts.append(f"{share['name']} {bytes_text(share['reserved'])} reserved")
        else:
            parts.append(f"{share['name']} unknown")
    if ledger.get("page_cache_reclaimable") is not None:
        parts.append(f"page cache {bytes_text(ledger['page_cache_reclaimable'])}")
    processes = sorted(ledger.get("processes") or [], key=lambda p: -(p.get("rss_bytes") or 0))
    parts += [f"{p['name']} {bytes_text(p.get('rss_bytes'))}" for p in processes[:3]]
    if ledger.get("swap_used"):
        parts.append(f"swap in use {bytes_text(ledger['swap_used'])}")
    held = ", ".join(parts) if parts else "no engine or large process"
    return f"held at {_when(last.get('at'))}: {held}"


def _loading_or_prefilling(intervals: list[dict]) -> str:
    """Which engine was loading at the end, and which prefilled in the recorded minutes."""
    if not intervals:
        return "engines: unknown — no interval was recorded"
    loading = [e["name"] for e in intervals[-1].get("engines") or []
               if e.get("phase") in LOADING_PHASES]
    prefilled: dict[str, tuple[str, float]] = {}
    for interval in intervals:
        for engine in interval.get("engines") or []:
            rate = engine.get("prefill_tokens_per_s")
            if rate:
                prefilled[engine["name"]] = (interval.get("at"), rate)
    parts = []
    if loading:
        phases = {e["name"]: e["phase"] for e in intervals[-1]["engines"]}
        parts.append("loading at the end: " + ", ".join(f"{name} ({phases[name]})"
                                                          for name in loading))
    if prefilled:
        parts.append("prefilling: " + ", ".join(
            f"{name} ({tps_text(rate)} in the interval ending {_when(at)})"
            for name, (at, rate) in prefilled.items()))
    return "; ".join(parts) if parts else "no engine was loading or prefilling"


def write_post_mortem(directory: Path, mortem: PostMortem) -> Path:
    """Write ``mortem`` as JSON beside the recorder (complete or absent); keep the newest
    ``POSTMORTEMS_KEPT``."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / f"postmortem-{mortem.last_at:%Y%m%dT%H%M%S%fZ}.json"
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        json.dump(mortem.as_dict(), file, default=_json_default)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    for old in sorted(directory.glob("postmortem-*.json"))[:-POSTMORTEMS_KEPT]:
        old.unlink(missing_ok=True)
    _fsync_directory(directory)
    return path


# --- boot tracking -------------------------------------------------------------------------------


@dataclass
class BootCheck:
    """What one start-up found: ``verdict`` is "first-start", "clean", "host-rebooted",
    "unexpected-reboot", "unclean-stop" or "clean-boot-unknown"; the Event written (None for
    "first-start" and "clean", or when the same one was written already) and the post-mortem's
    file."""

    verdict: str
    boot_before: str | None
    boot_now: str | None
    last_at: datetime | None
    event: Event | None = None
    post_mortem: Path | None = None


def check_boot(node: Node, recorder: FlightRecorder, procfs: Procfs, now: datetime,
               previous_boot: Callable[..., Any] | None = None) -> BootCheck:
    """Compare this boot with the one the recorder last wrote; write the Event that says what
    happened in between, then a start record. Run once per worker start, before it takes work.
    After an unexpected reboot the post-mortem carries the previous boot's kernel log as
    ``previous_boot`` reads it (:func:`collectors.kernellog.previous_boot_report`: the journal
    of boot -1, pstore's crash records written since the recorded minutes began)."""
    boot, boot_note = read_boot_id(procfs)
    recorder.boot, recorder.boot_note, recorder.boot_read = boot, boot_note, True
    recording = recorder.read()
    last = next((r for r in reversed(recording.records) if record_time(r) is not None), None)
    check = _judge(last, boot)
    if check.verdict in (UNEXPECTED_REBOOT, "unclean-stop"):
        kind = UNEXPECTED_REBOOT if check.verdict == UNEXPECTED_REBOOT else UNCLEAN_STOP
        mortem = post_mortem(kind, node.name, recording, check.boot_before, boot,
                             check.last_at, recorder.minutes, now)
        if kind == UNEXPECTED_REBOOT:
            _attach_kernel_log(mortem, previous_boot or previous_boot_report)
        check.post_mortem = write_post_mortem(recorder.directory, mortem)
        check.event = _event(node, kind, check.last_at,
                             _crash_message(check, mortem, boot_note, check.post_mortem))
    elif check.verdict == "host-rebooted":
        check.event = _event(node, HOST_REBOOTED, now, (
            f"Host rebooted: SparkOps stopped cleanly at {moment_text(check.last_at, UTC)} and "
            f"started again in another boot (boot id {_short(check.boot_before)} → "
            f"{_short(boot)}), found at {moment_text(now, UTC)}."))
    recorder.append([{"type": START, "at": now.isoformat(), "boot": boot,
                      "boot_note": boot_note, "pid": os.getpid()}])
    return check


def _attach_kernel_log(mortem: PostMortem, previous_boot: Callable[..., Any]) -> None:
    """Add what the previous boot's kernel log says to the post-mortem and its findings."""
    try:
        report = previous_boot(since=mortem.last_at - timedelta(minutes=mortem.minutes))
    except Exception as error:  # the post-mortem stands without it
        log.exception("reading the previous boot's kernel log failed")
        mortem.kernel_notes.append(f"the previous boot's kernel log could not be read: {error}")
        mortem.findings.append("the previous boot's kernel log could not be read")
        return
    mortem.kernel_evidence = [_evidence_dict(item) for item in report.evidence]
    mortem.kernel_notes = list(report.notes)
    if report.evidence:
        kinds: dict[str, int] = {}
        for item in report.evidence:
            kinds[item.headline.split(":")[0]] = kinds.get(item.headline.split(":")[0], 0) + 1
        told = ", ".join(f"{what} × {count}" if count > 1 else what
                         for what, count in kinds.items())
        mortem.findings.append(f"the previous boot's kernel log: {told} (last: "
                               f"{report.evidence[-1].raw[:160]})")
    else:
        mortem.findings.append("the previous boot's kernel log shows no OOM kill, NVIDIA "
                               "error, hung task or failed allocation"
                               + (f" ({'; '.join(report.notes)})" if report.notes else ""))


def _evidence_dict(item: Any) -> dict[str, Any]:
    data = dict(vars(item))
    if data.get("at") is not None:
        data["at"] = data["at"].isoformat()
    return data


def _judge(last: dict[str, Any] | None, boot: str | None) -> BootCheck:
    if last is None:
        return BootCheck("first-start", None, boot, None)
    before, at, clean = last.get("boot"), record_time(last), last.get("type") == CLEAN_END
    if before is None or boot is None:
        return BootCheck("clean-boot-unknown" if clean else "unclean-stop", before, boot, at)
    if before != boot:
        return BootCheck("host-rebooted" if clean else UNEXPECTED_REBOOT, before, boot, at)
    return BootCheck("clean" if clean else "unclean-stop", before, boot, at)


def _short(boot: str | None) -> str:
    return boot[:8] if boot else "unknown"


def _crash_message(check: BootCheck, mortem: PostMortem, boot_note: str, path: Path) -> str:
    last = moment_text(mortem.last_at, UTC)
    if check.verdict == UNEXPECTED_REBOOT:
        head = (f"Unexpected reboot: the last record is at {last}, and SparkOps never stopped "
                f"cleanly before the host restarted (boot id {_short(check.boot_before)} → "
                f"{_short(check.boot_now)}).")
    elif check.boot_before is None or check.boot_now is None:
        why = boot_note or "the last record names no boot"
        head = (f"SparkOps stopped without a clean stop: the last record is at {last}; whether "
                f"the host rebooted since is unknown — {why}.")
    else:
        head = (f"SparkOps stopped without a clean stop: the last record is at {last}; the "
                "host did not reboot (same boot id), so SparkOps' worker was killed or died.")
    count = (f"{len(mortem.samples)} samples, one a second, and {len(mortem.intervals)} "
             f"intervals of the last {mortem.minutes:g} minutes")
    return (f"{head} {'; '.join(mortem.findings)}. The recorded minutes ({count}) are in "
            f"{path}; found at start-up at {moment_text(mortem.found_at, UTC)}.")


def _event(node: Node, kind: str, at: datetime | None, message: str) -> Event | None:
    """Write the Event unless the same one was written already (a start that died after it)."""
    if at is None or Event.objects.filter(node=node, kind=kind, at=at).exists():
        return None
    severity = {UNEXPECTED_REBOOT: Event.Severity.CRITICAL, UNCLEAN_STOP: Event.Severity.WARNING
                }.get(kind, Event.Severity.INFO)
    return Event.objects.create(node=node, at=at, kind=kind, severity=severity, message=message)
