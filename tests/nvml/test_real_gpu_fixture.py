"""The collector's output from a real NVIDIA H200, checked against nvidia-smi's own view.

`tests/fixtures/nvml/h200_*` were captured by `tests/nvml/capture_fixture.py` on a machine with
an H200 (while a helper process held 1 GiB of GPU memory). These tests need no GPU: they prove
that the real-driver path produced sensible values and that the stored shape still round-trips
through `GpuReport`.
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from collectors.nvml import GpuReport

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvml"
MIB = 1 << 20


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    return json.loads((FIXTURES / "h200_real.json").read_text())


@pytest.fixture(scope="module")
def capture() -> dict[str, Any]:
    return json.loads((FIXTURES / "h200_capture.json").read_text())


@pytest.fixture(scope="module")
def smi_text() -> str:
    return (FIXTURES / "h200_nvidia_smi.txt").read_text()


def _csv_after(smi_text: str, command_prefix: str) -> list[dict[str, str]]:
    """Rows of the CSV that follows the `$ <command>` line starting with `command_prefix`."""
    section = smi_text.split(f"$ {command_prefix}", 1)[1].split("\n$ ", 1)[0]
    lines = section.splitlines()[1:]
    reader = csv.DictReader(io.StringIO("\n".join(lines)), skipinitialspace=True)
    return list(reader)


@pytest.fixture(scope="module")
def smi_gpu(smi_text: str) -> dict[str, str]:
    [row] = _csv_after(smi_text, "nvidia-smi --query-gpu=")
    return row


def _mib(value: str) -> int:
    return int(value.split()[0])


def test_fixture_round_trips_through_gpu_report(report: dict[str, Any]) -> None:
    # Equal after a round trip also means the fixture has every key the collector writes now.
    assert GpuReport.from_dict(report).as_dict() == report


def test_real_gpu_report_is_ok(report: dict[str, Any]) -> None:
    assert report["state"] == "ok"
    assert report["reason"] == ""
    assert report["events"] == []
    assert report["errors"] == {}
    assert len(report["devices"]) >= 1
    gpu = report["devices"][0]
    assert "H200" in gpu["name"]
    assert gpu["lost"] is False
    assert gpu["errors"] == {}


def test_versions_match_nvidia_smi(report: dict[str, Any], smi_text: str) -> None:
    driver = re.search(r"Driver Version:\s*(\S+)", smi_text)
    cuda = re.search(r"CUDA Version:\s*(\S+)", smi_text)
    assert driver and cuda
    assert report["driver_version"] == driver.group(1)
    assert report["cuda_driver_version"] == cuda.group(1)
    assert report["nvml_version"].endswith(driver.group(1))


def test_sensor_values_are_plausible_and_agree_with_nvidia_smi(
    report: dict[str, Any], smi_gpu: dict[str, str]
) -> None:
    gpu = report["devices"][0]
    assert gpu["uuid"] == smi_gpu["uuid"]
    assert 10 <= gpu["temperature_c"] <= 95
    assert abs(gpu["temperature_c"] - int(smi_gpu["temperature.gpu"])) <= 5
    assert 0 < gpu["power_w"] <= gpu["power_limit_w"]
    assert gpu["power_limit_w"] == pytest.approx(float(smi_gpu["power.limit [W]"].split()[0]))
    assert gpu["sm_clock_mhz"] > 0
    assert 0 <= gpu["utilization_gpu_pct"] <= 100
    assert gpu["pcie_link_gen"] == int(smi_gpu["pcie.link.gen.current"])
    assert gpu["pcie_link_width"] == int(smi_gpu["pcie.link.width.current"])


def test_fan_is_not_supported_on_a_passively_cooled_gpu(
    report: dict[str, Any], smi_gpu: dict[str, str]
) -> None:
    gpu = report["devices"][0]
    assert smi_gpu["fan.speed [%]"] == "[N/A]"
    assert gpu["fan_speed_pct"] is None
    assert "fan_speed_pct" in gpu["unsupported"]


def test_memory_is_supported_and_matches_nvidia_smi(
    report: dict[str, Any], smi_gpu: dict[str, str]
) -> None:
    memory = report["devices"][0]["memory"]
    assert memory["state"] == "ok"
    assert memory["matches_host_memory"] is False
    assert memory["total_bytes"] == _mib(smi_gpu["memory.total [MiB]"]) * MIB
    assert memory["reserved_bytes"] is not None
    parts = memory["reserved_bytes"] + memory["used_bytes"] + memory["free_bytes"]
    assert parts == memory["total_bytes"]
    # Same moment, same process set: nvidia-smi's "used" is NVML's v2 "used".
    assert abs(memory["used_bytes"] // MIB - _mib(smi_gpu["memory.used [MiB]"])) <= 64


def test_holder_process_is_reported_with_its_memory(
    report: dict[str, Any], capture: dict[str, Any], smi_text: str
) -> None:
    processes = {p["pid"]: p for p in report["devices"][0]["processes"]}
    holder = processes[capture["holder_pid"]]
    assert holder["kind"] == "compute"
    assert holder["used_gpu_memory_bytes"] >= capture["holder_bytes"]
    smi_apps = {
        int(row["pid"]): _mib(row["used_gpu_memory [MiB]"])
        for row in _csv_after(smi_text, "nvidia-smi --query-compute-apps=")
    }
    assert smi_apps[capture["holder_pid"]] == holder["used_gpu_memory_bytes"] // MIB
