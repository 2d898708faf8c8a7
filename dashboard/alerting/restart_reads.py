"""The node's restarts that rules judge, read once per evaluation for every rule that asks.

Four rules read restarts: unplanned-restart (the node's unplanned restarts), restart-failed (its
planned ones that failed, were interrupted or aborted), engine-down (its planned ones running)
and memory-not-returned (those whose stop was judged "not returned"). :data:`JUDGED` is the one
filter that holds all of them; each rule picks its own from that read with a plain test on a
restart (:func:`judged_restarts`). During one evaluation (:func:`one_read`, which
``evaluate_rules`` opens) the first question reads them, with their engines, in one query, and
the others are answered from it: one query a round instead of one per rule, over no more rows
than the rules' own queries read between them. Outside an evaluation (a rule called on its own)
each question is its own query.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from django.db.models import Q

from collectors.models import Node
from dashboard.restarts.fit import NOT_RETURNED
from dashboard.restarts.models import Restart

# A planned restart that ended badly (restart-failed) or is running (engine-down holds its
# engine); every unplanned one.
ENDED_BADLY = (Restart.Status.FAILED, Restart.Status.INTERRUPTED, Restart.Status.ABORTED)

JUDGED = (Q(kind=Restart.Kind.UNPLANNED)
          | Q(kind=Restart.Kind.PLANNED, status__in=(*ENDED_BADLY, Restart.Status.RUNNING))
          | Q(after__memory_return__verdict=NOT_RETURNED))


@dataclass
class _Read:
    """The judged restarts read in one evaluation, by node id."""

    by_node: dict[int, list[Restart]] = field(default_factory=dict)
    queries: int = 0

    def restarts(self, node: Node) -> list[Restart]:
        if node.pk not in self.by_node:
            self.by_node[node.pk] = _read(node)
            self.queries += 1
        return self.by_node[node.pk]


_current: ContextVar[_Read | None] = ContextVar("judged_restarts", default=None)


@contextmanager
def one_read() -> Iterator[None]:
    """Within it, :func:`judged_restarts` reads each node's judged restarts once."""
    token = _current.set(_Read())
    try:
        yield
    finally:
        _current.reset(token)


def judged_restarts(node: Node, which: Callable[[Restart], bool]) -> list[Restart]:
    """``node``'s restarts for which ``which`` holds, among those :data:`JUDGED` holds, in the
    order they were requested (oldest first; ties by id). Their engines come with them."""
    read = _current.get()
    restarts = read.restarts(node) if read is not None else _read(node)
    return [restart for restart in restarts if which(restart)]


def _read(node: Node) -> list[Restart]:
    """One query: ``node``'s judged restarts with their engines, oldest first."""
    return list(Restart.objects.filter(JUDGED, node=node).select_related("engine")
                .order_by("requested_at", "pk"))
