"""The kernel log as evidence (``collectors.kernellog``): recognition of real kernel lines from
public reports (``tests/fixtures/kernel/lines.json``), the /dev/kmsg record reader, the journal's
JSON, pstore records, the container → engine mapping with real rows, and, live, a line written
to this machine's /dev/kmsg arriving as an event."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from collectors import kernellog
from collectors.kernellog import (
    BootClock,
    KernelRecord,
    classify,
    collect_kernel_log,
    drain_kmsg,
    parse_journal_json,
    parse_kmsg_record,
    parse_pstore_text,
    previous_boot_evidence,
    previous_boot_report,
    store_finding,
)
from collectors.models import Engine, EngineStart, Event

FIXTURES = Path(__file__).parent / "fixtures" / "kernel"
LINES = json.loads((FIXTURES / "lines.json").read_text())["lines"]
DOCKER_ID = "00748bf4e957f82c239a1db8a88579059b7d40c7b5fbd3f43617d31d3f646f12"
BOOTED = datetime(2026, 9, 1, 8, 0, tzinfo=UTC)
CLOCK = BootClock(BOOTED, "test")
READ_AT = datetime(2026, 9, 1, 12, 0, tzinfo=UTC)


def line(name: str) -> str:
    return LINES[name]["line"]


def record(name_or_text: str, usec: int = 3_600_000_000, **extra) -> KernelRecord:
    text = LINES[name_or_text]["line"] if name_or_text in LINES else name_or_text
    return KernelRecord(message=text, usec=usec, seq=extra.pop("seq", 1), **extra)


def store(node, name_or_text: str, usec: int = 3_600_000_000, proc_root: Path | None = None,
          **extra) -> str:
    rec = record(name_or_text, usec, **extra)
    finding = classify(rec.message)
    assert finding is not None, rec.message
    return store_finding(node, finding, rec, CLOCK, proc_root=proc_root or Path("/nonexistent"),
                         read_at=READ_AT)


# --- recognition of real lines --------------------------------------------------------------------

EXPECTED = {
    # name: (kind, severity, pid, process name)
    "oom_docker_scope": ("kernel-oom-kill", "critical", 7134, "java"),
    "oom_pair_summary": ("kernel-oom-kill", "critical", 7899, "python"),
    "oom_pair_killed": ("kernel-oom-kill", "critical", 7899, "python"),
    "oom_memcg_killed": ("kernel-oom-kill", "critical", 15617, "python3"),
    "oom_killed_old_kernel": ("kernel-oom-kill", "critical", 18177, "palo_be"),
    "oom_cri_containerd": ("kernel-oom-kill", "critical", 461754, "pt_main_thread"),
    "xid_with_pid": ("kernel-nvidia-xid", "warning", 1797828, "pt_main_thread"),
    "xid_unknown_pid": ("kernel-nvidia-xid", "warning", None, None),
    "xid_vllm_worker": ("kernel-nvidia-xid", "warning", 12542, "VLLM::Worker"),
    "xid_reset_required": ("kernel-nvidia-xid", "critical", None, None),
    "xid_gsp_error": ("kernel-nvidia-xid", "critical", None, None),
    "no_memory_gb10": ("kernel-no-memory", "critical", None, None),
    "no_memory_assert": ("kernel-no-memory", "critical", None, None),
    "hung_task": ("kernel-hung-task", "warning", 1607, "gschedc0"),
    "hung_task_arm64": ("kernel-hung-task", "warning", 73, "spi0"),
    "allocation_failure": ("kernel-allocation-failure", "warning", None, "kworker/u16:3"),
    "allocation_failure_old_kernel": ("kernel-allocation-failure", "warning", None,
                                      "node_exporter"),
    "vmalloc_failure": ("kernel-allocation-failure", "warning", None, "python3"),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_reported_line_is_recognised_with_its_kind_severity_and_process(name):
    finding = classify(line(name))

    assert finding is not None
    assert (finding.kind, finding.severity, finding.pid, finding.name) == EXPECTED[name]


@pytest.mark.parametrize("name", sorted(n for n in LINES if n.startswith("not_evidence")))
def test_lines_around_the_evidence_are_not_events_of_their_own(name):
    assert classify(line(name)) is None


def test_every_fixture_line_names_its_source():
    assert all(entry["source"] for entry in LINES.values())
    assert set(EXPECTED) | {n for n in LINES if n.startswith("not_evidence")} == set(LINES)


def test_the_headlines_say_what_happened_in_words():
    assert classify(line("allocation_failure")).what == (
        "Page allocation failure: kworker/u16:3 could not get 2^4 contiguous pages (order 4, "
        "GFP_KERNEL|__GFP_COMP|__GFP_ZERO)")
    assert "because memory cgroup /lxc.payload" in classify(line("oom_cri_containerd")).detail
    assert classify(line("oom_docker_scope")).detail == " because the host ran out of memory"
    assert "GPU recovery action changed" in classify(line("xid_reset_required")).what
    # A hung task named with a colon (kworker/u16:3) keeps its name; the pid is the last field.
    hung = classify("INFO: task kworker/u16:3:4711 blocked for more than 241 seconds.")
    assert (hung.name, hung.pid) == ("kworker/u16:3", 4711)


# --- whose: the container and the engine, with real rows ------------------------------------------


@pytest.mark.django_db
def test_an_oom_kill_in_a_docker_scope_is_the_engine_of_that_container(node):
    engine = Engine.objects.create(node=node, name="vllm-a", container_id=DOCKER_ID,
                                   container_state="running")
    Engine.objects.create(node=node, name="other", container_id="f" * 64,
                          container_state="running")

    assert store(node, "oom_docker_scope", usec=LINES["oom_docker_scope"]["usec"]) == "created"

    event = Event.objects.get(kind="kernel-oom-kill")
    assert event.engine == engine
    assert event.severity == "critical"
    assert event.at == BOOTED + timedelta(microseconds=4650180470877)
    assert event.message.splitlines()[0] == (
        "OOM kill: the kernel killed java (pid 7134) in engine vllm-a (container 00748bf4e957, "
        "from its task_memcg) because the host ran out of memory.")
    assert line("oom_docker_scope") in event.message
    assert "2026-10-25 03:43:00 UTC (4650180.470877 s after boot)" in event.message


@pytest.mark.django_db
def test_a_podman_scope_maps_like_a_docker_one_and_a_recreated_container_still_finds_its_engine(
        node):
    old_id, new_id = "ab" * 32, "cd" * 32
    engine = Engine.objects.create(node=node, name="llama", container_id=new_id,
                                   container_state="running")
    EngineStart.objects.create(engine=engine, node=node, identity=f"{old_id}@2026-09-01T07:00",
                               seen_at=BOOTED)
    # The kernel's format (mem_cgroup_print_oom_context) with Podman's systemd scope name.
    summary = ("oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
               f"oom_memcg=/machine.slice/libpod-{old_id}.scope,"
               f"task_memcg=/machine.slice/libpod-{old_id}.scope/container,"
               "task=llama-server,pid=4242,uid=0")

    store(node, summary)

    event = Event.objects.get(kind="kernel-oom-kill")
    assert event.engine == engine
    assert f"because memory cgroup /machine.slice/libpod-{old_id}.scope reached its limit" in (
        event.message)


@pytest.mark.django_db
def test_a_container_no_engine_ran_in_and_a_host_process_are_said_so(node):
    store(node, "oom_pair_summary")
    store(node, "oom_cri_containerd", usec=7_200_000_000)

    host, k8s = Event.objects.order_by("at")
    assert host.engine is None
    assert "(not in a Docker or Podman container (task_memcg /init.scope))" in host.message
    assert k8s.engine is None and "not in a Docker or Podman container" in k8s.message


def _proc_process(root: Path, pid: int, comm: str, started_ticks: int, cgroup: str) -> None:
    directory = root / str(pid)
    directory.mkdir(parents=True)
    fields = ["S"] + ["0"] * 18 + [str(started_ticks)] + ["0"] * 30
    (directory / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")
    (directory / "cgroup").write_text(cgroup)


@pytest.mark.django_db
def test_an_xid_is_the_engine_of_its_process_while_that_process_still_runs(node, tmp_path):
    engine = Engine.objects.create(node=node, name="vllm-b", container_id=DOCKER_ID,
                                   container_state="running")
    hz = os.sysconf("SC_CLK_TCK")
    cgroup = f"0::/system.slice/docker-{DOCKER_ID}.scope\n"
    _proc_process(tmp_path, 12542, "VLLM::Worker", 100 * hz, cgroup)

    store(node, "xid_vllm_worker", usec=3_600_000_000, proc_root=tmp_path)

    event = Event.objects.get(kind="kernel-nvidia-xid")
    assert event.engine == engine
    assert "in engine vllm-b (container 00748bf4e957, from /proc/12542/cgroup)" in event.message


@pytest.mark.django_db
@pytest.mark.parametrize(("comm", "started_seconds"), [
    ("python3", 100),  # the PID now names another program
    ("VLLM::Worker", 7200),  # a process of that name started after the line was written
])
def test_a_reused_pid_is_never_taken_for_the_process_the_line_named(node, tmp_path, comm,
                                                                    started_seconds):
    Engine.objects.create(node=node, name="vllm-b", container_id=DOCKER_ID,
                          container_state="running")
    _proc_process(tmp_path, 12542, comm, started_seconds * os.sysconf("SC_CLK_TCK"),
                  f"0::/system.slice/docker-{DOCKER_ID}.scope\n")

    store(node, "xid_vllm_worker", usec=3_600_000_000, proc_root=tmp_path)

    event = Event.objects.get(kind="kernel-nvidia-xid")
    assert event.engine is None
    assert "its container is unknown: process 12542 is no longer running" in event.message


# --- folding: one OOM kill is one event, a burst is one event -------------------------------------


@pytest.mark.django_db
def test_the_two_lines_of_one_oom_kill_are_one_event_with_both_lines(node):
    assert store(node, "oom_pair_summary", usec=3_600_000_000) == "created"
    assert store(node, "oom_pair_killed", usec=3_600_000_150) == "folded"
    assert store(node, "oom_memcg_killed", usec=3_600_500_000) == "created"

    pair, other = Event.objects.filter(kind="kernel-oom-kill").order_by("at")
    assert line("oom_pair_summary") in pair.message and line("oom_pair_killed") in pair.message
    assert "pid 15617" in other.message


@pytest.mark.django_db
def test_a_burst_of_the_same_driver_error_is_one_event_that_counts_its_repeats(node):
    for offset in (0, 812, 20_000_000):
        store(node, "no_memory_gb10", usec=3_600_000_000 + offset)
    store(node, "no_memory_gb10", usec=3_600_000_000 + 120_000_000)  # past the window

    first, later = Event.objects.filter(kind="kernel-no-memory").order_by("at")
    assert first.message.splitlines()[-1].startswith(
        "Repeated 2 more times, last at 2026-09-01 09:00:20 UTC (3620.000000 s after boot): "
        "NVRM: nvCheckOkFailedNoLog")
    assert "Repeated" not in later.message


# --- /dev/kmsg records ----------------------------------------------------------------------------


def kmsg_fixture_records() -> list[bytes]:
    text = "\n".join(row for row in (FIXTURES / "kmsg.txt").read_text().splitlines()
                     if not row.startswith("#"))
    return [chunk.strip("\n").encode() + b"\n" for chunk in text.split("\n%%\n")]


def test_kmsg_records_with_dictionaries_escapes_and_extra_header_fields():
    first, second, udev, escaped, caller = [parse_kmsg_record(raw)
                                            for raw in kmsg_fixture_records()]

    assert (first.seq, first.usec, first.level, first.facility) == (160, 424069, 7, 0)
    assert first.message == ("pci_root PNP0A03:00: host bridge window [io  0x0000-0x0cf7] "
                             "(ignored)")
    assert first.fields == {"SUBSYSTEM": "acpi", "DEVICE": "+acpi:PNP0A03:00"}
    assert second.fields == {}
    assert (udev.facility, udev.level) == (3, 6)  # 30: daemon.info
    assert escaped.message == "tab\tcafé back\\slash"
    assert escaped.fields == {"DEVICE": "+pci:0000:01:00.0"}
    assert (caller.seq, caller.message) == (342, "systemd[1]: started")


def test_a_record_that_is_no_kmsg_record_is_refused():
    with pytest.raises(kernellog.KernelLogError):
        parse_kmsg_record(b"no header here\n")
    with pytest.raises(kernellog.KernelLogError):
        parse_kmsg_record(b"6,x,1,-;text\n")


def scripted(*reads):
    """``read(2)`` of /dev/kmsg as a script: bytes, or the OSError that read raises."""
    queue = list(reads)

    def read_one() -> bytes:
        if not queue:
            raise BlockingIOError(errno.EAGAIN, "no more")
        item = queue.pop(0)
        if isinstance(item, OSError):
            raise item
        return item

    return read_one


def kmsg(seq: int, text: str = "x") -> bytes:
    return f"6,{seq},{seq * 1000},-;{text}\n".encode()


def test_a_drain_skips_what_was_read_and_names_what_was_overwritten():
    batch = drain_kmsg(scripted(kmsg(4), kmsg(5), kmsg(6), kmsg(9),
                                OSError(errno.EPIPE, "Broken pipe"), kmsg(12), b"garbage",
                                kmsg(13)),
                       after_seq=5, limit=100)

    assert [r.seq for r in batch.records] == [6, 9, 12, 13]
    assert batch.last_seq == 13
    assert batch.lost == [(7, 8), (10, 11)] and batch.lost_count == 4
    assert (batch.overwritten_reads, batch.malformed, batch.more) == (1, 1, False)


def test_a_drain_stops_at_its_limit_and_the_next_one_goes_on_from_there():
    reads = [kmsg(seq) for seq in range(1, 8)]
    first = drain_kmsg(scripted(*reads), after_seq=None, limit=3)
    second = drain_kmsg(scripted(*reads), after_seq=first.last_seq, limit=3)

    assert ([r.seq for r in first.records], first.more) == ([1, 2, 3], True)
    assert [r.seq for r in second.records] == [4, 5, 6]
    assert first.lost == [] and second.lost == []


def test_a_read_error_other_than_overwritten_records_is_raised():
    with pytest.raises(OSError):
        drain_kmsg(scripted(OSError(errno.EIO, "I/O error")), after_seq=None, limit=10)


# --- the journal ----------------------------------------------------------------------------------


def test_the_journal_json_with_byte_array_and_null_messages_and_a_cut_off_line():
    records = parse_journal_json((FIXTURES / "journal-previous-boot.jsonl").read_text())

    assert len(records) == 7  # the null MESSAGE and the cut-off last line are not records
    hung = records[6]
    assert hung.message.startswith("INFO: task nvidia-smi:50112 blocked for more than 122")
    assert hung.message.endswith("\ufffd")  # the byte that is not UTF-8
    oom = records[3]
    assert oom.usec == 9120114372 + 2104331 - 5
    assert oom.realtime == datetime.fromtimestamp((1788650000000000 + 2104331) / 1e6, tz=UTC)
    assert (oom.level, oom.facility) == (6, 0)
    assert oom.cursor.startswith("s=7d1c0f3a") and oom.fields["_BOOT_ID"]


def fake_journalctl(tmp_path: Path, lines: list[str], *, fail: str = "") -> tuple[str, Path]:
    """A stand-in for journalctl (this machine keeps no journal): prints ``lines`` after the
    entry named by --after-cursor, logs its arguments, or fails with ``fail`` on stderr."""
    script = tmp_path / "journalctl"
    data = tmp_path / "journal.jsonl"
    calls = tmp_path / "calls.jsonl"
    data.write_text("\n".join(lines) + "\n")
    script.write_text(f"""#!{sys.executable}
import json, sys
with open({str(calls)!r}, "a") as out:
    out.write(json.dumps(sys.argv[1:]) + "\\n")
if {fail!r}:
    sys.stderr.write({fail!r} + "\\n")
    sys.exit(1)
args = sys.argv[1:]
after = args[args.index("--after-cursor") + 1] if "--after-cursor" in args else None
printing = after is None
for row in open({str(data)!r}):
    if printing:
        sys.stdout.write(row)
    elif json.loads(row).get("__CURSOR") == after:
        printing = True
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script), calls


def journal_rows() -> list[str]:
    return (FIXTURES / "journal-previous-boot.jsonl").read_text().splitlines()[:-1]


def test_previous_boot_evidence_from_the_journal_and_pstore(tmp_path):
    journalctl, calls = fake_journalctl(tmp_path, journal_rows())
    roots = copy_pstore(tmp_path)

    report = previous_boot_report(journalctl=journalctl, pstore_roots=roots)

    assert json.loads(calls.read_text().splitlines()[0])[:4] == ["-k", "-b", "-1", "-o"]
    kinds = [(item.kind, item.source.split(" ")[0]) for item in report.evidence]
    assert kinds == [
        ("kernel-no-memory", "journal"), ("kernel-no-memory", "journal"),
        ("kernel-oom-kill", "journal"), ("kernel-oom-kill", "journal"),
        ("kernel-hung-task", "journal"),
        # pstore: no wall-clock time, so after the journal's, in kernel time order; the dump's
        # NV_ERR line is the journal's own (same kernel time) and dmesg.txt repeats its part:
        # each is kept once.
        ("kernel-allocation-failure", "pstore"),
        ("kernel-hung-task", "pstore"),
    ]
    oom = report.evidence[2]
    assert oom.container_id == "3f9a1c0e5b7d2a4f6e8c0b1d3f5a7c9e2b4d6f8a0c2e4b6d8f0a2c4e6b8d0f2a"
    assert (oom.pid, oom.process, oom.severity) == (48211, "VLLM::Worker_TP", "critical")
    assert oom.at == datetime.fromtimestamp((1788650000000000 + 2104331) / 1e6, tz=UTC)
    assert oom.at_basis == "when the journal received it"
    dumped = report.evidence[-1]
    assert dumped.at is None and dumped.usec_since_boot == 9241308114
    assert dumped.at_basis == ("unknown: pstore keeps 9241.308114 s after that boot's start; "
                               "the record was written 2026-09-06 10:00:00 UTC")
    assert any(".enc.z: compressed" in note for note in report.notes)


def copy_pstore(tmp_path: Path) -> list[Path]:
    target = tmp_path / "pstore"
    shutil.copytree(FIXTURES / "pstore", target)
    written = datetime(2026, 9, 6, 10, 0, tzinfo=UTC).timestamp()
    for path in target.rglob("dmesg*"):
        os.utime(path, (written, written))
    return [target / "sys-fs-pstore", target / "systemd"]


def test_pstore_records_parse_with_prefix_time_and_caller(tmp_path):
    text = (FIXTURES / "pstore" / "sys-fs-pstore" / "dmesg-ramoops-0").read_text()

    started, failure = parse_pstore_text(text, "pstore test")

    assert (started.usec, started.level, started.message) == (12000100, 6, "systemd[1]: started")
    assert failure.message.startswith("python3: page allocation failure: order:9")
    assert classify(failure.message).what.startswith(
        "Page allocation failure: python3 could not get 2^9 contiguous pages")


def test_pstore_records_older_than_asked_are_left_out_and_a_missing_journal_is_a_note(tmp_path):
    roots = copy_pstore(tmp_path)
    journalctl, _ = fake_journalctl(tmp_path, [], fail="No journal boot entry found from the "
                                                       "specified boot offset (-1).")

    report = previous_boot_report(journalctl=journalctl, pstore_roots=roots,
                                  since=datetime(2026, 9, 7, tzinfo=UTC))

    assert report.evidence == []
    assert report.notes[0].startswith("journal: journalctl -k -b -1 failed: No journal boot")
    assert previous_boot_evidence(journalctl=None, pstore_roots=roots) == previous_boot_report(
        journalctl=None, pstore_roots=roots).evidence


# --- the run: source, position, the journal where /dev/kmsg cannot be opened ----------------------


@pytest.mark.django_db
def test_without_kmsg_the_journal_is_read_after_its_cursor_and_the_source_is_said(node, tmp_path):
    engine = Engine.objects.create(
        node=node, name="vllm-c", container_state="running",
        container_id="3f9a1c0e5b7d2a4f6e8c0b1d3f5a7c9e2b4d6f8a0c2e4b6d8f0a2c4e6b8d0f2a")
    journalctl, calls = fake_journalctl(tmp_path, journal_rows())
    proc = tmp_path / "proc"
    (proc / "sys/kernel/random").mkdir(parents=True)
    (proc / "sys/kernel/random/boot_id").write_text("5f0b2c6e-8d4a-4b1f-9e3c-7a2d1b0e9f88\n")
    (proc / "uptime").write_text("10000.00 20000.00\n")
    state = tmp_path / "data" / "kernel-log-spark-a.json"
    now = datetime(2026, 9, 1, 12, 0, tzinfo=UTC).timestamp()

    first = collect_kernel_log(node, state, proc_root=proc, kmsg=tmp_path / "no-kmsg",
                               journalctl=journalctl, limit=4, now=lambda: now)
    second = collect_kernel_log(node, state, proc_root=proc, kmsg=tmp_path / "no-kmsg",
                                journalctl=journalctl, limit=4, now=lambda: now)

    assert (first.source, first.records, first.more) == ("journal", 4, True)
    assert (second.source, second.records) == ("journal", 3)
    assert "--after-cursor" not in json.loads(calls.read_text().splitlines()[0])
    assert "--after-cursor" in json.loads(calls.read_text().splitlines()[1])
    source = Event.objects.get(kind="kernel-log-source")  # told once: the second run is the same
    assert source.severity == "info"
    assert source.message.startswith("Kernel log read from the journal (journalctl -k), because ")
    assert "no-kmsg could not be opened: No such file or directory" in source.message
    oom = Event.objects.get(kind="kernel-oom-kill")
    assert oom.engine == engine and "Killed process 48211" in oom.message  # both lines, one event
    booted = datetime.fromtimestamp(now - 10000, tz=UTC)
    assert oom.at == booted + timedelta(microseconds=9120114372 + 2104331 - 5)
    assert Event.objects.filter(kind="kernel-no-memory").count() == 1
    assert Event.objects.filter(kind="kernel-hung-task").count() == 1
    assert json.loads(state.read_text())["journal_cursor"].startswith("s=7d1c0f3a")


@pytest.mark.django_db
def test_a_run_that_finds_nothing_new_touches_neither_the_database_nor_its_state(
        node, tmp_path, django_assert_num_queries):
    journalctl, _ = fake_journalctl(tmp_path, journal_rows()[:2])
    state = tmp_path / "kernel-log-spark-a.json"
    collect_kernel_log(node, state, proc_root=tmp_path, kmsg=tmp_path / "no-kmsg",
                       journalctl=journalctl)
    written = state.stat()
    state.touch()  # a write since would be seen as a change of the file's times
    before = state.stat()
    assert json.loads(state.read_text())["journal_cursor"]

    with django_assert_num_queries(0):
        run = collect_kernel_log(node, state, proc_root=tmp_path, kmsg=tmp_path / "no-kmsg",
                                 journalctl=journalctl)

    assert (run.source, run.records) == ("journal", 0)
    after = state.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert written.st_size == after.st_size


@pytest.mark.django_db
def test_when_neither_source_can_be_read_the_node_says_so_once(node, tmp_path):
    journalctl, _ = fake_journalctl(tmp_path, [], fail="Failed to open journal: Permission denied")
    state = tmp_path / "kernel-log-spark-a.json"

    for _ in range(2):
        run = collect_kernel_log(node, state, proc_root=tmp_path, kmsg=tmp_path / "no-kmsg",
                                 journalctl=journalctl)

    assert run.source == "none"
    told = Event.objects.get(kind="kernel-log-source")
    assert told.severity == "warning"
    assert "the journal cannot be read either" in told.message
    assert "Failed to open journal: Permission denied" in told.message


# --- live: this machine's /dev/kmsg ---------------------------------------------------------------


def _writable_kmsg() -> None:
    try:
        with open(kernellog.KMSG_PATH, "w"):
            pass
    except OSError as error:
        pytest.skip(f"{kernellog.KMSG_PATH} cannot be written here ({error.strerror}): the "
                    "live test needs root")


def _drain_to_the_end(node, state: Path) -> None:
    """Read the machine's kernel log to its end, so that the next run reads only what follows."""
    while collect_kernel_log(node, state, limit=5000).more:
        pass


@pytest.mark.django_db
def test_a_line_written_to_the_real_kmsg_arrives_as_an_event_once(node, tmp_path):
    _writable_kmsg()
    state = tmp_path / "kernel-log-spark-a.json"
    _drain_to_the_end(node, state)
    tag = f"sparkops-test-{uuid.uuid4().hex[:12]}"
    # A PID above the kernel's largest (pid_max is at most 4194304), so no process has it.
    pid = 5_000_000 + uuid.uuid4().int % 1_000_000
    text = (f"{tag}: NVRM: Xid (PCI:0000:01:00): 79, pid={pid}, name={tag[:15]}, "
            "GPU has fallen off the bus.")
    with open(kernellog.KMSG_PATH, "w") as kmsg_file:
        kmsg_file.write(f"<3>{text}\n")

    run = collect_kernel_log(node, state)
    again = collect_kernel_log(node, state)

    assert run.source == "kmsg" and run.created >= 1
    event = Event.objects.get(kind="kernel-nvidia-xid", message__contains=tag)
    assert event.severity == "critical"
    assert event.message.startswith(
        f"NVIDIA Xid 79 (GPU has fallen off the bus) on GPU 0000:01:00, process {tag[:15]} "
        f"(pid {pid}) (its container is unknown: process {pid} is no longer running).\n")
    assert f"{text} [written to the kernel log by user space (syslog facility 1)" in event.message
    assert abs(event.at - datetime.now(UTC)) < timedelta(minutes=5)
    assert again.created == 0
    assert Event.objects.filter(message__contains=tag).count() == 1
    assert json.loads(state.read_text())["source"] == "kmsg"


@pytest.mark.slow
@pytest.mark.django_db
def test_a_real_containers_process_named_in_kmsg_is_its_engine(node, tmp_path, docker_host):
    from tests.containers import podman, run_container, unique_name

    _writable_kmsg()
    container_id = run_container(unique_name("kmsg"), ["sleep", "300"])
    pid = int(podman("inspect", "--format", "{{.State.Pid}}", container_id))
    engine = Engine.objects.create(node=node, name="sleeper", container_id=container_id,
                                   container_state="running")
    state = tmp_path / "kernel-log-spark-a.json"
    _drain_to_the_end(node, state)
    tag = uuid.uuid4().hex[:12]
    with open(kernellog.KMSG_PATH, "w") as kmsg_file:
        kmsg_file.write(f"<4>NVRM: Xid (PCI:0000:01:00): 31, pid={pid}, name=sleep, "
                        f"sparkops test {tag}\n")

    collect_kernel_log(node, state)

    event = Event.objects.get(kind="kernel-nvidia-xid", message__contains=tag)
    assert event.engine == engine
    assert f"in engine sleeper (container {container_id[:12]}, from /proc/{pid}/cgroup)" in (
        event.message)


@pytest.mark.django_db
def test_the_node_task_reads_into_the_data_directory_and_refuses_another_nodes_work(
        node, tmp_path, settings):
    from collectors import tasks

    settings.SPARKOPS_NODE_NAME = "spark-a"
    settings.DATA_DIR = tmp_path

    written = tasks.collect_kernel_log("spark-a")

    assert isinstance(written, int)
    assert json.loads((tmp_path / "kernel-log-spark-a.json").read_text())["source"] in (
        "kmsg", "journal", "none")
    assert Event.objects.filter(node=node, kind="kernel-log-source").count() == 1
    with pytest.raises(tasks.WrongNodeError):
        tasks.collect_kernel_log("spark-b")


@pytest.mark.django_db
def test_a_lost_position_reads_the_boot_again_without_storing_or_counting_a_line_twice(
        node, tmp_path):
    journalctl, _ = fake_journalctl(tmp_path, journal_rows())
    state = tmp_path / "kernel-log-spark-a.json"

    def read_all() -> None:
        while collect_kernel_log(node, state, proc_root=tmp_path, kmsg=tmp_path / "no-kmsg",
                                 journalctl=journalctl, limit=3).more:
            pass

    read_all()
    before = sorted(Event.objects.values_list("kind", "message"))
    state.unlink()
    read_all()

    assert sorted(Event.objects.values_list("kind", "message")) == before
    assert "Repeated 1 more time, last at" in Event.objects.get(kind="kernel-no-memory").message
