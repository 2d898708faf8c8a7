"""Config findings: launch settings and startup evidence an admin should act on.

Each finding has a stable ``code`` (dashboards and tests key on it), a ``severity`` and a message
that says what to change. The rules cover what vLLM does silently with a launch setting
(flags it removed, environment variables it ignores, a pinned KV pool that skips the memory
pre-check, an unset MoE backend), the startup failures its log reports and log lines SparkOps
recognised but could not read; they assume a GB10 node, the only hardware SparkOps watches.
A removed flag is judged against the engine's own version (its startup log's, or the caller's):
which release removed which flag comes from vLLM's own argument parsers, minor release by minor
release (``collectors.vllm.flag_history``). Settings that are recommended practice
(e.g. a small ``--gpu-memory-utilization`` next to ``--kv-cache-memory-bytes``) are not findings.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from collectors.vllm.flag_history import REMOVED
from collectors.vllm.flags import EngineConfig
from collectors.vllm.logs import StartupLog
from sparkops.units import fixed_gib_text

Severity = Literal["error", "warning", "info"]
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info")

# What CUDA reports as total memory on a GB10, as vLLM's logs print it (121.63 on some units).
GB10_TOTAL_GIB = 121.69
# --gpu-memory-utilization default: 0.92 in current releases, 0.9 in older ones.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92

# What to use instead of a removed flag, where there is a successor. The partial-prefill flags
# only ever worked in V0 (PR #10235), V1 rejected them (#13726) and PR #49244 deleted them.
REMOVED_FLAG_REPLACEMENTS = {
    "max-num-partial-prefills": "--long-prefill-token-threshold with --max-num-batched-tokens",
    "max-long-partial-prefills": "--long-prefill-token-threshold with --max-num-batched-tokens",
    "disable-log-requests": "nothing: request logging is off unless --enable-log-requests",
    "speculative-model": "--speculative-config '{\"model\": …}'",
    "num-speculative-tokens": "--speculative-config '{\"num_speculative_tokens\": …}'",
    "guided-decoding-backend": "--structured-outputs-config '{\"backend\": …}'",
    "cuda-graph-sizes": "--cudagraph-capture-sizes",
    "task": "--runner and --convert",
    "override-pooler-config": "--pooler-config",
    "disable-mm-preprocessor-cache": "--mm-processor-cache-gb 0",
    "swap-space": "nothing (V1 does not swap KV blocks to host memory)",
}
# Environment variables --moe-backend replaced (v0.17.0, PR #33807); vLLM 0.33 ignores them and
# logs "Unknown vLLM environment variable detected".
REPLACED_MOE_ENV_VARS = frozenset(
    {
        "VLLM_USE_FLASHINFER_MOE_FP4",
        "VLLM_USE_FLASHINFER_MOE_FP8",
        "VLLM_FLASHINFER_MOE_BACKEND",
        "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8",
    }
)

_FP4_CHECKPOINT = re.compile(r"nvfp4|fp4|modelopt", re.IGNORECASE)
# Mixture-of-experts names: "-A3B" / "-A12B" (active parameters), "8x7B", "MoE", "Mixtral".
_MOE_NAME = re.compile(
    r"(?:^|[-_/.])A\d+(?:\.\d+)?B(?:$|[-_/.])|\d+x\d+(?:\.\d+)?B|moe|mixtral", re.IGNORECASE
)

_STARTUP_ERROR_ADVICE = {
    "free-memory-below-utilization": (
        "another engine or the page cache holds the memory this --gpu-memory-utilization asks "
        "for. Stop this container, drop the page cache (sync; echo 3 > /proc/sys/vm/drop_caches), "
        "then start it; or lower --gpu-memory-utilization (the engines' fractions of 121.69 GiB "
        "must together fit in free memory)"
    ),
    "memory-profiling-error": (
        "another engine started or stopped while this one profiled memory. Start engines one at "
        "a time, each after the previous one has logged its KV cache size"
    ),
    "max-seq-len-too-long": (
        "one request of --max-model-len tokens does not fit in the KV cache. Lower "
        "--max-model-len to the estimated maximum vLLM printed, or give the KV cache more memory"
    ),
    "no-cache-memory": (
        "nothing was left for the KV cache after weights, activations and CUDA graphs. Raise "
        "--gpu-memory-utilization or set --kv-cache-memory-bytes, or lower "
        "--max-num-batched-tokens (it sizes the activation peak)"
    ),
    "ptx-toolchain": (
        "the image's CUDA toolchain is newer than the host driver (or does not know sm_121). Use "
        "an image built for this driver, or update the NVIDIA driver"
    ),
    "not-enough-gpu-memory": (
        "the weights did not fit in free memory. Free memory first (stop a neighbour, drop the "
        "page cache after it stops) or use a smaller or 4-bit checkpoint"
    ),
    "cuda-out-of-memory": (
        "CUDA ran out of memory while starting. With --kv-cache-memory-bytes vLLM skips its "
        "memory pre-check, so lower the pinned size or free memory before starting"
    ),
    "unrecognized-arguments": (
        "this vLLM release does not declare a flag on the command line (removed or misspelled); "
        "remove it or check `vllm serve --help` of this image"
    ),
    "engine-core-init-failed": (
        "the engine failed for a reason SparkOps does not recognise; read the log lines above "
        "'Engine core initialization failed'"
    ),
}


@dataclass(frozen=True)
class Finding:
    """One thing to act on: ``code`` is stable, ``severity`` one of :data:`SEVERITIES`."""

    code: str
    severity: Severity
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"code": self.code, "severity": self.severity, "message": self.message}


@dataclass(frozen=True)
class MountCheck:
    """A bind mount seen from both sides: ``container_inode`` is what the container sees at
    ``destination`` (the inode the mount was pinned to when the container was created),
    ``host_inode`` is what ``source`` is on the host now. ``None`` when it could not be read."""

    source: str
    destination: str
    container_inode: int | None
    host_inode: int | None
    host_exists: bool


def check_config(
    config: EngineConfig,
    *,
    log: StartupLog | None = None,
    mounts: list[MountCheck] | None = None,
    version: str | None = None,
) -> list[Finding]:
    """Findings for one engine, most severe first; empty when nothing needs attention.

    ``log`` (its last startup) sharpens the checks and adds startup failures; ``mounts`` adds
    stale bind mounts; ``version`` is the engine's vLLM version when the caller knows it
    otherwise (the log's version line is used when it is not given). Pure and cheap.
    """
    findings: list[Finding] = _removed_flags(config, log, version)
    for check in _CONFIG_CHECKS:
        findings.extend(check(config, log))
    findings.extend(stale_mounts(mounts or []))
    return sorted(findings, key=lambda finding: SEVERITIES.index(finding.severity))


def _quantization_on_prequantized(config: EngineConfig, log: StartupLog | None) -> list[Finding]:
    mismatch = _log_error(log, "quantization-mismatch")
    name_says_fp4 = bool(config.model and _FP4_CHECKPOINT.search(config.model))
    if mismatch is not None:
        evidence = f"the log shows vLLM refusing it: {mismatch}"
    elif config.quantization is not None and name_says_fp4:
        evidence = f"{config.model} is a prequantized FP4/ModelOpt checkpoint"
    else:
        return []
    flag = f"--quantization {config.quantization}" if config.quantization else "--quantization"
    ran_anyway = mismatch is None and log is not None and log.phase == "ready"
    return [
        Finding(
            "quantization-on-prequantized",
            "warning" if ran_anyway else "error",
            f"{flag} is set but {evidence}. vLLM reads the method from the checkpoint and stops "
            "at startup when the flag names a different one (e.g. modelopt for an NVFP4 "
            "checkpoint); remove --quantization.",
        )
    ]


def _moe_backend_unset(config: EngineConfig, log: StartupLog | None) -> list[Finding]:
    if config.moe_backend is not None:
        return []
    evidence = _moe_fp4_evidence(config, log)
    if evidence is None:
        return []
    return [
        Finding(
            "moe-backend-unset",
            "warning",
            f"No --moe-backend and {evidence}. On GB10 (sm_121) MoE kernels other than Marlin "
            "are silently slower, with no error (vLLM picks FlashInfer CUTLASS for NVFP4 by "
            "itself); add --moe-backend marlin (vLLM 0.17 or later) and compare decode tokens/s.",
        )
    ]


def _moe_fp4_evidence(config: EngineConfig, log: StartupLog | None) -> str | None:
    """Why this looks like an FP4 MoE model on non-Marlin kernels; the log beats the name."""
    name = config.model or ""
    if log is not None and log.moe_backend is not None:
        fp4 = _FP4_CHECKPOINT.search(log.moe_quantization or "") or _FP4_CHECKPOINT.search(name)
        if log.moe_backend.lower() == "marlin" or not fp4:
            return None
        return f"the log shows vLLM chose the {log.moe_backend} FP4 MoE kernels"
    logged_quantization = (log.engine_config.get("quantization") if log else None) or ""
    fp4 = _FP4_CHECKPOINT.search(name) or _FP4_CHECKPOINT.search(logged_quantization)
    if _MOE_NAME.search(name) and fp4:
        return f"{name} is an FP4 mixture-of-experts model"
    return None


def _kv_bytes_skips_precheck(config: EngineConfig, log: StartupLog | None) -> list[Finding]:
    if config.kv_cache_memory_bytes is None:
        return []
    return [
        Finding(
            "kv-bytes-skips-precheck",
            "warning",
            f"--kv-cache-memory-bytes {config.kv_cache_memory_bytes} "
            f"({fixed_gib_text(config.kv_cache_memory_bytes)}) pins the KV pool and skips "
            "vLLM's memory check: an over-commit goes straight to an out-of-memory failure "
            "(on GB10 it can wedge the host). Before each start, make sure this pool plus "
            "weights, CUDA graphs and a prefill buffer of --max-num-batched-tokens fit in free "
            "memory.",
        )
    ]


def _kv_bytes_default_utilization(config: EngineConfig, log: StartupLog | None) -> list[Finding]:
    if config.kv_cache_memory_bytes is None or config.gpu_memory_utilization is not None:
        return []
    needed = DEFAULT_GPU_MEMORY_UTILIZATION * GB10_TOTAL_GIB
    return [
        Finding(
            "kv-bytes-default-utilization",
            "warning",
            "--kv-cache-memory-bytes is set without --gpu-memory-utilization. vLLM still checks "
            f"free memory against the default utilization ({DEFAULT_GPU_MEMORY_UTILIZATION} × "
            f"{GB10_TOTAL_GIB} GiB ≈ {needed:.0f} GiB), so the start fails whenever another "
            "engine runs; add a small --gpu-memory-utilization (0.1 needs about 12 GiB free).",
        )
    ]


def _removed_flags(
    config: EngineConfig, log: StartupLog | None, version: str | None = None
) -> list[Finding]:
    """Flags a vLLM minor release stopped declaring, judged against the engine's own version:
    an engine of that release or later refuses them at startup (argparse: "unrecognized
    arguments"), an older one still accepts them, an unknown version is said to be unknown."""
    version = version or (log.version if log is not None else None)
    engine_minor = minor_release(version)
    refused = _log_error(log, "unrecognized-arguments") or ""
    findings = []
    for name in config.all_flags:
        removal = REMOVED.get(name)
        if removal is None:
            continue
        removed_minor = minor_release(removal["removed_in"])
        if engine_minor is not None and removed_minor is not None and engine_minor < removed_minor:
            continue
        replacement = REMOVED_FLAG_REPLACEMENTS.get(name)
        instead = f" Use {replacement} instead." if replacement else ""
        history = (
            f"vLLM {_minor_text(removal['removed_in'])} removed --{name} (the last release that "
            f"declares it is {removal['last']}"
            + (f", deprecated since {removal['deprecated_in']}" if removal["deprecated_in"] else "")
            + ")"
        )
        if f"--{name}" in refused:
            message = f"{history}, and this engine refused it at startup: remove it.{instead}"
            severity: Severity = "error"
        elif engine_minor is not None:
            message = (
                f"{history}; this engine runs vLLM {version}, which refuses it, so the engine "
                f"will not start: remove it.{instead}"
            )
            severity = "error"
        else:
            message = (
                f"{history}. This engine's vLLM version is not known yet (no version line in "
                "its log), so whether it still accepts the flag is unknown; an engine of that "
                f"release or later will not start.{instead}"
            )
            severity = "warning"
        findings.append(Finding("removed-flag", severity, message))
    return findings


def minor_release(version: str | None) -> tuple[int, int] | None:
    """``(0, 33)`` for "0.33.0", "v0.10.1.1" or "0.11.0rc2+cu130"; None when not a version."""
    match = re.match(r"v?(\d+)\.(\d+)", version or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def _minor_text(version: str) -> str:
    minor = minor_release(version)
    return f"{minor[0]}.{minor[1]}" if minor else version


def _unparsed_lines(config: EngineConfig, log: StartupLog | None) -> list[Finding]:
    if log is None or not log.unparsed:
        return []
    first = log.unparsed[0]
    more = f" (and {len(log.unparsed) - 1} more)" if len(log.unparsed) > 1 else ""
    return [
        Finding(
            "log-line-unparsed",
            "warning",
            f"vLLM printed a {first.fact} line SparkOps recognises but could not read, so that "
            f"figure is shown as unknown{more}: {first.message}",
        )
    ]


def _enforce_eager(config: EngineConfig, log: StartupLog | None) -> list[Finding]:
    if not config.enforce_eager:
        return []
    return [
        Finding(
            "enforce-eager",
            "info",
            "--enforce-eager turns CUDA graphs off. It is often needed on GB10 for stability, but "
            "decode pays kernel-launch overhead on every step; retry without it after a vLLM "
            "upgrade.",
        )
    ]


def _ignored_env_vars(config: EngineConfig, log: StartupLog | None) -> list[Finding]:
    ignored = sorted(REPLACED_MOE_ENV_VARS.intersection(log.unknown_env_vars if log else []))
    return [
        Finding(
            "ignored-env-var",
            "warning",
            f"vLLM ignored {name}: it no longer exists. The MoE kernel is chosen with "
            "--moe-backend now; remove the variable.",
        )
        for name in ignored
    ]


def _startup_errors(config: EngineConfig, log: StartupLog | None) -> list[Finding]:
    if log is None:
        return []
    return [
        Finding(
            "startup-error",
            "error",
            f"The last startup failed: {_STARTUP_ERROR_ADVICE[error.kind]}. vLLM said: "
            f"{error.message}",
        )
        for error in log.errors
        # A quantization mismatch has its own finding, quantization-on-prequantized.
        if error.kind in _STARTUP_ERROR_ADVICE
    ]


def _log_error(log: StartupLog | None, kind: str) -> str | None:
    if log is None:
        return None
    return next((error.message for error in log.errors if error.kind == kind), None)


def stale_mounts(mounts: list[MountCheck]) -> list[Finding]:
    return [
        Finding("stale-bind-mount", "error", reason)
        for mount in mounts
        if (reason := _stale_reason(mount)) is not None
    ]


def _stale_reason(mount: MountCheck) -> str | None:
    """Why the mount is stale, or None. Unknown inodes on an existing path prove nothing."""
    where = f"bind mount {mount.source} → {mount.destination}"
    inodes = (mount.container_inode, mount.host_inode)
    if not mount.host_exists:
        problem = f"The host path of the {where} is gone; the container still sees the old one."
    elif None in inodes or mount.container_inode == mount.host_inode:
        return None
    else:
        problem = (
            f"The {where} is pinned to inode {mount.container_inode}, but the host path is now "
            f"inode {mount.host_inode} (deleted and recreated, e.g. by a branch switch): the "
            "container sees the old, possibly empty, directory."
        )
    return (
        f"{problem} Recreate the container (docker compose up -d --force-recreate, or docker rm "
        "and run again); a restart keeps the old mount."
    )


_CONFIG_CHECKS: tuple[Callable[[EngineConfig, StartupLog | None], list[Finding]], ...] = (
    _quantization_on_prequantized,
    _moe_backend_unset,
    _kv_bytes_skips_precheck,
    _kv_bytes_default_utilization,
    _enforce_eager,
    _ignored_env_vars,
    _startup_errors,
    _unparsed_lines,
)
