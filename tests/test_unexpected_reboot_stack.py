"""The flight recorder across a real crash: ``bin/sparkops start``, a few seconds of recording,
then the whole process group killed with SIGKILL (no shutdown code runs), a torn record appended
(power lost mid-write) and a new boot id in the fixture procfs root; the next start must find
one ``unexpected-reboot`` at the last recorded moment, carrying the recorded minutes. A clean
stop (SIGTERM, the normal path) followed by a new boot is only "host rebooted".

The fixture procfs root links ``meminfo`` and ``pressure`` to this machine's own, so the samples
are real; only ``sys/kernel/random/boot_id`` is the test's (a UUID and a newline, the form of
Linux's ``proc_do_uuid`` in ``drivers/char/random.c``).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from collectors import flightrecorder as fr
from sparkops.testing.ports import free_port
from sparkops.timetext import moment_text
from tests.conftest import PROJECT, subprocess_env
from tests.processes import stop_group

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
NODE = "reboot-test"
STARTUP_SECONDS = 240


class Stack:
    """One data directory and fixture procfs root, and the stack started on them."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.data = tmp_path / "data"
        self.procfs = tmp_path / "proc"
        (self.procfs / "sys" / "kernel" / "random").mkdir(parents=True)
        (self.procfs / "meminfo").symlink_to("/proc/meminfo")
        if Path("/proc/pressure").is_dir():
            (self.procfs / "pressure").symlink_to("/proc/pressure")
        self.new_boot()
        self.process: subprocess.Popen | None = None
        self.starts = 0

    def new_boot(self) -> str:
        self.boot = str(uuid.uuid4())
        (self.procfs / fr.BOOT_ID).write_text(self.boot + "\n")
        return self.boot

    @property
    def recorder(self) -> fr.FlightRecorder:
        return fr.FlightRecorder(self.data / "flight-recorder" / NODE, 15)

    def start(self) -> None:
        self.starts += 1
        env = subprocess_env(
            SPARKOPS_DATA_DIR=str(self.data), SPARKOPS_BIND=f"127.0.0.1:{free_port()}",
            SPARKOPS_ADMIN_PASSWORD="reboot-test-password-1", SPARKOPS_NODE_NAME=NODE,
            SPARKOPS_BEAT_NODES=NODE, SPARKOPS_PROCFS=str(self.procfs),
            SPARKOPS_COLLECT_INTERVAL="2",
        )
        with (self.tmp_path / f"stack-{self.starts}.log").open("w") as log:
            self.process = subprocess.Popen(
                [str(PROJECT / "bin" / "sparkops"), "start"], env=env, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)

    def log_tail(self) -> str:
        return (self.tmp_path / f"stack-{self.starts}.log").read_text()[-3000:]

    def wait_for_intervals(self, count: int) -> fr.Recording:
        """Until the recorder holds ``count`` intervals of this boot."""
        deadline = time.monotonic() + STARTUP_SECONDS
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"the stack exited:\n{self.log_tail()}"
            recording = self.recorder.read() if self.recorder.directory.is_dir() else None
            if recording and sum(r["type"] == fr.INTERVAL and r["boot"] == self.boot
                                 for r in recording.records) >= count:
                return recording
            time.sleep(0.5)
        raise AssertionError(f"no {count} recorded intervals:\n{self.log_tail()}")

    def events(self, kind: str) -> list[tuple[datetime, str, str]]:
        """The node's events of ``kind``: (at, severity, message)."""
        database = self.data / "sparkops.sqlite3"
        with sqlite3.connect(database, timeout=30) as connection:
            rows = connection.execute(
                "select e.at, e.severity, e.message from collectors_event e join collectors_node"
                " n on n.id = e.node_id where n.name = ? and e.kind = ?", (NODE, kind)).fetchall()
        return [(datetime.fromisoformat(at).replace(tzinfo=UTC), severity, message)
                for at, severity, message in rows]

    def wait_for_event(self, kind: str) -> list[tuple[datetime, str, str]]:
        deadline = time.monotonic() + STARTUP_SECONDS
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"the stack exited:\n{self.log_tail()}"
            with_db = (self.data / "sparkops.sqlite3").exists()
            found = self.events(kind) if with_db else []
            if found:
                return found
            time.sleep(0.5)
        raise AssertionError(f"no {kind} event:\n{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL to the whole group: no shutdown code of any process runs."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None:
            stop_group(self.process)


def test_a_power_loss_mid_write_and_a_new_boot_is_one_unexpected_reboot(tmp_path):
    stack = Stack(tmp_path)
    try:
        stack.start()
        stack.wait_for_intervals(3)
        stack.kill()
        recorded = stack.recorder.read()
        last = max(fr.record_time(r) for r in recorded.records)
        samples = [r for r in recorded.records if r["type"] == fr.SAMPLE]
        assert recorded.records[-1]["type"] != fr.CLEAN_END
        torn = fr.encode({"type": fr.SAMPLE, "at": datetime.now(UTC).isoformat(),
                          "boot": stack.boot, "mem_available": 1})
        with stack.recorder.segments()[-1].open("ab") as segment:
            segment.write(torn[:len(torn) // 2])
        before = stack.boot
        after = stack.new_boot()

        stack.start()
        [(at, severity, message)] = stack.wait_for_event(fr.UNEXPECTED_REBOOT)
        stack.wait_for_intervals(1)  # and it records this boot
    finally:
        stack.stop()

    assert (at, severity) == (last, "critical")
    assert moment_text(last, UTC) in message and "lowest headroom" in message
    assert f"a torn record ({len(torn) // 2} bytes" in message
    [path] = (stack.data / "flight-recorder" / NODE).glob("postmortem-*.json")
    assert str(path) in message
    mortem = json.loads(path.read_text())
    assert (mortem["boot_before"], mortem["boot_after"]) == (before, after)
    assert mortem["last_at"] == last.isoformat()
    assert mortem["samples"] == samples
    assert len(mortem["intervals"]) >= 3
    assert all(interval["ledger"]["mem_total"] for interval in mortem["intervals"]
               if interval["ok"])
    assert stack.events(fr.HOST_REBOOTED) == []


def test_a_clean_stop_then_a_new_boot_is_only_host_rebooted(tmp_path):
    stack = Stack(tmp_path)
    try:
        stack.start()
        stack.wait_for_intervals(2)
        stack.stop()  # SIGTERM to the group: the normal stop
        assert stack.recorder.read().records[-1]["type"] == fr.CLEAN_END
        stack.new_boot()

        stack.start()
        [(_, severity, message)] = stack.wait_for_event(fr.HOST_REBOOTED)
        stack.wait_for_intervals(1)
    finally:
        stack.stop()

    assert severity == "info" and "stopped cleanly" in message
    assert stack.events(fr.UNEXPECTED_REBOOT) == []
    assert stack.events(fr.UNCLEAN_STOP) == []
