"""Emulated vLLM engines in a memory budget of the test's own, for the tests of memory that does
not come back after a stop and of the guarded start.

Both verdicts hang on a room the test's engines move by a few hundred MiB: the memory budget's
(``tests.containers.memory_budget``), which other programs on the machine do not move. The
engine runs ``collectors/emulator/bin/vllm`` in a Podman container whose cgroup parent is the
budget. With ``leak`` it keeps that much of its weights in a file on a host tmpfs bind-mounted
into the container (``--emulator-leak-on-stop``): the container's processes all die with it, so
nothing of its own can hold memory after the stop, but the file's pages stay resident and
charged to the budget, as a leaked shared-memory segment's do, until the test removes the file.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from collectors.models import Engine, Node
from sparkops.demo.budget import DemoBudget
from sparkops.testing.ports import free_port
from tests.conftest import PROJECT
from tests.containers import run_container, unique_name
from tests.cycles import CollectionCycle, ledger_shares

VLLM = str(PROJECT / "collectors" / "emulator" / "bin" / "vllm")
MIB = 1024**2
# Where the leaked file lives inside the container.
LEAK_MOUNT = "/sparkops-leak"
SHM = Path("/dev/shm")


@dataclass(frozen=True)
class BudgetEngine:
    name: str
    port: int
    container_id: str


@pytest.fixture
def leak_dir() -> Iterator[Path]:
    """A fresh folder on the host's tmpfs for an engine's leaked weights; removed, with what
    is in it (which frees the leaked memory), when the test ends."""
    folder = SHM / f"sparkops-test-leak-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def start_budget_engine(budget: DemoBudget, *, weights: int, kv: int, leak: int = 0,
                        leak_dir: Path | None = None, load_seconds: float = 1.0) -> BudgetEngine:
    """A managed emulated vLLM inside ``budget``: ``weights`` and ``kv`` bytes (the KV pool
    pinned), ``leak`` bytes of the weights in a file under ``leak_dir``."""
    name, port = unique_name("mem"), free_port()
    command = [VLLM, "serve", "nvidia/Gemma-4-26B-A4B-NVFP4", "--port", str(port),
               "--served-model-name", "gemma", "--kv-cache-memory-bytes", str(kv),
               "--emulator-weights-bytes", str(weights),
               "--emulator-load-seconds", str(load_seconds),
               "--emulator-profile-seconds", "0.5", "--emulator-graph-seconds", "0.5",
               "--emulator-stats-interval", "1"]
    volumes = []
    if leak:
        assert leak_dir is not None
        command += ["--emulator-leak-on-stop", str(leak), "--emulator-leak-dir", LEAK_MOUNT]
        volumes.append(f"{leak_dir}:{LEAK_MOUNT}")
    container_id = run_container(name, command, volumes=volumes, cgroup_parent=budget.parent,
                                 labels={"sparkops.engine": "vllm", "sparkops.manage": "true"})
    return BudgetEngine(name=name, port=port, container_id=container_id)


def ready_in_budget(cycle: CollectionCycle, node: Node, name: str) -> Engine:
    """Run collection cycles until the engine serves, its KV pool is in the ledger and the
    ledger has it inside the memory budget, which bounds the headroom; its row."""
    def ready() -> bool:
        share = ledger_shares(node).get(name) or {}
        engine = Engine.objects.filter(node=node, name=name).first()
        return bool(engine and engine.phase == "ready" and engine.last_scrape_ok_at
                    and share.get("kv_pool") and share.get("in_budget"))

    cycle.until(ready)
    return Engine.objects.get(node=node, name=name)
