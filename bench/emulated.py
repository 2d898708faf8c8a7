"""Emulated vLLM engines in real containers, one container per engine (the real shape).

Each container runs the project's emulator (``collectors/emulator/bin/vllm serve ...``) with
host networking on a port of its own, so SparkOps discovers it through the Docker API exactly as
it would a real engine, and Prometheus scrapes the very same ``/metrics``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from bench.services import PROJECT, Podman, http_ok
from sparkops.testing.ports import free_port, wait_for

VLLM = str(PROJECT / "collectors" / "emulator" / "bin" / "vllm")
PREFILL_LABEL = "sparkops.prefill-bytes-per-token"


@dataclass(frozen=True)
class EngineSpec:
    """One emulated engine: its container name, port and what it holds and serves."""

    name: str
    port: int
    model: str
    kv_bytes: str = "64M"
    weights_bytes: str = "32M"
    max_num_batched_tokens: int = 8192
    load: str = "1:256:64"  # requests/s : prompt tokens : generated tokens
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [VLLM, "serve", self.model, "--port", str(self.port),
                "--kv-cache-memory-bytes", self.kv_bytes,
                "--max-num-batched-tokens", str(self.max_num_batched_tokens),
                "--emulator-weights-bytes", self.weights_bytes,
                "--emulator-load", self.load,
                "--emulator-load-seconds", "0.2", "--emulator-profile-seconds", "0.2",
                "--emulator-graph-seconds", "0.2"]


def live_engines(count: int, prefill_bytes_per_token: int) -> list[EngineSpec]:
    """The engines both stacks monitor. The first carries a known prefill need (the label), so
    SparkOps' prefill-squeeze rule has an engine to protect when a neighbour takes the room."""
    specs = []
    for index in range(1, count + 1):
        labels = {"sparkops.engine": "vllm"}
        if index == 1:
            labels[PREFILL_LABEL] = str(prefill_bytes_per_token)
        specs.append(EngineSpec(name=f"bench-engine-{index}", port=free_port(),
                                model=f"bench/model-{index}", labels=labels))
    return specs


def small_engines(start: int, count: int) -> list[EngineSpec]:
    """Light engines for the collection-cost sweep (up to 64 on a small machine)."""
    return [EngineSpec(name=f"cost-engine-{index}", port=free_port(),
                       model=f"bench/small-{index}", kv_bytes="16M", weights_bytes="8M",
                       load="0.2:128:16", labels={"sparkops.engine": "vllm"})
            for index in range(start, start + count)]


def start(podman: Podman, specs: Iterable[EngineSpec]) -> None:
    for spec in specs:
        podman.run(spec.name, spec.command(), spec.labels)


def wait_ready(specs: Iterable[EngineSpec], timeout: float = 120.0) -> None:
    """Until every engine's ``/health`` answers 200 (startup phases done)."""
    pending = list(specs)

    def all_ready() -> bool:
        pending[:] = [spec for spec in pending if not http_ok(f"{spec.url}/health")]
        return not pending

    wait_for(all_ready, timeout, "every emulated engine ready", period=0.3)
