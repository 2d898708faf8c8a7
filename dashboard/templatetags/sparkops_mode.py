"""Read-only mode on the pages: ``{% load sparkops_mode %}``.

``{% read_only_mode as read_only %}`` is True when SparkOps runs read-only
(``SPARKOPS_READ_ONLY``), for pages that word an action differently then; ``{% read_only_notice %}``
writes the banner that says so (nothing otherwise), in the words the refusals use
(:data:`collectors.docker_api.READ_ONLY_TEXT`). The refusal itself happens at the seam
(``collectors.docker_api``, ``collectors.pagecache``) and in planning; this only tells the admin
before they try.
"""

from __future__ import annotations

from django import template
from django.utils.html import format_html

from collectors.docker_api import READ_ONLY_TEXT, read_only

__all__ = ["read_only_mode", "read_only_notice"]

register = template.Library()


@register.simple_tag
def read_only_mode() -> bool:
    return read_only()


@register.simple_tag
def read_only_notice() -> str:
    if not read_only():
        return ""
    return format_html('<p class="banner warn read-only-banner" role="status">'
                       "<strong>Read-only:</strong> {}.</p>", READ_ONLY_TEXT)
