"""The collectors' one hand-off to the rest of SparkOps: signals sent after node-side work.

Collection knows nothing of what follows it. Whoever needs to act after a collection (alert
evaluation does) connects a receiver here, in its own ``AppConfig.ready()``; the collectors
never name a module, a task or an app of the centre.
"""

from __future__ import annotations

from django.dispatch import Signal

__all__ = ["collection_finished"]

# Sent by ``collectors.tasks.collect_host_memory`` once a host collection is stored (or stored
# as failed), on the node's worker. Arguments: ``node_name`` (str), ``collection_id`` (int),
# ``ok`` (bool). Receivers must be quick (queue work, do not do it): they run inside the
# node's collection task. A receiver that raises is logged and the others still run.
collection_finished = Signal()
