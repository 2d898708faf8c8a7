"""Real containers for tests: Podman's Docker-compatible API service on a private socket.

Containers run a program from this machine's own file system (``--rootfs /:O``, an overlay, so
nothing is written back) with host networking, since no image registry is reachable.
``--runtime runc --cgroup-manager cgroupfs`` and the low ulimits are what this kind of machine
accepts (the default crun runtime fails with "cgroups in hybrid mode not supported"). The
Podman is a :class:`collectors.podman.PrivatePodman`: all of its state lives in one folder of
this run, removed by path at the end, after killing anything its containers left running.

A test whose verdict hangs on free memory runs its engines in a memory budget of its own
(:func:`memory_budget`): a memory cgroup that its containers get as their cgroup parent, and
that its collection cycles read (``SPARKOPS_MEMORY_BUDGET_CGROUP``), as an admin confines the
engines of a GB10. The headroom SparkOps judges is then the budget's room, which only the
test's engines move: other programs allocating and freeing memory on the machine meanwhile
(other tests, other jobs) neither move the verdict nor can be named as its cause.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from collectors.podman import LeftoverError, PodmanError, PrivatePodman
from sparkops.demo.budget import (
    CGROUP_ROOT,
    PROGRAM_BYTES_PER_ENGINE,
    BudgetUnavailable,
    DemoBudget,
    create_budget,
    remove_budget,
)
from sparkops.units import GIB

PROJECT = Path(__file__).resolve().parent.parent
# Podman state of this test run's own (storage, temp directory, volumes, networks): containers of
# another run on the same machine (or of the admin) are neither seen nor touched.
SESSION_PODMAN = PrivatePodman(Path(tempfile.gettempdir()) / f"sparkops-podman-{os.getpid()}")
STORAGE = SESSION_PODMAN.base
PODMAN = SESSION_PODMAN.argv
TEST_LABEL = "sparkops.test=1"
# Containers started by the test that is running (with the Podman that runs each): removed when
# it ends, so a test's engines are never the next test's neighbours (see ``conftest``).
_STARTED: list[tuple[PrivatePodman, str]] = []


def start_podman(private: PrivatePodman) -> str:
    """Start ``private``'s Docker-API service; its ``unix://`` URL (pytest failure if not)."""
    if not shutil.which("podman"):
        pytest.fail("podman is not installed (Debian packages podman and runc)")
    try:
        return private.start_service(timeout=20)
    except PodmanError as error:
        pytest.fail(str(error))


def stop_podman(private: PrivatePodman) -> None:
    """Remove everything ``private`` created: its containers and whatever they left running
    (found by cgroup and command line, then killed), its service, mounts and folders. Fails
    the test run, naming the processes, if any of them survives."""
    try:
        private.destroy()
    except LeftoverError as error:
        pytest.fail(f"test containers left processes behind: {error}")


@pytest.fixture(scope="session")
def docker_host() -> Iterator[str]:
    """Start ``podman system service`` on a private socket; yield its ``unix://`` URL."""
    url = start_podman(SESSION_PODMAN)
    try:
        yield url
    finally:
        stop_podman(SESSION_PODMAN)


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def run_container(name: str, command: list[str], *, labels: dict[str, str] | None = None,
                  volumes: list[str] | None = None, env: dict[str, str] | None = None,
                  private: PrivatePodman = SESSION_PODMAN, cgroup_parent: str | None = None
                  ) -> str:
    """Create and start a container running ``command`` from the host file system; its id.
    With ``cgroup_parent`` (a :func:`memory_budget`'s ``parent``) its cgroups are made below
    that one, so that the budget's limit covers its memory."""
    argv = [*private.argv, "run", "--detach", "--name", name, "--label", TEST_LABEL,
            "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
            "--network", "host", "--workdir", str(PROJECT)]
    if cgroup_parent:
        argv += ["--cgroup-parent", cgroup_parent]
    for key, value in (labels or {}).items():
        argv += ["--label", f"{key}={value}"]
    for volume in volumes or []:
        argv += ["--volume", volume]
    for key, value in (env or {}).items():
        argv += ["--env", f"{key}={value}"]
    argv += ["--rootfs", "/:O", *command]
    _STARTED.append((private, name))
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise RuntimeError(f"podman run failed: {result.stderr.strip()}")
    container_id = result.stdout.strip()
    # Removed by id from here on: a test may rename its container, and its first name would
    # then remove nothing (the container would stay, an engine in every later test's ledger).
    _STARTED[_STARTED.index((private, name))] = (private, container_id)
    return container_id


def remove_started_containers() -> None:
    """Remove every container ``run_container`` started since the last call (gone is fine)."""
    used = {id(private): private for private, _ in _STARTED}
    while _STARTED:
        private, name_or_id = _STARTED.pop()
        subprocess.run([*private.argv, "rm", "--force", "--ignore", "--time", "0", name_or_id],
                       capture_output=True, timeout=120)
    # Nothing of the test may stay behind: a container it started under another name (or by
    # other means) would be an engine in every later test's discovery and ledger.
    for private in used.values():
        left = subprocess.run([*private.argv, "ps", "--all", "--quiet", "--filter",
                               f"label={TEST_LABEL}"], capture_output=True, text=True,
                              timeout=60).stdout.split()
        if left:
            subprocess.run([*private.argv, "rm", "--force", "--ignore", "--time", "0", *left],
                           capture_output=True, timeout=120)
            raise AssertionError(f"the test left {len(left)} container(s) behind: {left}")


def podman(*args: str, timeout: float = 60) -> str:
    result = subprocess.run([*PODMAN, *args], capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout.strip()


@pytest.fixture
def memory_budget(settings) -> Iterator[Callable[..., DemoBudget]]:
    """Make a memory budget for the test's engines: ``memory_budget(engines, programs=n)``
    creates a private memory cgroup (:func:`sparkops.demo.budget.create_budget`) whose limit is
    ``engines`` bytes (what the test's engines hold at their largest, with the prefill buffers
    and gaps it reasons about) plus what ``n`` engine programs hold besides their reservations,
    points this test's collections at it (``SPARKOPS_MEMORY_BUDGET_CGROUP``, read by
    :func:`collectors.hostmemory.configured_budget`) and returns it: ``parent`` is for
    :func:`run_container`'s ``cgroup_parent``, ``path`` what SparkOps reads.

    When the test ends, its containers are removed first (a cgroup with processes in it cannot
    be removed), then the budget's cgroups in every hierarchy; anything left under
    ``/sys/fs/cgroup`` fails the test. Where the memory controller cannot be written the test
    fails with the reason: the suite runs as root, where it can be.
    """
    made: list[DemoBudget] = []

    def make(engines: int, *, programs: int) -> DemoBudget:
        limit = engines + programs * PROGRAM_BYTES_PER_ENGINE
        try:
            budget = create_budget(unique_name("sparkops-test"), limit)
        except BudgetUnavailable as why:
            pytest.fail(f"this test's memory budget ({limit / GIB:.2f} GiB) cannot be made: "
                        f"{why}")
        made.append(budget)
        settings.SPARKOPS_MEMORY_BUDGET_CGROUP = str(budget.path)
        return budget

    yield make
    remove_started_containers()
    left = [text for budget in made for text in remove_budget(budget.name)]
    left += [str(path) for budget in made
             for path in [*CGROUP_ROOT.glob(budget.name), *CGROUP_ROOT.glob(f"*/{budget.name}")]]
    assert not left, f"the memory budget's cgroups are still there: {', '.join(left)}"


def budget_squeeze_margin_gib(ledger: dict, need: int, gap: float) -> float:
    """The ``prefill-squeeze`` margin (GiB) that leaves a victim's prefill ``need`` ``gap``
    bytes inside the room the ledger measures now, which must be the memory budget's: the
    budget bounds the headroom and every engine runs inside it (otherwise the host's memory,
    which other programs move, would decide the verdict)."""
    assert ledger["headroom_source"] == "budget", ledger
    assert all(share["in_budget"] for share in ledger["engines"]), ledger["engines"]
    return round((ledger["budget_headroom"] - need - gap) / GIB, 3)
