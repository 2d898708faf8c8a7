"""The central beat's scheduler: node-local collections for every node that has an agent.

A fleet node's agent (``bin/sparkops agent``) runs no beat; the central stack's beat publishes
each node's collections to that node's queue. Which nodes those are is not configuration but
what the database says: ``SPARKOPS_BEAT_NODES`` (the central node itself, or nodes collected
the old way), plus every node whose own worker registered it (``Node.agent_started_at``,
``collectors.registration``). :class:`FleetScheduler` is Celery's ``PersistentScheduler`` (the
schedule file keeps each entry's last run across restarts) whose schedule is re-read every
``REFRESH_SECONDS``:

1. the configured schedule (``app.conf.beat_schedule``: ``sparkops.celery.beat_schedule`` of
   ``SPARKOPS_BEAT_NODES``, with the central housekeeping), plus
2. ``sparkops.celery.node_schedule`` of every agent-backed node that is not silent,

merged in place (``merge_inplace``: an entry whose node left is removed, a new node's entries
are added, the others keep their last run). The beat's own node is not taken from the database:
its worker registers it too, but whether it is collected stays ``SPARKOPS_BEAT_NODES``' say
(by default it is; a centre that names only other nodes collects no host of its own).

A node is *silent* while its last heartbeat is older than
``heartbeat.unreachable_after_seconds()`` (on the database's clock): its collections
are paused until it beats again, because each one would only wait in its queue and expire, and
a node down over a weekend would leave some hundred thousand of them in the broker. A node that
comes back is scheduled again within ``REFRESH_SECONDS`` of its first beat.

When the database cannot be read, the last list of nodes is kept and the failure logged once
(then again when it recovers); beat itself carries on. The stack's beat thread uses this
scheduler (``sparkops.stackworker``, by the path ``sparkops.celery.FLEET_SCHEDULER``).

Cost: one query of the node table (a row per node) every ``REFRESH_SECONDS`` (5 s), on the
beat's own connection, kept as Django keeps a request's (closed once unusable or older than
``CONN_MAX_AGE``): opening one for every refresh was most of the refresh's CPU. The schedule
is merged only when the agents to collect changed: merging builds every entry anew, with
Celery's time-zone work for each, and it was half of the beat's CPU between two sends.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

from celery.beat import PersistentScheduler
from django.conf import settings
from django.db import connection
from django.db.models import Q
from django.db.models.functions import Now

from collectors import heartbeat
from collectors.models import Node
from sparkops.celery import node_schedule

log = logging.getLogger(__name__)

REFRESH_SECONDS = 5.0


def agent_nodes_to_collect() -> list[str]:
    """The agent-backed nodes whose collections the central beat schedules now: registered
    (``agent_started_at`` set) and not silent (a beat within the unreachable bound, or none
    yet), sorted by name."""
    silent_before = Now() - timedelta(seconds=heartbeat.unreachable_after_seconds())
    return list(Node.objects.filter(agent_started_at__isnull=False)
                .filter(Q(heartbeat_at__isnull=True) | Q(heartbeat_at__gte=silent_before))
                .order_by("name").values_list("name", flat=True))


def fleet_schedule(configured: dict[str, dict], agents: Iterable[str],
                   collect_interval: float) -> dict[str, dict]:
    """The configured schedule plus the node-local collections of ``agents``."""
    return {**configured, **node_schedule(list(agents), collect_interval)}


class FleetScheduler(PersistentScheduler):
    """Celery beat's persistent scheduler over the configured nodes and the agent-backed ones
    (module docstring). ``clock`` is a monotonic clock in seconds."""

    refresh_seconds = REFRESH_SECONDS

    def __init__(self, *args: Any, clock: Callable[[], float] = time.monotonic,
                 **kwargs: Any) -> None:
        # Set before Celery's __init__, which sets the schedule up (and so refreshes it).
        self._clock = clock
        self._next_refresh = 0.0
        self._failing = False
        self.agent_nodes: list[str] = []
        self._merged: list[str] | None = None  # the agents the schedule was last merged with
        super().__init__(*args, **kwargs)

    def setup_schedule(self) -> None:
        super().setup_schedule()
        self.refresh()

    def refresh(self) -> bool:
        """Re-read the agent-backed nodes and merge the schedule; False when the database
        could not be read (the schedule then stays as it was)."""
        self._next_refresh = self._clock() + self.refresh_seconds
        try:
            agents = [name for name in agent_nodes_to_collect()
                      if name != settings.SPARKOPS_NODE_NAME]
        except Exception as error:  # noqa: BLE001 - beat carries on with the last list
            if not connection.in_atomic_block:  # a caller's transaction is the caller's
                connection.close()  # the next refresh connects anew
            if not self._failing:
                log.warning("beat cannot read which nodes have agents (%s); it keeps "
                            "collecting %s", error, ", ".join(self.agent_nodes) or "no agent")
            self._failing = True
            return False
        if not connection.in_atomic_block:
            connection.close_if_unusable_or_obsolete()  # kept while usable and not too old
        if self._failing:
            log.warning("beat reads which nodes have agents again")
            self._failing = False
        self._announce(agents)
        self.agent_nodes = agents
        if agents != self._merged:
            self.merge_inplace(fleet_schedule(self.app.conf.beat_schedule, agents,
                                              settings.SPARKOPS_COLLECT_INTERVAL))
            self.install_default_entries(self.schedule)  # Celery's own, as its setup adds them
            self._merged = agents
        return True

    def adjust(self, n: float, drift: float = 0.0) -> float:
        """A delay before the next tick, not shortened by Celery's early drift (module
        docstring: shortened, a delay under 10 ms became a spin)."""
        return super().adjust(n, drift=drift)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        if self._clock() >= self._next_refresh:
            self.refresh()
        delay = super().tick(*args, **kwargs)
        return min(delay, max(self._next_refresh - self._clock(), 0.0))

    def _announce(self, agents: list[str]) -> None:
        configured = set(settings.SPARKOPS_BEAT_NODES)  # collected whatever their agent does
        joined = sorted(set(agents) - set(self.agent_nodes) - configured)
        left = sorted(set(self.agent_nodes) - set(agents) - configured)
        if joined:
            log.info("beat schedules the collections of %s (agent registered and beating)",
                     ", ".join(joined))
        if left:
            log.warning("beat pauses the collections of %s (agent silent for over %g s, or "
                        "gone)", ", ".join(left), heartbeat.unreachable_after_seconds())
