"""Fragmentation: free blocks by size and compaction rates stored with each host collection, and
the alert that recommends a reboot in the node's next restart window.

This machine's real /proc for the healthy case; constructed trees of week-up GB10s for the
fragmented one (tests/fixtures/fragmentation/SOURCE.md says what they are based on).
"""

from __future__ import annotations

import os
import shutil
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone

from collectors.fragmentation import read_free_blocks
from collectors.hostmemory import collect_host_memory
from collectors.models import Engine, Metric
from collectors.procfs import Procfs
from collectors.sampling import Clock
from dashboard.alerting.rules.fragmentation import RULE, evaluate
from dashboard.restarts.models import RestartWindow
from dashboard.restarts.windows import build_recurrence
from tests.stored import host_samples

FIXTURES = Path(__file__).parent / "fixtures" / "fragmentation"
MEMINFO_GB10 = Path(__file__).parent / "fixtures" / "procfs" / "meminfo-gb10"
KIB, MIB, GIB = 1024, 1024**2, 1024**3
DEFAULTS = {spec.key: spec.default for spec in RULE.thresholds}
# A fresh-boot zone Normal on 4 KiB pages: most free memory in order-10 (4 MiB) blocks.
FRESH_NORMAL = "Node 0, zone   Normal    812    640    533    402    311    207    155     98" \
               "     71     64  22310 \n"


def _tree(tmp_path: Path, name: str) -> Path:
    root = tmp_path / name
    shutil.copytree(FIXTURES / name, root)
    return root


def _collect(node, root: Path | None, clock: Clock | None = None):
    procfs = Procfs() if root is None else Procfs(root)
    collection, _ = collect_host_memory(node, procfs, duration=0.2, period=0.05, clock=clock)
    values = {s.metric: (s.value, s.note)
              for s in host_samples(node) if s.at >= collection.window_started_at}
    return collection, values


def _condition(node):
    [condition] = evaluate(node, node.ledger, [], DEFAULTS, timezone.now())
    assert condition.rule == "fragmentation"
    return condition


def _direct_read(text: str, page_size: int) -> tuple[int, int, int | None]:
    """Free, huge-page-sized free and largest free block over the non-DMA zones, computed here
    from the text as proc_buddyinfo(5) defines it: order n is 2**n pages."""
    huge_order = {4096: 9, 16384: 11, 65536: 13}[page_size]
    free = huge = 0
    largest = None
    for line in text.splitlines():
        words = line.replace(",", " ").split()
        if words[3] in ("DMA", "DMA32"):
            continue
        for order, count in enumerate(int(word) for word in words[4:]):
            free += count * page_size * 2**order
            if order >= min(huge_order, len(words) - 5):
                huge += count * page_size * 2**order
            if count:
                largest = max(largest or 0, page_size * 2**order)
    return free, huge, largest


def test_this_machines_buddyinfo_reads_as_a_direct_read_says(tmp_path):
    text = Path("/proc/buddyinfo").read_text()
    live = read_free_blocks(Procfs())
    assert live.page_size == os.sysconf("SC_PAGE_SIZE")
    assert [(zone.node, zone.zone, len(zone.counts)) for zone in live.zones] == [
        (int(line.split()[1].rstrip(",")), line.split()[3], len(line.split()) - 4)
        for line in text.splitlines()]

    # The counts move between two reads: the arithmetic is checked on one text.
    root = tmp_path / "proc"
    root.mkdir()
    (root / "buddyinfo").write_text(text)
    blocks = read_free_blocks(Procfs(root))

    assert (blocks.free_bytes, blocks.huge_free_bytes, blocks.largest_block_bytes) == \
        _direct_read(text, os.sysconf("SC_PAGE_SIZE"))


def test_this_machines_collection_is_judged_by_the_figures_it_stored(node):
    """Whether this machine is fragmented depends on what ran on it before (a host that has
    served containers for hours may well be): the verdict is checked against the stored
    figures, worked out here as the rule's help text states it."""
    collection, values = _collect(node, None)

    assert collection.ok
    huge, free = values[Metric.FREE_IN_HUGE_BLOCKS][0], values[Metric.BUDDY_FREE][0]
    fails = values[Metric.COMPACT_FAILS_PER_MIN][0]
    available, total = values[Metric.MEM_AVAILABLE][0], values[Metric.MEM_TOTAL][0]
    assert None not in (huge, free, fails, available, total)  # this kernel has compaction
    condition = _condition(node)

    floor = min(DEFAULTS["huge_free_gib"], DEFAULTS["huge_free_percent"] / 100 * free / GIB)
    assert condition.threshold == pytest.approx(floor)
    if available < DEFAULTS["available_fine_percent"] / 100 * total:
        assert condition.value is None and "the headroom floor's concern" in condition.summary
        return
    fragmented = huge / GIB < floor or fails >= DEFAULTS["compact_fails_per_min"]
    assert condition.crosses_threshold() is fragmented
    assert ("memory is fragmented" in condition.summary) is fragmented
    if not fragmented:
        assert condition.value == pytest.approx(huge / GIB)
        assert condition.summary.endswith("large blocks are there")


def test_a_week_up_gb10_with_4k_pages_has_no_huge_block_left_and_fires(node, tmp_path):
    collection, values = _collect(node, _tree(tmp_path, "gb10-week-4k"))
    text = (FIXTURES / "gb10-week-4k" / "buddyinfo").read_text()
    free, huge, largest = _direct_read(text, 4096)

    assert values[Metric.BUDDY_FREE] == (free, "")
    assert free == pytest.approx(81.36 * GIB, rel=1e-3)  # zone Normal only, DMA left out
    assert values[Metric.FREE_IN_HUGE_BLOCKS] == (0, "")
    assert values[Metric.LARGEST_FREE_BLOCK] == (MIB, "")  # order 8 on 4 KiB pages
    assert values[Metric.MEM_AVAILABLE][0] == 100663296 * KIB  # 96 GiB: looks fine
    assert values[Metric.COMPACT_FAILS_PER_MIN] == (0, "")  # the file does not change here

    condition = _condition(node)
    assert condition.crosses_threshold() is True
    assert condition.threshold == 2.0 and condition.severity == "warning"
    assert condition.summary.startswith(
        "spark-a: 0 KiB of 81.4 GiB free memory is in huge-page-sized blocks (largest free "
        "block 1 MiB), compaction failures 0/min, while MemAvailable is 96.00 GiB: memory "
        "is fragmented")
    assert "no restart window is set for spark-a" in condition.summary


def test_64k_pages_make_every_order_sixteen_times_larger(node, tmp_path):
    _, values = _collect(node, _tree(tmp_path, "gb10-week-64k"))

    # sparkring#173: 27 blocks of 16 MiB, none of 32 MiB or more.
    assert values[Metric.LARGEST_FREE_BLOCK] == (16 * MIB, "")
    assert values[Metric.FREE_IN_HUGE_BLOCKS] == (0, "")
    text = (FIXTURES / "gb10-week-64k" / "buddyinfo").read_text()
    assert values[Metric.BUDDY_FREE][0] == _direct_read(text, 65536)[0]
    assert _condition(node).crosses_threshold() is True


def test_failing_compaction_fires_while_huge_blocks_are_still_free(node, tmp_path):
    root = _tree(tmp_path, "gb10-week-4k")
    (root / "buddyinfo").write_text(FRESH_NORMAL)
    vmstat = (root / "vmstat").read_text()
    bumped = vmstat.replace("compact_fail 1351920", "compact_fail 1351970") \
        .replace("compact_stall 2704113", "compact_stall 2704163")
    assert bumped != vmstat

    def sleep(seconds: float) -> None:
        # 50 more stalls that failed, during the window
        (root / "vmstat").write_text(bumped)
        time.sleep(seconds)

    collection, values = _collect(node, root, Clock(sleep=sleep))

    window = (collection.at - collection.window_started_at).total_seconds()
    assert values[Metric.COMPACT_FAILS_PER_MIN][0] == pytest.approx(50 * 60 / window)
    assert values[Metric.COMPACT_STALLS_PER_MIN][0] == pytest.approx(50 * 60 / window)
    assert values[Metric.FREE_IN_HUGE_BLOCKS][0] > 80 * GIB
    condition = _condition(node)
    assert condition.crosses_threshold() is True
    assert "memory is fragmented" in condition.summary


def test_a_fresh_box_with_quiet_compaction_is_not_fragmented(node, tmp_path):
    root = _tree(tmp_path, "gb10-week-4k")
    (root / "buddyinfo").write_text(FRESH_NORMAL)

    _collect(node, root)

    condition = _condition(node)
    assert condition.crosses_threshold() is False
    assert condition.summary.endswith("large blocks are there")


def test_scarce_blocks_with_little_memory_available_are_left_to_the_headroom_floor(node,
                                                                                  tmp_path):
    root = _tree(tmp_path, "gb10-week-4k")
    # MemAvailable 8 GiB of 121.69: below 20 % of MemTotal
    (root / "meminfo").write_text((root / "meminfo").read_text().replace(
        "MemAvailable:   100663296 kB", "MemAvailable:     8388608 kB"))

    _collect(node, root)

    condition = _condition(node)
    assert condition.value is None and condition.crosses_threshold() is None
    assert "the headroom floor's concern" in condition.summary


def test_the_advice_names_the_nodes_next_window_not_an_engines(node, tmp_path):
    engine = Engine.objects.create(node=node, name="gemma", container_id="c" * 64,
                                   container_state="running")
    RestartWindow.objects.create(  # an engine's window does not cover a reboot
        name="gemma nights", node=node, engine=engine, time_zone="Asia/Seoul",
        duration_minutes=60, recurrence=build_recurrence(
            datetime(2026, 1, 1, 1, 0), "Asia/Seoul", "FREQ=DAILY"))
    RestartWindow.objects.create(
        name="Sunday maintenance", node=node, time_zone="Asia/Seoul", duration_minutes=120,
        recurrence=build_recurrence(datetime(2026, 1, 4, 3, 0), "Asia/Seoul",
                                    "FREQ=WEEKLY;BYDAY=SU"))
    _collect(node, _tree(tmp_path, "gb10-week-4k"))

    now = timezone.now()
    [condition] = evaluate(node, node.ledger, [engine], DEFAULTS, now)

    seoul = ZoneInfo("Asia/Seoul")
    local = now.astimezone(seoul)
    start = (local - timedelta(hours=2)).replace(hour=3, minute=0, second=0, microsecond=0)
    while start.weekday() != 6 or start + timedelta(hours=2) <= local:
        start += timedelta(days=1)
    start, end = start.astimezone(UTC), (start + timedelta(hours=2)).astimezone(UTC)
    if start <= now:
        expected = f"window Sunday maintenance, open now until {end:%H:%M} UTC"
    else:
        expected = (f"next restart window, Sunday maintenance: {start:%Y-%m-%d %H:%M}–"
                    f"{end:%H:%M} UTC")
    assert condition.crosses_threshold() is True
    assert expected in condition.summary
    assert "gemma nights" not in condition.summary
    assert condition.details["reboot_advice"].startswith("reboot the host in its")


def test_unreadable_buddyinfo_is_unknown_with_its_reason(node, tmp_path):
    root = _tree(tmp_path, "gb10-week-4k")
    (root / "buddyinfo").unlink()

    collection, values = _collect(node, root)

    assert collection.ok  # meminfo was read: the collection stands
    value, note = values[Metric.FREE_IN_HUGE_BLOCKS]
    assert value is None and note.endswith("buddyinfo does not exist")
    condition = _condition(node)
    assert condition.value is None
    assert condition.summary.endswith("buddyinfo does not exist")


def test_a_node_never_collected_gives_one_unknown_condition(node):
    condition = _condition(node)

    assert condition.value is None
    assert condition.summary == \
        "spark-a: fragmentation unknown — no current collection of this node"
