"""The host's process table read straight from /proc gives what psutil gives: the same names
(a name the kernel cut at 15 characters completed from the command line) and resident sizes."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from collectors.processes import memory_by_process_name, process_table

pytestmark = pytest.mark.slow  # starts real processes


def _psutil_table() -> dict[int, tuple[str | None, int | None]]:
    """pid -> (name, rss) as psutil reads them (what the table was read with before)."""
    table = {}
    for process in psutil.process_iter(["pid", "name", "memory_info"]):
        info = process.info
        memory = info.get("memory_info")
        table[info["pid"]] = (info["name"], None if memory is None else memory.rss)
    return table


def _without_work_queue(name: str) -> str:
    """A kernel worker's name without the work queue it happens to run ("kworker/0:2")."""
    return name.split("-", 1)[0] if name.startswith("kworker/") else name


@pytest.fixture
def long_named_sleeper(tmp_path: Path):
    """A sleeping process whose program name is longer than the kernel keeps (15 characters),
    and one that named itself (``PR_SET_NAME``) with a name its command line does not
    complete."""
    program = tmp_path / "sparkops-a-very-long-program-name"
    shutil.copy(shutil.which("sleep"), program)
    sleeper = subprocess.Popen([str(program), "300"])
    titled = subprocess.Popen(["python3", "-c", (
        "import ctypes, time\n"
        "libc = ctypes.CDLL(None)\n"
        "libc.prctl(15, b'sparkops-retitled-worker', 0, 0, 0)\n"
        "time.sleep(300)\n")])
    try:
        yield sleeper.pid, titled.pid
    finally:
        for child in (sleeper, titled):
            child.kill()
            child.wait()


def test_names_and_sizes_are_psutils(long_named_sleeper):
    sleeper, titled = long_named_sleeper
    for _ in range(50):  # the retitled child sets its name once it runs
        if psutil.Process(titled).name().startswith("sparkops-retit"):
            break
        time.sleep(0.05)
    before = _psutil_table()
    ours = {pid: (name, rss) for pid, name, rss in process_table()}
    theirs = _psutil_table()

    assert ours[sleeper][0] == "sparkops-a-very-long-program-name"
    assert ours[sleeper] == theirs[sleeper]
    assert ours[titled] == theirs[titled]
    both = ours.keys() & theirs.keys()
    assert len(both) > 10 and os.getpid() in both
    # Every process seen by both has the same name, among those whose name held still while
    # the table was read (a busy machine starts, renames and ends processes meanwhile). A
    # kernel worker's name follows the work queue it runs at that instant and may change and
    # change back between two reads ("kworker/0:2-events", "kworker/0:2-events_power_efficient"),
    # so its work queue is not compared. Sizes of running ones move.
    still = {pid for pid in both if before.get(pid, (None,))[0] == theirs[pid][0]}
    assert len(still) > len(both) // 2
    assert {pid: _without_work_queue(ours[pid][0]) for pid in still} == {
        pid: _without_work_queue(theirs[pid][0]) for pid in still}
    assert sum(1 for pid in both if ours[pid][1] == theirs[pid][1]) > len(both) // 2


def test_memory_by_name_leaves_out_the_excluded_pids(long_named_sleeper):
    sleeper, _ = long_named_sleeper
    named = {group.name: group for group in memory_by_process_name()}
    assert named["sparkops-a-very-long-program-name"].count == 1
    assert named["sparkops-a-very-long-program-name"].rss_bytes == \
        psutil.Process(sleeper).memory_info().rss
    left = {group.name for group in memory_by_process_name(exclude_pids={sleeper})}
    assert "sparkops-a-very-long-program-name" not in left


def test_kernel_threads_hold_nothing_as_psutil_says():
    """A kernel thread (PF_KTHREAD in its stat's flags) is sized 0 without its statm read."""
    ours = {pid: rss for pid, _, rss in process_table()}
    kernel = [process.pid for process in psutil.process_iter(["ppid"])
              if process.info["ppid"] == 2 or process.pid == 2]
    if not kernel:
        pytest.skip("no kernel thread is visible (a PID namespace of its own)")
    for pid in kernel:
        if pid in ours:
            assert ours[pid] == 0 == psutil.Process(pid).memory_info().rss


def test_a_kernel_threads_statm_is_not_read(tmp_path):
    root = tmp_path / "proc"
    _fake_process(root, 31, "kworker/0:1", 100, "", flags=0x00208040)
    _fake_process(root, 32, "sleeper", 100, "/bin/sleeper")
    (root / "31" / "statm").unlink()
    assert process_table(root) == [(31, "kworker/0:1", 0),
                                   (32, "sleeper", 25 * os.sysconf("SC_PAGE_SIZE"))]


def _fake_process(root: Path, pid: int, comm: str, started: int, cmdline: str,
                  flags: int = 0x00400100) -> None:
    folder = root / str(pid)
    folder.mkdir(parents=True, exist_ok=True)
    # proc(5): pid (comm) state ppid ... with the flags the 9th field and the start time the
    # 22nd.
    fields = ["S"] + ["0"] * 5 + [str(flags)] + ["0"] * 12 + [str(started)] + ["0"] * 30
    (folder / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")
    (folder / "statm").write_text("100 25 10 1 0 20 0\n")
    (folder / "cmdline").write_bytes(cmdline.encode() + b"\0--flag\0")


def test_a_completed_name_is_read_once_per_process_and_again_for_a_new_one(tmp_path):
    root = tmp_path / "proc"
    _fake_process(root, 4242, "sparkops-a-very", 1000, "/opt/bin/sparkops-a-very-long-name")
    _fake_process(root, 4243, "short", 1000, "/bin/short")

    assert {pid: name for pid, name, _ in process_table(root)} == {
        4242: "sparkops-a-very-long-name", 4243: "short"}
    # The same process again: its command line is not read again (a title it sets later does
    # not rename it, as psutil keeps a process's name).
    (root / "4242" / "cmdline").write_bytes(b"/opt/bin/sparkops-a-very-other\0")
    assert dict((pid, name) for pid, name, _ in process_table(root))[4242] == \
        "sparkops-a-very-long-name"
    # A new process with the PID (another start time) is read anew.
    _fake_process(root, 4242, "sparkops-a-very", 2000, "/opt/bin/sparkops-a-very-new-one")
    assert dict((pid, name) for pid, name, _ in process_table(root))[4242] == \
        "sparkops-a-very-new-one"


def test_completed_names_are_kept_only_for_processes_still_seen(tmp_path):
    from collectors import processes

    root = tmp_path / "proc"
    for pid in range(100, 110):
        _fake_process(root, pid, "a-long-program-n", pid, f"/usr/bin/a-long-program-name-{pid}")
    process_table(root)
    kept = [key for key in processes._completed_names._kept if key[0] == str(root)]
    assert len(kept) == 10

    for pid in range(100, 108):
        shutil.rmtree(root / str(pid))
    assert {name for _, name, _ in process_table(root)} == {
        "a-long-program-name-108", "a-long-program-name-109"}
    kept = [key for key in processes._completed_names._kept if key[0] == str(root)]
    assert sorted(key[1] for key in kept) == [108, 109]
