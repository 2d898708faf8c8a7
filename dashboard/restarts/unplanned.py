"""Restarts behind SparkOps' back: read from the engine events the collectors record.

The collectors only state facts (``engine-restarted``, ``engine-exited``, ``engine-gone``); here
they become ``unplanned`` rows of the restart ledger, unless a planned restart of that engine
explains them. An exit followed by a restart a little later is one unplanned restart, not two.
Once the engine is ready again, the measured startup time is filled in, so unplanned restarts
teach the learned startup time too: from the container's start to the "→ ready" phase change the
collectors saw, else, for an engine already ready when they first saw it again (a start quicker
than a collection interval, or one made while SparkOps was down), the startup its own log tells
(its first line to ready; ``after["startup"]`` names that source). When the log of that start,
read, tells none either, the startup is unknown and ``after["startup"]`` says why; it is not
looked for again, so the restarts a pass re-reads stay the open and the recent ones.

**Memory not returned.** An engine that stopped behind SparkOps' back should have handed back
what it held (:func:`judge_memory_returns`): ``SPARKOPS_MEMORY_RETURN_GRACE_SECONDS`` after
its stop was seen, the highest MemAvailable stored since is compared with the last one stored
while it served (from its first scrape, once its start-up had allocated, to its last reading
running) plus what it held (:func:`dashboard.restarts.fit.returned_by_stop`), and so is the
memory budget's room where one is watched. Whether the engine ran inside the budget is
no longer known once it stopped (its processes are gone), so memory counts as missing only
when every room says so (:func:`dashboard.restarts.fit.not_returned`), and what is missing is
the smaller figure. An engine started again within the grace period holds memory anew: its
stop is left unknown. The verdict is kept on the unplanned restart (``after["memory_return"]``,
the shape the runbook keeps for a planned stop), where the alert of the same name reads it;
memory that did not come back is also a ``memory-not-returned`` event on the timeline, naming
the engine and the missing amount.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q, prefetch_related_objects

from collectors import readings
from collectors.ledger import engine_share
from collectors.models import Engine, EngineMetric, EngineReading, Event, Metric, Node
from collectors.readings import ENGINE
from dashboard.restarts.fit import (
    BUDGET,
    HOST,
    NOT_RETURNED,
    ROOM_WORDS,
    MemoryReturn,
    engines_held,
    not_returned,
    return_tolerance,
    returned_by_stop,
)
from dashboard.restarts.models import Restart
from sparkops.prepared import PreparedRead
from sparkops.units import size_text

WATCHED_EVENTS = ("engine-restarted", "engine-exited", "engine-gone")
# How far back events are examined on each pass (the pass runs after every collection).
LOOKBACK = timedelta(hours=1)
# An exit and the restart that follows within this long are one outage.
MERGE_WITHIN = timedelta(minutes=15)
# Slack around a planned restart's run within which its own stop/start events are expected.
PLANNED_SLACK = timedelta(seconds=60)
# The events after which an engine's memory should be back (a restart event means it runs
# again, holding memory anew: not judged).
STOP_EVENTS = ("engine-exited", "engine-gone")
START_EVENTS = ("engine-restarted", "engine-discovered")
MEMORY_NOT_RETURNED = "memory-not-returned"
# Where an unplanned restart says how its startup was found when no phase change showed it.
STARTUP = "startup"
# The stored room figures of each room: (the room, its total for the tolerance).
_ROOM_METRICS = {HOST: (Metric.MEM_AVAILABLE, None),
                 BUDGET: (Metric.MEMORY_BUDGET_ROOM, Metric.MEMORY_BUDGET_LIMIT)}


def record_unplanned_restarts(node: Node, now: datetime) -> list[Restart]:
    """Turn new restart-like events of ``node`` into unplanned restarts; return those written.

    Cost, on a pass that finds nothing new: two queries (the node's open and recent unplanned
    restarts, read once for every step of the pass, and its recent events), and one more for
    the restarts' engines when there are any."""
    restarts = _open_and_recent(node, now)
    since = _recent_since(now)
    seen_ids = {event_id for restart in restarts if restart.requested_at >= since
                for event_id in (restart.container_state or {}).get("event_ids", [])}
    # The engines are read by a second query, made only when there are new events: joined in,
    # their columns cost every pass more to build than the empty answer to read.
    events = _WATCHED_SINCE(node.pk, now - LOOKBACK, sorted(seen_ids))
    prefetch_related_objects(events, "engine")
    written = []
    for event in events:
        if _explained_by_plan(event):
            continue
        written.append(_record(event))
    if written:
        restarts = _open_and_recent(node, now)
    _fill_startup_times(restart for restart in restarts if _startup_open(restart))
    _judge(node, [restart for restart in restarts if restart.requested_at >= since], now)
    return written


def _recent_since(now: datetime) -> datetime:
    """Since when an unplanned restart is recent: the look-back and the merge window before it
    (an exit merged with a later restart keeps the exit's time)."""
    return now - LOOKBACK - MERGE_WITHIN


# The node's watched events since a time, but those of the given ids, oldest first; and its
# unplanned restarts whose startup is open or that were asked for since a time (prepared reads:
# every alert round makes them).
_WATCHED_SINCE = PreparedRead(lambda node_id, since, seen_ids: Event.objects.filter(
    node_id=node_id, kind__in=WATCHED_EVENTS, engine__isnull=False, at__gte=since,
).exclude(pk__in=seen_ids).order_by("at"))
_OPEN_OR_SINCE = PreparedRead(lambda node_id, since: Restart.objects.filter(
    Q(startup_seconds__isnull=True, finished_at__isnull=True) & ~Q(after__has_key=STARTUP)
    | Q(requested_at__gte=since),
    node_id=node_id, kind=Restart.Kind.UNPLANNED,
))


def _open_and_recent(node: Node, now: datetime) -> list[Restart]:
    """The unplanned restarts of ``node`` whose startup is still open (:func:`_startup_open`),
    or recent (:func:`_recent_since`), with their engines. One query, and one for the engines
    when there are any (usually there are none: joined in, the engines' columns would cost
    every pass)."""
    restarts = _OPEN_OR_SINCE(node.pk, _recent_since(now))
    prefetch_related_objects(restarts, "engine")
    return restarts


def _startup_open(restart: Restart) -> bool:
    """Whether the startup of an unplanned restart is still to be found: neither measured nor
    said to be unknown."""
    return restart.startup_seconds is None and restart.finished_at is None \
        and STARTUP not in (restart.after or {})


def _explained_by_plan(event: Event) -> bool:
    return Restart.objects.filter(
        engine=event.engine, kind=Restart.Kind.PLANNED, started_at__isnull=False,
        started_at__lte=event.at + PLANNED_SLACK,
    ).exclude(finished_at__lt=event.at - PLANNED_SLACK).exists()


def _record(event: Event) -> Restart:
    engine = event.engine
    state = {"state": engine.container_state, "exit_code": engine.exit_code,
             "started_at": engine.started_at.isoformat() if engine.started_at else None,
             "running": engine.container_state == "running", "event_ids": [event.pk]}
    open_one = Restart.objects.filter(
        engine=engine, kind=Restart.Kind.UNPLANNED, startup_seconds__isnull=True,
        requested_at__gte=event.at - MERGE_WITHIN,
    ).order_by("-requested_at").first()
    if open_one is not None:
        previous_ids = (open_one.container_state or {}).get("event_ids", [])
        open_one.container_state = {**state, "event_ids": [*previous_ids, event.pk]}
        open_one.reason = f"{open_one.reason} Then: {event.message}".strip()
        open_one.save(update_fields=["container_state", "reason"])
        return open_one
    return Restart.objects.create(
        node=event.node, engine=engine, kind=Restart.Kind.UNPLANNED,
        status=Restart.Status.DETECTED, requested_at=event.at, started_at=event.at,
        reason=event.message, container_state=state,
    )


def _fill_startup_times(pending: Iterable[Restart]) -> None:
    """Startup of an unplanned restart, once its engine is ready again: container start → the
    "→ ready" phase change seen, else the startup the engine's log tells, else unknown (said
    once, in ``after["startup"]``)."""
    for restart in pending:
        engine = restart.engine
        if engine.phase != "ready" or engine.started_at is None \
                or engine.started_at < restart.requested_at - MERGE_WITHIN:
            continue
        ready = Event.objects.filter(engine=engine, kind="phase-change",
                                     message__endswith="→ ready",
                                     at__gte=engine.started_at).order_by("at").first()
        if ready is not None:
            restart.startup_seconds = (ready.at - engine.started_at).total_seconds()
            restart.finished_at = ready.at
            restart.save(update_fields=["startup_seconds", "finished_at"])
            continue
        if engine.logs_read_at is None or engine.logs_read_at < engine.started_at:
            continue  # the log of this start not read yet (a failed read): a later pass reads it
        logged = _logged_startup_seconds(engine)
        if logged is not None:
            restart.startup_seconds = logged
            restart.finished_at = engine.started_at + timedelta(seconds=logged)
            restart.after = {**(restart.after or {}), STARTUP: {
                "source": "log", "text": f"{engine.name} was ready when SparkOps saw it again; "
                                         f"its log tells a startup of {logged:.0f} s"}}
            restart.save(update_fields=["startup_seconds", "finished_at", "after"])
            continue
        restart.after = {**(restart.after or {}), STARTUP: {
            "source": None, "text": f"{engine.name} was ready when SparkOps saw it again, and "
                                    "its log tells no startup: how long it took is unknown"}}
        restart.save(update_fields=["after"])


def _logged_startup_seconds(engine: Engine) -> float | None:
    """The startup (first line → ready) the engine's log tells, as last read; None when it tells
    none."""
    seconds = (engine.startup or {}).get("startup_seconds")
    return float(seconds) if isinstance(seconds, int | float) and seconds >= 0 else None


def judge_memory_returns(node: Node, now: datetime) -> list[Event]:
    """Judge, once each, whether the unplanned stops of ``node`` recorded lately handed back
    what the engine held, once the grace period after the stop has passed; the
    ``memory-not-returned`` events written. Cost: a few queries per unjudged stop."""
    since = _recent_since(now)
    return _judge(node, [restart for restart in _open_and_recent(node, now)
                         if restart.requested_at >= since], now)


def _judge(node: Node, restarts: list[Restart], now: datetime) -> list[Event]:
    grace = timedelta(seconds=settings.SPARKOPS_MEMORY_RETURN_GRACE_SECONDS)
    written = []
    for restart in restarts:
        if "memory_return" in (restart.after or {}):
            continue
        event_ids = (restart.container_state or {}).get("event_ids", [])
        stop = Event.objects.filter(pk__in=event_ids, kind__in=STOP_EVENTS).order_by("at").first()
        if stop is None or now < stop.at + grace:
            continue
        judgement = judge_stop(node, restart.engine, stop, now)
        restart.after = {**(restart.after or {}), "memory_return": judgement}
        restart.save(update_fields=["after"])
        if judgement["verdict"] == NOT_RETURNED:
            written.append(Event.objects.create(
                node=node, engine=restart.engine, at=now, kind=MEMORY_NOT_RETURNED,
                severity=Event.Severity.WARNING, message=judgement["text"]))
    return written


def judge_stop(node: Node, engine: Engine, stop: Event, now: datetime) -> dict[str, Any]:
    """The verdict on one stop seen by the collectors (``stop``), read from what they stored:
    ``verdict`` ("returned", "not returned" or "unknown", with ``why``), the rooms' accounts
    (:class:`~dashboard.restarts.fit.MemoryReturn` as dicts, the one that says least is missing
    first), what each engine held at the judgement (``engines_held``) and ``text``."""
    base: dict[str, Any] = {"stopped_at": stop.at.isoformat(), "judged_at": now.isoformat(),
                            "waited_seconds": round((now - stop.at).total_seconds(), 1),
                            "grace_seconds": settings.SPARKOPS_MEMORY_RETURN_GRACE_SECONDS,
                            "accounts": [], "text": ""}
    grace = timedelta(seconds=settings.SPARKOPS_MEMORY_RETURN_GRACE_SECONDS)
    again = Event.objects.filter(engine=engine, kind__in=START_EVENTS, at__gt=stop.at,
                                 at__lte=now).order_by("at").values_list("at", flat=True).first()
    if again is not None and again < stop.at + grace:
        return {**base, "verdict": "unknown",
                "why": f"{engine.name} started again within the grace period: its new start "
                       "holds memory anew"}
    # Room figures from before its next start only (a collection's reading may already hold
    # what the new start allocated before the collectors saw it).
    until = now if again is None else again - timedelta(seconds=settings.SPARKOPS_COLLECT_INTERVAL)
    held_figures = (EngineMetric.CONTAINER_MEMORY, EngineMetric.GPU_MEMORY)
    ran_at = EngineReading.objects.filter(ENGINE.holding_any(held_figures), engine=engine,
                                          at__lt=stop.at) \
        .order_by("-at").values_list("at", flat=True).first()
    if ran_at is None:
        return {**base, "verdict": "unknown",
                "why": f"{engine.name} was never read running before it stopped"}
    # The room before the stop is read only once the engine served (answered a scrape, which
    # it does after its start-up allocated its memory): a figure from while it still loaded
    # would not yet be short of what it held.
    scraped = [metric for metric in EngineMetric if metric not in held_figures]
    served = EngineReading.objects.filter(ENGINE.holding_any(scraped), engine=engine,
                                          at__lte=ran_at)
    if engine.started_at is not None:
        served = served.filter(at__gte=engine.started_at)
    served_at = served.order_by("at").values_list("at", flat=True).first()
    if served_at is None:
        return {**base, "verdict": "unknown",
                "why": f"{engine.name} stopped before it was read serving"}
    gpu_seen = ENGINE.holding(EngineMetric.GPU_MEMORY).filter(engine=engine, at__lte=ran_at) \
        .order_by("-at").values_list("value", flat=True).first()
    held, parts = returned_by_stop(engine_share(engine),
                                   gpu_seen=int(gpu_seen) if gpu_seen is not None else None)
    base["held_parts"] = parts
    if held is None:
        return {**base, "verdict": "unknown",
                "why": f"what {engine.name} held is not known: it reported neither its weights "
                       "and KV pool nor loaded models, and NVML saw nothing of its processes"}
    if held == 0:
        return {**base, "verdict": "unknown",
                "why": f"{engine.name} reports holding nothing now that it stopped (what it "
                       "held while it ran is not kept)"}
    accounts = [account for source in (HOST, BUDGET)
                if (account := _account(node, source, held, (served_at, ran_at), until))
                is not None]
    base["engines_held"] = engines_held(Engine.objects.filter(node=node, present=True))
    missing = not_returned(accounts)
    ordered = sorted(accounts, key=lambda account: account is not missing)
    base["accounts"] = [account.as_dict() for account in ordered]
    if not any(account.returned is not None for account in accounts):
        return {**base, "verdict": "unknown",
                "why": "no room figure was stored both while it ran and since it stopped"}
    if missing is None:
        return {**base, "verdict": "returned", "why": ""}
    words = ROOM_WORDS[missing.source]
    text = (f"{engine.name}: memory not returned: {size_text(missing.missing)} of what it held "
            f"({size_text(held)}) is still missing {base['waited_seconds']:.0f} s after it "
            f"stopped ({words} {size_text(missing.best)}, expected "
            f"{size_text(missing.expected)} ± {size_text(missing.tolerance)}).")
    return {**base, **missing.as_dict(), "verdict": NOT_RETURNED, "why": "", "text": text}


def _account(node: Node, source: str, held: int, serving: tuple[datetime, datetime],
             until: datetime) -> MemoryReturn | None:
    """One room's account of the stop from the stored samples: the last figure while the
    engine served (``serving``: from its first scrape to its last reading running), and the
    highest after that up to ``until``; None when that room has no figure from then."""
    metric, total_metric = _ROOM_METRICS[source]
    served_at, ran_at = serving
    stored = readings.HOST.holding(metric).filter(node=node)
    before = stored.filter(at__gte=served_at, at__lte=ran_at).order_by("-at") \
        .values_list("value", flat=True).first()
    if before is None:
        return None
    total = node.mem_total_bytes
    if total_metric is not None:
        total = readings.HOST.holding(total_metric).filter(node=node, at__lte=ran_at) \
            .order_by("-at").values_list("value", flat=True).first()
    since = [int(value) for value in stored.filter(at__gt=ran_at, at__lte=until)
             .values_list("value", flat=True)]
    account = MemoryReturn(source, int(before), held,
                           return_tolerance(held, int(total) if total is not None else None))
    return account.reading(max(since)) if since else account
