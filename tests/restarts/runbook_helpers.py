"""Real engines for the runbook tests: the emulator in a Podman container whose *next* start can
be told to fail or hang, the node's real ledger, and page cache to drop.

The container runs ``<dir>/vllm serve …`` (or ``<dir>/llama-server …``, ``<dir>/ollama serve``
for the other kinds the emulator speaks) where ``<dir>`` is bind-mounted at the same path: a
wrapper that appends the words of ``<dir>/next-start`` (when present) to the emulator's command
line from its second start on. Writing that file after the first start changes how the container
behaves when the runbook starts it again, as a model or driver change would, without recreating
it.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import docker
from django.utils import timezone

from collectors.engines import collect_engines
from collectors.hostmemory import collect_host_memory, window_figures
from collectors.ledger import update_ledger
from collectors.models import Engine, Node
from collectors.procfs import Procfs
from collectors.sampling import Clock
from dashboard.restarts.models import Restart
from sparkops.testing.ports import free_port
from tests.conftest import PROJECT
from tests.containers import run_container, unique_name

BIN = PROJECT / "collectors" / "emulator" / "bin"
# Each kind's program: the wrapper carries its name, so SparkOps finds the kind by its command.
PROGRAMS = {"vllm": "vllm", "llamacpp": "llama-server", "ollama": "ollama"}
MIB = 1024**2
# The first start never reads next-start: a test writes it just after `podman run` returns,
# while that first start may still be about to read it.
WRAPPER = """#!/bin/sh
# The emulator, plus this run's extra flags (set by the test for the starts after the first).
extra=""
if [ -f "{folder}/started" ] && [ -f "{folder}/next-start" ]; then
  extra=$(cat "{folder}/next-start")
fi
touch "{folder}/started"
exec {emulator} "$@" $extra
"""


@dataclass
class RealEngine:
    """One emulated engine in a real container, and the switch for its next start."""

    name: str
    port: int
    folder: Path
    container_id: str

    def next_start(self, *flags: str) -> None:
        """Extra emulator flags for the next time the container starts (never its first)."""
        (self.folder / "next-start").write_text(" ".join(flags))

    def row(self, node: Node) -> Engine:
        return Engine.objects.get(node=node, name=self.name)


def start_engine(folder: Path, *, kind: str = "vllm", manage: bool = True,
                 labels: dict[str, str] | None = None, load_seconds: float = 1.0) -> RealEngine:
    """Start an emulated engine of ``kind`` that starts in ~2 s: a vLLM (32 MiB weights, 64 MiB
    pinned KV pool), a llama-server (32 MiB weights, ``-c 8192`` at 4 KiB a cell: a 32 MiB KV
    pool) or an Ollama server that loads one model at start (32 MiB weights, 16 MiB of KV)."""
    folder.mkdir(parents=True, exist_ok=True)
    wrapper = folder / PROGRAMS[kind]
    wrapper.write_text(WRAPPER.format(folder=folder, emulator=BIN / PROGRAMS[kind]))
    wrapper.chmod(0o755)
    name, port = unique_name("rb"), free_port()
    all_labels = {"sparkops.engine": kind, **(labels or {})}
    if manage:
        all_labels["sparkops.manage"] = "true"
    command, env = _launch(kind, str(wrapper), port, load_seconds)
    container_id = run_container(name, command, labels=all_labels,
                                 volumes=[f"{folder}:{folder}"], env=env)
    return RealEngine(name=name, port=port, folder=folder, container_id=container_id)


def _launch(kind: str, program: str, port: int,
            load_seconds: float) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of an emulated engine of ``kind``."""
    load = ["--emulator-load-seconds", str(load_seconds)]
    if kind == "llamacpp":
        return [program, "-m", "/models/Qwen3-4B-Q4_K_M.gguf", "--port", str(port),
                "-c", "8192", "-np", "2", "--metrics", "--emulator-weights-bytes", "32M",
                "--emulator-kv-bytes-per-token", "4K", *load], {}
    if kind == "ollama":
        return [program, "serve", "--emulator-model", "qwen3:8b", "--emulator-preload",
                "--emulator-weights-bytes", "32M", "--emulator-kv-bytes-per-token", "4K",
                *load], {"OLLAMA_HOST": f"127.0.0.1:{port}", "OLLAMA_CONTEXT_LENGTH": "4096"}
    return [program, "serve", "nvidia/Gemma-4-26B-A4B-NVFP4", "--port", str(port),
            "--served-model-name", "gemma", "--kv-cache-memory-bytes", "64M",
            "--emulator-weights-bytes", "32M", *load,
            "--emulator-profile-seconds", "0.5", "--emulator-graph-seconds", "0.5",
            "--emulator-stats-interval", "1"], {}


def collect_until_ready(node: Node, api: docker.DockerClient, *names: str,
                        timeout: float = 30.0) -> dict[str, Engine]:
    """Collect engines until every one named is ready and scraped; the rows by name."""
    deadline = time.monotonic() + timeout
    while True:
        found = {e.name: e for e in collect_engines(node, api, timezone.now())}
        if all(n in found and found[n].phase == "ready" and found[n].last_scrape_ok_at
               for n in names):
            return found
        if time.monotonic() > deadline:
            seen = {n: (found[n].phase if n in found else "absent") for n in names}
            raise AssertionError(f"engines not ready within {timeout} s: {seen}")
        time.sleep(0.3)


def refresh_ledger(node: Node) -> None:
    """The node's ledger from a real host-memory window, as the collector builds it."""
    collection, window = collect_host_memory(node, Procfs(Path("/proc")), duration=0.3,
                                             period=0.1)
    assert collection.ok, collection.error
    update_ledger(node, window_figures(window), collection.at)


def plan_now(engine: Engine, **fields: object) -> Restart:
    now = timezone.now()
    values = {"expected_startup_seconds": 3, **fields}
    return Restart.objects.create(node=engine.node, engine=engine, kind=Restart.Kind.PLANNED,
                                  status=Restart.Status.SCHEDULED, requested_at=now,
                                  scheduled_for=now, **values)


def started_at(api: docker.DockerClient, container_id: str) -> str:
    return api.api.inspect_container(container_id)["State"]["StartedAt"]


def fill_page_cache(path: Path, size: int) -> None:
    """Write ``size`` bytes to disk and read them back: clean page cache the kernel can drop."""
    block = os.urandom(MIB)
    with path.open("wb") as handle:
        for _ in range(size // MIB):
            handle.write(block)
        handle.flush()
        os.fsync(handle.fileno())
    with path.open("rb") as handle:
        while handle.read(MIB):
            pass


def hook_clock(hook: Callable[[], None]) -> Clock:
    """A real clock that calls ``hook`` before every wait of the runbook: a way to act "while"
    a restart runs, in the same process and database transaction."""

    def sleep(seconds: float) -> None:
        hook()
        time.sleep(seconds)

    return Clock(sleep=sleep)


class MemFreeGoneAfterFirstRead(Procfs):
    """The host's real /proc/meminfo, except that from the second read on MemFree says 10 MiB:
    as if something took the room between the pre-check and the re-check."""

    def __init__(self) -> None:
        super().__init__(Path("/proc"))
        object.__setattr__(self, "reads", 0)

    def meminfo(self) -> str:
        text = super().meminfo()
        object.__setattr__(self, "reads", self.reads + 1)
        if self.reads == 1:
            return text
        return re.sub(r"^MemFree:\s+\d+ kB$", "MemFree:           10240 kB", text, flags=re.M)
