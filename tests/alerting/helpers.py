"""Small builders shared by the alerting tests: explicit times and conditions, no sleeping."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from collectors.models import Engine, Node
from dashboard.alerting.conditions import Condition

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    """``seconds`` after a fixed start instant."""
    return T0 + timedelta(seconds=seconds)


def floor(node: Node, value: float | None, **extra: Any) -> Condition:
    """A "headroom-floor" condition: bad below 8 GiB, clears at 10 GiB (for 30 s)."""
    fields: dict[str, Any] = {
        "rule": "headroom-floor", "node_id": node.pk, "engine_id": None, "value": value,
        "threshold": 8.0, "clear": 10.0, "direction": "below", "severity": "critical",
        "summary": f"MemAvailable {value} GiB below the 8 GiB floor",
        "details": {"mem_available_gib": value, "cause": "a neighbour's KV pool grew"},
    }
    return Condition(**{**fields, **extra})


def overcommit(node: Node, value: float | None, **extra: Any) -> Condition:
    """An "overcommit" condition (for 0 s): bad above 0 GiB over-committed, clears at 0."""
    fields: dict[str, Any] = {
        "rule": "overcommit", "node_id": node.pk, "engine_id": None, "value": value,
        "threshold": 0.0, "clear": 0.0, "direction": "above", "severity": "warning",
        "summary": f"reservations exceed MemTotal by {value} GiB", "details": {},
    }
    return Condition(**{**fields, **extra})


def engine_rule(node: Node, engine: Engine | None, rule: str, value: float | None,
                engine_id: int | None = None) -> Condition:
    """A per-engine condition of ``rule``: bad above 1, clears at 0."""
    return Condition(rule=rule, node_id=node.pk,
                     engine_id=engine.pk if engine is not None else engine_id, value=value,
                     threshold=1.0, clear=0.0, direction="above", severity="warning",
                     summary=f"{rule} on {engine.name if engine else engine_id}", details={})


def make_engine(node: Node, name: str) -> Engine:
    return Engine.objects.create(node=node, name=name, container_id=f"{name}-id",
                                 container_state="running")
