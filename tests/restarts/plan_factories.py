"""Small builders for the planning and page tests: engines, windows and restart rows."""

from __future__ import annotations

from datetime import datetime, timedelta

from collectors.models import Engine, Node
from dashboard.restarts.models import Restart, RestartWindow
from dashboard.restarts.windows import build_recurrence

SEOUL = "Asia/Seoul"


def make_engine(node: Node, name: str, *, managed: bool = True, present: bool = True,
                labels: dict[str, str] | None = None) -> Engine:
    return Engine.objects.create(node=node, name=name, container_id=f"{name}-id",
                                 container_state="running", managed=managed, present=present,
                                 labels=labels or {})


def make_window(node: Node, *, name: str = "sunday night", engine: Engine | None = None,
                local_start: datetime = datetime(2026, 11, 1, 3, 0), zone: str = SEOUL,
                rule: str = "FREQ=WEEKLY;BYDAY=SU", minutes: int = 120,
                enabled: bool = True) -> RestartWindow:
    return RestartWindow.objects.create(
        name=name, node=node, engine=engine, recurrence=build_recurrence(local_start, zone, rule),
        time_zone=zone, duration_minutes=minutes, enabled=enabled,
    )


def measured_start(engine: Engine, seconds: float, finished_at: datetime, *,
                   kind: str = Restart.Kind.PLANNED,
                   status: str = Restart.Status.SUCCEEDED) -> Restart:
    """A finished restart of ``engine`` that measured a startup of ``seconds``."""
    return Restart.objects.create(
        node=engine.node, engine=engine, kind=kind, status=status,
        requested_at=finished_at - timedelta(seconds=seconds + 200),
        started_at=finished_at - timedelta(seconds=seconds + 100), finished_at=finished_at,
        startup_seconds=seconds,
    )
