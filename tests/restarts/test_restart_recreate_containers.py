"""A plan that recreates an engine's container with new flags, against real containers: the
emulator in Podman, reached through the Docker-compatible API, the node's real /proc and ledger.

Recreating needs an image (the new container is created from the old one's), so these engines
do not run from the host's root file system like the other runbook tests: they run from a tiny
image of this session (empty folders and /etc's user list) with the host's /usr and the project
bind-mounted read-only, which the recreated container keeps like any other mount.
"""

from __future__ import annotations

import io
import shlex
import subprocess
import tarfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from collectors import docker_api
from collectors.docker_api import REPLACED_MARKER
from collectors.engines import collect_engines
from collectors.models import Engine, Node
from collectors.procfs import Procfs
from dashboard.audit.models import AuditEntry
from dashboard.restarts.change import RECREATE, FlagChange
from dashboard.restarts.models import Restart
from dashboard.restarts.planning import plan_restart
from dashboard.restarts.runbook import run_restart
from sparkops.testing.ports import free_port
from tests.conftest import PROJECT
from tests.containers import PODMAN, TEST_LABEL
from tests.restarts.runbook_helpers import BIN, collect_until_ready, refresh_ledger

# alone: the runbook judges the host's own MemAvailable (whether a stopped engine's memory
# came back, whether the next start fits), which engines of tests beside it would move.
pytestmark = [pytest.mark.slow, pytest.mark.django_db, pytest.mark.alone]

MIB = 1024**2
IMAGE = "localhost/sparkops-test-hostusr:latest"
MODEL = "nvidia/Gemma-4-26B-A4B-NVFP4"
POLL = 0.2


@pytest.fixture(autouse=True)
def _quick_restarts(settings):
    settings.SPARKOPS_RESTART_DRAIN_TIMEOUT_SECONDS = 3
    settings.SPARKOPS_RESTART_MIN_DEADLINE_SECONDS = 30
    settings.SPARKOPS_DROP_CACHES_COOLDOWN_SECONDS = 300


@pytest.fixture
def api(docker_host):
    client = docker_api.client(docker_host)
    yield client
    client.close()


def _tiny_root() -> bytes:
    """A root file system of folders and symlinks into /usr, with this host's users."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        # The project's top folder too, once: a checkout under /tmp shares "tmp".
        for folder in dict.fromkeys(("usr", "etc", "tmp", "proc", "sys", "dev", "run", "var",
                                     "root", *PROJECT.relative_to("/").parents[0].parts)):
            entry = tarfile.TarInfo(folder)
            entry.type, entry.mode = tarfile.DIRTYPE, 0o1777 if folder == "tmp" else 0o755
            tar.addfile(entry)
        for link, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"),
                             ("sbin", "usr/sbin")):
            entry = tarfile.TarInfo(link)
            entry.type, entry.linkname = tarfile.SYMTYPE, target
            tar.addfile(entry)
        for name in ("etc/passwd", "etc/group"):
            data = (Path("/") / name).read_bytes()
            entry = tarfile.TarInfo(name)
            entry.size, entry.mode = len(data), 0o644
            tar.addfile(entry, io.BytesIO(data))
    return buffer.getvalue()


@pytest.fixture(scope="session")
def host_image(docker_host) -> str:
    """The tiny image, imported once into this session's Podman (removed with its storage)."""
    imported = subprocess.run([*PODMAN, "import", "-", IMAGE], input=_tiny_root(),
                              capture_output=True, timeout=120)
    if imported.returncode != 0:
        pytest.fail(f"podman import failed: {imported.stderr.decode(errors='replace')}")
    return IMAGE


@dataclass
class ImageEngine:
    """An emulated vLLM in a container made from :data:`IMAGE`, and its command's words."""

    name: str
    container_id: str
    command: list[str]

    def command_with(self, *words: str) -> list[str]:
        """Its command with the KV pool flag's value replaced and ``words`` added."""
        argv = list(self.command)
        index = argv.index("--kv-cache-memory-bytes")
        argv[index + 1] = "128M"
        return [*argv, *words]


@pytest.fixture
def start_engine(host_image) -> Iterator[Callable[[], ImageEngine]]:
    """Start emulated engines from the tiny image; remove every container of the test (the
    recreated ones and any old one kept) when it ends."""
    run_label = f"sparkops.test.recreate={uuid.uuid4().hex[:8]}"

    def start() -> ImageEngine:
        name, port = f"rc-{uuid.uuid4().hex[:8]}", free_port()
        command = [str(BIN / "vllm"), "serve", MODEL, "--port", str(port),
                   "--served-model-name", "gemma", "--kv-cache-memory-bytes", "64M",
                   # vLLM's start-up check wants this share of the total free, pinned pool or
                   # not; the machine's free memory is what its other programs leave.
                   "--gpu-memory-utilization", "0.05",
                   "--emulator-weights-bytes", "32M", "--emulator-load-seconds", "1",
                   "--emulator-profile-seconds", "0.5", "--emulator-graph-seconds", "0.5",
                   "--emulator-stats-interval", "1"]
        argv = [*PODMAN, "run", "--detach", "--name", name, "--label", TEST_LABEL,
                "--label", run_label, "--label", "sparkops.engine=vllm",
                "--label", "sparkops.manage=true", "--env", "SPARKOPS_TEST_ENV=kept",
                "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
                "--network", "host", "--workdir", str(PROJECT),
                "--volume", "/usr:/usr:ro", "--volume", f"{PROJECT}:{PROJECT}:ro",
                host_image, *command]
        started = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if started.returncode != 0:
            pytest.fail(f"podman run failed: {started.stderr.strip()}")
        return ImageEngine(name=name, container_id=started.stdout.strip(), command=command)

    yield start
    left = subprocess.run([*PODMAN, "ps", "--all", "--quiet", "--filter", f"label={run_label}"],
                          capture_output=True, text=True, timeout=60).stdout.split()
    if left:
        subprocess.run([*PODMAN, "rm", "--force", "--time", "0", *left], capture_output=True,
                       timeout=120)


def plan_recreation(node: Node, engine: Engine, command: list[str]) -> Restart:
    admin = get_user_model().objects.create_superuser(f"root-{uuid.uuid4().hex[:6]}", "", None)
    return plan_restart(engine, user=admin, now=timezone.now(), reason="a larger KV pool",
                        change=FlagChange(shlex.join(command), RECREATE, 2 * 1024**3))


def run(restart: Restart, api: docker.DockerClient) -> Restart:
    return run_restart(restart.pk, api=api, procfs=Procfs(Path("/proc")), poll_seconds=POLL)


def names(api: docker.DockerClient) -> list[str]:
    return [name.lstrip("/") for c in api.api.containers(all=True) for name in c["Names"]]


def actions(restart: Restart) -> list[tuple[str, bool]]:
    return list(AuditEntry.objects.filter(restart=restart).order_by("at", "pk")
                .values_list("action", "allowed"))


def test_the_runbook_recreates_the_container_with_the_new_kv_pool(node, api, start_engine):
    real = start_engine()
    engine = collect_until_ready(node, api, real.name)[real.name]
    refresh_ledger(node)
    intended = real.command_with()
    restart = plan_recreation(node, engine, intended)
    assert restart.change["planned"]["engine"] == real.name

    restart = run(restart, api)

    assert restart.status == Restart.Status.SUCCEEDED, restart.outcome
    assert restart.outcome.endswith("It runs the intended flags.")
    # The container with the engine's name is a new one, running the new flags.
    now = api.api.inspect_container(real.name)
    assert now["Id"] != real.container_id and now["State"]["Running"] is True
    assert [now["Path"], *now["Args"]] == intended
    assert now["Config"]["Labels"]["sparkops.manage"] == "true"
    assert "SPARKOPS_TEST_ENV=kept" in now["Config"]["Env"]
    assert {m["Destination"] for m in now["Mounts"]} >= {"/usr", str(PROJECT)}
    assert now["HostConfig"]["NetworkMode"] == "host"
    # The old container is gone, and nothing kept under the replaced name.
    with pytest.raises(docker.errors.NotFound):
        api.api.inspect_container(real.container_id)
    assert not [name for name in names(api) if REPLACED_MARKER in name]
    # The pre-check planned the new pool and the memory checks counted it.
    precheck = restart.steps.get(step="precheck").data
    assert precheck["parts"]["kv_pool"] == 128 * MIB
    assert precheck["change"]["plan"]["rows"][0]["kv_pool"][1]["value"] == 128 * MIB
    record = restart.steps.get(step="record").data
    assert record["flags"]["runs_intended"] is True
    assert ("recreate-engine", True) in actions(restart)
    assert ("remove-replaced-engine", True) in actions(restart)
    # The engine's row follows the new container and, once collected, shows the new flags.
    engine = collect_until_ready(node, api, real.name)[real.name]
    assert engine.container_id == now["Id"]
    assert engine.config["kv_cache_memory_bytes"] == 128 * MIB
    assert Engine.objects.filter(node=node, name__contains=REPLACED_MARKER).count() == 0


def test_a_new_container_that_exits_at_once_gives_way_to_the_old_one(node, api, start_engine):
    real = start_engine()
    engine = collect_until_ready(node, api, real.name)[real.name]
    refresh_ledger(node)
    # The fit planner reads the unknown --emulator-fail as a flag vLLM would take; the
    # emulator refuses its value and exits, as vLLM does with a value it refuses.
    restart = plan_recreation(node, engine, real.command_with("--emulator-fail", "nonsense"))

    restart = run(restart, api)

    assert restart.status == Restart.Status.FAILED
    assert "The container exited during startup (exit code 2" in restart.outcome
    assert "the old one is back under its name, stopped, with its old flags" in restart.outcome
    old = api.api.inspect_container(real.name)
    assert old["Id"] == real.container_id and old["State"]["Running"] is False
    assert [old["Path"], *old["Args"]] == real.command
    assert not [name for name in names(api) if REPLACED_MARKER in name]
    assert Engine.objects.get(pk=engine.pk).container_id == real.container_id
    assert restart.container_state["exists"] is True and restart.container_state["running"] is False
    assert ("restore-engine", True) in actions(restart)
    assert "other flags than the intended ones" in restart.outcome


def test_a_command_the_container_engine_cannot_start_restores_the_old_container(node, api,
                                                                               start_engine):
    real = start_engine()
    engine = collect_until_ready(node, api, real.name)[real.name]
    refresh_ledger(node)
    missing = [f"/nonexistent-{uuid.uuid4().hex[:6]}/vllm", *real.command_with()[1:]]
    restart = plan_recreation(node, engine, missing)

    restart = run(restart, api)

    assert restart.status == Restart.Status.FAILED
    assert restart.outcome.startswith(f"Could not recreate {real.name}: cannot recreate "
                                      f"{real.name}:")
    assert f"the old container is back under its name {real.name}, stopped" in restart.outcome
    old = api.api.inspect_container(real.name)
    assert old["Id"] == real.container_id and old["State"]["Running"] is False
    assert not [name for name in names(api) if REPLACED_MARKER in name]
    assert ("recreate-engine", True) in actions(restart)
    assert collect_engines(node, api, timezone.now())  # the node still reads
