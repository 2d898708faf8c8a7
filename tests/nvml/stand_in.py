"""A stand-in for the pynvml module, for driving `collectors.nvml.read_gpus` without a GPU.

`StandInNvml` exposes the functions the collector calls (`NVML_FUNCTIONS_USED`), with pynvml's
parameter names, and behaves like pynvml at the Python boundary:

- failures raise pynvml's own exception classes, built the way pynvml builds them:
  `pynvml.NVMLError(code)` returns the matching subclass (`NVMLError_NotSupported` for 3, ...);
- results are pynvml's own ctypes structs (`c_nvmlMemory_t`, `c_nvmlMemory_v2_t`,
  `c_nvmlUtilization_t`) and, for process lists, the same friendly objects pynvml makes from
  `c_nvmlProcessInfo_v3_t`, with "not available" memory turned into None as pynvml does;
- every device call before `nvmlInit` raises `NVMLError_Uninitialized`, and once a device
  reports `GPU_IS_LOST`, every later call on it does too (a GPU that fell off the bus stays off).

Scenario builders at the bottom model the machines the collector must handle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pynvml

GIB = 1 << 30
MIB = 1 << 20


@dataclass(frozen=True)
class Fail:
    """A field that makes NVML answer with this error code."""

    code: int


NOT_SUPPORTED = Fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
GPU_IS_LOST = Fail(pynvml.NVML_ERROR_GPU_IS_LOST)
NO_PERMISSION = Fail(pynvml.NVML_ERROR_NO_PERMISSION)
FUNCTION_NOT_FOUND = Fail(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)


@dataclass(frozen=True)
class Memory:
    """What nvmlDeviceGetMemoryInfo returns; `v2=False` models a driver without the v2 call."""

    total: int
    used: int
    free: int
    reserved: int = 0
    v2: bool = True


@dataclass
class StandInDevice:
    """One device's answers. A `Fail` in any field makes that call raise its error."""

    name: str | Fail = "NVIDIA H100 80GB HBM3"
    uuid: str | Fail = "GPU-00000000-0000-0000-0000-000000000000"
    utilization: tuple[int, int] | Fail = (0, 0)
    temperature_c: int | Fail = 30
    power_mw: int | Fail = 70_000
    power_limit_mw: int | Fail = 700_000
    sm_clock_mhz: int | Fail = 1980
    fan_speed_pct: int | Fail = NOT_SUPPORTED
    pcie_link_gen: int | Fail = 5
    pcie_link_width: int | Fail = 16
    memory: Memory | Fail = field(default_factory=lambda: Memory(80 * GIB, 0, 80 * GIB))
    # (pid, bytes); bytes None means NVML reports the amount as not available.
    compute_processes: list[tuple[int, int | None]] | Fail = field(default_factory=list)
    graphics_processes: list[tuple[int, int | None]] | Fail = field(default_factory=list)
    handle: Fail | None = None
    lost: bool = False


@dataclass(frozen=True)
class _Handle:
    index: int


def _raise(code: int) -> None:
    # pynvml.NVMLError(code) returns the code's subclass, exactly as pynvml's own
    # _nvmlCheckReturn raises it.
    raise pynvml.NVMLError(code)


def _process_list(entries: list[tuple[int, int | None]]) -> list[Any]:
    not_available = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
    result = []
    for pid, used in entries:
        raw = pynvml.c_nvmlProcessInfo_v3_t(
            pid=pid, usedGpuMemory=not_available if used is None else used
        )
        obj = pynvml.nvmlStructToFriendlyObject(raw)
        if obj.usedGpuMemory == not_available:
            obj.usedGpuMemory = None
        result.append(obj)
    return result


class StandInNvml:
    """Plays pynvml for the collector; records calls so tests can check init/shutdown."""

    def __init__(
        self,
        devices: list[StandInDevice] | None = None,
        *,
        init_error: int | None = None,
        count_error: int | None = None,
        driver_version: str = "580.95.05",
        nvml_version: str = "13.580.95.05",
        cuda_driver_version: int = 13000,
    ) -> None:
        self.devices = devices if devices is not None else []
        self.init_error = init_error
        self.count_error = count_error
        self.driver_version = driver_version
        self.nvml_version = nvml_version
        self.cuda_driver_version = cuda_driver_version
        self.initialised = 0
        self.calls: list[str] = []

    # --- library and system ---------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            _raise(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")
        self._check_initialised()
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check_initialised()
        return self.driver_version

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._check_initialised()
        return self.nvml_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check_initialised()
        return self.cuda_driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._check_initialised()
        if self.count_error is not None:
            _raise(self.count_error)
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._check_initialised()
        if not 0 <= index < len(self.devices):
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        device = self.devices[index]
        if device.handle is not None:
            self._fail(device, device.handle)
        return _Handle(index)

    # --- device fields --------------------------------------------------------------------

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        return self._answer(handle, "name")

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        return self._answer(handle, "uuid")

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> pynvml.c_nvmlUtilization_t:
        gpu, memory = self._answer(handle, "utilization")
        return pynvml.c_nvmlUtilization_t(gpu=gpu, memory=memory)

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._answer(handle, "temperature_c")

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        return self._answer(handle, "power_mw")

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: _Handle) -> int:
        return self._answer(handle, "power_limit_mw")

    # `type` shadows the builtin because pynvml names the parameter so.
    def nvmlDeviceGetClockInfo(self, handle: _Handle, type: int) -> int:
        if type != pynvml.NVML_CLOCK_SM:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._answer(handle, "sm_clock_mhz")

    def nvmlDeviceGetFanSpeed(self, handle: _Handle) -> int:
        return self._answer(handle, "fan_speed_pct")

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: _Handle) -> int:
        return self._answer(handle, "pcie_link_gen")

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: _Handle) -> int:
        return self._answer(handle, "pcie_link_width")

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> Any:
        memory: Memory = self._answer(handle, "memory")
        if not version:
            # v1: "used" includes the driver's reservation.
            return pynvml.c_nvmlMemory_t(
                total=memory.total, used=memory.used + memory.reserved, free=memory.free
            )
        if not memory.v2:
            _raise(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return pynvml.c_nvmlMemory_v2_t(
            version=version,
            total=memory.total,
            reserved=memory.reserved,
            used=memory.used,
            free=memory.free,
        )

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[Any]:
        return _process_list(self._answer(handle, "compute_processes"))

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: _Handle) -> list[Any]:
        return _process_list(self._answer(handle, "graphics_processes"))

    # --- plumbing -------------------------------------------------------------------------

    def _check_initialised(self) -> None:
        if self.initialised <= 0:
            _raise(pynvml.NVML_ERROR_UNINITIALIZED)

    def _answer(self, handle: _Handle, name: str) -> Any:
        self.calls.append(name)
        self._check_initialised()
        device = self.devices[handle.index]
        if device.lost:
            _raise(pynvml.NVML_ERROR_GPU_IS_LOST)
        value = getattr(device, name)
        if isinstance(value, Fail):
            self._fail(device, value)
        return value

    @staticmethod
    def _fail(device: StandInDevice, failure: Fail) -> None:
        if failure.code == pynvml.NVML_ERROR_GPU_IS_LOST:
            device.lost = True
        _raise(failure.code)


# --- scenarios ------------------------------------------------------------------------------

GB10_VLLM_PIDS = (41_234, 41_877)
GB10_GRAPHICS_PID = 2_101


def gb10(**overrides: Any) -> StandInDevice:
    """A DGX Spark: memory and fan/PCIe Not Supported; utilization, temperature, power, SM clock
    and per-process memory work (two vLLM engines and the desktop's graphics process)."""
    values: dict[str, Any] = {
        "name": "NVIDIA GB10",
        "uuid": "GPU-2dee1e25-b3b5-007e-2b55-79f2d0f2ebe5",
        "utilization": (37, 0),
        "temperature_c": 54,
        "power_mw": 11_170,
        # Not established for GB10; modelled as not supported so both paths stay covered.
        "power_limit_mw": NOT_SUPPORTED,
        "sm_clock_mhz": 2405,
        "fan_speed_pct": NOT_SUPPORTED,
        "pcie_link_gen": NOT_SUPPORTED,
        "pcie_link_width": NOT_SUPPORTED,
        "memory": NOT_SUPPORTED,
        "compute_processes": [(GB10_VLLM_PIDS[0], 40 * GIB), (GB10_VLLM_PIDS[1], 24 * GIB)],
        "graphics_processes": [(GB10_GRAPHICS_PID, 43 * MIB)],
    }
    values.update(overrides)
    return StandInDevice(**values)


def gb10_zero_memory() -> StandInDevice:
    """A GB10 driver that answers the memory query with success and all zeros."""
    return gb10(memory=Memory(total=0, used=0, free=0, v2=False))


def gb10_host_memory(host_total: int) -> StandInDevice:
    """A GB10 driver that answers the memory query with the host's RAM figures."""
    return gb10(memory=Memory(total=host_total, used=7 * GIB, free=host_total - 7 * GIB))


def h100(index: int = 0, **overrides: Any) -> StandInDevice:
    """A datacenter GPU where everything but the fan works (passively cooled)."""
    total = 81_559 * MIB
    values: dict[str, Any] = {
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": f"GPU-5b6f3a2e-1c4d-4e8f-9a0b-{index:012x}",
        "utilization": (92, 61),
        "temperature_c": 63,
        "power_mw": 512_345,
        "power_limit_mw": 700_000,
        "sm_clock_mhz": 1980,
        "memory": Memory(
            total=total, reserved=529 * MIB, used=70 * GIB, free=total - 529 * MIB - 70 * GIB
        ),
        "compute_processes": [(5_001, 70 * GIB - 512 * MIB), (5_002, None), (5_003, 256 * MIB)],
        "graphics_processes": [(5_003, 256 * MIB)],
    }
    values.update(overrides)
    return StandInDevice(**values)
