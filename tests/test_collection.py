"""Collection into the database, including the dip a real allocation makes between two rows."""

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from collectors.hostmemory import collect_host_memory
from collectors.models import Collection, HostReading, Metric
from collectors.procfs import Procfs
from collectors.sampling import Clock
from tests.stillmemory import held, hold_block, wait_until_memory_is_still
from tests.stored import host_samples

FIXTURES = Path(__file__).parent / "fixtures" / "procfs"
MIB = 1024**2
GIB = 1024**3


def _stepped_clock() -> Clock:
    """A clock whose time moves only when the window sleeps: its reads fall where the pacing
    puts them, however busy the machine."""
    start, elapsed = datetime.now(UTC), [0.0]

    def sleep(seconds: float) -> None:
        elapsed[0] += seconds

    return Clock(wall=lambda: start + timedelta(seconds=elapsed[0]), mono=lambda: elapsed[0],
                 sleep=sleep)


def _values(collection):
    return {
        s.metric: (s.value, s.note)
        for s in host_samples(collection.node) if s.at <= collection.at
    }


def test_collection_stores_every_metric_with_pressure(node, procfs_tree):
    procfs = procfs_tree(
        (FIXTURES / "meminfo-gb10").read_text(), (FIXTURES / "pressure-memory").read_text()
    )

    collection, _ = collect_host_memory(node, procfs, duration=0.2, period=0.05,
                                        clock=_stepped_clock())

    values = _values(collection)
    assert collection.ok and collection.reads == 3  # at 0, 0.125 (memory still) and 0.2 s
    assert values[Metric.MEM_AVAILABLE][0] == 58112044 * 1024
    assert values[Metric.MEM_AVAILABLE_MIN][0] == 58112044 * 1024
    assert values[Metric.PSI_SOME_AVG10][0] == 1.25
    assert values[Metric.CMA_FREE][0] == 0
    node.refresh_from_db()
    assert node.mem_total_bytes == 127600468 * 1024
    assert node.last_collection_at == collection.at


def test_missing_field_is_stored_as_null_with_its_reason(node, procfs_tree):
    text = (FIXTURES / "meminfo-gb10").read_text().replace("MemFree:", "MemFree: n/a kB #")
    procfs = procfs_tree(text)  # no PSI file either

    collection, _ = collect_host_memory(node, procfs, duration=0.05, period=0.05)

    values = _values(collection)
    assert collection.ok
    assert values[Metric.MEM_FREE] == (None, "unreadable value 'n/a kB # 21203720 kB'")
    assert values[Metric.PSI_SOME_AVG10] == (
        None, "no /proc/pressure/memory (kernel without PSI)"
    )
    assert values[Metric.MEM_AVAILABLE][0] == 58112044 * 1024


def test_unreadable_meminfo_is_a_failed_collection_with_the_reason(node, procfs_tree):
    procfs = procfs_tree(None)

    collection, _ = collect_host_memory(node, procfs, duration=0.05, period=0.05)

    assert not collection.ok
    assert "meminfo does not exist" in collection.error
    assert not HostReading.objects.filter(node=node).exists()
    assert Collection.objects.get(pk=collection.pk).error == collection.error




@pytest.mark.slow
@pytest.mark.alone  # the 2 GiB dip is measured against the machine's own MemAvailable
def test_a_one_second_allocation_between_collections_is_the_interval_minimum(node):
    """A real 2 GiB allocation held ~1 s inside one window shows up as the interval minimum, as
    deep as the allocator itself read it while it held the block, timed while it did.

    The depth is the allocator's own reading, not one made before the window: what other
    programs free meanwhile (or the kernel reclaims) shows in the allocator's readings as in
    the window's.
    """
    size = 2 * GIB
    wait_until_memory_is_still()
    holder = hold_block(size, delay=0.3, hold=1.0)
    try:
        collection, _ = collect_host_memory(node, Procfs(), duration=10.0, period=0.1)
        made = held(holder)
    finally:
        holder.kill()
        holder.wait()
    (minimum,) = host_samples(node, Metric.MEM_AVAILABLE_MIN)
    (last,) = host_samples(node, Metric.MEM_AVAILABLE)

    depth_made = made["before"] - made["during"]
    assert depth_made >= GIB, f"the 2 GiB block moved MemAvailable by {depth_made // MIB} MiB"
    assert made["before"] - minimum.value >= depth_made - max(depth_made // 10, 32 * MIB)
    assert last.value > minimum.value  # the allocation was released inside the window
    # From the moment the block's pages began to be written: the lowest reading may come while
    # its last pages are (the block all but resident), a moment before the write returned.
    assert made["started"] <= minimum.at.timestamp() <= made["released"] + 0.2
    assert minimum.at < collection.at
