"""The flight recorder: its framed records (torn tail, damaged checksum), its two-segment bound
in time and size, what one collection writes, the boot check at start-up and the
unexpected-reboot rule over its Event.

The boot id fixture files have the form of ``/proc/sys/kernel/random/boot_id``: a random UUID
written once per boot, in lower-case hex with a newline (Linux ``drivers/char/random.c``,
``proc_do_uuid``; Documentation/admin-guide/sysctl/kernel.rst, "random" section).
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from collectors import flightrecorder as fr
from collectors import tasks as collector_tasks
from collectors.hostmemory import collect_host_memory
from collectors.models import Collection, Engine, Event
from collectors.procfs import Procfs
from dashboard.alerting.rules import unexpected_reboot

FIXTURES = Path(__file__).parent / "fixtures" / "procfs"
GIB = 1024**3
T0 = datetime(2026, 11, 3, 14, 0, tzinfo=UTC)


def _records(count: int, start: datetime = T0, step: float = 1.0) -> list[dict]:
    return [{"type": fr.SAMPLE, "at": (start + timedelta(seconds=i * step)).isoformat(),
             "boot": "b", "mem_available": (60 - i) * GIB} for i in range(count)]


class FakeClock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


# --- the record format ---------------------------------------------------------------------------


def test_records_come_back_as_written():
    written = _records(3)
    decoded = fr.decode(b"".join(fr.encode(r) for r in written))
    assert decoded.records == written
    assert decoded.skipped == []


def test_a_torn_last_record_is_skipped_and_the_rest_is_read():
    written = _records(3)
    whole = b"".join(fr.encode(r) for r in written)
    torn = fr.encode({"type": fr.SAMPLE, "at": T0.isoformat()})
    for cut in (1, fr.HEADER.size - 1, fr.HEADER.size + 3, len(torn) - 1):
        data = whole + torn[:cut]

        decoded = fr.decode(data, "segment-00000001.rec")

        assert decoded.records == written
        assert decoded.valid_end == len(whole)
        assert decoded.skipped == [fr.Skipped("segment-00000001.rec", len(whole), cut, "torn")]


def test_a_record_whose_checksum_fails_is_skipped_and_those_after_it_still_count():
    written = _records(3)
    frames = [bytearray(fr.encode(r)) for r in written]
    frames[1][-2] ^= 0x01  # one bit of the middle record's payload
    decoded = fr.decode(b"".join(bytes(f) for f in frames))

    assert decoded.records == [written[0], written[2]]
    assert [(s.offset, s.length, s.reason) for s in decoded.skipped] == [
        (len(frames[0]), len(frames[1]), "corrupt")]


def test_a_damaged_header_costs_only_its_record():
    written = _records(3)
    frames = [bytearray(fr.encode(r)) for r in written]
    frames[1][2:6] = b"\xff\xff\xff\xff"  # a length far past the end
    decoded = fr.decode(b"".join(bytes(f) for f in frames))
    assert decoded.records == [written[0], written[2]]
    assert decoded.skipped[0].reason == "corrupt"


def test_garbage_alone_is_no_record_and_no_crash():
    decoded = fr.decode(b"SF\x00\x00\x00\x05garbage and more" + bytes(range(256)))
    assert decoded.records == []
    assert sum(s.length for s in decoded.skipped) == len(b"SF\x00\x00\x00\x05garbage and more")\
        + 256


# --- the segment files ---------------------------------------------------------------------------


def test_a_torn_tail_is_read_past_then_cut_before_the_next_append(tmp_path):
    recorder = fr.FlightRecorder(tmp_path, minutes=15)
    recorder.append(_records(2))
    segment = recorder.segments()[-1]
    with segment.open("ab") as file:
        file.write(fr.encode(_records(1)[0])[:7])

    assert fr.FlightRecorder(tmp_path, 15).read().skipped[0].reason == "torn"

    later = fr.FlightRecorder(tmp_path, 15)  # a new process
    later.append(_records(1, start=T0 + timedelta(minutes=1)))
    again = later.read()
    assert again.skipped == []
    assert len(again.records) == 3


def test_rotation_keeps_at_least_the_last_minutes_and_at_most_two_segments(tmp_path):
    clock = FakeClock(T0)
    recorder = fr.FlightRecorder(tmp_path, minutes=2, clock=clock)
    for second in range(0, 11 * 60, 5):  # eleven minutes of 5 s intervals
        clock.now = T0 + timedelta(seconds=second)
        recorder.append(_records(5, start=clock.now))
        kept = [fr.record_time(r) for r in recorder.read().records]
        assert len(recorder.segments()) <= 2
        assert kept[-1] - kept[0] >= min(timedelta(minutes=2), clock.now - T0)
        assert clock.now - kept[0] <= timedelta(minutes=4, seconds=5)

    assert [p.name for p in recorder.segments()] == ["segment-00000005.rec",
                                                     "segment-00000006.rec"]


def test_the_store_never_grows_past_two_segment_caps(tmp_path):
    cap = 20_000
    recorder = fr.FlightRecorder(tmp_path, minutes=15, max_segment_bytes=cap,
                                 clock=FakeClock(T0))  # never due by time: only the cap counts
    batch = _records(6)
    batch_bytes = sum(len(fr.encode(r)) for r in batch)
    for _ in range(200):
        recorder.append(batch)
        sizes = [p.stat().st_size for p in recorder.segments()]
        assert len(sizes) <= 2
        assert all(size <= cap for size in sizes)
        assert sum(sizes) <= 2 * cap + batch_bytes
    assert len(recorder.read().records) >= (cap // batch_bytes) * len(batch)


def test_segment_caps_scale_with_the_minutes_kept():
    assert fr.segment_bytes(15) == fr.MIN_SEGMENT_BYTES
    assert fr.segment_bytes(60) == 60 * fr.SEGMENT_BYTES_PER_MINUTE


def test_one_recorder_per_node_name_under_the_data_directory(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    assert fr.node_recorder("spark-a") is fr.node_recorder("spark-a")
    assert fr.node_recorder("spark-a") is not fr.node_recorder("spark-b")
    assert fr.node_recorder("../x/y").directory.parent == tmp_path / "flight-recorder"


# --- what a collection writes --------------------------------------------------------------------


def test_samples_are_kept_one_a_second():
    ticks = iter([0.0, 0.1, 0.5, 0.99, 1.0, 1.7, 2.05, 2.1])
    samples = fr.SecondSamples(wall=lambda: T0, mono=lambda: next(ticks))
    for index in range(8):
        samples.offer(str(index))
    assert [text for _, text in samples.kept] == ["0", "4", "6"]


def _boot_tree(tmp_path: Path, boot: str | None, meminfo: str | None = None) -> Procfs:
    root = tmp_path / "proc"
    (root / "sys" / "kernel" / "random").mkdir(parents=True, exist_ok=True)
    (root / "pressure").mkdir(exist_ok=True)
    (root / "meminfo").write_text(meminfo or (FIXTURES / "meminfo-gb10").read_text())
    boot_file = root / fr.BOOT_ID
    if boot is None:
        boot_file.unlink(missing_ok=True)
    else:
        boot_file.write_text(boot + "\n")
    return Procfs(root)


def test_a_collection_writes_its_samples_and_its_interval_with_the_ledger(node, tmp_path):
    boot = str(uuid.uuid4())
    procfs = fr.SampledProcfs(_boot_tree(tmp_path, boot).root,
                              samples=fr.SecondSamples(every=0.05))
    Engine.objects.create(node=node, name="gemma", container_id="c1", container_state="running",
                          phase="loading", rates={"prefill_tokens_per_s": 900.0})
    collection, window = collect_host_memory(node, procfs, duration=0.3, period=0.05)
    node.ledger = {"headroom": 50 * GIB, "engines": []}
    recorder = fr.FlightRecorder(tmp_path / "rec", 15)

    written = fr.record_collection(recorder, node, procfs, collection, window)

    records = recorder.read().records
    assert written == len(records) >= 3
    samples, interval = records[:-1], records[-1]
    assert {r["type"] for r in samples} == {fr.SAMPLE}
    assert samples[0]["mem_available"] == 58112044 * 1024
    assert {r["boot"] for r in records} == {boot}
    assert interval["type"] == fr.INTERVAL and interval["collection_id"] == collection.pk
    assert interval["ledger"] == {"headroom": 50 * GIB, "engines": []}
    assert interval["engines"] == [{"name": "gemma", "phase": "loading",
                                    "container_state": "running",
                                    "prefill_tokens_per_s": 900.0}]


def test_the_collection_task_feeds_the_nodes_recorder(node, settings, tmp_path, monkeypatch):
    settings.DATA_DIR = tmp_path / "data"
    settings.SPARKOPS_NODE_NAME = "spark-a"
    settings.SPARKOPS_PROCFS = str(_boot_tree(tmp_path, str(uuid.uuid4())).root)
    settings.SPARKOPS_COLLECT_INTERVAL = 1.0
    monkeypatch.setattr(collector_tasks, "_announce", lambda *args: None)

    collection_id = collector_tasks.collect_host_memory("spark-a")

    records = fr.node_recorder("spark-a").read().records
    assert records[-1]["type"] == fr.INTERVAL and records[-1]["collection_id"] == collection_id
    assert records[-1]["ledger"]["mem_available"] == 58112044 * 1024
    assert sum(r["type"] == fr.SAMPLE for r in records) >= 1


# --- the boot check ------------------------------------------------------------------------------


def _recorded_run(recorder: fr.FlightRecorder, boot: str, *, clean: bool) -> datetime:
    """Two minutes of a run of ``boot`` with a squeeze at its end; returns its last moment."""
    records = []
    for second in range(120):
        at = T0 + timedelta(seconds=second)
        records.append({"type": fr.SAMPLE, "at": at.isoformat(), "boot": boot,
                        "mem_available": (40 - second // 4) * GIB, "mem_free": GIB,
                        "swap_used": 0, "page_cache": 2 * GIB})
        if second % 5 == 4:
            records.append({
                "type": fr.INTERVAL, "at": at.isoformat(), "boot": boot, "ok": True,
                "mem_available_min": (40 - second // 4) * GIB,
                "mem_available_min_at": at.isoformat(),
                "ledger": {"headroom": (40 - second // 4) * GIB, "headroom_source": "host",
                           "page_cache_reclaimable": 2 * GIB, "swap_used": 0,
                           "engines": [{"name": "gemma", "actual": 70 * GIB, "reserved": None},
                                       {"name": "qwen", "actual": None,
                                        "reserved": 20 * GIB}],
                           "processes": [{"name": "python3", "rss_bytes": GIB, "count": 2}]},
                "engines": [{"name": "gemma", "phase": "ready", "container_state": "running",
                             "prefill_tokens_per_s": 2400.0 if second > 100 else 0.0},
                            {"name": "qwen", "phase": "loading",
                             "container_state": "running", "prefill_tokens_per_s": None}],
            })
    last = T0 + timedelta(seconds=119)
    if clean:
        last += timedelta(seconds=1)
        records.append({"type": fr.CLEAN_END, "at": last.isoformat(), "boot": boot})
    recorder.append(records)
    return last


def test_a_changed_boot_after_an_unclean_end_is_an_unexpected_reboot_at_the_last_moment(
        node, tmp_path):
    before, after = str(uuid.uuid4()), str(uuid.uuid4())
    recorder = fr.FlightRecorder(tmp_path / "rec", 15)
    last = _recorded_run(recorder, before, clean=False)
    now = last + timedelta(hours=2)

    check = fr.check_boot(node, recorder, _boot_tree(tmp_path, after), now)

    assert check.verdict == fr.UNEXPECTED_REBOOT
    event = Event.objects.get(kind=fr.UNEXPECTED_REBOOT)
    assert (event.at, event.severity, event.engine) == (last, "critical", None)
    assert "2026-11-03 14:01:59 UTC" in event.message
    assert "lowest headroom 11.0 GiB (MemAvailable) at 2026-11-03 14:01:56 UTC" in event.message
    assert "gemma 70.0 GiB, qwen 20.0 GiB reserved, page cache 2.00 GiB" in event.message
    assert "loading at the end: qwen (loading)" in event.message
    assert "prefilling: gemma (2,400 tok/s" in event.message
    assert str(check.post_mortem) in event.message
    mortem = json.loads(check.post_mortem.read_text())
    assert (mortem["boot_before"], mortem["boot_after"]) == (before, after)
    assert len(mortem["samples"]) == 120 and len(mortem["intervals"]) == 24
    assert mortem["samples"][-1]["at"] == last.isoformat()
    # The start of this boot is recorded, so the next start judges from it.
    assert recorder.read().records[-1]["type"] == fr.START
    assert recorder.read().records[-1]["boot"] == after


def test_only_the_last_minutes_go_into_the_post_mortem(node, tmp_path):
    before = str(uuid.uuid4())
    recorder = fr.FlightRecorder(tmp_path / "rec", minutes=1)
    last = _recorded_run(recorder, before, clean=False)

    check = fr.check_boot(node, recorder, _boot_tree(tmp_path, str(uuid.uuid4())),
                          last + timedelta(minutes=5))

    mortem = json.loads(check.post_mortem.read_text())
    assert len(mortem["samples"]) == 61  # 14:00:59 to 14:01:59, both ends
    assert mortem["samples"][0]["at"] == (last - timedelta(minutes=1)).isoformat()


def test_a_torn_record_is_named_in_the_post_mortem(node, tmp_path):
    recorder = fr.FlightRecorder(tmp_path / "rec", 15)
    last = _recorded_run(recorder, str(uuid.uuid4()), clean=False)
    with recorder.segments()[-1].open("ab") as file:
        file.write(fr.encode(_records(1)[0])[:20])

    check = fr.check_boot(node, fr.FlightRecorder(tmp_path / "rec", 15),
                          _boot_tree(tmp_path, str(uuid.uuid4())), last + timedelta(minutes=3))

    assert check.event.at == last
    assert "a torn record (20 bytes at byte" in check.event.message


def test_a_changed_boot_after_a_clean_stop_is_only_host_rebooted(node, tmp_path):
    recorder = fr.FlightRecorder(tmp_path / "rec", 15)
    _recorded_run(recorder, str(uuid.uuid4()), clean=True)
    now = T0 + timedelta(hours=1)

    check = fr.check_boot(node, recorder, _boot_tree(tmp_path, str(uuid.uuid4())), now)

    assert check.verdict == "host-rebooted" and check.post_mortem is None
    assert list(Event.objects.values_list("kind", "severity", "at")) == [
        (fr.HOST_REBOOTED, "info", now)]


def test_the_same_boot_after_an_unclean_end_is_sparkops_killed_not_a_reboot(node, tmp_path):
    boot = str(uuid.uuid4())
    recorder = fr.FlightRecorder(tmp_path / "rec", 15)
    last = _recorded_run(recorder, boot, clean=False)

    check = fr.check_boot(node, recorder, _boot_tree(tmp_path, boot), last + timedelta(minutes=1))

    assert check.verdict == "unclean-stop"
    event = Event.objects.get()
    assert (event.kind, event.severity, event.at) == (fr.UNCLEAN_STOP, "warning", last)
    assert "the host did not reboot (same boot id)" in event.message
    assert not Event.objects.filter(kind=fr.UNEXPECTED_REBOOT).exists()


def test_the_same_boot_after_a_clean_stop_and_a_first_start_write_no_event(node, tmp_path):
    boot = str(uuid.uuid4())
    first = fr.check_boot(node, fr.FlightRecorder(tmp_path / "a", 15), _boot_tree(tmp_path, boot),
                          T0)
    recorder = fr.FlightRecorder(tmp_path / "b", 15)
    _recorded_run(recorder, boot, clean=True)
    again = fr.check_boot(node, recorder, _boot_tree(tmp_path, boot), T0 + timedelta(hours=1))

    assert (first.verdict, again.verdict) == ("first-start", "clean")
    assert not Event.objects.exists()


def test_an_unreadable_boot_id_says_so_and_is_never_an_unexpected_reboot(node, tmp_path):
    recorder = fr.FlightRecorder(tmp_path / "rec", 15)
    last = _recorded_run(recorder, str(uuid.uuid4()), clean=False)

    check = fr.check_boot(node, recorder, _boot_tree(tmp_path, None), last + timedelta(hours=1))

    event = Event.objects.get()
    assert (check.verdict, event.kind) == ("unclean-stop", fr.UNCLEAN_STOP)
    assert "whether the host rebooted since is unknown" in event.message
    assert "boot_id does not exist" in event.message


def test_a_start_that_died_after_writing_its_event_does_not_write_it_twice(node, tmp_path):
    recorder = fr.FlightRecorder(tmp_path / "rec", 15)
    last = _recorded_run(recorder, str(uuid.uuid4()), clean=False)
    Event.objects.create(node=node, at=last, kind=fr.UNEXPECTED_REBOOT, severity="critical",
                         message="written by a start that died before its start record")

    check = fr.check_boot(node, recorder, _boot_tree(tmp_path, str(uuid.uuid4())),
                          last + timedelta(hours=1))

    assert check.event is None
    assert Event.objects.count() == 1


# --- the worker's start and stop -----------------------------------------------------------------


def _worker(queues: list[str]) -> SimpleNamespace:
    return SimpleNamespace(app=SimpleNamespace(amqp=SimpleNamespace(
        queues=SimpleNamespace(consume_from={name: None for name in queues}))))


def test_the_worker_checks_the_boot_on_start_and_marks_a_warm_stop_clean(
        node, settings, tmp_path, monkeypatch):
    settings.DATA_DIR = tmp_path / "data"
    settings.SPARKOPS_NODE_NAME = "spark-a"
    settings.SPARKOPS_PROCFS = str(_boot_tree(tmp_path, str(uuid.uuid4())).root)
    monkeypatch.setattr(collector_tasks, "_clean_stop_asked", False)
    # The receiver closes the parent process's connections before the pool forks; here that
    # connection is the test's own.
    monkeypatch.setattr(collector_tasks.connections, "close_all", lambda: None)
    worker = _worker(["node.spark-a", "sparkops", "notify"])

    collector_tasks._check_boot_when_the_worker_starts(sender=worker)
    collector_tasks._mark_a_clean_stop(sender=worker)  # no stop was asked: not clean
    assert [r["type"] for r in fr.node_recorder("spark-a").read().records] == [fr.START]

    collector_tasks._note_a_warm_stop(how="Warm")
    collector_tasks._mark_a_clean_stop(sender=worker)
    assert [r["type"] for r in fr.node_recorder("spark-a").read().records] == [
        fr.START, fr.CLEAN_END]


def test_a_worker_that_does_not_serve_the_node_leaves_its_recorder_alone(settings, tmp_path):
    settings.DATA_DIR = tmp_path / "data"
    settings.SPARKOPS_NODE_NAME = "spark-a"

    collector_tasks._check_boot_when_the_worker_starts(sender=_worker(["sparkops", "notify"]))

    assert not (tmp_path / "data" / "flight-recorder").exists()


# --- the alert rule ------------------------------------------------------------------------------


THRESHOLDS = {"recent_minutes": 60.0}


def _collection(node, at: datetime) -> None:
    Collection.objects.create(node=node, at=at, window_started_at=at - timedelta(seconds=5),
                              reads=50, ok=True)


def test_no_unexpected_reboot_no_condition(node):
    assert unexpected_reboot.evaluate(node, {}, [], THRESHOLDS, T0) == []


@pytest.mark.parametrize(("found_after", "evaluated_after", "value"), [
    (None, timedelta(hours=5), 1.0),  # not back yet: just found
    (timedelta(hours=3), timedelta(hours=3, minutes=59), 1.0),
    (timedelta(hours=3), timedelta(hours=4, minutes=1), 0.0),
])
def test_the_alert_is_open_while_the_reboot_was_found_recently(node, found_after,
                                                              evaluated_after, value):
    last = T0
    message = ("Unexpected reboot: the last record is at 2026-11-03 14:00:00 UTC, and SparkOps "
               "never stopped cleanly before the host restarted (boot id aaaa → bbbb). lowest "
               "headroom 1.20 GiB (MemAvailable). The recorded minutes (120 samples) are in "
               "/data/flight-recorder/spark-a/postmortem-x.json; found at start-up at ...")
    event = Event.objects.create(node=node, at=last, kind=fr.UNEXPECTED_REBOOT,
                                 severity="critical", message=message)
    _collection(node, last - timedelta(seconds=5))  # the run before the reboot
    if found_after is not None:
        _collection(node, last + found_after)

    [condition] = unexpected_reboot.evaluate(node, {}, [], THRESHOLDS, last + evaluated_after)

    assert condition.rule == "unexpected-reboot" and condition.engine_id is None
    assert condition.value == value and condition.crosses_threshold() is (value > 0)
    assert condition.severity == "critical"
    assert condition.summary == ("spark-a: Unexpected reboot: the last record is at 2026-11-03 "
                                 "14:00:00 UTC, and SparkOps never stopped cleanly before the "
                                 "host restarted (boot id aaaa → bbbb). lowest headroom 1.20 GiB "
                                 "(MemAvailable).")
    assert condition.details["event_id"] == event.pk
    assert condition.details["last_record_at"] == last.isoformat()


def test_an_unexpected_reboot_carries_the_previous_boots_kernel_log(node, tmp_path):
    from collectors import kernellog

    pstore = Path(__file__).parent / "fixtures" / "kernel" / "pstore" / "sys-fs-pstore"
    recorder = fr.FlightRecorder(tmp_path / "rec", 15)
    last = _recorded_run(recorder, str(uuid.uuid4()), clean=False)

    def previous_boot(since):
        return kernellog.previous_boot_report(journalctl=None, pstore_roots=[pstore],
                                              since=since)

    check = fr.check_boot(node, recorder, _boot_tree(tmp_path, str(uuid.uuid4())),
                          last + timedelta(hours=1), previous_boot=previous_boot)

    mortem = json.loads(check.post_mortem.read_text())
    raws = [item["raw"] for item in mortem["kernel_evidence"]]
    assert any("page allocation failure: order:9" in raw for raw in raws)
    assert all(item["source"].startswith(str(pstore)) or "pstore" in item["source"]
               for item in mortem["kernel_evidence"])
    event = Event.objects.get(kind=fr.UNEXPECTED_REBOOT)
    assert "the previous boot's kernel log: " in event.message


def test_a_kernel_log_that_cannot_be_read_leaves_the_post_mortem_standing(node, tmp_path):
    recorder = fr.FlightRecorder(tmp_path / "rec", 15)
    last = _recorded_run(recorder, str(uuid.uuid4()), clean=False)

    def unreadable(since):
        raise OSError("permission denied")

    check = fr.check_boot(node, recorder, _boot_tree(tmp_path, str(uuid.uuid4())),
                          last + timedelta(hours=1), previous_boot=unreadable)

    assert check.verdict == fr.UNEXPECTED_REBOOT
    mortem = json.loads(check.post_mortem.read_text())
    assert mortem["kernel_notes"] == ["the previous boot's kernel log could not be read: "
                                      "permission denied"]
