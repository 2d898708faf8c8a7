"""What ``bin/sparkops status`` says: release, node, database, broker, what runs, the last
collection and delivery, and readiness, in a few lines an admin reads at a glance.

What runs comes from the supervisor's state file and the worker's liveness file
(``sparkops.stackstate``), each pid checked against ``/proc``; under systemd the service's own
state is added. Readiness is the same as ``/readyz`` (``collectors.health``), and decides the
command's exit status. Moments are written in ``SPARKOPS_TIME_ZONE`` with their zone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone

from collectors.health import Readiness, readiness
from collectors.models import Collection
from dashboard.notify.models import Notification
from sparkops.backends import describe_broker, describe_database
from sparkops.stackstate import (
    StackProcess,
    liveness_age,
    read_stack_state,
    state_file,
    systemd_state,
)
from sparkops.timetext import age_text, moment_text
from sparkops.version import VERSION


@dataclass(frozen=True)
class StatusReport:
    lines: list[str]
    ready: bool


def when_text(at: datetime, now: datetime) -> str:
    """``2026-12-01 22:09:16 KST (12 s ago)``."""
    return f"{moment_text(at, timezone.get_default_timezone())} " \
           f"({age_text((now - at).total_seconds())} ago)"


def _process_text(process: StackProcess, now: datetime) -> str:
    if not process.alive:
        return f"{process.name} pid {process.pid} is gone"
    since = f" since {when_text(process.started_at, now)}" if process.started_at else ""
    restarts = {0: "", 1: ", restarted once"}.get(process.restarts,
                                                  f", restarted {process.restarts} times")
    return f"{process.name} pid {process.pid}{since}{restarts}"


def stack_lines(data_dir: Path, now: datetime) -> list[str]:
    """What runs on this data directory, from the state and liveness files, and systemd."""
    state = read_stack_state(data_dir)
    if state.supervisor is None:
        lines = [f"stack:      not running (no {state_file(data_dir)})"]
    elif not state.running:
        lines = [f"stack:      not running ({state_file(data_dir)} names supervisor pid "
                 f"{state.supervisor.pid}, which is gone: the stack was killed)"]
    else:
        lines = [f"stack:      running, {_process_text(state.supervisor, now)}"]
        lines += [f"            {_process_text(process, now)}" for process in state.processes]
    age = liveness_age(data_dir)
    if age is not None:
        timeout = settings.SPARKOPS_WORKER_LIVENESS_TIMEOUT
        fresh = "fresh" if age < timeout else f"stale, more than {timeout:g} s"
        lines.append(f"heartbeat:  the worker's liveness file was touched {age_text(age)} ago "
                     f"({fresh})")
    service = systemd_state()
    if service is not None:
        lines.append(f"systemd:    sparkops.service is {service}")
    return lines


def collection_line(node: str, now: datetime) -> str:
    newest = Collection.objects.filter(node__name=node).order_by("-at").first()
    if newest is None:
        return f"collection: none yet on node {node}"
    outcome = "ok" if newest.ok else f"failed: {newest.error}"
    return f"collection: last at {when_text(newest.at, now)}, {outcome}"


def delivery_line(now: datetime) -> str:
    delivered = (Notification.objects.filter(delivered_at__isnull=False)
                 .select_related("channel").order_by("-delivered_at").first())
    waiting = Notification.objects.filter(delivered_at__isnull=True,
                                          failed_at__isnull=True).count()
    queue = f"; {waiting} waiting" if waiting else ""
    if delivered is None:
        return f"delivery:   no notification delivered yet{queue}"
    return (f"delivery:   last at {when_text(delivered.delivered_at, now)}: "
            f"{delivered.get_kind_display().lower()} to {delivered.channel}{queue}")


def readiness_lines(result: Readiness) -> list[str]:
    if result.ok:
        return ["ready:      yes (database, broker and collection hold)"]
    return ["ready:      no"] + [f"            {check.name}: {check.reason}"
                                 for check in result.failed()]


def status_report(now: datetime | None = None) -> StatusReport:
    now = now or timezone.now()
    node = settings.SPARKOPS_NODE_NAME
    result = readiness(now)
    checks = {check.name: check for check in result.checks}
    lines = [
        f"SparkOps {VERSION} on node {node}",
        f"database:   {describe_database()} ({'answers' if checks['database'].ok else 'down'})",
        f"broker:     {describe_broker()} ({'answers' if checks['broker'].ok else 'down'})",
        *stack_lines(Path(settings.DATA_DIR), now),
    ]
    if checks["database"].ok:
        try:
            lines += [collection_line(node, now), delivery_line(now)]
        except DatabaseError as error:
            lines.append(f"history:    cannot be read: {' '.join(str(error).split())}")
    lines += readiness_lines(result)
    return StatusReport(lines=lines, ready=result.ok)
