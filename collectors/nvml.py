"""The NVML seam: the one module in SparkOps that talks to the NVIDIA driver's management library.

`read_gpus()` opens NVML, reads every device field by field, closes NVML and returns a
`GpuReport`. It never raises for a driver problem: a machine without a driver, a driver whose
kernel module is not loaded, a driver/library version mismatch and a GPU that falls off the bus
are all states in the report, because a dashboard must show them rather than crash.

Why field by field: NVML support differs per device. On a DGX Spark (GB10) the memory is unified
with the CPU, so `nvmlDeviceGetMemoryInfo` raises `NVMLError_NotSupported` (some drivers instead
answer with zeros or the host's totals), and fan and PCIe queries are not supported either, while
utilization, temperature, power, SM clock and per-process memory work. A field NVML cannot give
is recorded in the device's `unsupported` list (or its `errors` map, with NVML's message) and its
value is None, never 0: "unknown" must not look like "idle".

GPU memory on a GB10 has to come from `/proc/meminfo` instead; that is another seam's job.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import pynvml

logger = logging.getLogger(__name__)

ReportState = Literal["ok", "no_driver", "error"]
MemoryState = Literal["ok", "not_supported", "error", "unknown"]

# Every pynvml function the collector calls. Test stand-ins implement exactly these names; a
# test checks that pynvml still has them all.
NVML_FUNCTIONS_USED: tuple[str, ...] = (
    "nvmlInit",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetNVMLVersion",
    "nvmlSystemGetCudaDriverVersion",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetFanSpeed",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses",
)

# pynvml raises this (not an NVMLError) when an unversioned call such as
# nvmlDeviceGetComputeRunningProcesses finds no matching symbol in an older driver library.
_LIBRARY_MISMATCH: tuple[type[Exception], ...] = tuple(
    cls for cls in (getattr(pynvml, "NVMLLibraryMismatchError", None),) if cls is not None
)

# The v2 memory query splits the driver's reservation out of "used", as nvidia-smi does.
_MEMORY_V2: int | None = getattr(pynvml, "nvmlMemory_v2", None)
_MEMORY_V2_FALLBACK: tuple[type[Exception], ...] = tuple(
    getattr(pynvml, name)
    for name in (
        "NVMLError_FunctionNotFound",
        "NVMLError_ArgumentVersionMismatch",
        "NVMLError_NotSupported",
    )
    if hasattr(pynvml, name)
)

# NVML's total can be the host's RAM on unified-memory devices (GB10 on some drivers). A total
# within this fraction of the host's physical memory is flagged rather than trusted as VRAM.
_HOST_MEMORY_TOLERANCE = 0.03

_T = TypeVar("_T")


@dataclass(frozen=True)
class GpuMemory:
    """Device memory as NVML reports it, or why it does not.

    `state` is "ok" (the byte counts are set), "not_supported" (NVML raised NotSupported, or
    answered with a total of 0, as unified-memory GB10 drivers do), "error" (`reason` holds
    NVML's message) or "unknown" (not read because the device was lost first). When state is
    "ok" and `matches_host_memory` is True, the total is about the host's physical memory: on a
    unified-memory device that is host RAM, not memory reserved for the GPU.

    With NVML's v2 query (drivers since R510) total = reserved + used + free, and `used_bytes`
    matches nvidia-smi's "Memory-Usage". Where only v1 exists, `reserved_bytes` is None and
    `used_bytes` includes the driver's reservation (about 600 MiB on an H200).
    """

    state: MemoryState
    total_bytes: int | None = None
    used_bytes: int | None = None
    free_bytes: int | None = None
    reserved_bytes: int | None = None
    matches_host_memory: bool = False
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "total_bytes": self.total_bytes,
            "used_bytes": self.used_bytes,
            "free_bytes": self.free_bytes,
            "reserved_bytes": self.reserved_bytes,
            "matches_host_memory": self.matches_host_memory,
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GpuMemory:
        return cls(
            state=data["state"],
            total_bytes=data.get("total_bytes"),
            used_bytes=data.get("used_bytes"),
            free_bytes=data.get("free_bytes"),
            reserved_bytes=data.get("reserved_bytes"),
            matches_host_memory=bool(data.get("matches_host_memory", False)),
            reason=data.get("reason", ""),
        )


@dataclass(frozen=True)
class GpuProcess:
    """A process holding a context on a GPU.

    `pid` is in the host PID namespace: NVML reports host PIDs, so matching them to containers
    or to `/proc` only works when SparkOps itself runs in the host PID namespace.
    `used_gpu_memory_bytes` is None when NVML reports the amount as not available (it does so
    for callers outside the host PID namespace, and on some platforms always). `kind` is
    "compute", "graphics" or "compute+graphics" (nvidia-smi's C, G and C+G).
    """

    pid: int
    used_gpu_memory_bytes: int | None
    kind: str = "compute"

    def as_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "used_gpu_memory_bytes": self.used_gpu_memory_bytes,
            "kind": self.kind,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GpuProcess:
        return cls(
            pid=int(data["pid"]),
            used_gpu_memory_bytes=data.get("used_gpu_memory_bytes"),
            kind=data.get("kind", "compute"),
        )


@dataclass(frozen=True)
class GpuEvent:
    """Something an admin must hear about now, e.g. kind "gpu-lost" with severity "critical"."""

    kind: str
    severity: str
    message: str
    device_index: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "severity": self.severity,
            "message": self.message,
            "device_index": self.device_index,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GpuEvent:
        return cls(
            kind=data["kind"],
            severity=data["severity"],
            message=data["message"],
            device_index=data.get("device_index"),
        )


@dataclass
class GpuDevice:
    """One GPU's reading.

    Contract: a value field is None exactly when its name is in `unsupported` (NVML said Not
    Supported), in `errors` (NVML failed; the map holds its message), or the device was `lost`
    before the field was read. Units: percent, degrees Celsius, watts, MHz, bytes.
    `processes` is None when neither process list could be read; `unsupported` and `errors` may
    also name the calls "handle", "compute_processes" and "graphics_processes".
    """

    index: int
    name: str | None = None
    uuid: str | None = None
    lost: bool = False
    utilization_gpu_pct: int | None = None
    utilization_memory_pct: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: int | None = None
    fan_speed_pct: int | None = None
    pcie_link_gen: int | None = None
    pcie_link_width: int | None = None
    memory: GpuMemory = field(default_factory=lambda: GpuMemory(state="unknown"))
    processes: list[GpuProcess] | None = None
    unsupported: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "uuid": self.uuid,
            "lost": self.lost,
            "utilization_gpu_pct": self.utilization_gpu_pct,
            "utilization_memory_pct": self.utilization_memory_pct,
            "temperature_c": self.temperature_c,
            "power_w": self.power_w,
            "power_limit_w": self.power_limit_w,
            "sm_clock_mhz": self.sm_clock_mhz,
            "fan_speed_pct": self.fan_speed_pct,
            "pcie_link_gen": self.pcie_link_gen,
            "pcie_link_width": self.pcie_link_width,
            "memory": self.memory.as_dict(),
            "processes": (
                None if self.processes is None else [p.as_dict() for p in self.processes]
            ),
            "unsupported": list(self.unsupported),
            "errors": dict(self.errors),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GpuDevice:
        processes = data.get("processes")
        return cls(
            index=int(data["index"]),
            name=data.get("name"),
            uuid=data.get("uuid"),
            lost=bool(data.get("lost", False)),
            utilization_gpu_pct=data.get("utilization_gpu_pct"),
            utilization_memory_pct=data.get("utilization_memory_pct"),
            temperature_c=data.get("temperature_c"),
            power_w=data.get("power_w"),
            power_limit_w=data.get("power_limit_w"),
            sm_clock_mhz=data.get("sm_clock_mhz"),
            fan_speed_pct=data.get("fan_speed_pct"),
            pcie_link_gen=data.get("pcie_link_gen"),
            pcie_link_width=data.get("pcie_link_width"),
            memory=GpuMemory.from_dict(data["memory"]),
            processes=None if processes is None else [GpuProcess.from_dict(p) for p in processes],
            unsupported=list(data.get("unsupported", [])),
            errors=dict(data.get("errors", {})),
        )


@dataclass
class GpuReport:
    """What one `read_gpus()` call saw.

    `state` is "ok" (NVML answered; devices may still be lost, see `events`), "no_driver" (no
    NVML library, or the kernel driver is not loaded) or "error" (NVML is there but unusable,
    e.g. after a driver upgrade without a reboot). `reason` is one line for people; it is empty
    when state is "ok" and nothing is wrong. System-level fields follow GpuDevice's contract,
    with their own `unsupported` and `errors`.
    """

    state: ReportState
    reason: str = ""
    driver_version: str | None = None
    nvml_version: str | None = None
    cuda_driver_version: str | None = None
    devices: list[GpuDevice] = field(default_factory=list)
    events: list[GpuEvent] = field(default_factory=list)
    unsupported: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; unknown values are None."""
        return {
            "state": self.state,
            "reason": self.reason,
            "driver_version": self.driver_version,
            "nvml_version": self.nvml_version,
            "cuda_driver_version": self.cuda_driver_version,
            "devices": [d.as_dict() for d in self.devices],
            "events": [e.as_dict() for e in self.events],
            "unsupported": list(self.unsupported),
            "errors": dict(self.errors),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GpuReport:
        """Rebuild a report from `as_dict()` output (e.g. a stored sample or a fixture)."""
        state = data["state"]
        if state not in ("ok", "no_driver", "error"):
            raise ValueError(f"unknown GPU report state {state!r}")
        return cls(
            state=state,
            reason=data.get("reason", ""),
            driver_version=data.get("driver_version"),
            nvml_version=data.get("nvml_version"),
            cuda_driver_version=data.get("cuda_driver_version"),
            devices=[GpuDevice.from_dict(d) for d in data.get("devices", [])],
            events=[GpuEvent.from_dict(e) for e in data.get("events", [])],
            unsupported=list(data.get("unsupported", [])),
            errors=dict(data.get("errors", {})),
        )

    def pids(self) -> set[int]:
        """Every PID that holds a context on any device in this report."""
        return {p.pid for d in self.devices for p in (d.processes or [])}


class _FieldReader:
    """Runs one NVML call per field and files its failure under that field.

    Once a call says the GPU is lost, later calls are skipped: each would fail the same way,
    and on a GPU that fell off the bus every call can take a long time.
    """

    def __init__(self, *, skip_after_lost: bool = True) -> None:
        self.unsupported: list[str] = []
        self.errors: dict[str, str] = {}
        self.lost_message: str | None = None
        self._skip_after_lost = skip_after_lost

    def read(self, fields: tuple[str, ...], call: Callable[[], _T]) -> _T | None:
        if self._skip_after_lost and self.lost_message is not None:
            return None
        try:
            return call()
        except pynvml.NVMLError_NotSupported:
            self.unsupported.extend(fields)
        except pynvml.NVMLError_GpuIsLost as exc:
            self.lost_message = str(exc)
            self.errors.update(dict.fromkeys(fields, str(exc)))
        except pynvml.NVMLError as exc:
            self.errors.update(dict.fromkeys(fields, str(exc)))
        except _LIBRARY_MISMATCH as exc:
            self.errors.update(dict.fromkeys(fields, str(exc)))
        return None


def read_gpus(nvml: Any = pynvml, *, host_memory_bytes: int | None = None) -> GpuReport:
    """Read every GPU NVML can see, and never raise for a driver or device problem.

    `nvml` is the pynvml module, or a test stand-in with the same function names
    (`NVML_FUNCTIONS_USED`) that raises pynvml's own exception classes. `host_memory_bytes` is
    the host's physical memory, used only to flag a memory total that is really host RAM;
    by default it is read from the OS.

    Cost: one nvmlInit/nvmlShutdown pair and about 20 NVML calls per device. nvmlInit can take
    a second or more on a node without the persistence daemon, so call this from a periodic
    collector task, not from a web request. Where pynvml found no NVML library, nothing is
    asked for :data:`NO_LIBRARY_RECHECK_SECONDS`: the same report comes back.
    """
    global _no_library_until
    if nvml is pynvml and time.monotonic() < _no_library_until:
        return GpuReport(state="no_driver", reason=_NO_LIBRARY)
    try:
        nvml.nvmlInit()
    except (pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError_DriverNotLoaded) as exc:
        if nvml is pynvml and isinstance(exc, pynvml.NVMLError_LibraryNotFound):
            _no_library_until = time.monotonic() + NO_LIBRARY_RECHECK_SECONDS
        return GpuReport(state="no_driver", reason=_no_driver_reason(exc))
    except pynvml.NVMLError_LibRmVersionMismatch:
        return GpuReport(
            state="error",
            reason=(
                "NVIDIA driver and NVML library versions differ (driver upgraded without a "
                "reboot or module reload)"
            ),
        )
    except pynvml.NVMLError as exc:
        return GpuReport(state="error", reason=f"NVML initialisation failed: {exc}")
    try:
        return _read_initialised(nvml, host_memory_bytes)
    finally:
        _shutdown(nvml)


# pynvml's nvmlInit asks the dynamic loader for libnvidia-ml.so.1 again at every call while it
# has not loaded it (pynvml.py, _LoadNvmlLibrary), a search of the library path each collection
# on a node without the driver. That answer changes only when a driver is installed, so it is
# taken as it stands for this long (monotonic clock) in this process.
NO_LIBRARY_RECHECK_SECONDS = 300.0
_no_library_until = 0.0
_NO_LIBRARY = "no NVIDIA driver: libnvidia-ml.so.1 not found"


def _no_driver_reason(exc: Exception) -> str:
    if isinstance(exc, pynvml.NVMLError_LibraryNotFound):
        return _NO_LIBRARY
    return "no NVIDIA driver: the NVIDIA kernel module is not loaded"


def _shutdown(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except pynvml.NVMLError as exc:
        # The reading is already complete; a failed shutdown only leaks NVML's own state.
        logger.warning("nvmlShutdown failed: %s", exc)


def _read_initialised(nvml: Any, host_memory_bytes: int | None) -> GpuReport:
    # System calls are not skipped after a lost GPU: the other devices still need counting.
    system = _FieldReader(skip_after_lost=False)
    report = GpuReport(state="ok")
    report.driver_version = system.read(("driver_version",), nvml.nvmlSystemGetDriverVersion)
    report.nvml_version = system.read(("nvml_version",), nvml.nvmlSystemGetNVMLVersion)
    cuda = system.read(("cuda_driver_version",), nvml.nvmlSystemGetCudaDriverVersion)
    report.cuda_driver_version = None if cuda is None else _cuda_version_string(cuda)
    count = system.read(("device_count",), nvml.nvmlDeviceGetCount)
    report.unsupported = system.unsupported
    report.errors = system.errors
    if system.lost_message is not None:
        report.events.append(
            GpuEvent("gpu-lost", "critical", f"NVML reports a lost GPU: {system.lost_message}")
        )
    if count is None:
        report.state = "error"
        why = system.errors.get("device_count", "Not Supported")
        report.reason = f"NVML could not count GPUs: {why}"
        return report
    if count == 0:
        report.reason = "NVML found no GPUs"
        return report

    host_total = host_memory_bytes if host_memory_bytes is not None else _host_memory_bytes()
    for index in range(count):
        device, event = _read_device(nvml, index, host_total)
        report.devices.append(device)
        if event is not None:
            report.events.append(event)
    lost = [d.index for d in report.devices if d.lost]
    if lost:
        report.reason = "GPU lost: " + ", ".join(f"GPU {i}" for i in lost)
    return report


def _read_device(
    nvml: Any, index: int, host_total: int | None
) -> tuple[GpuDevice, GpuEvent | None]:
    reader = _FieldReader()
    device = GpuDevice(index=index)
    handle = reader.read(("handle",), lambda: nvml.nvmlDeviceGetHandleByIndex(index))
    if handle is not None:
        _read_fields(nvml, handle, device, reader, host_total)
    device.unsupported = reader.unsupported
    device.errors = reader.errors
    if reader.lost_message is None:
        return device, None
    device.lost = True
    label = f"GPU {index}" + (f" ({device.uuid})" if device.uuid else "")
    event = GpuEvent(
        kind="gpu-lost",
        severity="critical",
        message=f"{label} is lost: {reader.lost_message}; it needs a reset or a reboot",
        device_index=index,
    )
    return device, event


def _read_fields(
    nvml: Any, handle: Any, device: GpuDevice, reader: _FieldReader, host_total: int | None
) -> None:
    device.name = reader.read(("name",), lambda: nvml.nvmlDeviceGetName(handle))
    device.uuid = reader.read(("uuid",), lambda: nvml.nvmlDeviceGetUUID(handle))
    utilization = reader.read(
        ("utilization_gpu_pct", "utilization_memory_pct"),
        lambda: nvml.nvmlDeviceGetUtilizationRates(handle),
    )
    if utilization is not None:
        device.utilization_gpu_pct = int(utilization.gpu)
        device.utilization_memory_pct = int(utilization.memory)
    device.temperature_c = reader.read(
        ("temperature_c",),
        lambda: nvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
    )
    power_mw = reader.read(("power_w",), lambda: nvml.nvmlDeviceGetPowerUsage(handle))
    device.power_w = None if power_mw is None else power_mw / 1000
    limit_mw = reader.read(("power_limit_w",), lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle))
    device.power_limit_w = None if limit_mw is None else limit_mw / 1000
    device.sm_clock_mhz = reader.read(
        ("sm_clock_mhz",), lambda: nvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
    )
    device.fan_speed_pct = reader.read(
        ("fan_speed_pct",), lambda: nvml.nvmlDeviceGetFanSpeed(handle)
    )
    device.pcie_link_gen = reader.read(
        ("pcie_link_gen",), lambda: nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle)
    )
    device.pcie_link_width = reader.read(
        ("pcie_link_width",), lambda: nvml.nvmlDeviceGetCurrPcieLinkWidth(handle)
    )
    device.memory = _read_memory(nvml, handle, reader, host_total)
    device.processes = _read_processes(nvml, handle, reader)


def _read_memory(nvml: Any, handle: Any, reader: _FieldReader, host_total: int | None) -> GpuMemory:
    info = reader.read(("memory",), lambda: _memory_info(nvml, handle))
    if info is None:
        if "memory" in reader.unsupported:
            return GpuMemory(state="not_supported", reason="NVML: Not Supported")
        if "memory" in reader.errors:
            return GpuMemory(state="error", reason=reader.errors["memory"])
        return GpuMemory(state="unknown", reason="not read: the GPU was lost first")
    total, used, free = int(info.total), int(info.used), int(info.free)
    reserved = getattr(info, "reserved", None)
    if total == 0:
        # Some GB10 drivers answer "success" with all zeros instead of Not Supported.
        reader.unsupported.append("memory")
        return GpuMemory(state="not_supported", reason="NVML reported a total of 0 bytes")
    matches_host = (
        host_total is not None
        and host_total > 0
        and abs(total - host_total) <= _HOST_MEMORY_TOLERANCE * host_total
    )
    return GpuMemory(
        state="ok",
        total_bytes=total,
        used_bytes=used,
        free_bytes=free,
        reserved_bytes=None if reserved is None else int(reserved),
        matches_host_memory=matches_host,
        reason="total is about the host's RAM (unified memory?)" if matches_host else "",
    )


def _memory_info(nvml: Any, handle: Any) -> Any:
    """NVML's v2 memory struct where the driver has it, else v1 (no `reserved` attribute)."""
    if _MEMORY_V2 is not None:
        try:
            return nvml.nvmlDeviceGetMemoryInfo(handle, version=_MEMORY_V2)
        except _MEMORY_V2_FALLBACK:
            # Older drivers lack the v2 call. GB10 answers v1 as it answers v2 (NotSupported,
            # or zeros), so asking v1 there costs one call and gives the same outcome.
            pass
    return nvml.nvmlDeviceGetMemoryInfo(handle)


def _read_processes(nvml: Any, handle: Any, reader: _FieldReader) -> list[GpuProcess] | None:
    compute = reader.read(
        ("compute_processes",), lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    )
    graphics = reader.read(
        ("graphics_processes",), lambda: nvml.nvmlDeviceGetGraphicsRunningProcesses(handle)
    )
    if compute is None and graphics is None:
        return None
    by_pid: dict[int, GpuProcess] = {}
    for kind, entries in (("compute", compute or []), ("graphics", graphics or [])):
        for entry in entries:
            pid = int(entry.pid)
            used = _process_memory(entry.usedGpuMemory)
            seen = by_pid.get(pid)
            if seen is None:
                by_pid[pid] = GpuProcess(pid=pid, used_gpu_memory_bytes=used, kind=kind)
                continue
            # A process with both contexts is listed twice; NVML reports the same memory
            # figure in both lists, so keep the larger known one rather than adding them.
            known = [m for m in (seen.used_gpu_memory_bytes, used) if m is not None]
            by_pid[pid] = GpuProcess(
                pid=pid,
                used_gpu_memory_bytes=max(known) if known else None,
                kind="compute+graphics",
            )
    return sorted(by_pid.values(), key=lambda p: p.pid)


def _process_memory(value: int | None) -> int | None:
    # pynvml turns NVML_VALUE_NOT_AVAILABLE into None; a stand-in or an older pynvml may not.
    if value is None or value == pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value:
        return None
    return int(value)


def _cuda_version_string(version: int) -> str:
    """13000 -> "13.0", as nvidia-smi prints "CUDA Version"."""
    return f"{version // 1000}.{(version % 1000) // 10}"


def _host_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


@dataclass(frozen=True)
class ContainerGpuUse:
    """The GPU processes of one container (`container_id` None: not in any known container).

    `processes` pairs each process with its device index. `used_gpu_memory_bytes` is the sum
    over them, or None when any process's figure is unknown: a partial sum would understate.
    """

    container_id: str | None
    processes: list[tuple[int, GpuProcess]]

    @property
    def used_gpu_memory_bytes(self) -> int | None:
        amounts = [p.used_gpu_memory_bytes for _, p in self.processes]
        if any(a is None for a in amounts):
            return None
        return sum(a for a in amounts if a is not None)


def processes_by_container(
    report: GpuReport, container_for_pid: Mapping[int, str | None]
) -> dict[str | None, ContainerGpuUse]:
    """Group the report's GPU processes by container.

    `container_for_pid` maps PID -> container id (e.g. from `procfs.container_ids_for_pids`); a
    PID missing from it, or mapped to None, lands under the None key.
    """
    grouped: dict[str | None, list[tuple[int, GpuProcess]]] = {}
    for device in report.devices:
        for process in device.processes or []:
            key = container_for_pid.get(process.pid)
            grouped.setdefault(key, []).append((device.index, process))
    return {key: ContainerGpuUse(key, entries) for key, entries in grouped.items()}
