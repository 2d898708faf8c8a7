"""One way to show a moment on a page: ``{% load sparkops_time %}{{ at|when }}``.

Every datetime is written as ``2026-12-01 22:09:16 KST``: an ISO-like date and a 24-hour time in
the active zone (the viewer's, set by ``dashboard.zone.ViewerZoneMiddleware``), followed by the
zone's abbreviation, or by its UTC offset (``UTC+04:00``) where the zone has no letters for it.
It is wrapped in ``<time datetime="…Z" title="Asia/Seoul">`` so the instant (in UTC) and the zone's
name are in the page too. ``{{ at|when:"relative" }}`` adds ``data-relative``: the page's script
then shows "3 min ago" with the exact time as the tooltip (static/js/clock.js).

``{% zone_attributes %}`` writes the active zone for the pages' scripts: its name and, for the
offsets it uses this year, the abbreviation of each, so a time formatted in the browser carries
the same label as one formatted here.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, tzinfo

from django import template
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.html import format_html

from dashboard.zone import viewer_zone
from sparkops.timetext import (
    minute_text,
    moment_text,
    offset_text,
    same_clock,
    zone_label,
    zone_name,
)

__all__ = ["also_in", "offset_text", "when", "zone_abbreviations", "zone_attributes", "zone_name"]

register = template.Library()

def _moment(value: object) -> datetime | None:
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str) and value:
        moment = parse_datetime(value)
    else:
        return None
    if moment is None:
        return None
    if timezone.is_naive(moment):
        moment = moment.replace(tzinfo=UTC)
    return moment


@register.filter(is_safe=True)
def when(value: object, style: str = "") -> str:
    """``value`` (an aware datetime, or an ISO string) as ``<time>`` in the active zone; ``""``
    for ``None`` or an empty value, so ``|default:"—"`` can follow."""
    moment = _moment(value)
    if moment is None:
        return ""
    zone = timezone.get_current_timezone()
    instant = moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    text = moment_text(moment, zone)
    if style == "relative":
        return format_html('<time datetime="{}" title="{}" data-relative>{}</time>', instant,
                           text, text)
    return format_html('<time datetime="{}" title="{}">{}</time>', instant, zone_name(zone), text)


@register.filter(is_safe=True)
def also_in(value: object, zone_key: str) -> str:
    """After ``{{ at|when }}``: ``(window's zone: 2036-11-02 03:00 KST, Asia/Seoul)`` where the
    zone ``zone_key`` (a restart window's own) reads ``value`` differently from the viewer's;
    ``""`` where both read it alike, for ``None``, or for an unknown zone."""
    moment = _moment(value)
    zone = viewer_zone(zone_key)
    if moment is None or zone is None or same_clock(moment, zone, timezone.get_current_timezone()):
        return ""
    return format_html('<span class="muted window-zone">(window\'s zone: {}, {})</span>',
                       minute_text(moment, zone), zone_name(zone))


def zone_abbreviations(zone: tzinfo, year: int) -> dict[str, str]:
    """Offset in minutes (as a string) → abbreviation, for the offsets ``zone`` uses in ``year``
    (sampled on the first of each month: a zone changes offset at most a few times a year)."""
    labels: dict[str, str] = {}
    for month in range(1, 13):
        local = datetime(year, month, 1, 12, tzinfo=UTC).astimezone(zone)
        offset = local.utcoffset() or timedelta(0)
        label = zone_label(local)
        if label[0].isalpha() and not label.startswith("UTC+") and not label.startswith("UTC-"):
            labels[str(int(offset.total_seconds() // 60))] = label
    return labels


@register.simple_tag
def zone_attributes() -> str:
    zone = timezone.get_current_timezone()
    year = timezone.now().year
    labels = zone_abbreviations(zone, year)
    return format_html('data-zone="{}" data-zone-labels="{}"', zone_name(zone), json.dumps(labels))

