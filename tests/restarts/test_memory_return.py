"""Memory that must come back when an engine stops, and the floor of the guarded start: the
arithmetic (``dashboard.restarts.fit``), the judgement of an unplanned stop from the stored
samples (``dashboard.restarts.unplanned``), the memory-not-returned alert rule over the verdicts
the restarts keep, the compaction and refusals of the guarded start's drop, and the emulator's
memory that outlives it (``--emulator-leak-on-stop``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from collectors import pagecache as node_pagecache
from collectors.emulator.cli import CliError, parse_args
from collectors.emulator.memory import LeftBehind
from collectors.ledger import EngineShare
from collectors.models import Engine, EngineMetric, EngineReading, Event, Metric
from collectors.pagecache import CompactFailed, compact_memory
from dashboard.alerting.rules import memory_not_returned
from dashboard.audit.models import AuditEntry
from dashboard.restarts.fit import (
    BUDGET,
    HOST,
    MemoryReturn,
    engines_held,
    guard_floor,
    missing_now,
    not_returned,
    return_tolerance,
    returned_by_stop,
)
from dashboard.restarts.models import Restart
from dashboard.restarts.pagecache import DropRefused, drop_while_starting, last_drop_before_guard
from dashboard.restarts.unplanned import judge_memory_returns, record_unplanned_restarts
from sparkops.units import GIB, MIB
from tests.stored import engine_sample, engine_samples, host_sample

T0 = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
THRESHOLDS = {spec.key: spec.default for spec in memory_not_returned.RULE.thresholds}


def _share(**parts: int | None) -> EngineShare:
    values = dict(engine_id=1, name="gemma", weights=None, kv_pool=None, cuda_graphs=None,
                  actual=None, prefill_estimate=None, prefill_observed=None, prefill_need=None,
                  prefill_need_source=None)
    values.update(parts)
    return EngineShare(**values)


# --- the arithmetic ----------------------------------------------------------------------------


def test_what_a_stop_should_hand_back_leaves_the_cgroup_figure_out():
    # 15 GiB of weights + 60 GiB of KV pool + 0.5 GiB of graphs reported; the cgroup saw 90 GiB
    # (the page cache of the weights read), which a stop does not hand back to MemAvailable.
    share = _share(weights=15 * GIB, kv_pool=60 * GIB, cuda_graphs=GIB // 2, actual=90 * GIB)

    assert returned_by_stop(share, gpu_seen=None) == (
        int(75.5 * GIB), {"reported": int(75.5 * GIB), "gpu_seen": None})
    assert returned_by_stop(share, gpu_seen=80 * GIB)[0] == 80 * GIB  # NVML saw more
    assert returned_by_stop(_share(loaded_models=9 * GIB), gpu_seen=None)[0] == 9 * GIB
    assert returned_by_stop(_share(weights=15 * GIB, actual=90 * GIB), gpu_seen=None) == \
        (None, {"reported": None, "gpu_seen": None})


def test_the_tolerance_is_five_percent_of_what_it_held_or_one_percent_of_the_room():
    assert return_tolerance(80 * GIB, int(121.69 * GIB)) == 4 * GIB  # 5 % of 80 GiB
    assert return_tolerance(10 * GIB, int(121.69 * GIB)) == int(1.2169 * GIB)  # 1 % of MemTotal
    assert return_tolerance(100 * MIB, None) == 5 * MIB


def test_a_memory_account_keeps_its_best_reading_and_says_what_is_missing():
    account = MemoryReturn(HOST, before=20 * GIB, held=60 * GIB, tolerance=3 * GIB)
    assert (account.expected, account.missing, account.returned) == (80 * GIB, None, None)

    low = account.reading(int(67.6 * GIB)).reading(None).reading(60 * GIB)

    assert low.best == int(67.6 * GIB)  # the highest reading counts, an unreadable one not
    assert low.missing == 80 * GIB - int(67.6 * GIB) and low.returned is False
    assert low.reading(78 * GIB).returned is True  # 2 GiB short: within the tolerance
    assert MemoryReturn.from_dict(low.as_dict()) == low


def test_memory_counts_as_missing_only_when_every_room_says_so():
    host = MemoryReturn(HOST, 20 * GIB, 60 * GIB, 3 * GIB, best=68 * GIB)  # 12 GiB missing
    budget = MemoryReturn(BUDGET, 10 * GIB, 60 * GIB, 3 * GIB, best=62 * GIB)  # 8 GiB missing

    assert not_returned([host, budget]) == budget  # the smaller figure
    back = MemoryReturn(BUDGET, 10 * GIB, 60 * GIB, 3 * GIB, best=70 * GIB)
    assert not_returned([host, back]) is None  # the engine's memory came back to its budget
    unread = MemoryReturn(BUDGET, 10 * GIB, 60 * GIB, 3 * GIB)
    assert not_returned([host, unread]) == host and not_returned([unread]) is None


def test_what_is_missing_now_leaves_out_what_the_engines_took_since():
    account = MemoryReturn(HOST, 20 * GIB, 60 * GIB, 3 * GIB, best=68 * GIB)
    then = {"1": 0, "2": 10 * GIB}

    assert missing_now(account, 68 * GIB, held_then=then, held_now=then) == 12 * GIB
    # The stopped engine runs again with 50 GiB, the neighbour grew by 2 GiB: the room fell to
    # 16 GiB, and what is missing is still 12 GiB.
    assert missing_now(account, 16 * GIB, held_then=then,
                       held_now={"1": 50 * GIB, "2": 12 * GIB}) == 12 * GIB
    # The neighbour stopped since: its 10 GiB came back to the room too.
    assert missing_now(account, 78 * GIB, held_then=then, held_now={"1": 0}) == 12 * GIB
    assert missing_now(account, 80 * GIB, held_then=then, held_now=then) == 0
    assert missing_now(account, None, held_then=then, held_now=then) is None


def test_the_guard_floor_is_what_the_engine_still_has_to_allocate_plus_the_margin():
    # 80 GiB to allocate; MemAvailable fell by 30 GiB since the start: 50 GiB still to come.
    floor, still = guard_floor(80 * GIB, available_at_start=100 * GIB,
                               available_now=70 * GIB, margin=GIB)
    assert (floor, still) == (51 * GIB, 50 * GIB)
    # Unknown MemAvailable: the whole need is still to come; a configured floor replaces it.
    assert guard_floor(80 * GIB, available_at_start=None, available_now=70 * GIB,
                       margin=GIB) == (81 * GIB, 80 * GIB)
    assert guard_floor(80 * GIB, available_at_start=100 * GIB, available_now=10 * GIB,
                       margin=GIB, fixed=4 * GIB) == (4 * GIB, 0)


def _engine(node, name="gemma", **fields) -> Engine:
    values = dict(node=node, name=name, container_id=name * 8, container_state="running",
                  phase="ready", started_at=T0 - timedelta(days=1),
                  startup={"weights_gib": 15.0, "kv_cache_gib": 60.0, "cuda_graph_gib": 0.5})
    values.update(fields)
    return Engine.objects.create(**values)


def test_engines_held_counts_running_engines_only(node):
    running = _engine(node, "running")
    stopped = _engine(node, "stopped", container_state="exited")
    unknown = _engine(node, "unknown", startup={})

    assert engines_held([running, stopped, unknown]) == {
        str(running.pk): int(75.5 * GIB), str(stopped.pk): 0, str(unknown.pk): 0}


# --- an unplanned stop, judged from the stored samples ------------------------------------------


def _samples(node, metric, values_by_second: dict[int, float]) -> None:
    for s, v in values_by_second.items():
        host_sample(node, metric, T0 + timedelta(seconds=s), v)


def _stopped_engine(node, available_after_gib: float) -> Engine:
    """An engine that held 75.5 GiB, last read running at T0+5 s and seen exited at T0+10 s,
    with MemAvailable 20 GiB while it ran and ``available_after_gib`` after."""
    engine = _engine(node, container_state="exited", exit_code=1)
    engine_sample(engine, EngineMetric.REQUESTS_RUNNING, T0, 0.0)  # it served
    engine_sample(engine, EngineMetric.CONTAINER_MEMORY, T0 + timedelta(seconds=5),
                  float(80 * GIB))
    _samples(node, Metric.MEM_AVAILABLE, {0: 20 * GIB, 5: 20 * GIB,
                                          15: available_after_gib * GIB,
                                          70: available_after_gib * GIB})
    Event.objects.create(node=node, engine=engine, kind="engine-exited", severity="warning",
                         at=T0 + timedelta(seconds=10), message="gemma stopped: exit code 1")
    return engine


def test_an_unplanned_stop_whose_memory_stayed_gone_is_an_event_after_the_grace(node, settings):
    settings.SPARKOPS_MEMORY_RETURN_GRACE_SECONDS = 60
    engine = _stopped_engine(node, available_after_gib=80.0)  # 15.5 GiB short of 95.5

    record_unplanned_restarts(node, T0 + timedelta(seconds=20))  # within the grace: not yet
    assert "memory_return" not in Restart.objects.get().after
    record_unplanned_restarts(node, T0 + timedelta(seconds=75))

    restart = Restart.objects.get(kind="unplanned")
    verdict = restart.after["memory_return"]
    assert verdict["verdict"] == "not returned" and verdict["source"] == "host"
    assert verdict["missing_bytes"] == int(95.5 * GIB) - 80 * GIB
    event = Event.objects.get(kind="memory-not-returned")
    assert event.engine == engine and event.severity == "warning"
    assert event.message == ("gemma: memory not returned: 15.5 GiB of what it held (75.5 GiB) "
                             "is still missing 65 s after it stopped (MemAvailable 80.0 GiB, "
                             "expected 95.5 GiB ± 3.8 GiB).")
    judge_memory_returns(node, T0 + timedelta(seconds=90))  # judged once
    assert Event.objects.filter(kind="memory-not-returned").count() == 1


def test_an_unplanned_stop_whose_memory_came_back_raises_nothing(node):
    _stopped_engine(node, available_after_gib=94.0)  # 1.5 GiB short: within 3.8 GiB

    record_unplanned_restarts(node, T0 + timedelta(seconds=75))

    verdict = Restart.objects.get().after["memory_return"]
    assert verdict["verdict"] == "returned"
    assert not Event.objects.filter(kind="memory-not-returned").exists()


def test_an_engine_started_again_within_the_grace_is_not_judged(node):
    engine = _stopped_engine(node, available_after_gib=40.0)
    Event.objects.create(node=node, engine=engine, kind="engine-restarted", message="again",
                         at=T0 + timedelta(seconds=30))

    record_unplanned_restarts(node, T0 + timedelta(seconds=75))

    verdict = Restart.objects.get().after["memory_return"]
    assert verdict["verdict"] == "unknown" and "started again within the grace" in verdict["why"]
    assert not Event.objects.filter(kind="memory-not-returned").exists()


def test_an_engine_that_stopped_while_it_loaded_is_not_judged(node):
    _stopped_engine(node, available_after_gib=40.0)
    EngineReading.objects.filter(requests_running__isnull=False).update(requests_running=None)
    assert engine_samples(metric=EngineMetric.REQUESTS_RUNNING) == []

    record_unplanned_restarts(node, T0 + timedelta(seconds=75))

    verdict = Restart.objects.get().after["memory_return"]
    assert (verdict["verdict"], verdict["why"]) == (
        "unknown", "gemma stopped before it was read serving")


def test_an_engine_never_read_running_is_not_judged(node):
    engine = _engine(node, container_state="exited")
    Event.objects.create(node=node, engine=engine, kind="engine-exited", at=T0, message="m")

    record_unplanned_restarts(node, T0 + timedelta(seconds=75))

    verdict = Restart.objects.get().after["memory_return"]
    assert (verdict["verdict"], verdict["why"]) == (
        "unknown", "gemma was never read running before it stopped")


# --- the alert rule -----------------------------------------------------------------------------


def _verdict_restart(engine, *, kind="planned", stopped=T0, missing_gib=15.5) -> Restart:
    account = MemoryReturn(HOST, 20 * GIB, int(75.5 * GIB), int(3.775 * GIB),
                           best=int((95.5 - missing_gib) * GIB))
    verdict = {**account.as_dict(), "verdict": "not returned", "accounts": [account.as_dict()],
               "stopped_at": stopped.isoformat(), "engines_held": {str(engine.pk): 0},
               "text": "judged"}
    return Restart.objects.create(node=engine.node, engine=engine, kind=kind, status="aborted",
                                  requested_at=stopped - timedelta(minutes=5),
                                  started_at=stopped - timedelta(minutes=1),
                                  after={"memory_return": verdict})


def _evaluate(node, engines, available_gib, now):
    return memory_not_returned.evaluate(node, {"mem_available": int(available_gib * GIB)},
                                        engines, THRESHOLDS, now)


def test_the_alert_names_the_engine_and_what_is_missing_until_it_comes_back(node):
    engine = _engine(node, container_state="exited")
    restart = _verdict_restart(engine)

    (open_,) = _evaluate(node, [engine], 80.0, T0 + timedelta(minutes=5))
    assert open_.rule == "memory-not-returned" and open_.engine_id == engine.pk
    assert open_.crosses_threshold() and open_.value == pytest.approx(15.5)
    assert open_.summary == ("gemma: memory not returned after its planned restart at "
                             "2026-11-30 03:00:00 UTC: 15.5 GiB of what it held (75.5 GiB) is "
                             "still missing; MemAvailable 80.0 GiB")
    assert open_.details["restart_id"] == restart.pk

    (back,) = _evaluate(node, [engine], 95.0, T0 + timedelta(minutes=10))
    assert back.back_past_clear()


def test_the_alert_counts_the_engine_started_again_and_a_reboot(node):
    engine = _engine(node, container_state="exited")
    _verdict_restart(engine, kind="unplanned")
    engine.container_state = "running"  # started again: it holds its 75.5 GiB anew
    engine.save()

    (again,) = _evaluate(node, [engine], 80.0 - 75.5, T0 + timedelta(minutes=5))
    assert again.value == pytest.approx(15.5)
    assert "after its stop seen by SparkOps" in again.summary

    Event.objects.create(node=node, kind="host-rebooted", at=T0 + timedelta(minutes=6),
                         message="rebooted")
    (rebooted,) = _evaluate(node, [engine], 4.5, T0 + timedelta(minutes=7))
    assert rebooted.value == 0.0 and "the host rebooted since" in rebooted.summary


def test_the_alert_forgets_old_stops_and_stops_that_returned(node):
    engine = _engine(node, container_state="exited")
    _verdict_restart(engine, stopped=T0 - timedelta(hours=30))
    returned = _verdict_restart(_engine(node, "other"))
    returned.after["memory_return"]["verdict"] = "returned"
    returned.save()

    assert _evaluate(node, [engine], 80.0, T0) == []


# --- the guarded start's drop: compaction and refusals ------------------------------------------


def test_compacting_is_refused_in_read_only_mode_and_without_root(tmp_path, settings,
                                                                   monkeypatch):
    (tmp_path / "sys" / "vm").mkdir(parents=True)
    settings.SPARKOPS_READ_ONLY = True
    with pytest.raises(CompactFailed, match="read-only"):
        compact_memory(tmp_path)
    settings.SPARKOPS_READ_ONLY = False
    monkeypatch.setattr(node_pagecache.os, "geteuid", lambda: 1000)
    with pytest.raises(CompactFailed, match="needs root, and the drop-caches helper does not"):
        compact_memory(tmp_path)
    monkeypatch.setattr(node_pagecache.os, "geteuid", lambda: 0)

    compact_memory(tmp_path)

    assert (tmp_path / "sys" / "vm" / "compact_memory").read_text() == "1\n"


def test_the_guarded_drop_is_refused_and_audited_in_read_only_mode(node, settings):
    settings.SPARKOPS_READ_ONLY = True
    engine = _engine(node)
    restart = Restart.objects.create(node=node, engine=engine, kind="planned", status="running")

    with pytest.raises(DropRefused, match="read-only"):
        drop_while_starting(engine=engine, restart=restart, actor="worker:test", why="low")

    entry = AuditEntry.objects.get()
    assert (entry.action, entry.allowed, entry.details["guarded_start"]) == \
        ("drop-caches", False, True)


def test_the_guard_is_not_held_back_by_its_own_restarts_drop_caches_step(node):
    engine = _engine(node)
    restart = Restart.objects.create(node=node, engine=engine, kind="planned", status="running")
    other = Restart.objects.create(node=node, engine=engine, kind="planned", status="succeeded")
    for at, owner, guarded in ((T0, other, False), (T0 + timedelta(minutes=1), restart, False)):
        AuditEntry.objects.create(action="drop-caches", allowed=True, node=node, restart=owner,
                                  details={"ok": True, **({"guarded_start": True}
                                                          if guarded else {})}, at=at)

    assert last_drop_before_guard(node.pk, restart) == T0  # the other restart's drop
    guarded = AuditEntry.objects.create(action="drop-caches", allowed=True, node=node,
                                        restart=restart, at=T0 + timedelta(minutes=2),
                                        details={"ok": True, "guarded_start": True})
    assert last_drop_before_guard(node.pk, restart) == guarded.at


# --- the emulator's memory that outlives it -----------------------------------------------------


def test_the_emulator_leaves_part_of_its_weights_in_a_file_it_never_removes(tmp_path):
    config = parse_args(["serve", "m", "--emulator-weights-bytes", "8M",
                         "--emulator-leak-on-stop", "3M", "--emulator-leak-dir", str(tmp_path)])
    assert (config.leak_on_stop_bytes, config.leak_dir) == (3 * MIB, str(tmp_path))

    left = LeftBehind(tmp_path, 3 * MIB + 5, "weights")

    assert left.path.stat().st_size == 3 * MIB + 5
    with pytest.raises(FileExistsError):  # never two engines in one file
        LeftBehind(tmp_path, 1, "weights")


@pytest.mark.parametrize(("flags", "error"), [
    (["--emulator-leak-on-stop", "3M"], "needs --emulator-leak-dir"),
    (["--emulator-leak-on-stop", "9M", "--emulator-leak-dir", "/x"], "at most --emulator-weig"),
])
def test_the_emulator_refuses_a_leak_it_cannot_hold(flags, error):
    with pytest.raises(CliError, match=error):
        parse_args(["serve", "m", "--emulator-weights-bytes", "8M", *flags])
