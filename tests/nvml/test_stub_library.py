"""read_gpus() through the REAL pynvml and ctypes, against a stub libnvidia-ml.so.1 built from
`nvml_stub.c`: library loading, NVML return codes, pynvml's exception mapping and struct
layouts all run for real. Each scenario runs in a fresh interpreter, because the dynamic loader
reads LD_LIBRARY_PATH once and pynvml keeps the library it loaded."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
STUB_SOURCE = Path(__file__).with_name("nvml_stub.c")
GIB = 1 << 30
RESERVED = 529 << 20

_READ = (
    "import json\n"
    "from collectors.nvml import read_gpus\n"
    "print(json.dumps(read_gpus(host_memory_bytes=2048 << 30).as_dict()))\n"
)


@pytest.fixture(scope="module")
def stub_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler to build the stub NVML library")
    out = tmp_path_factory.mktemp("nvml-stub")
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O1", "-o", str(out / "libnvidia-ml.so.1"), STUB_SOURCE],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return out


def _read(stub_dir: Path, **stub_env: str) -> tuple[dict[str, Any], list[str]]:
    log = stub_dir / f"shutdown-{uuid.uuid4().hex}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("STUB_")}
    env.update(stub_env, LD_LIBRARY_PATH=str(stub_dir), STUB_SHUTDOWN_LOG=str(log))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", _READ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    shutdowns = log.read_text().split() if log.exists() else []
    return json.loads(done.stdout), shutdowns


def test_discrete_gpu_through_real_pynvml(stub_dir: Path) -> None:
    report, shutdowns = _read(stub_dir, STUB_PROC_PID="4242", STUB_PROC_MEM=str(3 * GIB))

    assert report["state"] == "ok"
    assert report["driver_version"] == "999.1.2"
    assert report["cuda_driver_version"] == "13.1"
    [gpu] = report["devices"]
    assert gpu["name"] == "Stub GPU"
    assert (gpu["utilization_gpu_pct"], gpu["temperature_c"], gpu["sm_clock_mhz"]) == (42, 51, 1755)
    assert gpu["power_w"] == pytest.approx(123.456)
    assert gpu["memory"] == {
        "state": "ok",
        "total_bytes": 80 * GIB,
        "used_bytes": GIB,
        "free_bytes": 80 * GIB - RESERVED - GIB,
        "reserved_bytes": RESERVED,
        "matches_host_memory": False,
        "reason": "",
    }
    assert gpu["processes"] == [{"pid": 4242, "used_gpu_memory_bytes": 3 * GIB, "kind": "compute"}]
    assert gpu["unsupported"] == [] and gpu["errors"] == {}
    assert shutdowns == ["shutdown"]


def test_gb10_like_not_supported_fields(stub_dir: Path) -> None:
    report, shutdowns = _read(
        stub_dir, STUB_MEM_RC="3", STUB_FAN_RC="3", STUB_PCIE_RC="3", STUB_PROC_PID="7"
    )

    [gpu] = report["devices"]
    assert gpu["memory"]["state"] == "not_supported"
    assert gpu["memory"]["total_bytes"] is None
    assert sorted(gpu["unsupported"]) == [
        "fan_speed_pct",
        "memory",
        "pcie_link_gen",
        "pcie_link_width",
    ]
    assert gpu["fan_speed_pct"] is None
    assert gpu["processes"][0]["pid"] == 7
    assert shutdowns == ["shutdown"]


def test_memory_answered_with_zeros(stub_dir: Path) -> None:
    report, _ = _read(stub_dir, STUB_MEM_TOTAL="0")

    assert report["devices"][0]["memory"]["state"] == "not_supported"


def test_process_memory_not_available_becomes_none(stub_dir: Path) -> None:
    report, _ = _read(stub_dir, STUB_PROC_PID="99", STUB_PROC_MEM="na")

    assert report["devices"][0]["processes"] == [
        {"pid": 99, "used_gpu_memory_bytes": None, "kind": "compute"}
    ]


def test_gpu_lost_mid_read(stub_dir: Path) -> None:
    report, shutdowns = _read(stub_dir, STUB_TEMP_RC="15")

    [gpu] = report["devices"]
    assert gpu["lost"] is True
    assert gpu["utilization_gpu_pct"] == 42
    assert gpu["temperature_c"] is None and gpu["power_w"] is None
    assert [(e["kind"], e["severity"]) for e in report["events"]] == [("gpu-lost", "critical")]
    assert shutdowns == ["shutdown"]


def test_kernel_module_not_loaded(stub_dir: Path) -> None:
    report, shutdowns = _read(stub_dir, STUB_INIT_RC="9")

    assert report["state"] == "no_driver"
    assert report["reason"] == "no NVIDIA driver: the NVIDIA kernel module is not loaded"
    assert shutdowns == []


def test_library_and_kernel_module_mismatch(stub_dir: Path) -> None:
    report, shutdowns = _read(stub_dir, STUB_INIT_RC="18")

    assert report["state"] == "error"
    assert "versions differ" in report["reason"]
    assert shutdowns == []
