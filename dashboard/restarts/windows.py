"""Restart windows: RFC 5545 recurrences in a named time zone, turned into UTC occurrences.

A window's ``recurrence`` is exactly two lines, ``DTSTART;TZID=<IANA zone>:<local start>`` and
``RRULE:<rule>``, and is read with python-dateutil's ``rrulestr`` so the semantics are the
standard's, not ours. The zone is resolved with :mod:`zoneinfo`, so an occurrence keeps its local
wall-clock time across daylight-saving changes ("03:00 Europe/Berlin" is 02:00 UTC in winter and
01:00 UTC in summer). Each occurrence lasts ``duration_minutes`` of elapsed time. A local time the
clocks skip (02:30 on the night they go forward) falls an hour later, as zoneinfo reads it with
the offset before the change; one they pass twice is its first pass.

Every function here raises :class:`ValueError` with a message fit for a form on bad input.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from dateutil.rrule import rrule, rrulestr
from django.db.models import Q

from collectors.models import Engine, Node
from dashboard.restarts.models import RestartWindow

__all__ = [
    "MAX_DURATION_MINUTES",
    "WindowOccurrence",
    "build_recurrence",
    "check_window",
    "current_or_next",
    "occurrences",
    "parse_recurrence",
    "resolve_zone",
    "split_recurrence",
    "window_containing",
]

# A window longer than a day would overlap the next daily one and says nothing useful about when
# an outage is acceptable.
MAX_DURATION_MINUTES = 24 * 60
# Windows are for restarts that take ~10 minutes; a rule that fires every minute or second is a
# typo, and iterating it from DTSTART would cost real time on every page view.
REFUSED_FREQUENCIES = {"SECONDLY", "MINUTELY"}
LOCAL_FORMAT = "%Y%m%dT%H%M%S"
DTSTART_LINE = re.compile(r"^DTSTART;TZID=(?P<zone>[^:;\s]+):(?P<local>\d{8}T\d{6})$")


@dataclass(frozen=True)
class WindowOccurrence:
    """One opening of a window, in UTC: ``start <= t < end``.

    ``window`` says which window it belongs to (not part of equality).
    """

    start: datetime
    end: datetime
    window: RestartWindow | None = field(default=None, compare=False, repr=False)

    def contains(self, at: datetime) -> bool:
        return self.start <= at < self.end


def resolve_zone(name: str) -> ZoneInfo:
    """The IANA zone called ``name`` (e.g. "Asia/Seoul"), or ValueError saying it is unknown."""
    name = (name or "").strip()
    if not name:
        raise ValueError("Choose a time zone (an IANA name such as Asia/Seoul).")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"Unknown time zone {name!r}: use an IANA name such as Asia/Seoul or Europe/Berlin."
        ) from None


def build_recurrence(local_start: datetime, time_zone: str, rrule_line: str) -> str:
    """The recurrence text for a window that first opens at ``local_start`` in ``time_zone``.

    ``local_start`` is a wall-clock time (its tzinfo, if any, is ignored); ``rrule_line`` is what
    an admin types, with or without the ``RRULE:`` prefix, e.g. ``FREQ=WEEKLY;BYDAY=SU``. The
    result is validated by :func:`parse_recurrence`; ValueError explains what is wrong.
    """
    zone = resolve_zone(time_zone)
    rule = _normalise_rule(rrule_line)
    local = local_start.replace(tzinfo=None)
    text = f"DTSTART;TZID={zone.key}:{local:{LOCAL_FORMAT}}\nRRULE:{rule}"
    parse_recurrence(text)
    return text


def split_recurrence(text: str) -> tuple[datetime, str, str]:
    """``(naive local start, zone name, rule without "RRULE:")`` of a stored recurrence.

    Only the two-line form written by :func:`build_recurrence` is accepted: a floating DTSTART
    (no TZID) would make occurrences depend on the server's zone.
    """
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    if len(lines) != 2 or not lines[1].upper().startswith("RRULE:"):
        raise ValueError("A recurrence is a DTSTART;TZID=… line and an RRULE: line.")
    match = DTSTART_LINE.match(lines[0])
    if match is None:
        raise ValueError("DTSTART must name its zone: DTSTART;TZID=Asia/Seoul:20261101T030000.")
    try:
        local = datetime.strptime(match["local"], LOCAL_FORMAT)
    except ValueError:
        raise ValueError(f"DTSTART {match['local']} is not a valid date and time.") from None
    return local, match["zone"], lines[1][len("RRULE:"):]


def parse_recurrence(text: str) -> rrule:
    """The dateutil rule of a stored recurrence, its DTSTART aware in the window's zone.

    Refuses an unknown zone, a rule dateutil cannot read, COUNT=0 (no occurrence at all) and
    rules that recur more often than hourly.
    """
    _, zone_name, rule = split_recurrence(text)
    resolve_zone(zone_name)
    parts = _rule_parts(rule)
    if parts.get("COUNT") == "0":
        raise ValueError("COUNT=0 gives no occurrence at all; leave COUNT out to repeat forever.")
    if parts.get("FREQ") in REFUSED_FREQUENCIES:
        raise ValueError("A restart window recurs at most hourly (FREQ=HOURLY, DAILY, WEEKLY, "
                         "MONTHLY or YEARLY).")
    try:
        parsed = rrulestr(text, tzids=resolve_zone)
    except (ValueError, TypeError, KeyError) as error:
        raise ValueError(f"Not a valid RRULE ({error}). Example: FREQ=WEEKLY;BYDAY=SU.") from None
    if not isinstance(parsed, rrule):
        raise ValueError("Give one RRULE line.")
    return parsed


def check_window(recurrence: str, duration_minutes: int, now: datetime) -> WindowOccurrence:
    """Validate a whole window as the form saves it; returns its current or next occurrence.

    The duration must be 1 minute to 24 hours, and the rule must still open at or after ``now``
    (a rule whose COUNT or UNTIL has run out, or that matches no date, is refused).
    """
    if not 0 < duration_minutes <= MAX_DURATION_MINUTES:
        raise ValueError(f"A window lasts from 1 to {MAX_DURATION_MINUTES} minutes (24 hours).")
    found = _current_or_next(parse_recurrence(recurrence), duration_minutes, now)
    if found is None:
        raise ValueError("This rule has no occurrence from now on: its COUNT or UNTIL has run "
                         "out, or it matches no date.")
    return found


def occurrences(window: RestartWindow, start: datetime, end: datetime) -> list[WindowOccurrence]:
    """Occurrences of ``window`` overlapping ``[start, end)``, in UTC, oldest first.

    An occurrence that opened before ``start`` and is still open is included. Cost: dateutil
    iterates from DTSTART, so this is linear in the number of occurrences since then (a weekly
    window has 52 a year).
    """
    rule = parse_recurrence(window.recurrence)
    length = timedelta(minutes=window.duration_minutes)
    starts = rule.between(start - length, end, inc=True)
    found = [_occurrence(opened, length, window) for opened in starts]
    return [occ for occ in found if occ.end > start and occ.start < end]


def current_or_next(window: RestartWindow, now: datetime) -> WindowOccurrence | None:
    """The occurrence open at ``now``, else the next one, else None (the rule has run out)."""
    return _current_or_next(parse_recurrence(window.recurrence), window.duration_minutes, now,
                            window)


def window_containing(node: Node, engine: Engine | None, at: datetime) -> WindowOccurrence | None:
    """The enabled window occurrence of ``node`` open at ``at`` that applies to ``engine``.

    A node window (no engine) applies to every engine of the node; an engine window only to that
    engine. When several are open, the one that stays open longest wins (most room for the
    outage); its ``window`` attribute names it.
    """
    applies = Q(engine__isnull=True)
    if engine is not None:
        applies |= Q(engine=engine)
    candidates = RestartWindow.objects.filter(applies, node=node, enabled=True)
    best: WindowOccurrence | None = None
    for window in candidates:
        found = current_or_next(window, at)
        if found is None or not found.contains(at):
            continue
        if best is None or found.end > best.end:
            best = found
    return best


def _current_or_next(rule: rrule, duration_minutes: int, now: datetime,
                     window: RestartWindow | None = None) -> WindowOccurrence | None:
    length = timedelta(minutes=duration_minutes)
    latest = rule.before(now, inc=True)
    if latest is not None:
        occurrence = _occurrence(latest, length, window)
        if occurrence.contains(now):
            return occurrence
    upcoming = rule.after(now)
    return None if upcoming is None else _occurrence(upcoming, length, window)


def _occurrence(opened: datetime, length: timedelta,
                window: RestartWindow | None) -> WindowOccurrence:
    # Convert first, then add: the duration is elapsed time, so a 2-hour window on the night
    # the clocks change still lasts two real hours.
    start = opened.astimezone(UTC)
    return WindowOccurrence(start=start, end=start + length, window=window)


def _normalise_rule(rrule_line: str) -> str:
    rule = (rrule_line or "").strip()
    if rule.upper().startswith("RRULE:"):
        rule = rule[len("RRULE:"):].strip()
    if not rule:
        raise ValueError("Give a recurrence rule, e.g. FREQ=WEEKLY;BYDAY=SU.")
    if "\n" in rule or "\r" in rule or "DTSTART" in rule.upper():
        raise ValueError("Give only the RRULE line (e.g. FREQ=WEEKLY;BYDAY=SU); the start time "
                         "and zone have their own fields.")
    # RRULE names and values are case-insensitive (RFC 5545 §3.1); dateutil wants upper case.
    return rule.upper()


def _rule_parts(rule: str) -> dict[str, str]:
    parts: dict[str, str] = {}
    for part in rule.split(";"):
        name, _, value = part.partition("=")
        parts[name.strip().upper()] = value.strip().upper()
    return parts
