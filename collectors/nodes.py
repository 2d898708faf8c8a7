"""Which node this process is, and its row."""

from __future__ import annotations

import socket

from django.conf import settings

from collectors.meminfo import parse_meminfo
from collectors.models import Node
from collectors.procfs import Procfs, ProcfsError
from collectors.reads import node_named


def local_procfs() -> Procfs:
    from pathlib import Path

    return Procfs(Path(settings.SPARKOPS_PROCFS))


def local_node() -> Node:
    """The row for the node this process runs on, created on first use.

    MemTotal is read from the machine (GB10 units report 119.7–121.7 GiB; never assume 128).
    """
    node, created = node_named(settings.SPARKOPS_NODE_NAME), False
    if node is None:  # the first time: created (or made meanwhile by another process)
        node, created = Node.objects.get_or_create(
            name=settings.SPARKOPS_NODE_NAME, defaults={"hostname": socket.gethostname()}
        )
    if created or node.mem_total_bytes is None:
        try:
            node.mem_total_bytes = parse_meminfo(local_procfs().meminfo()).get("MemTotal")
        except ProcfsError:
            return node
        node.save(update_fields=["mem_total_bytes"])
    return node
