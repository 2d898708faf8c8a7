"""What the overview shows about a node's GPUs: the current figures and their history.

Two views of the same NVML figures (:data:`collectors.gpus.GPU_SERIES`: utilisation,
temperature, power draw, SM clock):

* :func:`current_gpus` — the latest report, each figure as a short text or, where NVML gave
  none, "not supported" or "unknown" with the reason (never 0), for the current-value line.
* :func:`gpu_history` — the timeline's four GPU panels, one line per device, read from the
  stored :class:`GpuSample` rows (and their roll-ups over long ranges) like every other series:
  min-max downsampled, broken into gaps where a read gave no figure or no read happened. A line
  starts at the first row in range (over long ranges, at the chart bucket holding it), never
  before. A figure the GPU cannot report draws no line,
  and the panel and the notes say so ("power draw: not supported by NVIDIA GB10 (GPU 0)").
  Without any GPU in range and in the latest report (no driver, no GPU, not read yet) there are
  no GPU panels at all, and the notes say why in words instead of an empty chart.

Cost: one query per source for all devices and series (``dashboard.series.gpu_points``), one
grouped query on the index of failed reads, and one small query per series that failed in range.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Max

from collectors.gpus import GPU_SERIES, GpuSeries, field_reading
from collectors.models import GPU_NOT_SUPPORTED, GpuSample, Node
from collectors.nvml import GpuDevice, GpuReport
from dashboard.memory import reduce_series
from dashboard.series import gpu_points

Points = list[tuple[datetime, float | None]]

PANEL_PREFIX = "gpu_"
PANEL_TITLES = {
    "utilization_gpu_pct": "GPU utilisation",
    "temperature_c": "GPU temperature",
    "power_w": "GPU power draw",
    "sm_clock_mhz": "GPU SM clock",
}
NOT_READ_YET = "GPU: not read yet (the node's engine collection has not run)."


def panel_key(series: GpuSeries) -> str:
    return PANEL_PREFIX + series.field


def device_label(index: int, name: str | None) -> str:
    """How a GPU is named on the page: "NVIDIA GB10 (GPU 0)", or "GPU 0" without a name."""
    return f"{name} (GPU {index})" if name else f"GPU {index}"


# --- the latest report -----------------------------------------------------------------------

def _latest_report(node: Node) -> GpuReport | None:
    return GpuReport.from_dict(node.gpu) if node.gpu else None


def _figure_text(series: GpuSeries, device: GpuDevice, value: float) -> str:
    if series.field == "utilization_gpu_pct":
        return f"util {value:.0f} %"
    if series.field == "temperature_c":
        return f"{value:.0f} °C"
    if series.field == "power_w":
        limit = device.power_limit_w
        return f"{value:.0f} W" + (f" of {limit:.0f} W" if limit else "")
    return f"SM {value:.0f} MHz"


def _missing_text(series: GpuSeries, reason: str) -> str:
    word = "not supported" if reason == GPU_NOT_SUPPORTED else "unknown"
    return f"{'util' if series.field == 'utilization_gpu_pct' else series.name} {word}"


def device_figures(device: GpuDevice) -> list[dict[str, str]]:
    """The device's figures for the current-value line: ``text`` ("54 °C", "power draw not
    supported") and, when there is no figure, the ``reason``."""
    out = []
    for series in GPU_SERIES:
        value, reason = field_reading(device, series.field)
        text = _missing_text(series, reason) if value is None \
            else _figure_text(series, device, value)
        out.append({"key": series.field, "text": text, "reason": reason})
    return out


def field_notes(report: GpuReport | None) -> dict[str, list[str]]:
    """Why a panel draws no line for a device now, by panel key, from the latest report:
    "<figure>: not supported by <device>", "<figure> unknown on <device>: <reason>", or that
    the device is lost."""
    notes: dict[str, list[str]] = {panel_key(series): [] for series in GPU_SERIES}
    for device in report.devices if report is not None else []:
        label = device_label(device.index, device.name)
        for series in GPU_SERIES:
            value, reason = field_reading(device, series.field)
            if value is not None:
                continue
            if device.lost:
                text = f"{label} is lost: it fell off the bus and needs a reset or a reboot"
            elif reason == GPU_NOT_SUPPORTED:
                text = f"{series.name}: not supported by {label}"
            else:
                text = f"{series.name} unknown on {label}: {reason}"
            notes[panel_key(series)].append(text)
    return notes


def report_problem(report: GpuReport | None) -> str:
    """The latest report's trouble in words ("" when NVML answered with GPUs)."""
    if report is None:
        return NOT_READ_YET
    if report.state != "ok":
        return f"GPU: {report.reason}"
    if not report.devices:
        return f"GPU: {report.reason or 'NVML found no GPUs'}"
    return ""


def current_gpus(node: Node) -> dict[str, Any]:
    """The latest report for the current-value line: the report's own dict, each device with
    its ``figures`` (:func:`device_figures`), and the ``notes`` on what cannot be drawn."""
    report = _latest_report(node)
    if report is None:
        return {"devices": [], "notes": []}
    devices = [{**device.as_dict(), "figures": device_figures(device)}
               for device in report.devices]
    return {"devices": devices, "notes": _flat(field_notes(report))}


def _flat(notes: dict[str, list[str]]) -> list[str]:
    """Every panel's notes once each, in panel order (a lost GPU is one note, not four)."""
    return list(dict.fromkeys(text for texts in notes.values() for text in texts))


# --- history ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class GpuLine:
    """One device's series in one GPU panel, reduced for the chart."""

    panel: str
    key: str
    label: str
    unit: str
    device: int
    points: Points


@dataclass
class GpuHistory:
    """The GPU panels of a timeline (none without a GPU), their lines, and the words the
    chart shows beside them: ``notes`` (what cannot be drawn now, and why) and ``failures``
    (per device and series, the latest read in range that gave no figure)."""

    panels: list[dict[str, Any]] = field(default_factory=list)
    lines: list[GpuLine] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    failures: list[dict[str, str]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"shown": bool(self.panels), "notes": self.notes, "failures": self.failures}


def gpu_history(node: Node, *, start: datetime, end: datetime, resolution: int, budget: int,
                step: float, bucket: float) -> GpuHistory:
    """The GPU panels of ``node``'s timeline over [start, end], read at ``resolution`` (0: raw),
    each line reduced to ``budget`` points and broken where rows are more than ``step`` seconds
    apart (``dashboard.timeline`` passes its frame)."""
    report = _latest_report(node)
    found = gpu_points(node, [series.metric for series in GPU_SERIES], start, resolution,
                       bucket)
    names = {device.index: device.name for device in report.devices} if report else {}
    devices = sorted({index for index, _ in found} | set(names))
    history = GpuHistory()
    problem = report_problem(report)
    if not devices:
        history.notes.append(problem)
        return history
    if problem:
        history.notes.append(f"{problem} — the GPU panels show what was read before.")
    notes = field_notes(report)
    for series in GPU_SERIES:
        key = panel_key(series)
        lines = [_line(series, index, names.get(index), found.get((index, series.metric), []),
                       budget, step) for index in devices]
        history.lines += lines
        empty = "; ".join(notes[key]) or "no GPU readings in this range"
        panel = {"key": key, "title": PANEL_TITLES[series.field], "unit": series.unit,
                 "empty": empty}
        if series.unit == "%":
            panel["range"] = [0, 100]
        history.panels.append(panel)
    history.notes += _flat(notes)
    history.failures = failed_reads(node, start, end, names)
    return history


def _line(series: GpuSeries, index: int, name: str | None, points: list, budget: int,
          step: float) -> GpuLine:
    return GpuLine(panel=panel_key(series), key=f"gpu{index}:{series.field}",
                   label=f"{device_label(index, name)} {series.name}", unit=series.unit,
                   device=index, points=reduce_series(points, [], budget, step))


def failed_reads(node: Node, start: datetime, end: datetime, names: dict[int, str | None]
                 ) -> list[dict[str, str]]:
    """Per device and series, the latest read in [start, end] that gave a figure NVML could
    have given but did not (an error, a lost GPU; "not supported" is a note, not a failure):
    ``text`` names it, ``at`` is when, ``note`` why. Raw rows only (roll-ups keep no failures),
    so on long ranges this reaches back as far as raw samples are kept."""
    failed = GpuSample.objects.filter(node=node, at__gte=start, at__lte=end,
                                      value__isnull=True).exclude(note=GPU_NOT_SUPPORTED)
    latest = failed.values("device_index", "metric").annotate(last=Max("at")) \
        .order_by("device_index", "metric")
    by_metric = {series.metric: series for series in GPU_SERIES}
    out = []
    for row in latest:
        series = by_metric.get(row["metric"])
        if series is None:
            continue
        note = failed.filter(device_index=row["device_index"], metric=row["metric"],
                             at=row["last"]).values_list("note", flat=True).first()
        out.append({"text": f"{device_label(row['device_index'], names.get(row['device_index']))}"
                            f" {series.name}",
                    "at": row["last"].isoformat(), "note": note or ""})
    return out
