"""Real memory for an emulated engine: weights, KV pool, CUDA graphs, transient prefill buffers.

On a GB10 the GPU's memory *is* host memory, so an engine's reservations show up in MemFree and
MemAvailable (and in CUDA's own free figure, which follows MemFree). The emulator makes the same
thing true on any Linux box: every reservation is a private anonymous mapping whose pages are all
touched (one byte written per page), so the kernel really backs it, the process's VmRSS grows by
its size and the host's MemFree/MemAvailable fall by it. Private (not shared) on purpose: a
shared anonymous mapping is accounted as shmem, which /proc/meminfo reports under `Cached`, and
SparkOps would mistake the emulator for page cache.

One exception, on purpose: :class:`LeftBehind`, memory that does not come back when the engine
stops (``--emulator-leak-on-stop``). It is a file on a tmpfs (shared memory, as a segment in
``/dev/shm`` is): its pages are ``Shmem``, counted neither in MemAvailable nor as droppable
cache, charged to the memory cgroup of the process that wrote them, and, unlike the process's
own mappings, they outlive it. A container's processes all die with it, so no helper process
of its own can keep memory after a stop; a file the host keeps can, as a leaked shared-memory
segment or IPC buffer keeps its pages: it stands for memory that is "not returned" after an
engine's container exited.
"""

from __future__ import annotations

import mmap
import os
import threading
from pathlib import Path

PAGE_SIZE = mmap.PAGESIZE
MEMINFO = Path("/proc/meminfo")


class Reservation:
    """`nbytes` of anonymous memory, resident once touched, returned to the kernel by `free`.

    With `populate` the kernel backs every page at creation (MAP_POPULATE, about twice as fast as
    faulting pages one by one: roughly 0.25 s per GiB on a small VM); without it nothing is
    resident until `touch`, which lets a caller make memory appear gradually, as weights do while
    they load. A zero-byte reservation is valid and holds nothing.
    """

    def __init__(self, nbytes: int, *, populate: bool = False) -> None:
        if nbytes < 0:
            raise ValueError("a reservation cannot be negative")
        self.nbytes = nbytes
        self._touched = 0
        self._map: mmap.mmap | None = None
        if nbytes:
            flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
            if populate:
                flags |= getattr(mmap, "MAP_POPULATE", 0)
            self._map = mmap.mmap(-1, nbytes, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            if populate:
                self.touch()

    @property
    def resident_bytes(self) -> int:
        """Bytes touched so far (what VmRSS has gained from this reservation)."""
        return self._touched

    def touch(self, upto: int | None = None) -> None:
        """Write one byte in every page up to offset `upto` (default: all), so each is resident."""
        if self._map is None:
            return
        end = self.nbytes if upto is None else min(upto, self.nbytes)
        start = self._touched
        if end <= start:
            return
        # One byte per page through an extended slice: the loop runs in C, not Python.
        count = len(range(start, end, PAGE_SIZE))
        self._map[start:end:PAGE_SIZE] = b"\x01" * count
        self._touched = end

    def free(self) -> None:
        """Unmap; the memory goes back to the kernel at once. Idempotent."""
        if self._map is not None:
            self._map.close()
            self._map = None
        self._touched = 0


class LeftBehind:
    """``nbytes`` written to a new file in ``folder`` (meant to be a tmpfs the host mounts into
    the container), resident at once and never removed by the emulator: they stay held after it
    exits, until someone deletes the file (or the host reboots). ``path`` names it."""

    CHUNK = 1 << 20

    def __init__(self, folder: str | os.PathLike[str], nbytes: int, name: str) -> None:
        if nbytes < 0:
            raise ValueError("a reservation cannot be negative")
        self.nbytes = nbytes
        self.path = Path(folder) / name
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            block = b"\x01" * self.CHUNK
            left = nbytes
            while left > 0:
                left -= os.write(fd, block[:min(left, self.CHUNK)])
        finally:
            os.close(fd)


class TransientBuffer:
    """The activation buffer a prefill step holds, resized per step and released when idle.

    vLLM's prefill grabs an activation buffer as wide as the tokens it batches (the profile run
    sizes its peak with `max_num_batched_tokens` for that reason); decode holds about one step of
    activations, which is negligible and not modelled.
    Thread-safe: the engine resizes it, a shutdown frees it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: Reservation | None = None

    @property
    def nbytes(self) -> int:
        with self._lock:
            return self._current.nbytes if self._current else 0

    def hold(self, nbytes: int) -> None:
        """Hold exactly `nbytes` resident (reallocating only when the size changes)."""
        with self._lock:
            if self._current is not None and self._current.nbytes == nbytes:
                return
            if self._current is not None:
                self._current.free()
                self._current = None
            if nbytes > 0:
                self._current = Reservation(nbytes, populate=True)

    def release(self) -> None:
        """Give the buffer back (no-op when none is held)."""
        self.hold(0)


def read_meminfo(path: Path = MEMINFO) -> dict[str, int]:
    """/proc/meminfo as bytes per field (`MemFree`, `MemAvailable`, …); empty if unreadable."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    fields: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if not parts:
            continue
        try:
            value = int(parts[0])
        except ValueError:
            continue
        fields[name] = value * 1024 if len(parts) > 1 and parts[1] == "kB" else value
    return fields


def host_memory() -> tuple[int, int]:
    """(MemTotal, MemFree) in bytes — the pair CUDA's `mem_get_info` follows on a GB10
    (`torch.cuda.mem_get_info` there follows MemFree: reclaimable page cache is not free)."""
    info = read_meminfo()
    return info.get("MemTotal", 0), info.get("MemFree", 0)
