"""A node's memory budget: a memory cgroup's room read with MemAvailable, the ledger's headroom as
the smaller of the two, causes confined to what runs inside it, and how the pages tell it.

The reader is tested on real cgroups (a child memory cgroup made as root, with a real process
allocating in it) where this machine lets the test write the memory controller; the file
formats of the other cgroup version are fixture trees written as the kernel writes them.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from itertools import count
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.urls import reverse

from collectors.hostmemory import budget_figures, record_window, window_figures
from collectors.ledger import budget_components, build_ledger, dip_figures, record_changes
from collectors.meminfo import parse_meminfo
from collectors.models import Engine, LedgerChange, Metric
from collectors.procfs import BudgetReading, Procfs, read_memory_budget
from collectors.sampling import Clock, WindowReading, watch_host_memory
from dashboard.alerting.rules import prefill_squeeze
from dashboard.alerting.settings import rule_settings
from dashboard.exports.figures import host_reading
from sparkops.demo.budget import (
    BudgetUnavailable,
    budget_limit,
    create_budget,
    remove_budget,
)
from sparkops.demo.node import Scale
from sparkops.env import env_path_below
from sparkops.units import GIB, MIB
from tests.stored import host_samples

T0 = datetime(2026, 11, 30, 14, 0, tzinfo=UTC)
MEMINFO = Path(__file__).parent / "fixtures" / "procfs" / "meminfo-gb10"
HELD = 256 * MIB
# Charges are batched per CPU before usage_in_bytes sees them (a few hundred KiB at most), and
# the allocating program's own pages come and go a little: moves are checked to within this.
SLACK = 8 * MIB

# A program that holds (touched, private anonymous pages, like the engine emulator) and frees
# memory when told on stdin, answering "ok" once done.
ALLOCATOR = """
import mmap, sys
held = None
for line in sys.stdin:
    command, _, size = line.strip().partition(" ")
    if command == "hold":
        held = mmap.mmap(-1, int(size), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        held[::mmap.PAGESIZE] = b"\\1" * len(range(0, int(size), mmap.PAGESIZE))
    elif command == "free" and held is not None:
        held.close()
        held = None
    print("ok", flush=True)
"""


class Allocator:
    """A real process in a memory cgroup that holds and frees memory on command."""

    def __init__(self, cgroup: Path) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", ALLOCATOR], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        (cgroup / "cgroup.procs").write_text(str(self.process.pid))
        self.tell("noop")  # it runs (and is charged) inside the cgroup from here on

    def tell(self, command: str) -> None:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        assert self.process.stdout.readline().strip() == "ok"

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(timeout=10)


@pytest.fixture
def memory_cgroup() -> Iterator[Path]:
    """A child memory cgroup of this machine (v1 controller or v2) with a 1 GiB limit, made by
    the demo's own code and removed afterwards; the test is skipped, with the reason, where the
    memory controller cannot be written (not root, none mounted)."""
    name = f"sparkops-test-{uuid.uuid4().hex[:8]}"
    try:
        budget = create_budget(name, GIB)
    except BudgetUnavailable as why:
        pytest.skip(f"cannot make a memory cgroup here: {why}")
    try:
        yield budget.path
    finally:
        assert remove_budget(name) == []


# --- reading a real memory cgroup -----------------------------------------------------------
@pytest.mark.slow
def test_the_budget_s_room_falls_and_rises_with_a_process_allocating_inside_it(memory_cgroup):
    allocator = Allocator(memory_cgroup)
    try:
        idle = read_memory_budget(memory_cgroup)
        allocator.tell(f"hold {HELD}")
        holding = read_memory_budget(memory_cgroup)
        allocator.tell("free")
        freed = read_memory_budget(memory_cgroup)
    finally:
        allocator.stop()

    assert idle.error is None and idle.limit == GIB and not idle.unlimited
    assert holding.working_set - idle.working_set >= HELD - SLACK
    assert idle.room - holding.room >= HELD - SLACK
    assert freed.room - holding.room >= HELD - SLACK
    assert idle.room == GIB - idle.working_set


@pytest.mark.slow
@pytest.mark.django_db
def test_a_collection_keeps_the_budget_s_lowest_room_and_when_it_was_seen(node, memory_cgroup):
    allocator = Allocator(memory_cgroup)
    reads, ticks = count(1), count(0)
    seen_at: list[datetime] = []

    def wall() -> datetime:
        at = T0 + timedelta(seconds=next(ticks) * 0.1)
        seen_at.append(at)
        return at

    def sleep(_: float) -> None:
        # The collection's own pace drives the process: it holds memory between the second and
        # the fourth read of the window, and frees it before the last.
        read = next(reads)
        if read == 2:
            allocator.tell(f"hold {HELD}")
        elif read == 4:
            allocator.tell("free")

    mono = count(0)
    clock = Clock(wall=wall, mono=lambda: next(mono) * 0.1, sleep=sleep)
    try:
        window = watch_host_memory(Procfs(), duration=0.75, period=0.1, clock=clock,
                                   budget=memory_cgroup)
    finally:
        allocator.stop()
    collection = record_window(node, window)

    assert collection.ok and window.budget is not None
    assert window.budget.room - window.min_budget_room >= HELD - SLACK
    rows = {row.metric: row for row in host_samples(node)}
    assert rows[Metric.MEMORY_BUDGET_LIMIT].value == GIB
    assert rows[Metric.MEMORY_BUDGET_ROOM].value == window.budget.room
    lowest = rows[Metric.MEMORY_BUDGET_ROOM_MIN]
    assert lowest.value == window.min_budget_room
    # Stored at the instant it was seen, while the memory was held, not at the window's end.
    assert lowest.at == window.min_budget_room_at < window.finished_at
    assert window_figures(window)["budget"]["room_min"] == window.min_budget_room


@pytest.mark.django_db
def test_an_unreadable_budget_is_unknown_with_its_reason_never_zero(node, tmp_path):
    missing = tmp_path / "sparkops-nowhere"
    reading = read_memory_budget(missing)
    assert (reading.limit, reading.room, reading.working_set) == (None, None, None)
    assert reading.room_note == f"{missing} does not exist"
    assert "no memory controller" in read_memory_budget(tmp_path).room_note

    info = parse_meminfo(MEMINFO.read_text())
    window = WindowReading(started_at=T0, finished_at=T0 + timedelta(seconds=5), reads=50,
                           last=info, pressure=None, min_available=info.mem_available,
                           min_available_at=T0, budget=reading)
    record_window(node, window)
    rows = {row.metric: row for row in host_samples(node)}
    for metric in (Metric.MEMORY_BUDGET_LIMIT, Metric.MEMORY_BUDGET_ROOM,
                   Metric.MEMORY_BUDGET_ROOM_MIN):
        assert rows[metric].value is None and "does not exist" in rows[metric].note


# --- the file formats: cgroup v1 and v2, as the kernel writes them ---------------------------
def _cgroup(root: Path, files: dict[str, str]) -> Path:
    root.mkdir()
    for name, text in files.items():
        (root / name).write_text(text)
    return root


# memory.stat keys and the "max" of memory.max: Documentation/admin-guide/cgroup-v2.rst;
# v1's total_* keys and the PAGE_COUNTER_MAX limit: Documentation/admin-guide/cgroup-v1/memory.rst.
V2_STAT = "anon 3221225472\nfile 1073741824\nactive_file 268435456\ninactive_file 805306368\n"
V1_STAT = ("cache 1073741824\nrss 3221225472\ninactive_file 0\n"
           "hierarchical_memory_limit 9223372036854771712\ntotal_cache 1073741824\n"
           "total_rss 3221225472\ntotal_inactive_file 805306368\n")


def test_cgroup_v2_room_is_the_limit_less_the_working_set(tmp_path):
    limited = _cgroup(tmp_path / "inference.slice", {
        "memory.max": "8589934592\n", "memory.current": "4294967296\n", "memory.stat": V2_STAT})
    reading = read_memory_budget(limited)
    assert (reading.version, reading.limit) == (2, 8 * GIB)
    assert reading.working_set == 4 * GIB - 768 * MIB
    assert reading.room == 8 * GIB - reading.working_set

    unlimited = _cgroup(tmp_path / "open.slice", {
        "memory.max": "max\n", "memory.current": "4294967296\n", "memory.stat": V2_STAT})
    reading = read_memory_budget(unlimited)
    assert reading.unlimited and reading.limit is None and reading.room is None
    assert reading.room_note == f"no limit (memory.max is 'max' in {unlimited})"


def test_cgroup_v1_counts_the_children_and_knows_its_no_limit_value(tmp_path):
    files = {"memory.limit_in_bytes": "9223372036854771712\n",
             "memory.usage_in_bytes": "4294967296\n", "memory.stat": V1_STAT}
    reading = read_memory_budget(_cgroup(tmp_path / "open", files))
    assert reading.version == 1 and reading.unlimited and reading.room is None
    assert reading.working_set == 4 * GIB - 768 * MIB  # total_inactive_file, not inactive_file

    files["memory.limit_in_bytes"] = "3221225472\n"  # below the working set: no room, not < 0
    reading = read_memory_budget(_cgroup(tmp_path / "full", files))
    assert reading.room == 0

    files["memory.stat"] = "cache 0\n"
    reading = read_memory_budget(_cgroup(tmp_path / "odd", files))
    assert reading.room is None and "no total_inactive_file line" in reading.room_note


# --- the ledger ------------------------------------------------------------------------------
def _figures(host_min_gib: float | None, room_min_gib: float | None, *, limit_gib=10.0,
             room_gib: float | None = None) -> dict:
    def b(value):
        return None if value is None else int(value * GIB)

    room = room_gib if room_gib is not None else room_min_gib
    budget = BudgetReading("/sys/fs/cgroup/memory/inference", 1, b(limit_gib),
                           b((limit_gib or 12.0) - (room or 0)), 0, unlimited=limit_gib is None)
    return {"mem_total": int(121.69 * GIB), "mem_available": b(30),
            "mem_available_min": b(host_min_gib), "page_cache_reclaimable": 2 * GIB,
            "swap_used": 0, "budget": budget_figures(budget, b(room_min_gib))}


def _engine(node, name, kv_gib, **extra):
    values = dict(node=node, name=name, container_id=name * 8, container_state="running",
                  phase="ready", startup={"weights_gib": 15.0, "kv_cache_gib": kv_gib,
                                          "cuda_graph_gib": 0.5},
                  config={"max_num_batched_tokens": 8192, "kv_cache_memory_bytes": 1})
    values.update(extra)
    return Engine.objects.create(**values)


def test_the_ledger_headroom_is_the_smaller_of_the_host_s_and_the_budget_s(node):
    within = build_ledger(node, T0, _figures(27, 3, room_gib=3.5), [], []).as_dict()
    assert (within["headroom"], within["headroom_source"]) == (3 * GIB, "budget")
    assert within["host_headroom"] == 27 * GIB
    assert within["headroom_now"] == int(3.5 * GIB)  # the room at the end, not its minimum

    host_bound = build_ledger(node, T0, _figures(2, 3), [], []).as_dict()
    assert (host_bound["headroom"], host_bound["headroom_source"]) == (2 * GIB, "host")

    unlimited = build_ledger(node, T0, _figures(27, None, limit_gib=None), [], []).as_dict()
    assert (unlimited["headroom"], unlimited["headroom_source"]) == (27 * GIB, "host")
    assert unlimited["budget"]["unlimited"] and unlimited["budget"]["room"] is None

    plain = dict(_figures(27, 3))
    del plain["budget"]
    assert build_ledger(node, T0, plain, [], []).as_dict()["headroom_source"] == "host"


@pytest.mark.django_db
def test_while_the_budget_bounds_the_headroom_only_what_runs_inside_it_is_a_cause(node):
    gemma = _engine(node, "gemma", 6.0, prefill_bytes_per_token=4 * 131072)  # needs 4 GiB
    nemotron = _engine(node, "nemotron", 8.0)
    ledger = build_ledger(node, T0, _figures(20, 12), [gemma, nemotron], [],
                          in_budget={gemma.pk, nemotron.pk})
    record_changes(node, ledger, T0)
    # Meanwhile a program outside the budget took more than the neighbour's growth.
    LedgerChange.objects.create(node=node, component="process:python3", label="process python3",
                                at=T0 + timedelta(seconds=30), before_bytes=GIB,
                                after_bytes=3 * GIB)
    nemotron.startup = {**nemotron.startup, "kv_cache_gib": 9.5}
    nemotron.save()
    at = T0 + timedelta(minutes=1)
    inside = build_ledger(node, at, _figures(18, 5), [gemma, nemotron], [],
                          in_budget={gemma.pk, nemotron.pk})
    record_changes(node, inside, at)
    node.refresh_from_db()
    assert budget_components(node.ledger) == {f"engine:{e.pk}:{part}" for e in (gemma, nemotron)
                                              for part in ("kv_pool", "non_kv")}

    conditions = prefill_squeeze.evaluate(node, node.ledger, [gemma, nemotron],
                                          dict(rule_settings("prefill-squeeze").thresholds), at)

    at_risk = next(c for c in conditions if c.engine_id == gemma.pk)
    assert at_risk.crosses_threshold() and at_risk.value == pytest.approx(5 - 2.0)
    assert at_risk.details["cause"].startswith("nemotron's KV pool went 8.00 → 9.50 GiB")
    assert [c["label"] for c in at_risk.details["causes"]] == ["nemotron's KV pool"]
    # Where the host bounds the headroom, the program outside is the largest mover again.
    host_causes = prefill_squeeze.causes(node, gemma, at, 30)
    assert host_causes[0]["label"] == "process python3"


def test_a_prefill_dip_is_read_from_the_budget_where_other_programs_do_not_move_it():
    previous = {"mem_available": 20 * GIB, "budget": {"room": 3 * GIB}}
    # Another program took 2 GiB of MemAvailable for a moment; inside the budget a prefill
    # buffer of 200 MiB came and went.
    figures = {"mem_available": 20 * GIB, "mem_available_min": 18 * GIB,
               "budget": {"room": 3 * GIB, "room_min": 3 * GIB - 200 * MIB}}
    assert dip_figures(previous, figures) == (3 * GIB, 3 * GIB, 3 * GIB - 200 * MIB)
    # Without the budget's room in both collections, MemAvailable is what there is.
    assert dip_figures({"mem_available": 20 * GIB}, figures) == (20 * GIB, 20 * GIB, 18 * GIB)


# --- what the pages and exports say ------------------------------------------------------------
def _collected(node, budget: BudgetReading, room_min: int | None, engines=()) -> None:
    info = parse_meminfo(MEMINFO.read_text())
    now = datetime.now(UTC)
    window = WindowReading(started_at=now - timedelta(seconds=5), finished_at=now, reads=50,
                           last=info, pressure=None, min_available=info.mem_available,
                           min_available_at=now - timedelta(seconds=1), budget=budget,
                           min_budget_room=room_min,
                           min_budget_room_at=now - timedelta(seconds=2))
    record_window(node, window)
    record_changes(node, build_ledger(node, now, window_figures(window), list(engines), []), now)


def test_the_overview_tells_the_headroom_within_the_memory_budget(admin_client, node):
    cgroup = "/sys/fs/cgroup/memory/sparkops-demo-0123456789"
    _collected(node, BudgetReading(cgroup, 1, int(10.5 * GIB), 8 * GIB, 0), int(2.4 * GIB))

    page = admin_client.get(reverse("dashboard:overview", args=[node.name])).content.decode()

    assert (f"Headroom: 2.40 GiB within the memory budget {cgroup} (limit 10.5 GiB), its "
            "lowest room in the interval; the host has MemAvailable") in page
    assert "Room in the memory budget" in page
    assert f"Within the memory budget {cgroup} (limit 10.50 GiB)" in page
    assert "It bounds the headroom" in page
    figure = next(f for f in admin_client.get(
        reverse("dashboard:headroom-json", args=[node.name])).json()["figures"]
        if f["key"] == "budget_room_min")
    assert figure["value"] == 2.4 and figure["display"] == "2.40 GiB"
    reading = host_reading(node, datetime.now(UTC), 5)
    assert reading.headroom_bytes == int(2.4 * GIB)  # /metrics and the API: the smaller


def test_an_unlimited_budget_reads_no_limit_and_leaves_the_headroom_to_the_host(admin_client,
                                                                                node):
    cgroup = "/sys/fs/cgroup/inference.slice"
    _collected(node, BudgetReading(cgroup, 2, None, 8 * GIB, 0, unlimited=True), None)

    payload = admin_client.get(reverse("dashboard:headroom-json", args=[node.name])).json()
    figure = next(f for f in payload["figures"] if f["key"] == "budget_room_min")
    assert figure["value"] is None and figure["display"] == "no limit"
    assert "memory.max is 'max'" in figure["unknown_reason"]
    page = admin_client.get(reverse("dashboard:overview", args=[node.name])).content.decode()
    assert f"the memory budget {cgroup} has no limit, so MemAvailable bounds the headroom" \
        in page
    assert node.ledger["headroom_source"] == "host"


def test_without_a_budget_the_overview_shows_no_budget_figure(admin_client, node):
    info = parse_meminfo(MEMINFO.read_text())
    now = datetime.now(UTC)
    record_window(node, WindowReading(started_at=now - timedelta(seconds=5), finished_at=now,
                                      reads=50, last=info, pressure=None,
                                      min_available=info.mem_available, min_available_at=now))
    payload = admin_client.get(reverse("dashboard:headroom-json", args=[node.name])).json()
    assert "budget_room_min" not in [f["key"] for f in payload["figures"]]


# --- the setting and the demo's budget ------------------------------------------------------------
def test_the_budget_setting_takes_only_a_path_below_the_cgroup_root(monkeypatch):
    name, root, example = "SPARKOPS_MEMORY_BUDGET_CGROUP", "/sys/fs/cgroup", "/sys/fs/cgroup/x"
    monkeypatch.delenv(name, raising=False)
    assert env_path_below(name, root, example) == ""
    monkeypatch.setenv(name, "/sys/fs/cgroup/memory/inference/")
    assert env_path_below(name, root, example) == "/sys/fs/cgroup/memory/inference"
    for wrong in ("memory/inference", "/tmp/inference", "/sys/fs/cgroup", "/sys/fs/cgroup/../x"):
        monkeypatch.setenv(name, wrong)
        with pytest.raises(ImproperlyConfigured, match=name):
            env_path_below(name, root, example)


def test_the_demo_s_budget_holds_the_story_s_peak_and_the_rule_s_default_room():
    scale = Scale(64)
    assert budget_limit(scale) == scale.peak_bytes + int(2.5 * GIB) + 2 * 128 * MIB


def test_without_a_memory_controller_the_demo_is_told_why(tmp_path):
    with pytest.raises(BudgetUnavailable, match="no memory controller"):
        create_budget("sparkops-demo-x", GIB, root=tmp_path)
