"""read_gpus() against the pynvml stand-in, and against the real pynvml on a GPU-less machine."""

from __future__ import annotations

import ctypes
import inspect
import json

import pynvml
import pytest

from collectors.nvml import NVML_FUNCTIONS_USED, GpuReport, read_gpus
from tests.nvml.stand_in import (
    FUNCTION_NOT_FOUND,
    GB10_GRAPHICS_PID,
    GB10_VLLM_PIDS,
    GIB,
    GPU_IS_LOST,
    MIB,
    NO_PERMISSION,
    Memory,
    StandInNvml,
    gb10,
    gb10_host_memory,
    gb10_zero_memory,
    h100,
)

# A discrete GPU's host: far more RAM than one GPU has, so no total looks like host memory.
BIG_HOST = 2048 * GIB


def _read(nvml: StandInNvml, host_memory_bytes: int = BIG_HOST) -> GpuReport:
    report = read_gpus(nvml, host_memory_bytes=host_memory_bytes)
    # Whatever happened, the report must be JSON-ready and survive a round trip.
    data = json.loads(json.dumps(report.as_dict()))
    assert GpuReport.from_dict(data).as_dict() == data
    return report


def _assert_closed(nvml: StandInNvml) -> None:
    assert nvml.calls[0] == "nvmlInit"
    assert nvml.calls.count("nvmlShutdown") == 1
    assert nvml.initialised == 0


def test_gb10_memory_not_supported_is_a_state_not_zero() -> None:
    nvml = StandInNvml([gb10()])

    report = _read(nvml)

    assert report.state == "ok"
    assert report.reason == ""
    assert (report.driver_version, report.cuda_driver_version) == ("580.95.05", "13.0")
    [gpu] = report.devices
    assert gpu.name == "NVIDIA GB10"
    assert gpu.memory.state == "not_supported"
    assert gpu.as_dict()["memory"]["total_bytes"] is None
    assert gpu.as_dict()["memory"]["used_bytes"] is None
    for name in ("memory", "fan_speed_pct", "pcie_link_gen", "pcie_link_width"):
        assert name in gpu.unsupported
    assert gpu.fan_speed_pct is None and gpu.pcie_link_gen is None
    assert gpu.errors == {}
    _assert_closed(nvml)


def test_gb10_fields_that_work_are_read() -> None:
    report = _read(StandInNvml([gb10()]))

    [gpu] = report.devices
    assert gpu.utilization_gpu_pct == 37
    assert gpu.temperature_c == 54
    assert gpu.power_w == pytest.approx(11.17)
    assert gpu.sm_clock_mhz == 2405
    assert not gpu.lost
    assert report.events == []


def test_gb10_processes_carry_their_own_memory() -> None:
    report = _read(StandInNvml([gb10()]))

    processes = {p.pid: p for p in report.devices[0].processes or []}
    assert processes[GB10_VLLM_PIDS[0]].used_gpu_memory_bytes == 40 * GIB
    assert processes[GB10_VLLM_PIDS[0]].kind == "compute"
    assert processes[GB10_VLLM_PIDS[1]].used_gpu_memory_bytes == 24 * GIB
    assert processes[GB10_GRAPHICS_PID].kind == "graphics"
    assert report.pids() == {*GB10_VLLM_PIDS, GB10_GRAPHICS_PID}


def test_driver_answering_zeros_for_memory_is_not_supported() -> None:
    report = _read(StandInNvml([gb10_zero_memory()]))

    memory = report.devices[0].memory
    assert memory.state == "not_supported"
    assert memory.total_bytes is None and memory.free_bytes is None
    assert "0 bytes" in memory.reason
    assert "memory" in report.devices[0].unsupported


def test_driver_answering_host_totals_is_flagged() -> None:
    host = 121_690 * MIB
    report = _read(StandInNvml([gb10_host_memory(host)]), host_memory_bytes=host)

    memory = report.devices[0].memory
    assert memory.state == "ok"
    assert memory.total_bytes == host
    assert memory.matches_host_memory is True
    assert "host" in memory.reason


def test_datacenter_gpu_reads_every_supported_field() -> None:
    nvml = StandInNvml([h100(0), h100(1)])

    report = _read(nvml)

    assert report.state == "ok"
    assert [d.index for d in report.devices] == [0, 1]
    gpu = report.devices[0]
    assert (gpu.utilization_gpu_pct, gpu.utilization_memory_pct) == (92, 61)
    assert gpu.power_w == pytest.approx(512.345)
    assert gpu.power_limit_w == pytest.approx(700.0)
    assert (gpu.pcie_link_gen, gpu.pcie_link_width) == (5, 16)
    assert gpu.unsupported == ["fan_speed_pct"]
    memory = gpu.memory
    assert memory.state == "ok"
    assert memory.matches_host_memory is False
    assert memory.reserved_bytes == 529 * MIB
    assert memory.used_bytes == 70 * GIB
    assert memory.total_bytes == memory.reserved_bytes + memory.used_bytes + memory.free_bytes
    _assert_closed(nvml)


def test_process_memory_not_available_is_none_and_c_plus_g_is_merged() -> None:
    report = _read(StandInNvml([h100()]))

    processes = {p.pid: p for p in report.devices[0].processes or []}
    assert processes[5_002].used_gpu_memory_bytes is None
    assert processes[5_003].kind == "compute+graphics"
    assert processes[5_003].used_gpu_memory_bytes == 256 * MIB
    assert len(processes) == 3


def test_driver_without_memory_v2_falls_back_to_v1() -> None:
    total = 81_559 * MIB
    old = Memory(total=total, reserved=529 * MIB, used=GIB, free=total - 529 * MIB - GIB, v2=False)

    report = _read(StandInNvml([h100(memory=old)]))

    memory = report.devices[0].memory
    assert memory.state == "ok"
    assert memory.reserved_bytes is None
    assert memory.used_bytes == GIB + 529 * MIB  # v1 counts the reservation as used


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "no NVIDIA driver: libnvidia-ml.so.1 not found"),
        (
            pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
            "no NVIDIA driver: the NVIDIA kernel module is not loaded",
        ),
    ],
)
def test_no_driver_is_a_state_with_a_clear_reason(code: int, reason: str) -> None:
    nvml = StandInNvml([h100()], init_error=code)

    report = _read(nvml)

    assert report.state == "no_driver"
    assert report.reason == reason
    assert report.devices == []
    # Init failed, so there is nothing to shut down.
    assert nvml.calls == ["nvmlInit"]


def test_library_and_kernel_module_version_mismatch_is_an_error() -> None:
    nvml = StandInNvml([h100()], init_error=pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)

    report = _read(nvml)

    assert report.state == "error"
    assert "versions differ" in report.reason
    assert nvml.calls == ["nvmlInit"]


def test_other_init_failures_are_errors_with_nvml_message() -> None:
    report = _read(StandInNvml(init_error=pynvml.NVML_ERROR_NO_PERMISSION))

    assert report.state == "error"
    assert report.reason == "NVML initialisation failed: Insufficient Permissions"


def test_gpu_lost_mid_read_marks_the_device_and_raises_a_critical_event() -> None:
    nvml = StandInNvml([h100(0, temperature_c=GPU_IS_LOST), h100(1)])

    report = _read(nvml)

    assert report.state == "ok"
    assert "GPU 0" in report.reason
    lost, healthy = report.devices
    assert lost.lost is True
    # Read before the loss: kept. From the loss on: unknown, never 0.
    assert lost.name == "NVIDIA H100 80GB HBM3"
    assert lost.utilization_gpu_pct == 92
    assert lost.temperature_c is None and lost.power_w is None and lost.sm_clock_mhz is None
    assert lost.memory.state == "unknown"
    assert lost.processes is None
    assert lost.errors == {"temperature_c": "GPU is lost"}
    [event] = report.events
    assert (event.kind, event.severity, event.device_index) == ("gpu-lost", "critical", 0)
    assert lost.uuid is not None and lost.uuid in event.message
    # The loss is not read again and again: NVML calls on a lost GPU can each take long.
    assert nvml.calls.count("power_mw") == 1  # device 1's only
    assert healthy.lost is False and healthy.temperature_c == 63
    _assert_closed(nvml)


def test_gpu_lost_before_its_handle_is_still_reported() -> None:
    report = _read(StandInNvml([h100(handle=GPU_IS_LOST)]))

    [gpu] = report.devices
    assert gpu.lost is True and gpu.name is None
    assert [e.kind for e in report.events] == ["gpu-lost"]


def test_a_failing_field_records_nvml_message_and_leaves_the_rest() -> None:
    nvml = StandInNvml([h100(power_mw=NO_PERMISSION, graphics_processes=FUNCTION_NOT_FOUND)])

    report = _read(nvml)

    gpu = report.devices[0]
    assert gpu.power_w is None
    assert gpu.errors == {
        "power_w": "Insufficient Permissions",
        "graphics_processes": "Function Not Found",
    }
    assert "power_w" not in gpu.unsupported
    assert gpu.temperature_c == 63
    # Compute processes were read, so the list is there (partial, as errors say).
    assert gpu.processes is not None and len(gpu.processes) == 3


def test_both_process_lists_failing_gives_none_not_an_empty_list() -> None:
    device = h100(compute_processes=NO_PERMISSION, graphics_processes=NO_PERMISSION)

    report = _read(StandInNvml([device]))

    assert report.devices[0].processes is None
    assert report.as_dict()["devices"][0]["processes"] is None


def test_count_failure_is_an_error_and_still_shuts_down() -> None:
    nvml = StandInNvml([h100()], count_error=pynvml.NVML_ERROR_UNKNOWN)

    report = _read(nvml)

    assert report.state == "error"
    assert report.reason == "NVML could not count GPUs: Unknown Error"
    assert report.errors == {"device_count": "Unknown Error"}
    _assert_closed(nvml)


def test_no_gpus_is_ok_with_a_reason() -> None:
    report = _read(StandInNvml([]))

    assert (report.state, report.reason, report.devices) == ("ok", "NVML found no GPUs", [])


def test_a_bug_below_still_shuts_nvml_down() -> None:
    class Broken(StandInNvml):
        def nvmlDeviceGetName(self, handle: object) -> str:
            raise RuntimeError("bug")

    nvml = Broken([h100()])

    with pytest.raises(RuntimeError):
        read_gpus(nvml)
    assert nvml.initialised == 0


def test_from_dict_rejects_an_unknown_state() -> None:
    with pytest.raises(ValueError, match="unknown GPU report state"):
        GpuReport.from_dict({"state": "fine"})


def test_stand_in_matches_pynvml_function_names_and_parameters() -> None:
    stand_in = StandInNvml()
    for name in NVML_FUNCTIONS_USED:
        real = inspect.signature(getattr(pynvml, name))
        ours = inspect.signature(getattr(stand_in, name))
        assert list(ours.parameters) == list(real.parameters), name


def _nvml_library_loads() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def test_real_pynvml_without_a_driver_reports_no_driver() -> None:
    if _nvml_library_loads():
        pytest.skip("this machine has an NVIDIA driver; the real-GPU fixture covers that path")

    report = read_gpus()

    assert report.state == "no_driver"
    assert report.reason == "no NVIDIA driver: libnvidia-ml.so.1 not found"
    assert report.as_dict()["devices"] == []
