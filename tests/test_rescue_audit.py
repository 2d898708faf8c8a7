"""The rescue reserve audit: on this machine's real /proc and /sys it says what a direct read
says; on fixture trees of a well-prepared and a fragile GB10 it says what is fine and what to
do; with a real container it reads the engine's /dev/shm and memory lock as the container engine
and the kernel report them; and the node page shows it.

tests/fixtures/rescue/SOURCE.md says how the fixture trees are made.
"""

from __future__ import annotations

import json
import math
import os
import resource
import shutil
from datetime import timedelta
from pathlib import Path

import pytest
from django.urls import reverse
from django.utils import timezone

from collectors.models import Engine, HostReading, Metric
from collectors.procfs import Procfs
from collectors.readings import HOST, Sample
from collectors.rescue import audit_node
from tests.containers import podman, run_container, unique_name

FIXTURES = Path(__file__).parent / "fixtures" / "rescue"
GEMMA = "3f9c2b7e1d4a5c6b8e9f0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f"
CHAT = "a1d2c3b4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f67890abcdef0123456789"
GIB, MIB = 1024**3, 1024**2
OOM_DAEMONS = {"earlyoom", "systemd-oomd", "oomd"}


def _audit(node, name: str | None, root: Path | None = None):
    if name is None:
        return audit_node(node, timezone.now(), Procfs(), Path("/sys/fs/cgroup"))
    base = FIXTURES / name if root is None else root
    return audit_node(node, timezone.now(), Procfs(base / "proc"), base / "sys" / "fs" / "cgroup")


def _page_cache(node, gib: float, hours: int = 24) -> None:
    now = timezone.now()
    moments = [now - timedelta(hours=h) for h in range(hours)]
    HostReading.objects.bulk_create(
        HOST.reading(node, at, [Sample(Metric.PAGE_CACHE_RECLAIMABLE, at, gib * GIB)])
        for at in moments)


def _engine(node, name: str, container_id: str) -> Engine:
    return Engine.objects.create(node=node, name=name, container_id=container_id,
                                 container_state="running")


def _scores() -> dict[int, int]:
    scores = {}
    for entry in os.listdir("/proc"):
        try:
            scores[int(entry)] = int(Path(f"/proc/{entry}/oom_score").read_text())
        except (ValueError, OSError):
            continue
    return scores


# --- this machine ------------------------------------------------------------------------------

def test_on_this_machine_every_item_says_what_a_direct_read_says(node):
    before = _scores()
    audit = _audit(node, None)
    after = _scores()

    swaps = Path("/proc/swaps").read_text().splitlines()[1:]
    swap = audit.finding("swap")
    assert swap.figures["swap_bytes"] == sum(int(line.split()[-3]) * 1024 for line in swaps)
    zram_only = bool(swaps) and all("/zram" in line.split()[0] for line in swaps)
    assert swap.status == ("warn" if not swaps else "info" if zram_only else "ok")
    assert swap.status != "warn" or swap.found == "No swap: /proc/swaps lists no area."

    daemons = set()
    for entry in os.listdir("/proc"):
        try:
            daemons.add(Path(f"/proc/{entry}/comm").read_text().strip())
        except OSError:
            continue
    running = daemons & OOM_DAEMONS
    assert (audit.finding("oom-daemon").status == "warn") == (not running)

    victim = audit.finding("oom-victim")
    # Scores move with memory use: the one named is the highest of a direct read just before
    # or just after.
    assert min(max(before.values()), max(after.values())) <= victim.figures["oom_score"] \
        <= max(max(before.values()), max(after.values()))
    assert victim.figures["pid"] in before or victim.figures["pid"] in after

    reserve = audit.finding("reserve")
    unified = next((p for p in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
                    if (p / "cgroup.controllers").is_file()), None)
    has_memory = unified is not None and \
        "memory" in (unified / "cgroup.controllers").read_text().split()
    if not has_memory:
        assert reserve.status == "warn" and "nothing protects sshd" in reserve.found
    else:
        slice_dir = unified / "system.slice"
        protected = any(int(value) > 0 if value.isdigit() else value == "max"
                        for value in ((slice_dir / name).read_text().strip()
                                      for name in ("memory.min", "memory.low")))
        assert (reserve.status == "ok") == protected

    min_free = audit.finding("min-free")
    total_kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text()
                     .splitlines() if line.startswith("MemTotal:"))
    assert min_free.figures == {
        "min_free_kbytes": int(Path("/proc/sys/vm/min_free_kbytes").read_text()),
        "kernel_default_kbytes": min(max(math.isqrt(total_kib * 16), 128), 262144)}

    assert audit.finding("page-cache").status == "unknown"  # nothing stored for this node yet
    assert audit.read_on_node and audit.counts["unknown"] == 1


# --- fixture trees -----------------------------------------------------------------------------

def test_a_well_prepared_gb10_is_fine_everywhere(node):
    _engine(node, "gemma", GEMMA)
    _page_cache(node, 2.0)

    audit = _audit(node, "well-prepared")

    statuses = {found.key: found.status for found in audit.findings}
    assert statuses == {"swap": "ok", "oom-daemon": "ok", "oom-victim": "ok", "reserve": "ok",
                        "min-free": "ok", "engine:gemma": "info", "page-cache": "ok"}
    assert audit.finding("swap").found == \
        "16.0 GiB of swap, 256 MiB in use: file /swap.img (16.0 GiB)."
    assert audit.finding("oom-daemon").figures["earlyoom_prefer"] == \
        "(^|/)(vllm|VLLM::EngineCor)$"
    assert audit.finding("oom-victim").found == (
        "Highest oom_score: VLLM::EngineCor (pid 4301, engine gemma, oom_score 1481). "
        "An engine goes first.")
    assert audit.finding("reserve").found.startswith(
        "system.slice: memory.min 2.0 GiB, memory.low 0 KiB, holding 1.4 GiB now; "
        "ssh.service: memory.min 256 MiB")
    assert "the kernel's default for this MemTotal (about 45184 KiB)" in \
        audit.finding("min-free").found
    engine = audit.finding("engine:gemma")
    assert engine.figures == {"pid": 4242, "shm_bytes": 16 * GIB, "memlock_bytes": None,
                              "memlock_unlimited": True}
    assert "locked pages cannot be swapped or reclaimed" in engine.advice
    assert audit.finding("page-cache").found.startswith(
        "Reclaimable page cache: median 2.0 GiB (2% of MemTotal)")
    json.dumps(audit.as_dict())  # ready for an API


def test_a_fragile_gb10_says_what_to_do_for_each_item(node):
    _engine(node, "gemma", GEMMA)
    _engine(node, "whisper", "f" * 64)  # its container is not running
    _page_cache(node, 30.0)

    audit = _audit(node, "fragile")

    statuses = {found.key: found.status for found in audit.findings}
    assert statuses == {"swap": "warn", "oom-daemon": "warn", "oom-victim": "warn",
                        "reserve": "warn", "min-free": "warn", "engine:gemma": "warn",
                        "engine:whisper": "unknown", "page-cache": "warn"}
    assert "install earlyoom" in audit.finding("oom-daemon").advice.lower()
    victim = audit.finding("oom-victim")
    # the chat backend runs in a container too, but it is no engine
    assert victim.found.startswith("Highest oom_score: node (pid 1340, oom_score 684).")
    assert "highest engine process: vllm (pid 5120, engine gemma, oom_score 96)" in victim.found
    assert "--oom-score-adj" in victim.advice
    reserve = audit.finding("reserve")
    assert "system.slice has none: it gets none" in reserve.found
    assert reserve.advice.startswith(
        "systemctl set-property system.slice MemoryMin=<at least what it holds now, 3.0 GiB>")
    assert "about 45184 KiB" in audit.finding("min-free").advice
    engine = audit.finding("engine:gemma")
    assert engine.figures["shm_bytes"] == 64 * MIB and engine.figures["memlock_bytes"] == 8 * MIB
    assert "--ipc=host or --shm-size" in engine.advice
    assert audit.finding("engine:whisper").found.startswith("unknown — no process of its")
    assert "(25% of MemTotal)" in audit.finding("page-cache").found
    assert "drop_caches" in audit.finding("page-cache").advice


def test_a_child_protection_alone_is_named_and_a_slice_of_its_own_is_enough(node, tmp_path):
    root = tmp_path / "tree"
    shutil.copytree(FIXTURES / "fragile", root)
    (root / "sys/fs/cgroup/system.slice/memory.low").write_text("max\n")

    reserve = _audit(node, "fragile", root).finding("reserve")

    assert reserve.status == "ok"
    assert reserve.found.startswith("system.slice: memory.min 0 KiB, memory.low max (all of it)")


def test_zram_swap_and_an_earlyoom_without_prefer_are_notes_not_fine(node, tmp_path):
    root = tmp_path / "tree"
    shutil.copytree(FIXTURES / "well-prepared", root)
    swaps = root / "proc" / "swaps"
    swaps.write_text(swaps.read_text().splitlines()[0] + "\n"
                     + f"{'/dev/zram0':<40}partition\t8388604\t\t0\t\t100\n")
    (root / "proc" / "640" / "cmdline").write_bytes(b"/usr/bin/earlyoom\0-r\x003600\0")

    audit = _audit(node, "well-prepared", root)

    assert audit.finding("swap").status == "info"
    assert "zram, compressed in memory itself" in audit.finding("swap").advice
    daemon = audit.finding("oom-daemon")
    assert daemon.found == "Running: earlyoom (pid 640; no --prefer, no --avoid)."
    assert daemon.advice.startswith("Give earlyoom --prefer")


def test_asked_away_from_the_node_the_node_side_items_are_unknown_with_why(node, settings):
    settings.SPARKOPS_NODE_NAME = "central"
    _page_cache(node, 2.0)
    from collectors.rescue import audit_for_page

    audit = audit_for_page(node, timezone.now())

    assert not audit.read_on_node
    assert {f.key: f.status for f in audit.findings} == {
        "swap": "unknown", "oom-daemon": "unknown", "oom-victim": "unknown",
        "reserve": "unknown", "min-free": "unknown", "page-cache": "ok"}
    assert audit.finding("swap").found == ("unknown — read on the node itself, and this page "
                                           "is served by central, not spark-a")


# --- a real container --------------------------------------------------------------------------

@pytest.mark.slow
def test_a_real_engine_containers_shm_and_memlock_are_what_the_engine_and_kernel_say(
        docker_host, node):
    container_id = run_container(unique_name("rescue"), ["sleep", "300"])
    _engine(node, "sleeper", container_id)
    pid = int(podman("inspect", "--format", "{{.State.Pid}}", container_id))
    shm_size = int(podman("inspect", "--format", "{{.HostConfig.ShmSize}}", container_id))

    engine = _audit(node, None).finding("engine:sleeper")

    assert engine.figures["pid"] == pid
    assert engine.figures["shm_bytes"] == shm_size
    soft, _ = resource.prlimit(pid, resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY:
        assert engine.figures["memlock_unlimited"] is True
    else:
        assert engine.figures["memlock_bytes"] == soft
    assert engine.status == ("warn" if shm_size <= 64 * MIB else engine.status)


# --- the node page -----------------------------------------------------------------------------

def test_the_node_page_shows_the_audit_read_on_the_node(admin_client, node, settings):
    settings.SPARKOPS_NODE_NAME = node.name

    page = admin_client.get(reverse("dashboard:overview", args=[node.name])).content.decode()

    assert "Rescue reserve" in page and "Read on the node as this page was made." in page
    for key in ("swap", "oom-daemon", "oom-victim", "reserve", "min-free", "page-cache"):
        assert f'data-finding="{key}"' in page
    if not Path("/proc/swaps").read_text().splitlines()[1:]:
        assert "No swap: /proc/swaps lists no area." in page and "What to do: Add a swap" in page


def test_the_page_of_another_node_says_why_its_items_are_unknown(admin_client, node, settings):
    settings.SPARKOPS_NODE_NAME = "central"

    page = admin_client.get(reverse("dashboard:overview", args=[node.name])).content.decode()

    assert ("Node-side items are unknown: read on the node itself, and this page is served "
            "by central, not spark-a.") in page
    assert page.count('data-status="unknown"') == 6  # five node-side items, and no samples
