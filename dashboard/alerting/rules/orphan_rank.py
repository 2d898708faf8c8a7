"""Orphan rank: a part of an engine spread over nodes holds memory while the engine cannot serve.

On 2–4 GB10s linked by ConnectX-7 one model is split over a container per node
(``collectors.spanning``: ``Engine.span_key`` names the engine on every node, ``Engine.span``
each row's place). When the head's container stops, the ranks on the other nodes often keep
running and keep their share of the model: tens of GiB pinned on a node for an engine that no
longer answers, which nothing else on that node can use. The other way round, a head whose rank
died keeps its own share while it cannot serve.

The rule is evaluated per node, over that node's spanning engines; the other parts of each
engine are read across nodes by ``span_key``. One condition per spanning engine row of the node:

* a rank (``span.role`` "rank"): its value is the memory it holds (GiB; its ledger share, its
  container's memory or its GPU memory, the largest known; none once its container stopped)
  while every head row of its span is stopped or gone, else 0; unknown (None) when no head of it
  was ever seen on a node SparkOps watches;
* a head: the memory it holds while a rank it expects (``span.ranks``) is not running on any
  node, else 0; unknown when how many ranks it has is not known, or no rank of it was ever seen.

It fires above a small floor (a rank's own program holds a few hundred MiB before it loads
anything). Engines of a planned restart in progress, on any node of their span, are not judged
(unknown for its duration): a planned restart stops the head and the ranks on purpose.
Cost: one query for the spans' rows and one for their restarts, and one per stopped head.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

from collectors.models import Engine, Event, Node
from collectors.spanning import HEAD, RANK
from dashboard.alerting.conditions import Condition
from dashboard.alerting.rules.base import Rule, ThresholdSpec
from dashboard.restarts.models import Restart
from sparkops.timetext import moment_text
from sparkops.units import UNKNOWN, gib, size_text

STOPPED_KINDS = ("engine-exited", "engine-gone")


def evaluate(node: Node, ledger: dict, engines: list[Engine], t: dict[str, Any],
             now: datetime) -> list[Condition]:
    """One condition per spanning engine row of ``node`` (see the module)."""
    spanning = [e for e in engines if e.span_key and (e.span or {}).get("role") in (HEAD, RANK)]
    if not spanning:
        return []
    keys = {e.span_key for e in spanning}
    members: dict[str, list[Engine]] = defaultdict(list)
    for member in Engine.objects.filter(span_key__in=keys).select_related("node"):
        members[member.span_key].append(member)
    restarting = _restarting(keys, now)
    shares = {share.get("engine_id"): share for share in ledger.get("engines") or []}
    conditions = []
    for engine in spanning:
        others = [m for m in members[engine.span_key] if m.pk != engine.pk]
        if engine.span_key in restarting:
            judged: tuple[float | None, str, dict[str, Any]] = (
                None, f"{_part(engine)} of {_name(engine, others)} on {node.name}: not judged "
                      "while a planned restart of it is in progress", {})
        elif engine.span["role"] == RANK:
            judged = _rank(node, engine, others, shares, now)
        else:
            judged = _head(node, engine, others, shares)
        value, summary, details = judged
        conditions.append(Condition(
            rule=RULE.name, node_id=node.pk, engine_id=engine.pk, value=value,
            threshold=t["floor_gib"], clear=t["floor_gib"], direction="above",
            severity="warning", summary=summary,
            details={"engine": engine.name, "span_key": engine.span_key,
                     "role": engine.span.get("role"), "rank": engine.span.get("rank"),
                     "ranks": engine.span.get("ranks"), "floor_gib": t["floor_gib"],
                     **details},
        ))
    return conditions


def _rank(node: Node, engine: Engine, others: list[Engine], shares: dict[Any, dict],
          now: datetime) -> tuple[float | None, str, dict[str, Any]]:
    """A rank: the memory it holds while no head of its span runs."""
    heads = [m for m in others if (m.span or {}).get("role") == HEAD]
    held = _held(engine, shares.get(engine.pk))
    what = f"{_part(engine)} of {_name(engine, others)} on {node.name}"
    holds = _holds(engine, held)
    if not heads:
        return None, (f"{what} {holds}; its head is {UNKNOWN} — no head of it was ever seen on "
                      "a node SparkOps watches"), {"held_bytes": held}
    running = [h for h in heads if _running(h)]
    if running:
        head = running[0]
        return 0.0, f"{what} {holds}; its head on {head.node.name} runs", \
            {"held_bytes": held, "head": head.name, "head_node": head.node.name}
    head = max(heads, key=lambda h: h.last_seen)
    stopped_at = _stopped_at(head)
    when = (f"{_ago(stopped_at, now)} ago ({moment_text(stopped_at, UTC)})"
            if stopped_at else f"at a moment {UNKNOWN} — no stop of it was recorded")
    how = "is gone" if not head.present else f"stopped (container {head.container_state})"
    still = "still " if held else ""
    summary = f"{what} {still}{holds}; its head on {head.node.name} {how} {when}"
    return (gib(held) if held is not None else None), summary, {
        "held_bytes": held, "head": head.name, "head_node": head.node.name,
        "head_state": head.container_state if head.present else "gone",
        "head_stopped_at": stopped_at.isoformat() if stopped_at else None}


def _head(node: Node, engine: Engine, others: list[Engine],
          shares: dict[Any, dict]) -> tuple[float | None, str, dict[str, Any]]:
    """A head: the memory it holds while a rank it expects runs on no node."""
    span = engine.span
    what = f"{engine.name} on {node.name}"
    if not _running(engine):
        return 0.0, f"{what} is not running (engine-down says why)", {}
    ranks = span.get("ranks")
    if ranks is None:
        return None, (f"{what}: how many ranks it has is {UNKNOWN} — "
                      f"{span.get('basis') or 'its flags do not say'}"), {}
    if ranks <= 1 or not others:
        state = "it expects no other rank" if ranks <= 1 else \
            f"{UNKNOWN} — no other rank of it was ever seen on a node SparkOps watches"
        return (0.0 if ranks <= 1 else None), f"{what}: {state}", {}
    missing = _missing(engine, others, ranks)
    held = _held(engine, shares.get(engine.pk))
    if not missing:
        return 0.0, f"{what} runs with all {ranks} ranks", {"held_bytes": held}
    where = "; ".join(_where(rank, others) for rank in missing)
    summary = (f"{what} runs without {_ranks_words(missing)} of {ranks} ({where}); it "
               f"{_holds(engine, held)} it cannot serve with")
    return (gib(held) if held is not None else None), summary, \
        {"held_bytes": held, "missing_ranks": missing}


def _missing(head: Engine, others: list[Engine], ranks: int) -> list[int]:
    """The ranks 0..ranks-1 that no running row of the span runs; a running row of unknown
    rank (a Ray worker) stands for the lowest one still missing."""
    covered: set[int] = set()
    unnumbered = 0
    for row in [head, *[o for o in others if _running(o)]]:
        span = row.span or {}
        if span.get("rank") is None:
            unnumbered += 1
            continue
        covered.update(range(span["rank"], span["rank"] + (span.get("local") or 1)))
    missing = sorted(set(range(ranks)) - covered)
    return missing[unnumbered:]


def _where(rank: int, others: list[Engine]) -> str:
    """Where rank ``rank`` was last seen, and its state then."""
    rows = [o for o in others if (o.span or {}).get("rank") is not None
            and o.span["rank"] <= rank < o.span["rank"] + (o.span.get("local") or 1)]
    if not rows:
        return f"rank {rank}: not seen on any node"
    row = max(rows, key=lambda r: r.last_seen)
    state = "container gone" if not row.present else f"container {row.container_state}" + (
        f", exit code {row.exit_code}" if row.exit_code is not None else "")
    return f"rank {rank} on {row.node.name}: {state}"


def _held(engine: Engine, share: dict | None) -> int | None:
    """What the engine holds now: the largest of its ledger share (what it holds, what it
    reported reserving), its container's memory and its GPU memory; 0 once its container
    stopped (its processes are gone; memory not returned is that rule's); None when none
    is known."""
    if not _running(engine):
        return 0
    share = share or {}
    known = [v for v in (share.get("actual"), share.get("reserved"), engine.memory_usage_bytes,
                         engine.gpu_memory_bytes) if isinstance(v, int | float)]
    return int(max(known)) if known else None


def _holds(engine: Engine, held: int | None) -> str:
    if held is None:
        return f"holds {UNKNOWN} — its memory was not read"
    if not _running(engine):
        return f"holds nothing (container {engine.container_state if engine.present else 'gone'})"
    return f"holds {size_text(held)}"


def _running(engine: Engine) -> bool:
    return engine.present and engine.container_state == "running"


def _stopped_at(head: Engine) -> datetime | None:
    event = Event.objects.filter(engine=head, kind__in=STOPPED_KINDS).order_by("-at").first()
    return event.at if event is not None else None


def _restarting(keys: set[str], now: datetime) -> set[str]:
    """The span keys with an engine, on any node, in a planned restart not past its deadline."""
    running = Restart.objects.filter(kind="planned", status="running",
                                     engine__span_key__in=keys).select_related("engine")
    return {r.engine.span_key for r in running if r.deadline is None or r.deadline > now}


def _part(engine: Engine) -> str:
    """The row's place in its span, for people: "rank 1", "ranks 2–3", "a Ray worker"."""
    span = engine.span or {}
    rank, local = span.get("rank"), span.get("local") or 1
    if rank is None:
        return "a Ray worker" if span.get("backend") == "ray" else "a rank"
    return _ranks_words(list(range(rank, rank + local))) if local > 1 else f"rank {rank}"


def _ranks_words(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}–{ranks[-1]}"
    return "ranks " + ", ".join(str(rank) for rank in ranks)


def _name(engine: Engine, others: list[Engine]) -> str:
    """The span's name for people: its label's, else its head's engine name, else the key."""
    if (engine.span or {}).get("backend") == "label":
        return engine.span_key.partition("|")[2]
    heads = [o for o in others if (o.span or {}).get("role") == HEAD]
    if (engine.span or {}).get("role") == HEAD:
        return engine.name
    return heads[0].name if heads else engine.span_key


def _ago(then: datetime, now: datetime) -> str:
    """How long before ``now``: "40 s", "4 min", "2 h 5 min"."""
    seconds = max(int((now - then).total_seconds()), 0)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min"
    hours, rest = divmod(seconds, 3600)
    return f"{hours} h {rest // 60} min" if rest // 60 else f"{hours} h"


RULE = Rule(
    name="orphan-rank",
    title="Orphan rank",
    description=(
        "An engine spread over nodes (tensor, pipeline or data parallel over vLLM's executor "
        "or Ray, or SGLang over nodes; or labelled sparkops.span) has a part that holds memory "
        "it cannot serve with: a rank still running while its head is stopped or gone, or a "
        "head running while a rank it expects runs on no node. The value is the memory that "
        "part holds. Engines of a planned restart in progress are not judged."
    ),
    for_seconds=120,
    evaluate=evaluate,
    thresholds=(
        ThresholdSpec(
            key="floor_gib", label="Memory floor", default=1.0, unit="GiB",
            help="A part holding less than this is not named: a rank's own program holds a "
                 "few hundred MiB before it loads any weights.",
            minimum=0.0, maximum=1024.0),
    ),
    value_unit="GiB",
)
