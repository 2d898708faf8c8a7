"""Keep what NVML reports about a node's GPUs: the latest report on the node, each read's
figures as history, and an event when a GPU is lost or NVML breaks.

Every read writes one :class:`GpuSample` per device and series of :data:`GPU_SERIES`
(utilisation, temperature, power draw, SM clock). A figure NVML did not give is still a row,
without a value and with the reason :func:`field_reading` words ("not supported" where the GPU
cannot report it, else NVML's error), so a chart breaks its line there and says why. A report
without devices (no driver, NVML unusable, no GPUs) writes no rows: the chart has no data then,
and the page says why from the node's latest report.

Cost: one bulk insert of four rows per device per read, in the same transaction as the report.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import transaction

from collectors.models import GPU_NOT_SUPPORTED, Event, GpuMetric, GpuSample, Node
from collectors.nvml import GpuDevice, GpuReport
from sparkops.rowwrites import save_fields

NOTE_LIMIT = GpuSample._meta.get_field("note").max_length


@dataclass(frozen=True)
class GpuSeries:
    """One series kept per GPU: its stored metric, the :class:`GpuDevice` field it is read
    from, what people call it, and its unit."""

    metric: GpuMetric
    field: str
    name: str
    unit: str


GPU_SERIES: tuple[GpuSeries, ...] = (
    GpuSeries(GpuMetric.UTILIZATION, "utilization_gpu_pct", "utilisation", "%"),
    GpuSeries(GpuMetric.TEMPERATURE, "temperature_c", "temperature", "°C"),
    GpuSeries(GpuMetric.POWER, "power_w", "power draw", "W"),
    GpuSeries(GpuMetric.SM_CLOCK, "sm_clock_mhz", "SM clock", "MHz"),
)


def field_reading(device: GpuDevice, field: str) -> tuple[float | None, str]:
    """``device``'s figure for ``field`` (a :class:`GpuDevice` attribute), or None and why.

    The one wording of a missing figure, for the stored rows and the pages alike: "not
    supported" (NVML's NotSupported: this GPU cannot report it), "NVML error: <message>", a
    device NVML could not open, or a figure not read because the GPU was lost first.
    """
    value = getattr(device, field)
    if value is not None:
        return float(value), ""
    if field in device.unsupported:
        return None, GPU_NOT_SUPPORTED
    if field in device.errors:
        return None, _clip(f"NVML error: {device.errors[field]}")
    if "handle" in device.errors or "handle" in device.unsupported:
        why = device.errors.get("handle", "Not Supported")
        return None, _clip(f"NVML could not open the GPU: {why}")
    if device.lost:
        return None, "not read: the GPU was lost"
    return None, "not read"


def _clip(text: str) -> str:
    return text if len(text) <= NOTE_LIMIT else text[: NOTE_LIMIT - 1] + "…"


def gpu_samples(node: Node, report: GpuReport, now: datetime) -> list[GpuSample]:
    """The rows one read adds to the history: every series of every device in ``report``."""
    rows = []
    for device in report.devices:
        for series in GPU_SERIES:
            value, note = field_reading(device, series.field)
            rows.append(GpuSample(node=node, device_index=device.index,
                                  device_uuid=device.uuid or "", metric=series.metric, at=now,
                                  value=value, note=note))
    return rows


def record_gpu_report(node: Node, report: GpuReport, now: datetime) -> None:
    """Store the report on the node and its figures as history; a newly lost GPU is a critical
    event (once, not per read)."""
    previous = node.gpu or {}
    was_lost = {e.get("device_index") for e in previous.get("events", [])
                if e.get("kind") == "gpu-lost"}
    with transaction.atomic():
        for event in report.events:
            if event.kind == "gpu-lost" and event.device_index in was_lost:
                continue
            Event.objects.create(node=node, at=now, kind=event.kind, severity=event.severity,
                                 message=event.message)
        if report.state == "error" and previous.get("state") != "error":
            Event.objects.create(node=node, at=now, kind="nvml-error", severity="warning",
                                 message=f"NVML unusable: {report.reason}")
        GpuSample.objects.bulk_create(gpu_samples(node, report, now))
        node.gpu = report.as_dict()
        node.gpu_read_at = now
        save_fields(node, ["gpu", "gpu_read_at"])
