"""How a moment is written for people: one format, always with its zone.

``2026-12-01 22:09:16 KST`` — an ISO-like date and a 24-hour time in a zone, followed by the
zone's abbreviation at that moment, or by its UTC offset (``UTC+04:00``) where the zone database
has only numbers for it. Pages write moments in the viewer's zone through the ``when`` template
filter (``dashboard/templatetags/sparkops_time.py``), which builds on these; texts that are
stored or mailed are written in UTC, so they read the same for everyone.

Minute precision (``clock_text``, ``span_text``) is for promises and windows ("back by 03:22
KST"); ``round_up`` never makes a promise optimistic.
"""

from __future__ import annotations

from datetime import datetime, timedelta, tzinfo

FORMAT = "%Y-%m-%d %H:%M:%S"
MINUTE_FORMAT = "%Y-%m-%d %H:%M"


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


def ceil_minute(at: datetime) -> datetime:
    """``at`` rounded up to a whole minute (the same instant in every zone of whole-minute
    offset, which is all of today's)."""
    if at.second or at.microsecond:
        return at.replace(second=0, microsecond=0) + timedelta(minutes=1)
    return at


def moment_text(at: datetime, zone: tzinfo) -> str:
    """``2026-12-01 22:09:16 KST``: ``at`` in ``zone``, labelled."""
    local = at.astimezone(zone)
    return f"{local.strftime(FORMAT)} {zone_label(local)}"


def clock_text(at: datetime, zone: tzinfo, *, round_up: bool = False) -> str:
    """``03:22 KST``: the time of day of ``at`` in ``zone``, to the minute, labelled."""
    local = (ceil_minute(at) if round_up else at).astimezone(zone)
    return f"{local:%H:%M} {zone_label(local)}"


def minute_text(at: datetime, zone: tzinfo, *, round_up: bool = False) -> str:
    """``2026-12-01 03:22 KST``: ``at`` in ``zone``, to the minute, labelled."""
    local = (ceil_minute(at) if round_up else at).astimezone(zone)
    return f"{local.strftime(MINUTE_FORMAT)} {zone_label(local)}"


def span_text(start: datetime, end: datetime, zone: tzinfo) -> str:
    """``2026-12-01 03:00–05:00 KST``; the end's date is written too when it differs, and each
    end has its own label when the zone changes offset in between."""
    local_start, local_end = start.astimezone(zone), end.astimezone(zone)
    start_label, end_label = zone_label(local_start), zone_label(local_end)
    end_format = "%H:%M" if local_start.date() == local_end.date() else MINUTE_FORMAT
    head = local_start.strftime(MINUTE_FORMAT)
    if start_label != end_label:
        head = f"{head} {start_label}"
    return f"{head}–{local_end.strftime(end_format)} {end_label}"


def same_clock(at: datetime, zone: tzinfo, other: tzinfo) -> bool:
    """Whether ``at`` reads the same in both zones (same offset and label at that moment)."""
    one, two = at.astimezone(zone), at.astimezone(other)
    return one.utcoffset() == two.utcoffset() and zone_label(one) == zone_label(two)


def age_text(seconds: float) -> str:
    """A length of time for people, to the second: ``4 s``, ``3 min 20 s``, ``2 h 5 min``,
    ``3 d 4 h`` (how long ago a node was last heard from, how old a collection is)."""
    seconds = max(int(seconds), 0)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s" if seconds else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"
