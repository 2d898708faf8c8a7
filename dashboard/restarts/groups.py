"""Restarts of engines that span nodes: one restart of the head, one part per rank.

An engine split over several Sparks (``collectors.spanning``) has a row on every node it runs on,
and restarting one of them alone breaks the others: a rank whose head went away hangs in its
collective calls, and a head that starts without its ranks waits for them until it times out.
So a restart of such an engine is planned on its head (:func:`ranks_to_restart`), and each rank
gets a part: a :class:`~dashboard.restarts.models.Restart` of the rank's row on the rank's own
node (run there by that node's worker, as every restart is), whose ``part_of`` is the head's
restart. The head's restart is the engine's one outage; the parts are steps of it on other nodes.

The runs meet at barriers, read from the rows' recorded steps (nothing but the database is
shared between the nodes' workers):

==============================  ==============================================================
head                            part (each rank)
==============================  ==============================================================
precheck; waits until every     precheck
part passed its own
drain, stop                     waits until the head stopped; drain, stop
waits until every part stopped
drop_caches, recheck; waits     drop_caches, recheck
until every part passed its
re-check
start                           waits until the head started; start
follow until the engine         follow until its container stays up (a rank reports no
serves; waits until every       readiness of its own: the engine is ready when its head is);
part's container runs again     waits until the head's restart ended
==============================  ==============================================================

The head stops first (clients lose the engine at once, not after its ranks broke under it) and
starts first: Ray's workers join a head that runs (``ray start --address``), and vLLM's own
executor and SGLang wait for every rank at their rendezvous whichever comes first. Any member
that ends otherwise than succeeded ends the others at their next barrier or poll: ``aborted``
(``failed`` for a run whose container was already started again), naming the member, its node
and its outcome; containers already stopped stay stopped (as a lone restart's abort leaves
them), and nothing is started after a member failed.

A barrier waits at most ``SPARKOPS_RESTART_GROUP_WAIT_SECONDS`` (a part may have to wait for
its node's queue); a part waiting for its head's start waits as long as the head may need for
its own re-check.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from collectors.models import Engine
from dashboard.restarts.models import Restart, RestartStep

__all__ = ["HEAD_ENDED", "HEAD_STARTED", "HEAD_STOPPED", "PARTS_PRECHECKED", "PARTS_RECHECKED",
           "PARTS_RUNNING", "PARTS_STOPPED", "Barrier", "Group", "GroupEnded", "head_engine",
           "rank_refusal", "ranks_to_restart", "wait_until"]

OPEN = (Restart.Status.SCHEDULED, Restart.Status.RUNNING)


def _span_rows(engine: Engine) -> list[Engine]:
    """Every row of the engine ``engine`` is a part of, on any node, present or not."""
    if not engine.span_key:
        return [engine]
    return list(Engine.objects.filter(span_key=engine.span_key).select_related("node")
                .order_by("node__name", "name"))


def _is_head(engine: Engine) -> bool:
    return (engine.span or {}).get("role") == "head"


def head_engine(engine: Engine) -> Engine | None:
    """The present head of the spanning engine ``engine`` is a rank of (None: not a rank, or
    no head is present)."""
    if not engine.span_key or _is_head(engine):
        return None
    return next((row for row in _span_rows(engine) if _is_head(row) and row.present), None)


def rank_refusal(engine: Engine) -> str:
    """Why ``engine`` may not be restarted by itself ("" when it may): a rank whose head is
    present restarts with its head. A rank whose head is gone (an orphan) may be."""
    head = head_engine(engine)
    if head is None:
        return ""
    return (f"{engine.name} is a rank of an engine that spans nodes; its head is {head.name} on "
            f"{head.node.name}: plan the restart of {head.name}, and its ranks restart with it, "
            "in order")


def ranks_to_restart(head: Engine) -> tuple[list[Engine], str]:
    """The ranks a restart of ``head`` restarts with it, or ``([], why not)`` when one of them
    cannot be: not present, not enabled for management, or in an open restart already. An
    engine on one node (or a rank) has none."""
    if not head.span_key or not _is_head(head):
        return [], ""
    ranks = [row for row in _span_rows(head) if row.pk != head.pk]
    for rank in ranks:
        where = f"{rank.name} on {rank.node.name}"
        if not rank.present:
            return [], f"its rank {where} is gone: the engine cannot restart whole"
        if not rank.manageable:
            return [], (f"its rank {where} is not enabled for management (label "
                        "sparkops.manage=true or the admin setting)")
        open_one = Restart.objects.filter(engine=rank, status__in=OPEN).first()
        if open_one is not None:
            return [], f"its rank {where} already has a {open_one.status} restart (#{open_one.pk})"
    return ranks, ""


class GroupEnded(Exception):
    """Another member of the group ended otherwise than succeeded."""


@dataclass(frozen=True)
class Barrier:
    """What one run waits for: words for people, and the step the awaited members must have
    finished ok (``None``: that they ended)."""

    name: str
    step: str | None
    on: str  # PARTS (the head waits for its parts) or HEAD (a part waits for its head)


PARTS, HEAD = "parts", "head"
PARTS_PRECHECKED = Barrier("every rank passed its pre-check", "precheck", PARTS)
PARTS_STOPPED = Barrier("every rank stopped", "stop", PARTS)
PARTS_RECHECKED = Barrier("every rank passed its re-check", "recheck", PARTS)
PARTS_RUNNING = Barrier("every rank's container runs again", "follow", PARTS)
HEAD_STOPPED = Barrier("the head stopped", "stop", HEAD)
HEAD_STARTED = Barrier("the head started", "start", HEAD)
HEAD_ENDED = Barrier("the head's restart ended", None, HEAD)


@dataclass(frozen=True)
class Group:
    """The restart group a run belongs to, seen from one of its members."""

    restart_id: int
    head_id: int
    part_ids: tuple[int, ...]

    @classmethod
    def of(cls, restart: Restart) -> Group | None:
        """The group of ``restart``; None for a restart of an engine on one node."""
        head_id = restart.part_of_id or restart.pk
        parts = tuple(Restart.objects.filter(part_of_id=head_id).order_by("pk")
                      .values_list("pk", flat=True))
        if not parts:
            return None
        return cls(restart_id=restart.pk, head_id=head_id, part_ids=parts)

    @property
    def is_head(self) -> bool:
        return self.restart_id == self.head_id

    def awaited(self, barrier: Barrier) -> tuple[int, ...]:
        return self.part_ids if barrier.on == PARTS else (self.head_id,)

    def passed(self, barrier: Barrier) -> bool:
        """Has every awaited member passed ``barrier``? Raises :class:`GroupEnded` first when
        another member ended otherwise than succeeded (two queries)."""
        self.raise_if_ended()
        awaited = self.awaited(barrier)
        if barrier.step is None:
            done = Restart.objects.filter(pk__in=awaited).exclude(status__in=OPEN)
        else:
            done = RestartStep.objects.filter(restart_id__in=awaited, step=barrier.step,
                                              ok=True, finished_at__isnull=False)
        return done.values("restart_id" if barrier.step else "pk").distinct().count() \
            == len(awaited)

    def raise_if_ended(self) -> None:
        """Raise :class:`GroupEnded` naming the first other member that ended otherwise than
        succeeded (one query)."""
        others = [pk for pk in (self.head_id, *self.part_ids) if pk != self.restart_id]
        member = (Restart.objects.filter(pk__in=others).exclude(status__in=OPEN)
                  .exclude(status=Restart.Status.SUCCEEDED).select_related("node", "engine")
                  .order_by("finished_at", "pk").first())
        if member is not None:
            role = "the head" if member.pk == self.head_id else "the rank"
            raise GroupEnded(f"the restart of {role} {member.engine.name} on "
                             f"{member.node.name} (#{member.pk}) ended {member.status}: "
                             f"{member.outcome}")

    def members_words(self, barrier: Barrier) -> str:
        rows = (Restart.objects.filter(pk__in=self.awaited(barrier))
                .select_related("node", "engine").order_by("pk"))
        return ", ".join(f"{r.engine.name} on {r.node.name} (#{r.pk})" for r in rows)


def wait_until(group: Group, barrier: Barrier, *, limit: float, mono: Callable[[], float],
               pause: Callable[[float], None], poll: float) -> float:
    """Block until ``group`` passed ``barrier``; the seconds waited. ``pause(seconds)`` runs
    between reads (the run's heartbeat and sleep). Raises :class:`GroupEnded` when another
    member ended badly, :class:`TimeoutError` after ``limit`` seconds."""
    begun = mono()
    while not group.passed(barrier):
        waited = mono() - begun
        if waited >= limit:
            raise TimeoutError(f"{barrier.name} not within {limit:.0f} s (waiting for "
                               f"{group.members_words(barrier)})")
        pause(min(poll, max(limit - waited, 0.0)))
    return mono() - begun
