"""The node's restarts that rules judge, read once per evaluation for every rule that asks.

Four rules read restarts: unplanned-restart (the node's unplanned restarts), restart-failed (its
planned ones that failed, were interrupted or aborted), engine-down (its planned ones running)
and memory-not-returned (those whose stop was judged "not returned"). :data:`JUDGED` is the one
filter that holds all of them; each rule picks its own from that read with a plain test on a
restart (:func:`judged_restarts`). During one evaluation (:func:`one_read`, which
``evaluate_rules`` opens) the first question reads them in one query, and the others are
answered from it: one query a round instead of one per rule, over no more rows than the rules'
own queries read between them. Their engines are the round's (read a moment before, for the
rules); only a restart of an engine that is no longer present has its engine read, by one more
query. Outside an evaluation (a rule called on its own) each question is its own query, and one
for the engines when there are restarts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from django.db.models import Q, prefetch_related_objects

from collectors.models import Engine, Node
from dashboard.restarts.fit import NOT_RETURNED
from dashboard.restarts.models import Restart
from sparkops.prepared import PreparedRead

# A planned restart that ended badly (restart-failed) or is running (engine-down holds its
# engine); every unplanned one.
ENDED_BADLY = (Restart.Status.FAILED, Restart.Status.INTERRUPTED, Restart.Status.ABORTED)

JUDGED = (Q(kind=Restart.Kind.UNPLANNED)
          | Q(kind=Restart.Kind.PLANNED, status__in=(*ENDED_BADLY, Restart.Status.RUNNING))
          | Q(after__memory_return__verdict=NOT_RETURNED))

# A node's judged restarts, oldest first (a prepared read: every round reads them).
_JUDGED_OF_NODE = PreparedRead(lambda node_id: Restart.objects.filter(JUDGED, node_id=node_id)
                               .order_by("requested_at", "pk"))


@dataclass
class _Read:
    """The judged restarts read in one evaluation, by node id, and the round's engines."""

    engines: dict[int, Engine]
    by_node: dict[int, list[Restart]] = field(default_factory=dict)

    def restarts(self, node: Node) -> list[Restart]:
        if node.pk not in self.by_node:
            self.by_node[node.pk] = _read(node, self.engines)
        return self.by_node[node.pk]


_current: ContextVar[_Read | None] = ContextVar("judged_restarts", default=None)


@contextmanager
def one_read(engines: Iterable[Engine] = ()) -> Iterator[None]:
    """Within it, :func:`judged_restarts` reads each node's judged restarts once; those of
    ``engines`` (the round's, as read for it) come with these engine rows."""
    token = _current.set(_Read(engines={engine.pk: engine for engine in engines}))
    try:
        yield
    finally:
        _current.reset(token)


def judged_restarts(node: Node, which: Callable[[Restart], bool]) -> list[Restart]:
    """``node``'s restarts for which ``which`` holds, among those :data:`JUDGED` holds, in the
    order they were requested (oldest first; ties by id). Their engines come with them."""
    read = _current.get()
    restarts = read.restarts(node) if read is not None else _read(node, {})
    return [restart for restart in restarts if which(restart)]


def _read(node: Node, engines: dict[int, Engine]) -> list[Restart]:
    """``node``'s judged restarts with their engines, oldest first: those of ``engines`` given
    from it, the others read. One query, and one more for the engines not given, if any
    (joined in, the engines' columns would cost every round, also the many with no restart)."""
    restarts = _JUDGED_OF_NODE(node.pk)
    for restart in restarts:
        if restart.engine_id in engines:
            restart.engine = engines[restart.engine_id]
    prefetch_related_objects(restarts, "engine")  # skips the restarts given their engine
    return restarts
