"""The fleet on every page: ``{% load sparkops_fleet %}``.

``{% fleet_link %}`` writes the navigation's "Fleet" link once there is more than one node
(nothing for a single node, whose overview is the home page); one query per page, counted once
per request. ``{% node_contact node as contact %}`` is ``dashboard.fleet.node_contact`` for a
node's own pages (the overview's banner while it is out of contact).
"""

from __future__ import annotations

from typing import Any

from django import template
from django.conf import settings
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from collectors.models import Node
from dashboard.fleet import Contact
from dashboard.fleet import node_contact as read_contact

__all__ = ["fleet_link", "node_contact"]

register = template.Library()

_COUNTED = "_sparkops_node_count"


@register.simple_tag(takes_context=True)
def fleet_link(context: dict[str, Any]) -> str:
    request = context.get("request")
    count = getattr(request, _COUNTED, None)
    if count is None:
        count = Node.objects.count()
        if request is not None:
            setattr(request, _COUNTED, count)
    if count < 2:
        return ""
    return format_html('<a href="{}" id="fleet-link">Fleet</a>', reverse("dashboard:fleet"))


@register.simple_tag
def node_contact(node: Node) -> Contact:
    return read_contact(node, timezone.now(), settings.SPARKOPS_COLLECT_INTERVAL)
