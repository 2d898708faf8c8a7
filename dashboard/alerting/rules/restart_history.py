"""What the two restart rules share: one condition per engine from its latest matching restart.

A condition is active while that restart is recent (finished, or requested when it has not
finished, within the rule's memory) and inactive after, so the alert resolves by itself.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timedelta

from collectors.models import Node
from dashboard.alerting.conditions import Condition, Severity
from dashboard.alerting.restart_reads import judged_restarts
from dashboard.restarts.models import Restart


def latest_restart_conditions(node: Node, now: datetime, minutes: float, rule: str,
                              which: Callable[[Restart], bool], severity: Severity = "critical",
                              ignore: Callable[[Restart], bool] | None = None,
                              ) -> list[Condition]:
    """One condition per engine of ``node`` whose latest restart for which ``which`` holds
    (among the restarts rules judge, ``dashboard.alerting.restart_reads``) is not
    ``ignore``d: active when it ended less than ``minutes`` ago. Cost: the node's judged
    restarts, read at most once a round (``dashboard.alerting.restart_reads``: one query, and
    one for engines no longer present).

    The value counts the restarts of the engine's episode (see :func:`episode`) while it is
    active, and is 0 after; the summary says what happened each time, so a restart folded into
    an open alert changes its summary, count and figures together.
    """
    since = now - timedelta(minutes=minutes)
    by_engine: dict[int, list[Restart]] = {}
    for restart in judged_restarts(node, which):
        by_engine.setdefault(restart.engine_id, []).append(restart)
    conditions = []
    for engine_id, restarts in by_engine.items():
        latest = restarts[-1]
        if ignore is not None and ignore(latest):
            continue
        kept = [r for r in restarts if ignore is None or not ignore(r)]
        chain = episode(kept, minutes)
        recent = _ended(latest) >= since
        conditions.append(Condition(
            rule=rule, node_id=node.pk, engine_id=engine_id,
            value=float(len(chain)) if recent else 0.0,
            threshold=0.5, clear=0.5, direction="above", severity=severity,
            summary=_summary(chain),
            details={"restart_id": latest.pk, "restart_text": _line(latest),
                     "restart_count": len(chain),
                     "restarts": [f"{what_happened(r)} at {_ended(r):%H:%M:%S} UTC"
                                  for r in chain],
                     "status": latest.status, "container_state": latest.container_state,
                     "outcome": latest.outcome},
        ))
    return conditions


def episode(restarts: list[Restart], minutes: float) -> list[Restart]:
    """The latest restarts (oldest first) each of which came while the one before it was still
    recent: those an open alert has folded in since it opened. ``restarts`` is oldest first."""
    chain = restarts[-1:]
    for earlier in reversed(restarts[:-1]):
        if (_ended(chain[0]) - _ended(earlier)).total_seconds() >= minutes * 60:
            break
        chain.insert(0, earlier)
    return chain


def what_happened(restart: Restart) -> str:
    """One restart in a few words: "exited (137)", "OOM-killed", "restarted", "failed: …"."""
    if restart.kind != Restart.Kind.UNPLANNED:
        return f"{restart.status}: {restart.outcome}" if restart.outcome else restart.status
    text = restart.reason or ""
    first, _, later = text.partition(" Then: ")
    if "OOM killer" in first:
        what = "OOM-killed"
    elif found := re.search(r"container (\w+), exit code (-?\d+)", first):
        what = f"{found[1]} ({found[2]})"
    elif "is gone" in first:
        what = "container gone"
    elif "restarted" in first or "recreated" in first:
        what = "restarted"
    else:
        what = first or restart.status
    return f"{what}, then restarted" if "restarted" in later else what


def _ended(restart: Restart) -> datetime:
    return restart.finished_at or restart.requested_at


def _line(restart: Restart) -> str:
    return (f"{restart.engine.name}: {restart.kind} restart {restart.status} at "
            f"{_ended(restart):%Y-%m-%d %H:%M:%S} UTC: {restart.outcome or restart.reason}")


def _summary(chain: list[Restart]) -> str:
    """One restart as its own line; several as "2 unplanned restarts of gemma since …: …"."""
    if len(chain) == 1:
        return _line(chain[0])
    first = chain[0]
    told = ", ".join(f"{what_happened(r)} at {_ended(r):%H:%M:%S}" for r in chain)
    return (f"{len(chain)} {first.kind} restarts of {first.engine.name} since "
            f"{_ended(first):%Y-%m-%d %H:%M:%S} UTC: {told}")
