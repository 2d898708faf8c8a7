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

register = template.Library()

FORMAT = "%Y-%m-%d %H:%M:%S"


def zone_name(zone: tzinfo) -> str:
    """The zone's IANA name (``Asia/Seoul``), or what the zone calls itself otherwise."""
    return getattr(zone, "key", None) or str(zone)


def offset_text(offset: timedelta | None) -> str:
    """``UTC+09:00``, ``UTC-03:30``, ``UTC`` for a zero offset."""
    if not offset:
        return "UTC"
    minutes = int(offset.total_seconds() // 60)
    sign = "+" if minutes >= 0 else "-"
    hours, rest = divmod(abs(minutes), 60)
    return f"UTC{sign}{hours:02d}:{rest:02d}"


def zone_label(moment: datetime) -> str:
    """The abbreviation of ``moment``'s zone at that moment (``KST``, ``CET``, ``UTC``), or its
    offset where the zone database has only numbers for it (``+04`` becomes ``UTC+04:00``)."""
    name = moment.tzname() or ""
    if name and name[0].isalpha():
        return name
    return offset_text(moment.utcoffset())


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
    local = moment.astimezone(zone)
    instant = moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    text = f"{local.strftime(FORMAT)} {zone_label(local)}"
    if style == "relative":
        return format_html('<time datetime="{}" title="{}" data-relative>{}</time>', instant,
                           text, text)
    return format_html('<time datetime="{}" title="{}">{}</time>', instant, zone_name(zone), text)


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

