"""Demo mode, the node side: the story's two engines, scaled to this machine, in real containers.

``bin/sparkops demo`` (``sparkops/management/commands/demo.py``) tells the seeds' story on a
machine without a GB10. This module holds what does not depend on the dashboard:

* the two engines of the story (:data:`GEMMA`, :data:`NEMOTRON`) with their GB10 sizes in GiB and
  their measured speeds, and :data:`NEIGHBOUR_GROWN_KV_GIB`, the pool the neighbour is recreated
  with;
* :class:`Scale`: how many MiB of real memory stand for one GiB of the story, chosen from this
  machine's MemAvailable by :func:`choose_scale` so that the story moves the real headroom
  visibly and never threatens the machine;
* :func:`engine_command`: the engine emulator's command line for one engine at one scale;
* :class:`PodmanService` and :class:`Containers`: a private Podman Docker-API service and the
  engine containers, created the way this kind of machine accepts them (see the README, "Demo"),
  over a :class:`collectors.podman.PrivatePodman`, so stopping the demo touches no other
  container on the machine.

Nothing here fakes discovery: the engines are real containers running the project's vLLM
emulator, which really reserves the (scaled) memory, and SparkOps finds them through the Docker
Engine API like any other engine.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from collectors.podman import LeftoverError, PodmanError, PrivatePodman
from sparkops.units import GIB, KIB, MIB

VLLM = Path(settings.BASE_DIR) / "collectors" / "emulator" / "bin" / "vllm"
DEMO_LABEL = "sparkops.demo"
INSTALL_HINT = "sudo apt-get install -y podman runc"
# The emulator's KV bytes per token at MiB-for-GiB (a ~16 KiB/token model scaled by 1/1024); at
# other scales it moves with the scale so token counts keep their real magnitude.
KV_BYTES_PER_TOKEN_AT_1 = 16
# The scales tried, in MiB of real memory per GiB of the story, largest first: 64 makes the
# neighbour's 16 GiB growth a real 1 GiB; 1 is the emulator's own MiB-for-GiB convention.
SCALES = (64, 32, 16, 8, 4, 2, 1)
# The story's peak may take at most this share of MemAvailable, and never more than the cap.
MEMORY_SHARE = 0.25
MEMORY_CAP = 8 * GIB
# An explicit --mib-per-gib may go further, but never past half of what is available.
MEMORY_SHARE_MAX = 0.5
# Emulated start-up at speed 1: loading, profiling, graph capture. A GB10 takes ~10 minutes; the
# demo compresses that (the startup a restart measures is still the real time it took).
STARTUP_PHASE_SECONDS = (20.0, 5.0, 5.0)


class DemoError(RuntimeError):
    """The demo cannot go on; the message says why and what to do."""


@dataclass(frozen=True)
class EngineSpec:
    """One engine of the story: GB10 sizes in GiB (of the story), speeds in tok/s.

    ``activation_kib_per_token`` is the transient buffer a prefill grabs per batched token, so
    the prefill need is ``max_num_batched_tokens`` × it. ``load`` is the emulator's built-in
    traffic, ``RPS:PROMPT:GEN``.
    """

    name: str
    model: str
    weights_gib: float
    kv_gib: float
    graphs_gib: float
    activation_kib_per_token: int
    decode_tps: float
    prefill_tps: float
    load: str
    max_num_batched_tokens: int = 8192
    max_model_len: int = 131072
    max_num_seqs: int = 16

    @property
    def prefill_gib(self) -> float:
        return self.max_num_batched_tokens * self.activation_kib_per_token / (1024 * 1024)


# The idle-ish engine that gets squeezed. NVFP4 weights of a 26B MoE (~15 GiB); a 6 GiB pinned
# pool; decode 41.1 tok/s and prefill ~2,400 tok/s as measured in the seed. Its 8,192-token
# prefill buffer is 14 GiB (1.75 MiB per token, mostly logits over a 262k vocabulary), so on the
# GB10 it fits in 30 GiB of headroom but not in the 14 GiB left after the neighbour grew.
# Light steady traffic, with idle gaps so that a planned restart can drain it.
GEMMA = EngineSpec(
    name="gemma", model="nvidia/Gemma-4-26B-A4B-NVFP4", weights_gib=15.0, kv_gib=6.0,
    graphs_gib=0.5, activation_kib_per_token=1792, decode_tps=41.1, prefill_tps=2400.0,
    load="0.2:1200:120",
)
# The neighbour: a 120B MoE (~60 GiB of NVFP4 weights), 8 GiB pool, 23 tok/s decode and
# ~1,884 tok/s prefill (seed); a little traffic of short prompts so its pages have rates too.
NEMOTRON = EngineSpec(
    name="nemotron", model="nvidia/Nemotron-3-Super-120B-A12B-NVFP4", weights_gib=60.0,
    kv_gib=8.0, graphs_gib=0.5, activation_kib_per_token=1024, decode_tps=23.0,
    prefill_tps=1884.0, load="0.05:400:100",
)
ENGINES = (GEMMA, NEMOTRON)
# The seed: the neighbour restarted with its KV pool 8 → 24 GiB, host available fell 30 → 14 GiB.
NEIGHBOUR_GROWN_KV_GIB = 24.0
# The long document of the seed (83 s stall on the GB10).
DOCUMENT_TOKENS = 48508


def story_peak_gib() -> float:
    """The most the story ever holds, in GiB of the story: both engines resident with the
    neighbour grown, plus both prefill buffers at once (128 GiB, more than a GB10 has: a bound)."""
    resident = sum(e.weights_gib + e.kv_gib + e.graphs_gib for e in ENGINES)
    grown = NEIGHBOUR_GROWN_KV_GIB - NEMOTRON.kv_gib
    return resident + grown + sum(e.prefill_gib for e in ENGINES)


@dataclass(frozen=True)
class Scale:
    """``mib_per_gib`` MiB of real memory for every GiB of the story."""

    mib_per_gib: int

    def bytes(self, story_gib: float) -> int:
        """Real bytes for ``story_gib`` GiB of the story, in whole KiB."""
        return int(round(story_gib * self.mib_per_gib * MIB / KIB)) * KIB

    @property
    def kv_bytes_per_token(self) -> int:
        return KV_BYTES_PER_TOKEN_AT_1 * self.mib_per_gib

    def activation_bytes_per_token(self, spec: EngineSpec) -> int:
        return spec.activation_kib_per_token * self.mib_per_gib

    @property
    def peak_bytes(self) -> int:
        return self.bytes(story_peak_gib())

    @property
    def neighbour_growth_bytes(self) -> int:
        return self.bytes(NEIGHBOUR_GROWN_KV_GIB) - self.bytes(NEMOTRON.kv_gib)

    def describe(self) -> str:
        return f"{self.mib_per_gib} MiB here for every GiB of the story"


def choose_scale(mem_available: int, requested: int | None = None) -> Scale:
    """The scale for a machine with ``mem_available`` bytes available.

    Without ``requested``: the largest of :data:`SCALES` whose peak stays within
    :data:`MEMORY_SHARE` of MemAvailable and :data:`MEMORY_CAP`. With it: that scale, as long as
    its peak stays within :data:`MEMORY_SHARE_MAX`. Raises :class:`DemoError` when nothing fits.
    """
    if requested is not None:
        scale = Scale(requested)
        if requested < 1 or scale.peak_bytes > mem_available * MEMORY_SHARE_MAX:
            raise DemoError(
                f"--mib-per-gib {requested} would hold up to {scale.peak_bytes / GIB:.1f} GiB; "
                f"this machine has {mem_available / GIB:.1f} GiB available and the demo takes at "
                f"most half of it")
        return scale
    budget = min(mem_available * MEMORY_SHARE, MEMORY_CAP)
    for mib_per_gib in SCALES:
        if Scale(mib_per_gib).peak_bytes <= budget:
            return Scale(mib_per_gib)
    raise DemoError(
        f"this machine has {mem_available / GIB:.2f} GiB available; the demo needs "
        f"{Scale(1).peak_bytes / MIB:.0f} MiB at the smallest scale (a quarter of MemAvailable)")


def change_fraction_for(scale: Scale, mem_total: int) -> float | None:
    """A ledger change threshold (share of MemTotal) that records the neighbour's scaled growth
    as a change an alert can name, or None when the configured one already does.

    The threshold is meant for a GB10 (0.5 % ≈ 0.6 GiB against the seed's 16 GiB growth); at a
    small scale the growth would pass under it, so the demo lowers it to a quarter of the growth.
    """
    configured = settings.SPARKOPS_LEDGER_CHANGE_FRACTION
    growth = scale.neighbour_growth_bytes
    if growth >= 2 * configured * mem_total:
        return None
    return growth / 4 / mem_total


def startup_seconds(speed: float) -> tuple[float, float, float]:
    """The emulated load, profile and graph-capture durations at ``speed``."""
    return tuple(round(s / speed, 3) for s in STARTUP_PHASE_SECONDS)  # type: ignore[return-value]


def engine_command(spec: EngineSpec, scale: Scale, *, port: int, speed: float,
                   kv_gib: float | None = None) -> list[str]:
    """``vllm serve …`` for ``spec`` at ``scale``: the flags SparkOps reads are the real ones
    (pinned pool, batched tokens, model length), the ``--emulator-*`` ones size and pace it."""
    load, profile, graph = startup_seconds(speed)
    return [
        str(VLLM), "serve", spec.model, "--served-model-name", spec.name,
        "--host", "127.0.0.1", "--port", str(port),
        "--kv-cache-memory-bytes", str(scale.bytes(spec.kv_gib if kv_gib is None else kv_gib)),
        "--max-model-len", str(spec.max_model_len),
        "--max-num-batched-tokens", str(spec.max_num_batched_tokens),
        "--max-num-seqs", str(spec.max_num_seqs),
        # A pinned pool alone still leaves vLLM checking free memory against the default 0.92
        # utilization, which fails whenever a neighbour runs: a small one, as on a shared GB10.
        "--gpu-memory-utilization", "0.1",
        # Both models are MoE on sm_121: without Marlin vLLM silently picks slower kernels.
        "--moe-backend", "marlin",
        "--emulator-weights-bytes", str(scale.bytes(spec.weights_gib)),
        "--emulator-graph-bytes", str(scale.bytes(spec.graphs_gib)),
        "--emulator-kv-bytes-per-token", str(scale.kv_bytes_per_token),
        "--emulator-activation-bytes-per-token", str(scale.activation_bytes_per_token(spec)),
        "--emulator-prefill-tps", f"{spec.prefill_tps:g}",
        "--emulator-decode-tps", f"{spec.decode_tps:g}",
        "--emulator-load", spec.load,
        "--emulator-load-seconds", f"{load:g}", "--emulator-profile-seconds", f"{profile:g}",
        "--emulator-graph-seconds", f"{graph:g}",
    ]


def engine_labels(spec: EngineSpec, scale: Scale) -> dict[str, str]:
    """Discovery as an engine, planned restarts allowed, and its prefill buffer per token."""
    return {
        "sparkops.engine": "vllm",
        "sparkops.manage": "true",
        "sparkops.prefill-bytes-per-token": str(scale.activation_bytes_per_token(spec)),
        DEMO_LABEL: "1",
    }


def missing_programs() -> list[str]:
    """Programs the demo needs that are not installed (podman, and runc, its runtime here)."""
    missing = [] if shutil.which("podman") else ["podman"]
    # runc lives in /usr/sbin on Debian, which is not on every user's PATH.
    if not (shutil.which("runc") or any(Path(d, "runc").exists()
                                        for d in ("/usr/sbin", "/usr/bin", "/sbin"))):
        missing.append("runc")
    return missing


def _hint(stderr: str) -> str:
    """The known failures of Podman on this kind of machine, named."""
    if "hybrid mode" in stderr:
        return " (the crun runtime was used: the demo needs runc)"
    if "setrlimit" in stderr:
        return " (the ulimits were refused)"
    return ""


class Containers:
    """Engine containers created with the podman CLI over one storage (``podman_argv`` holds
    the global flags: ``--runtime runc --cgroup-manager cgroupfs`` and the storage roots).

    Each runs a program of this machine's own file system (``--rootfs /:O``, an overlay, so
    nothing is written back) with host networking: no image registry is needed. With
    ``cgroup_parent`` (a cgroup path such as ``/sparkops-demo-…``, see
    :mod:`sparkops.demo.budget`) each container's cgroups are made below it, so a memory limit
    set there covers every engine.
    """

    def __init__(self, podman_argv: list[str], *, extra_labels: dict[str, str] | None = None,
                 cgroup_parent: str | None = None):
        self.podman_argv = list(podman_argv)
        self.extra_labels = dict(extra_labels or {})
        self.cgroup_parent = cgroup_parent

    def podman(self, *args: str, timeout: float = 60) -> str:
        """Run ``podman <args>`` with the global flags; its output, or :class:`DemoError`."""
        try:
            result = subprocess.run([*self.podman_argv, *args], capture_output=True, text=True,
                                    timeout=timeout)
        except subprocess.TimeoutExpired:
            raise DemoError(f"podman {args[0]} did not finish within {timeout:.0f} s") from None
        if result.returncode != 0:
            stderr = result.stderr.strip()
            raise DemoError(f"podman {args[0]} failed: {stderr}{_hint(stderr)}")
        return result.stdout.strip()

    def run(self, name: str, command: list[str], labels: dict[str, str]) -> str:
        """Create and start container ``name``; its id."""
        argv = ["run", "--detach", "--name", name,
                # Higher limits are refused on this kind of machine.
                "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
                "--network", "host", "--workdir", str(settings.BASE_DIR)]
        if self.cgroup_parent:
            argv += ["--cgroup-parent", self.cgroup_parent]
        for key, value in {**labels, **self.extra_labels}.items():
            argv += ["--label", f"{key}={value}"]
        return self.podman(*argv, "--rootfs", "/:O", *command)

    def remove(self, name: str) -> None:
        """Remove ``name`` at once (its memory is freed with its processes); gone is fine."""
        self.podman("rm", "--force", "--ignore", "--time", "0", name)

    def remove_demo(self) -> None:
        """Remove every container the demo created in this storage."""
        self.podman("rm", "--force", "--time", "0", "--filter", f"label={DEMO_LABEL}=1", "--all")


class PodmanService:
    """``podman system service`` on a private socket, over a :class:`PrivatePodman` of its own.

    The storage lives in a folder named after the demo's data directory, so the containers of
    an admin (or of a test run) are neither seen nor touched, and a demo that was killed before
    it could clean up is cleaned up by the next one.
    """

    def __init__(self, data_dir: Path) -> None:
        digest = hashlib.sha256(str(data_dir).encode()).hexdigest()[:10]
        # A short path: the API socket's path must fit a unix socket name (108 bytes).
        self.podman = PrivatePodman(Path(tempfile.gettempdir()) / f"sparkops-demo-{digest}")
        self.base = self.podman.base
        self.socket = self.podman.socket
        self.podman_argv = self.podman.argv
        self.containers = Containers(self.podman_argv)

    @property
    def url(self) -> str:
        return self.podman.url

    def start(self, timeout: float = 30) -> str:
        """Start the service (after clearing a killed demo's leftovers); its ``unix://`` URL."""
        if self.base.exists():
            self._reset()
        self.base.mkdir(parents=True)
        try:
            return self.podman.start_service(log=self.base / "service.log", timeout=timeout)
        except PodmanError as error:
            text = str(error)
            self.stop()
            raise DemoError(f"{text}{_hint(text)}") from None

    def stop(self) -> None:
        """Remove the demo's containers and everything they left running, stop the service,
        and delete its storage; :class:`DemoError` if a process or mount survives."""
        # On failure the removal below takes whatever is left.
        with contextlib.suppress(DemoError, OSError):
            self.containers.remove_demo()
        self._reset()

    def _reset(self) -> None:
        # Only this storage, by path: containers of a demo that was killed may still run and
        # hold their memory; other Podman state on the machine is not touched.
        try:
            self.podman.destroy()
        except LeftoverError as error:
            raise DemoError(f"{error}; stop them by hand (their pids are listed)") from None


def healthy(port: int, timeout: float = 2.0) -> bool:
    """Does the engine on ``port`` answer ``/health`` with 200 (it is ready)?"""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=timeout) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError):
        return False


def complete(port: int, model: str, prompt_tokens: int, *, max_tokens: int = 64,
             timeout: float = 600) -> dict:
    """``POST /v1/completions`` of a prompt ``prompt_tokens`` long (the emulator's
    ``sparkops_prompt_tokens``), waiting for the whole answer; the response body."""
    body = json.dumps({"model": model, "prompt": "Summarise this document.",
                       "sparkops_prompt_tokens": prompt_tokens,
                       "max_tokens": max_tokens}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return json.loads(reply.read())
