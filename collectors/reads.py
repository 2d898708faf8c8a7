"""The rows every collection and every alert round read, as prepared reads
(:mod:`sparkops.prepared`): a node by its name, and a node's present engines."""

from __future__ import annotations

from collectors.models import Engine, Node
from sparkops.prepared import PreparedRead

_NODE_NAMED = PreparedRead(lambda name: Node.objects.filter(name=name).order_by("pk")[:1])
# By name: the engines' own order (node, name) within one node, without joining the node.
_PRESENT_ENGINES = PreparedRead(lambda node_id: Engine.objects
                                .filter(node_id=node_id, present=True).order_by("name"))


def node_named(name: str) -> Node | None:
    """The node called ``name``, or None. One query."""
    found = _NODE_NAMED(name)
    return found[0] if found else None


def present_engines(node: Node) -> list[Engine]:
    """``node``'s present engines, by name. One query."""
    return _PRESENT_ENGINES(node.pk)
