"""Memory not returned: an engine stopped and what it held did not come back.

On a GB10 memory sometimes stays gone after an engine's container exits (memory the driver
keeps, a leaked shared-memory segment): tens of GiB that only a reboot frees, and an engine
started into it runs the host out of memory. The restarts domain judges every stop once, the
grace period (``SPARKOPS_MEMORY_RETURN_GRACE_SECONDS``) after it: the runbook for a planned stop
(it then does not start the engine), ``dashboard.restarts.unplanned`` for one the collectors saw.
Both keep the verdict on the restart, ``after["memory_return"]``: the room (MemAvailable, or
the memory budget's room) before the stop, what the engine held, the tolerance, and what every
engine held at the judgement.

This rule keeps one condition per engine whose latest such verdict says "not returned", while
the stop is recent: its value is what is still missing now (the node's ledger against the
expected room, less what the node's engines took since: the engine started again, a neighbour
grew; :func:`dashboard.restarts.fit.missing_now`), so the alert resolves when the memory comes
back, and at once after a reboot of the host.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from collectors.flightrecorder import HOST_REBOOTED, UNEXPECTED_REBOOT
from collectors.models import Engine, Event, Node
from dashboard.alerting.conditions import Condition
from dashboard.alerting.restart_reads import judged_restarts
from dashboard.alerting.rules.base import Rule, ThresholdSpec
from dashboard.restarts.fit import (
    BUDGET,
    NOT_RETURNED,
    ROOM_WORDS,
    MemoryReturn,
    engines_held,
    missing_now,
)
from dashboard.restarts.models import Restart
from sparkops.timetext import moment_text
from sparkops.units import gib, size_text


def evaluate(node: Node, ledger: dict, engines: list[Engine], t: dict[str, Any],
             now: datetime) -> list[Condition]:
    """One condition per engine of ``node`` whose latest stop within the rule's memory left
    memory missing; none for the others. Cost: the node's judged restarts, read at most once a
    round (``dashboard.alerting.restart_reads``: one query, and one for engines no longer
    present), and one query per verdict for reboots."""
    since = now - timedelta(hours=t["remember_hours"])
    latest: dict[int, tuple[Restart, dict[str, Any]]] = {}
    for restart in sorted(judged_restarts(node, _not_returned), key=_started):
        verdict = restart.after["memory_return"]
        stopped_at = verdict.get("stopped_at")
        if not verdict.get("accounts") or not stopped_at \
                or datetime.fromisoformat(stopped_at) < since:
            continue
        latest[restart.engine_id] = (restart, verdict)
    held_now = engines_held(engines)
    return [_condition(node, ledger, restart, verdict, held_now, t)
            for restart, verdict in latest.values()]


def _not_returned(restart: Restart) -> bool:
    return ((restart.after or {}).get("memory_return") or {}).get("verdict") == NOT_RETURNED


def _started(restart: Restart) -> tuple[datetime, int]:
    return restart.started_at or restart.requested_at, restart.pk


def _condition(node: Node, ledger: dict, restart: Restart, verdict: dict[str, Any],
               held_now: dict[str, int], t: dict[str, Any]) -> Condition:
    engine = restart.engine
    stopped_at = datetime.fromisoformat(verdict["stopped_at"])
    held_then = verdict.get("engines_held") or {}
    rebooted = Event.objects.filter(node=node, kind__in=[HOST_REBOOTED, UNEXPECTED_REBOOT],
                                    at__gt=stopped_at).order_by("at").first()
    # Each room's figure now, and what is missing by it; the room that says least is missing,
    # measured against its own tolerance, decides (as when the stop was judged): the host's
    # MemAvailable, which other programs move, cannot hold open what the budget shows back.
    rooms = []
    for data in verdict["accounts"]:
        account = MemoryReturn.from_dict(data)
        room_now = _room_now(ledger, account.source)
        missing = None if rebooted else missing_now(account, room_now, held_then=held_then,
                                                    held_now=held_now)
        rooms.append((account, room_now, missing))
    known = [room for room in rooms if room[2] is not None]
    account, room_now, missing = min(known, key=lambda room: room[2] / max(room[0].tolerance, 1)) \
        if known else rooms[0]
    threshold = gib(account.tolerance)
    when = moment_text(stopped_at, UTC)
    how = "planned restart" if restart.kind == Restart.Kind.PLANNED else "stop seen by SparkOps"
    if rebooted is not None:
        value, state = 0.0, f"the host rebooted since ({moment_text(rebooted.at, UTC)})"
    elif missing is None:
        value, state = None, f"{ROOM_WORDS[account.source]} unknown now"
    else:
        value = gib(missing)
        state = (f"{size_text(missing)} of what it held ({size_text(account.held)}) is still "
                 f"missing; {ROOM_WORDS[account.source]} {size_text(room_now)}")
    return Condition(
        rule=RULE.name, node_id=node.pk, engine_id=engine.pk, value=value,
        threshold=threshold, clear=threshold / 2, direction="above", severity="warning",
        summary=f"{engine.name}: memory not returned after its {how} at {when}: {state}",
        details={"restart_id": restart.pk, "stopped_at": verdict["stopped_at"],
                 "room": account.source, "held_bytes": account.held,
                 "expected_bytes": account.expected, "room_now_bytes": room_now,
                 "missing_bytes": missing, "tolerance_bytes": account.tolerance,
                 "missing_when_judged_bytes": verdict.get("missing_bytes"),
                 "judged": verdict.get("text", ""),
                 "rebooted_at": rebooted.at.isoformat() if rebooted else None,
                 "remember_hours": t["remember_hours"]},
    )


def _room_now(ledger: dict, source: str) -> int | None:
    """The room a verdict was measured in, from the node's latest ledger: its MemAvailable, or
    the memory budget's room at the end of its interval."""
    if source == BUDGET:
        return (ledger.get("budget") or {}).get("room")
    return ledger.get("mem_available")


RULE = Rule(
    name="memory-not-returned",
    title="Memory not returned",
    description=(
        "An engine stopped and MemAvailable (or the memory budget's room, where the engine ran "
        "in one) did not come back by what the engine held within the grace period "
        "(SPARKOPS_MEMORY_RETURN_GRACE_SECONDS, 60 s by default), beyond a tolerance of 5 % of "
        "what it held or 1 % of the room's total, whichever is larger. On a GB10 such memory "
        "usually stays gone until a reboot; a restart does not start the engine into it. Open "
        "while the memory is still missing (what the node's engines took since does not "
        "count), resolved when it comes back or the host reboots."
    ),
    for_seconds=0,
    evaluate=evaluate,
    value_unit="GiB",
    repeat_seconds=24 * 3600,
    thresholds=(
        ThresholdSpec("remember_hours", "Compare for", 24.0, "h",
                      "How long after the stop the room is still compared with what it was "
                      "expected to reach; past that, what else changed on the node makes the "
                      "comparison meaningless and the alert resolves.",
                      minimum=0.1, maximum=24.0 * 30),
    ),
)
