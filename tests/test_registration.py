"""A node's registration: its facts read from fixture /proc, /sys and /etc trees and from this
machine, the upsert of its row, the port refresh, and the heartbeat thread of its worker."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest
from django.db import DatabaseError

from collectors import heartbeat, registration, tasks
from collectors.models import Node
from collectors.procfs import Procfs
from collectors.registration import (
    FACT_KEYS,
    NodeHeartbeat,
    agent_node_names,
    fact_text,
    is_agent_backed,
    read_facts,
    refresh_interconnect,
    register,
)
from collectors.sysfs import Sysfs, interconnect
from sparkops.version import VERSION
from tests.conftest import FIXTURES
from tests.nvml.stand_in import StandInNvml

SPARK_SYSFS = FIXTURES / "sysfs" / "dgx-spark"
NVRM = ("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.95.05  Release Build  "
        "(dvs-builder@U22-I3-AF03-09-1)  Wed Sep 17 00:00:00 UTC 2025\n"
        "GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n")
GB10_MEMTOTAL_BYTES = 127600468 * 1024  # tests/fixtures/procfs/meminfo-gb10


def _files(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    return root


@pytest.fixture
def gb10_proc(tmp_path) -> Procfs:
    """A GB10's /proc: meminfo, the kernel release, host name, VM settings, NVIDIA module."""
    return Procfs(_files(tmp_path / "proc", {
        "meminfo": (FIXTURES / "procfs" / "meminfo-gb10").read_text(),
        "sys/kernel/osrelease": "6.11.0-1016-nvidia\n",
        "sys/kernel/hostname": "spark-b\n",
        "sys/vm/swappiness": "60\n",
        "sys/vm/min_free_kbytes": "67584\n",
        "sys/vm/overcommit_memory": "0\n",
        "sys/vm/watermark_scale_factor": "10\n",
        "driver/nvidia/version": NVRM,
    }))


@pytest.fixture
def dgx_etc(tmp_path) -> Path:
    """A DGX OS /etc: os-release, and dgx-release after two OTA updates (each appends)."""
    return _files(tmp_path / "etc", {
        "os-release": 'PRETTY_NAME="Ubuntu 24.04.3 LTS"\nNAME="Ubuntu"\nVERSION_ID="24.04"\n',
        "dgx-release": ('DGX_NAME="DGX Spark"\nDGX_PRETTY_NAME="NVIDIA DGX Spark"\n'
                        'DGX_SWBUILD_DATE="2025-09-10-13-50-03"\nDGX_SWBUILD_VERSION="7.2.3"\n'
                        'DGX_OTA_VERSION="7.2.3"\nDGX_OTA_DATE="Tue Oct  7 2025"\n'
                        'DGX_OTA_VERSION="7.3.1"\nDGX_OTA_DATE="Mon Nov 10 2025"\n'),
    })


def _values(facts: dict) -> dict[str, str | None]:
    return {key: item["value"] for key, item in facts["items"].items()}


# --- the facts ------------------------------------------------------------------------------


def test_facts_of_a_dgx_spark_in_the_agreed_shape(gb10_proc, dgx_etc):
    moment = datetime(2025, 11, 20, 9, 30, tzinfo=UTC)
    facts = read_facts(gb10_proc, Sysfs(SPARK_SYSFS), etc=dgx_etc, nvml=StandInNvml(),
                       now=moment)

    assert set(facts) == {"read_at", "items", "interconnect"}
    assert facts["read_at"] == "2025-11-20T09:30:00+00:00"
    assert tuple(facts["items"]) == FACT_KEYS
    assert _values(facts) == {
        "hostname": "spark-b", "kernel": "6.11.0-1016-nvidia", "os": "Ubuntu 24.04.3 LTS",
        "dgx_os": "7.3.1", "driver": "580.95.05", "cuda": "13.0", "firmware": "5.36_0ACUM018",
        "swappiness": "60", "min_free_kbytes": "67584", "overcommit_memory": "0",
        "watermark_scale_factor": "10", "transparent_hugepage": "madvise",
        "sparkops_version": VERSION,
    }
    for item in facts["items"].values():
        assert set(item) == {"value", "source"} and item["source"]
    sources = {key: item["source"] for key, item in facts["items"].items()}
    assert sources["kernel"] == str(gb10_proc.root / "sys/kernel/osrelease")
    assert sources["dgx_os"] == f"DGX_OTA_VERSION of {dgx_etc / 'dgx-release'}"
    assert "container" in sources["os"]
    assert sources["driver"].startswith("NVML")
    assert sources["firmware"] == str(SPARK_SYSFS / "class/dmi/id/bios_version")
    assert facts["interconnect"] == interconnect(Sysfs(SPARK_SYSFS))


def test_without_nvml_the_driver_comes_from_the_kernel_module_and_cuda_says_why(gb10_proc,
                                                                                 dgx_etc):
    no_library = StandInNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    items = read_facts(gb10_proc, Sysfs(SPARK_SYSFS), etc=dgx_etc, nvml=no_library)["items"]

    assert items["driver"]["value"] == "580.95.05"
    assert str(gb10_proc.root / "driver/nvidia/version") in items["driver"]["source"]
    assert items["cuda"]["value"] is None
    assert "libnvidia-ml.so.1 not found" in items["cuda"]["unknown"]


def test_a_machine_without_nvidia_dgx_os_or_firmware_tables_says_why_each_is_unknown(tmp_path):
    proc = Procfs(_files(tmp_path / "proc", {"meminfo": "MemTotal: 1024 kB\n"}))
    etc = _files(tmp_path / "etc", {"os-release": "NAME=Debian\n"})
    sysfs = Sysfs(tmp_path / "sys")
    no_driver = StandInNvml(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    items = read_facts(proc, sysfs, etc=etc, nvml=no_driver)["items"]

    unknown = {key: item["unknown"] for key, item in items.items() if item["value"] is None}
    assert set(unknown) == set(FACT_KEYS) - {"sparkops_version", "hostname"}
    assert "dgx-release does not exist" in unknown["dgx_os"]
    assert "has no PRETTY_NAME" in unknown["os"]
    assert "kernel module is not loaded" in unknown["driver"]
    assert "driver/nvidia/version does not exist" in unknown["driver"]
    assert "bios_version does not exist" in unknown["firmware"]
    assert "osrelease does not exist" in unknown["kernel"]
    assert "swappiness does not exist" in unknown["swappiness"]
    # Without the kernel's file the host name is this process's own.
    assert items["hostname"]["value"] == socket.gethostname()
    assert "gethostname()" in items["hostname"]["source"]


def test_a_dgx_release_without_ota_updates_gives_its_software_build(tmp_path):
    etc = _files(tmp_path / "etc", {"dgx-release": 'DGX_SWBUILD_VERSION="7.2.3"\n'})
    items = read_facts(Procfs(tmp_path), Sysfs(tmp_path), etc=etc, nvml=StandInNvml())["items"]

    assert items["dgx_os"]["value"] == "7.2.3"
    assert items["dgx_os"]["source"].startswith("DGX_SWBUILD_VERSION of ")


def test_this_machines_facts_are_read_without_crashing():
    facts = read_facts(Procfs(Path("/proc")), Sysfs(Path("/sys")))
    items = facts["items"]

    assert tuple(items) == FACT_KEYS
    for key, item in items.items():
        assert item["value"] is not None or item["unknown"], key
    assert items["kernel"]["value"] == os.uname().release
    assert items["hostname"]["value"] == socket.gethostname()
    assert items["swappiness"]["value"] == Path("/proc/sys/vm/swappiness").read_text().strip()
    pretty = [line for line in Path("/etc/os-release").read_text().splitlines()
              if line.startswith("PRETTY_NAME=")]
    assert items["os"]["value"] == pretty[-1].partition("=")[2].strip('"')
    assert items["transparent_hugepage"]["value"] in ("always", "madvise", "never", None)
    assert isinstance(facts["interconnect"], list)


def test_a_fact_reads_for_people_with_its_reason_when_unknown():
    facts = {"items": {"kernel": {"value": "6.11.0", "source": "x"},
                       "cuda": {"value": None, "source": "NVML", "unknown": "no NVIDIA driver"}}}

    assert fact_text(facts, "kernel") == "6.11.0"
    assert fact_text(facts, "cuda") == "unknown — no NVIDIA driver"
    assert fact_text({}, "kernel").startswith("unknown — ")


# --- the row --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_registering_upserts_the_node_row_and_marks_it_agent_backed(gb10_proc, dgx_etc,
                                                                     tmp_path):
    Node.objects.create(name="spark-b", hostname="old-name")  # as a collection creates it
    assert not is_agent_backed(Node.objects.get(name="spark-b"))

    first = register("spark-b", procfs=gb10_proc, sysfs=Sysfs(SPARK_SYSFS), etc=dgx_etc,
                     nvml=StandInNvml())

    assert Node.objects.count() == 1
    assert first.hostname == "spark-b"
    assert first.mem_total_bytes == GB10_MEMTOTAL_BYTES
    assert first.agent_started_at is not None and is_agent_backed(first)
    assert _values(first.facts)["kernel"] == "6.11.0-1016-nvidia"
    assert agent_node_names() == ["spark-b"]

    # A restart registers again; a meminfo it cannot read leaves the known MemTotal alone.
    (gb10_proc.root / "meminfo").unlink()
    again = register("spark-b", procfs=gb10_proc, sysfs=Sysfs(SPARK_SYSFS), etc=dgx_etc,
                     nvml=StandInNvml())
    assert Node.objects.count() == 1
    assert again.mem_total_bytes == GB10_MEMTOTAL_BYTES
    assert again.agent_started_at >= first.agent_started_at


@pytest.mark.django_db
def test_a_port_refresh_changes_only_the_interconnect(gb10_proc, dgx_etc, tmp_path):
    sysfs_root = tmp_path / "sys"
    shutil.copytree(SPARK_SYSFS, sysfs_root, symlinks=True)
    registered = register("spark-b", procfs=gb10_proc, sysfs=Sysfs(sysfs_root), etc=dgx_etc,
                          nvml=StandInNvml())
    assert not refresh_interconnect("spark-c", Sysfs(sysfs_root))  # never registered

    # The ConnectX link goes down: the kernel's operstate says so, and its speed goes.
    interface = sysfs_root / "class/net/enp1s0f0np0"
    (interface / "operstate").write_text("down\n")
    (interface / "speed").unlink()
    (interface / "speed").symlink_to("/sys/class/net/lo/speed")
    assert refresh_interconnect("spark-b", Sysfs(sysfs_root))

    node = Node.objects.get(name="spark-b")
    port = {p["name"]: p for p in node.facts["interconnect"]}["enp1s0f0np0"]
    assert port["state"] == "down" and port["rate_gbps"] is None
    assert node.facts["items"] == registered.facts["items"]
    assert node.facts["read_at"] == registered.facts["read_at"]


# --- the heartbeat thread -------------------------------------------------------------------


def _wait_for(condition, what: str, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {seconds} s"
        time.sleep(0.02)


@pytest.mark.django_db(transaction=True)
def test_the_heartbeat_thread_registers_then_beats_until_stopped(gb10_proc, dgx_etc):
    def register_here(name: str) -> Node:
        return register(name, procfs=gb10_proc, sysfs=Sysfs(SPARK_SYSFS), etc=dgx_etc,
                        nvml=StandInNvml())

    beating = NodeHeartbeat("hb-node", interval=0.05, register=register_here).start()
    try:
        _wait_for(lambda: beating.registered, "the registration")
        _wait_for(lambda: Node.objects.filter(name="hb-node", heartbeat_at__isnull=False)
                  .exists(), "a beat of the registered node")
    finally:
        beating.stop()

    assert not beating.is_alive()
    node = Node.objects.get(name="hb-node")
    assert node.agent_started_at is not None and node.heartbeat_at is not None
    assert node.clock_skew_seconds is not None
    assert node.facts["items"]["hostname"]["value"] == "spark-b"


@pytest.mark.django_db(transaction=True)
def test_a_failing_beat_is_logged_and_the_thread_carries_on(gb10_proc, dgx_etc, caplog):
    Node.objects.create(name="hb-flaky")
    calls: list[str] = []

    def beat_through_an_outage(name: str) -> None:
        calls.append(name)
        if len(calls) <= 2:
            raise DatabaseError("server closed the connection unexpectedly")
        heartbeat.beat(name)

    beating = NodeHeartbeat("hb-flaky", interval=0.05, register=lambda name: None,
                            beat=beat_through_an_outage)
    with caplog.at_level(logging.INFO, logger=registration.__name__):
        beating.start()
        try:
            _wait_for(lambda: beating.beats >= 1, "a beat after the outage")
        finally:
            beating.stop()

    assert Node.objects.get(name="hb-flaky").heartbeat_at is not None
    messages = [record.getMessage() for record in caplog.records]
    assert any("heartbeat of node hb-flaky failed" in m for m in messages)
    assert any("failed again (2 in a row)" in m for m in messages)
    assert any("is back after 2 failed rounds" in m for m in messages)


@pytest.mark.django_db(transaction=True)
def test_a_registration_that_hangs_does_not_hold_the_beats_up():
    """A driver that hangs NVML hangs the registration (it reads the driver's version); the
    node's existing row still gets its beats meanwhile."""
    Node.objects.create(name="hb-hung")
    released = threading.Event()

    def register_through_a_hung_driver(name: str) -> None:
        released.wait(30)

    beating = NodeHeartbeat("hb-hung", interval=0.05,
                            register=register_through_a_hung_driver).start()
    try:
        _wait_for(lambda: Node.objects.filter(name="hb-hung", heartbeat_at__isnull=False)
                  .exists(), "a beat while the registration hangs")
        assert not beating.registered
        released.set()
        _wait_for(lambda: beating.registered, "the registration once the driver answers")
    finally:
        released.set()
        beating.stop()


def test_a_worker_that_does_not_serve_this_node_starts_no_heartbeat(settings):
    settings.SPARKOPS_NODE_NAME = "spark-a"
    central_only = SimpleNamespace(app=SimpleNamespace(amqp=SimpleNamespace(
        queues=SimpleNamespace(consume_from={"sparkops": None, "notify": None}))))

    tasks._register_and_beat_once_the_worker_is_ready(sender=central_only)

    assert tasks._heartbeat is None
