"""Keep a node's latest NVML report, and raise an event when a GPU is lost or NVML breaks."""

from __future__ import annotations

from datetime import datetime

from collectors.models import Event, Node
from collectors.nvml import GpuReport


def record_gpu_report(node: Node, report: GpuReport, now: datetime) -> None:
    """Store the report on the node; a newly lost GPU is a critical event (once, not per read)."""
    previous = node.gpu or {}
    was_lost = {e.get("device_index") for e in previous.get("events", [])
                if e.get("kind") == "gpu-lost"}
    for event in report.events:
        if event.kind == "gpu-lost" and event.device_index in was_lost:
            continue
        Event.objects.create(node=node, at=now, kind=event.kind, severity=event.severity,
                             message=event.message)
    if report.state == "error" and previous.get("state") != "error":
        Event.objects.create(node=node, at=now, kind="nvml-error", severity="warning",
                             message=f"NVML unusable: {report.reason}")
    node.gpu = report.as_dict()
    node.gpu_read_at = now
    node.save(update_fields=["gpu", "gpu_read_at"])
