"""Capture `tests/fixtures/nvml/*` on a machine with a real NVIDIA GPU.

Usage (from the repository root, on the GPU machine)::

    python3 -m tests.nvml.capture_fixture OUT_DIR [PREFIX]

It starts a helper process that holds 1 GiB of GPU memory (through PyTorch, when installed) so
the per-process path has something to report, runs `read_gpus()` once with the real pynvml,
and writes:

- `<PREFIX>_real.json`: `GpuReport.as_dict()`, exactly as the collector produced it;
- `<PREFIX>_nvidia_smi.txt`: nvidia-smi's own view, taken while the helper was alive;
- `<PREFIX>_capture.json`: how it was captured (pynvml version, helper PID and size).

Not a test: pytest does not collect it, and CI never runs it (CI has no GPU).
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from collectors.nvml import read_gpus
from collectors.procfs import container_id_for_pid

HOLD_BYTES = 1 << 30

_HOLDER = (
    "import sys, torch\n"
    f"x = torch.empty({HOLD_BYTES}, dtype=torch.uint8, device='cuda')\n"
    "torch.cuda.synchronize()\n"
    "print('ready', flush=True)\n"
    "sys.stdin.read()\n"
)

_SMI_QUERIES = (
    ["nvidia-smi"],
    [
        "nvidia-smi",
        "--query-gpu=index,name,uuid,driver_version,memory.total,memory.used,memory.free,"
        "utilization.gpu,temperature.gpu,power.draw,power.limit,clocks.sm,fan.speed,"
        "pcie.link.gen.current,pcie.link.width.current",
        "--format=csv",
    ],
    ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv"],
)


def _start_holder() -> subprocess.Popen[str] | None:
    try:
        holder = subprocess.Popen(
            [sys.executable, "-c", _HOLDER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
    except OSError:
        return None
    assert holder.stdout is not None
    if holder.stdout.readline().strip() != "ready":
        holder.kill()
        return None
    return holder


def _nvidia_smi() -> str:
    sections = []
    for command in _SMI_QUERIES:
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        except OSError as exc:
            sections.append(f"$ {' '.join(command)}\n{exc}\n")
            continue
        sections.append(f"$ {' '.join(command)}\n{done.stdout}{done.stderr}")
    return "\n".join(sections)


def main(out_dir: Path, prefix: str) -> None:
    holder = _start_holder()
    try:
        started = time.monotonic()
        report = read_gpus()
        read_seconds = time.monotonic() - started
        smi = _nvidia_smi()
        # Read while the helper is alive: its /proc entry goes when it exits.
        holder_container = None if holder is None else container_id_for_pid(holder.pid)
    finally:
        if holder is not None:
            assert holder.stdin is not None
            holder.stdin.close()
            holder.wait(timeout=60)

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{prefix}_real.json").write_text(json.dumps(report.as_dict(), indent=2) + "\n")
    (out_dir / f"{prefix}_nvidia_smi.txt").write_text(smi)
    capture = {
        "pynvml_distribution": f"nvidia-ml-py {metadata.version('nvidia-ml-py')}",
        "python": platform.python_version(),
        "kernel": platform.release(),
        "read_gpus_seconds": round(read_seconds, 3),
        "holder_pid": None if holder is None else holder.pid,
        "holder_bytes": None if holder is None else HOLD_BYTES,
        "holder_container_id": holder_container,
    }
    (out_dir / f"{prefix}_capture.json").write_text(json.dumps(capture, indent=2) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "h200")
