"""Restart windows: RFC 5545 recurrences in a named time zone, turned into UTC occurrences.

A window's ``recurrence`` is exactly two lines, ``DTSTART;TZID=<IANA zone>:<local start>`` and
``RRULE:<rule>``, and is read with python-dateutil's ``rrulestr`` so the semantics are the
standard's, not ours. The zone is resolved with :mod:`zoneinfo`, so an occurrence keeps its local
wall-clock time across daylight-saving changes ("03:00 Europe/Berlin" is 02:00 UTC in winter and
01:00 UTC in summer). Each occurrence lasts ``duration_minutes`` of elapsed time. A local time the
clocks skip (02:30 on the night they go forward) falls an hour later, as zoneinfo reads it with
the offset before the change; one they pass twice is its first pass.

Every expansion is bounded, whatever a stored rule says (see :func:`expansion_cost`): the rule is
re-anchored near the range asked for, whole periods after its DTSTART, so a window that started in
1800 costs what one that started last week costs; a rule that can never match a date is refused
before it is expanded; and the expansion runs in a copy of the calendar placed just before the
year 9999, where dateutil's iteration ends by itself, so even a rule that stops matching cannot
search for long. An expansion that would still cost more than :data:`MAX_ITERATIONS` steps is
refused with a message instead of run.

Every function here raises :class:`ValueError` with a message fit for a form on bad input.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass, field
from datetime import MAXYEAR, UTC, datetime, timedelta
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
    "expansion_cost",
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
# A window opens at least once a year; the search for the next opening looks no further.
NEXT_OPENING_HORIZON = timedelta(days=366)
# A COUNT counts from DTSTART, so such a rule cannot be re-anchored: its start must be recent.
COUNT_START_HORIZON = timedelta(days=366)
MAX_COUNT = 1000
MAX_INTERVAL = 1000
# Steps of dateutil's loop one expansion may take (a step is a day for DAILY and HOURLY rules, a
# week, month or year for the others; an HOURLY rule takes a step per opening too). Pure-Python
# steps cost ~5-10 µs, so this keeps an expansion well under a tenth of a second.
MAX_ITERATIONS = 20_000
STEPS_PER_YEAR = {"YEARLY": 1, "MONTHLY": 12, "WEEKLY": 53, "DAILY": 366, "HOURLY": 366}
# Longest month, for rules that name a day no month (of those chosen) has. February counts 29:
# a leap day is a date.
MONTH_DAYS = {1: 31, 2: 29, 3: 31, 4: 30, 5: 31, 6: 30, 7: 31, 8: 31, 9: 30, 10: 31, 11: 30,
              12: 31}
# Around the local range asked for: one day absorbs any UTC offset and daylight-saving fold.
LOCAL_PADDING = timedelta(days=1)
LOCAL_FORMAT = "%Y%m%dT%H%M%S"
FREQUENCIES = ("YEARLY", "MONTHLY", "WEEKLY", "DAILY", "HOURLY", "MINUTELY", "SECONDLY")
WEEKDAYS = ("MO", "TU", "WE", "TH", "FR", "SA", "SU")
# RFC 5545's RRULE parts, and BYEASTER, a python-dateutil extension it accepts.
RULE_NAMES = ("FREQ", "UNTIL", "COUNT", "INTERVAL", "BYSECOND", "BYMINUTE", "BYHOUR", "BYDAY",
              "BYMONTHDAY", "BYYEARDAY", "BYWEEKNO", "BYMONTH", "BYSETPOS", "WKST", "BYEASTER")
BYDAY_ITEM = re.compile(r"^[+-]?(?:[1-9]|[1-4]\d|5[0-3])?(?:MO|TU|WE|TH|FR|SA|SU)$")
UNTIL_VALUE = re.compile(r"^\d{8}(?:T\d{6}Z?)?$")
# (lowest, highest, may be negative) of each number-list part (RFC 5545 §3.3.10).
NUMBER_RANGES = {"BYSECOND": (0, 60, False), "BYMINUTE": (0, 59, False),
                 "BYHOUR": (0, 23, False), "BYMONTH": (1, 12, False),
                 "BYMONTHDAY": (1, 31, True), "BYYEARDAY": (1, 366, True),
                 "BYWEEKNO": (1, 53, True), "BYSETPOS": (1, 366, True),
                 "BYEASTER": (0, 366, True)}
# Out-of-range days and weeks are refused by _refuse_impossible_dates, which names the months.
UNRANGED_HERE = {"BYMONTHDAY", "BYYEARDAY", "BYWEEKNO"}
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

    Refuses an unknown zone, a rule dateutil cannot read, COUNT=0 (no occurrence at all), COUNT
    above :data:`MAX_COUNT`, INTERVAL above :data:`MAX_INTERVAL`, rules that recur more often than
    hourly, and rules that name no date there is (February 30, the 31st of 30-day months, the
    400th day of a year). Cost: constant; nothing is expanded.
    """
    _, zone_name, rule = split_recurrence(text)
    resolve_zone(zone_name)
    _check_rule_syntax(rule)
    parts = _rule_parts(rule)
    if parts.get("COUNT") == "0":
        raise ValueError("COUNT=0 gives no occurrence at all; leave COUNT out to repeat forever.")
    if parts.get("FREQ") in REFUSED_FREQUENCIES:
        raise ValueError("A restart window recurs at most hourly (FREQ=HOURLY, DAILY, WEEKLY, "
                         "MONTHLY or YEARLY).")
    _refuse_unbounded(parts)
    _refuse_impossible_dates(parts)
    try:
        parsed = rrulestr(text, tzids=resolve_zone)
    except (ValueError, TypeError, KeyError) as error:
        # _check_rule_syntax has named every malformed part; what is left is dateutil's verdict
        # on a combination (UNTIL without Z, for instance).
        raise ValueError(f"{rule} is not a rule this calendar can read: {error}. Example: "
                         "FREQ=WEEKLY;BYDAY=SU.") from None
    if not isinstance(parsed, rrule):
        raise ValueError("Give one RRULE line.")
    return parsed


def check_window(recurrence: str, duration_minutes: int, now: datetime) -> WindowOccurrence:
    """Validate a whole window as the form saves it; returns its current or next occurrence.

    The duration must be 1 minute to 24 hours, a rule with COUNT must start within the last
    year, and the rule must open within a year of ``now`` or of its first opening (a rule whose
    COUNT or UNTIL has run out, that matches no date, or that opens less often than once a year
    is refused).
    """
    if not 0 < duration_minutes <= MAX_DURATION_MINUTES:
        raise ValueError(f"A window lasts from 1 to {MAX_DURATION_MINUTES} minutes (24 hours).")
    parse_recurrence(recurrence)
    local_start, zone_name, rule = split_recurrence(recurrence)
    if "COUNT" in _rule_parts(rule):
        started = local_start.replace(tzinfo=resolve_zone(zone_name))
        if started < now - COUNT_START_HORIZON:
            raise ValueError("A rule with COUNT counts from its first opening, which must be "
                             "within the last year; leave COUNT out, or start it later.")
    found = _current_or_next(recurrence, duration_minutes, now)
    if found is None:
        raise ValueError("This rule has no occurrence from now on (within the next year): its "
                         "COUNT or UNTIL has run out, or it matches no date, or it opens less "
                         "often than once a year.")
    return found


def occurrences(window: RestartWindow, start: datetime, end: datetime) -> list[WindowOccurrence]:
    """Occurrences of ``window`` overlapping ``[start, end)``, in UTC, oldest first.

    An occurrence that opened before ``start`` and is still open is included. Cost: linear in
    the length of the range (not in the time since DTSTART), at most :data:`MAX_ITERATIONS`
    steps; a longer range is refused with ValueError.
    """
    length = timedelta(minutes=window.duration_minutes)
    starts = _starts(window.recurrence, start - length, end)
    found = [_occurrence(opened, length, window) for opened in starts]
    return [occ for occ in found if occ.end > start and occ.start < end]


def current_or_next(window: RestartWindow, now: datetime) -> WindowOccurrence | None:
    """The occurrence open at ``now``, else the next one within a year of ``now`` (or of the
    first opening, when that is later), else None (the rule has run out, or opens less often)."""
    return _current_or_next(window.recurrence, window.duration_minutes, now, window)


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


def expansion_cost(recurrence: str, start: datetime, end: datetime) -> int:
    """The most steps dateutil's loop can take to expand ``recurrence`` over ``[start, end]``.

    Every expansion here checks this first and refuses (ValueError, saying why) above
    :data:`MAX_ITERATIONS`, so it is the bound of what any input can cost. Cost: constant.
    """
    return _plan(recurrence, start, end).cost


def _current_or_next(recurrence: str, duration_minutes: int, now: datetime,
                     window: RestartWindow | None = None) -> WindowOccurrence | None:
    length = timedelta(minutes=duration_minutes)
    local_start, zone_name, _ = split_recurrence(recurrence)
    # A window whose first opening is still to come is searched from there.
    first = local_start.replace(tzinfo=resolve_zone(zone_name)).astimezone(UTC)
    for opened in _starts(recurrence, now - length, max(now, first) + NEXT_OPENING_HORIZON):
        occurrence = _occurrence(opened, length, window)
        if occurrence.contains(now) or occurrence.start > now:
            return occurrence
    return None


@dataclass(frozen=True)
class _Plan:
    """How to expand a rule over a range cheaply: from ``anchor`` (a naive local DTSTART with
    the same occurrences from there on), in a calendar ``shift_years`` later, ``cost`` steps."""

    rule: rrule
    zone: ZoneInfo
    shift_years: int
    cost: int
    low: datetime
    high: datetime


def _plan(recurrence: str, start: datetime, end: datetime) -> _Plan:
    parse_recurrence(recurrence)
    local_start, zone_name, rule_text = split_recurrence(recurrence)
    zone = resolve_zone(zone_name)
    parts = _rule_parts(rule_text)
    freq, interval = parts["FREQ"], int(parts.get("INTERVAL") or 1)
    low = start.astimezone(zone).replace(tzinfo=None) - LOCAL_PADDING
    high = end.astimezone(zone).replace(tzinfo=None) + LOCAL_PADDING
    anchor = local_start
    if "COUNT" not in parts and anchor < low:
        anchor = _aligned(anchor, freq, interval, low)
    # A window that first opens after the range: the range holds nothing, nothing to search.
    high = max(high, anchor)
    first_year = anchor.year
    shift = _twin_shift(first_year, high.year)
    # dateutil's loop ends by itself after the year 9999: the shifted copy never searches
    # further than that, even when the rule matches nothing more.
    cost = (MAXYEAR - (first_year + shift) + 1) * STEPS_PER_YEAR[freq]
    if freq == "HOURLY":
        cost += int((high - anchor).total_seconds() // 3600 // interval)
    if cost > MAX_ITERATIONS:
        raise ValueError(f"Expanding this rule would take about {cost:,} steps (at most "
                         f"{MAX_ITERATIONS:,}): start it later, or without COUNT.")
    shifted = _with_rule_text(rule_text, _shift(anchor, shift), zone, shift, high)
    return _Plan(rule=shifted, zone=zone, shift_years=shift, cost=cost, low=low, high=high)


def _starts(recurrence: str, start: datetime, end: datetime) -> list[datetime]:
    """UTC starts of ``recurrence`` in ``[start, end]``, oldest first, within the plan's bound."""
    plan = _plan(recurrence, start, end)
    local = plan.rule.between(_shift(plan.low, plan.shift_years),
                              _shift(plan.high, plan.shift_years), inc=True)
    starts = [_shift(opened, -plan.shift_years).replace(tzinfo=plan.zone).astimezone(UTC)
              for opened in local]
    return [opened for opened in starts if start <= opened <= end]


def _with_rule_text(rule_text: str, dtstart: datetime, zone: ZoneInfo, shift: int,
                    high: datetime) -> rrule:
    """The dateutil rule of ``rule_text`` from naive ``dtstart``; UNTIL (UTC) becomes naive
    local time in ``zone``, no later than ``high`` (the range ends there anyway), shifted like
    everything else."""
    parts = [part for part in rule_text.split(";") if part.strip()]
    kept = [part for part in parts if not part.strip().upper().startswith("UNTIL=")]
    rule = rrulestr("RRULE:" + ";".join(kept), dtstart=dtstart)
    until = [part.split("=", 1)[1].strip() for part in parts if part not in kept]
    if not until:
        return rule
    local_until = min(_parse_until(until[0]).astimezone(zone).replace(tzinfo=None), high)
    return rule.replace(until=_shift(local_until, shift))


def _parse_until(text: str) -> datetime:
    # parse_recurrence has let dateutil check the value: with a zoned DTSTART it is UTC.
    text = text.upper().removesuffix("Z")
    form = LOCAL_FORMAT if "T" in text else "%Y%m%d"
    return datetime.strptime(text, form).replace(tzinfo=UTC)


def _aligned(start: datetime, freq: str, interval: int, target: datetime) -> datetime:
    """The latest of ``start`` plus a whole number of ``interval`` periods that is at most
    ``target``, with the fields dateutil fills in from DTSTART (time of day, weekday, day of
    month, month) unchanged, so it yields the same occurrences from there on. ``start`` itself
    when no such later one exists (a 31st or 29 February that the periods never reach again)."""
    fixed = {"HOURLY": timedelta(hours=interval), "DAILY": timedelta(days=interval),
             "WEEKLY": timedelta(weeks=interval)}.get(freq)
    if fixed is not None:
        return start + fixed * ((target - start) // fixed)
    months = 12 if freq == "YEARLY" else 1
    elapsed = ((target.year - start.year) * 12 + target.month - start.month) // months
    periods = elapsed // interval
    # At most 48 tries: a day that exists recurs within 4 years, or never for this interval.
    for back in range(min(periods, 48) + 1):
        moved = _add_months(start, (periods - back) * interval * months)
        if moved is not None and moved <= target:
            return moved
    return start


def _add_months(moment: datetime, months: int) -> datetime | None:
    index = moment.year * 12 + moment.month - 1 + months
    year, month = divmod(index, 12)
    if year > MAXYEAR or moment.day > calendar.monthrange(year, month + 1)[1]:
        return None
    return moment.replace(year=year, month=month + 1)


def _twin_shift(first_year: int, last_year: int) -> int:
    """Whole years to add so that ``first_year..last_year`` land as close before 9999 as their
    calendar allows: each year lands on one that starts on the same weekday and has the same
    length, so every date, weekday, week number and day count is the same there.

    Within a century the calendar repeats every 28 years, and the whole Gregorian calendar
    every 400; the search stops at the first fit, at most 400 years back.
    """
    span = [_year_shape(year) for year in range(first_year, last_year + 1)]
    latest = MAXYEAR - last_year
    for shift in range(latest, max(latest - 400, -1), -1):
        if all(_year_shape(first_year + shift + i) == shape for i, shape in enumerate(span)):
            return shift
    return 0


def _year_shape(year: int) -> tuple[int, bool]:
    return datetime(year, 1, 1).weekday(), calendar.isleap(year)


def _shift(moment: datetime, years: int) -> datetime:
    # Safe for 29 February: a twin year has the same length.
    return moment.replace(year=moment.year + years)


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


def _check_rule_syntax(rule: str) -> None:
    """ValueError, in words naming the part at fault, for an RRULE line that is not well formed.

    Checks what RFC 5545 §3.3.10 spells out for each part: NAME=VALUE pairs separated by ";",
    each name known and given once, FREQ present, and each value of the kind its name takes
    (a frequency, a positive number, a weekday list, a number list within its range, a UTC date).
    Cost: linear in the length of the line.
    """
    seen: set[str] = set()
    for part in rule.split(";"):
        if not part.strip():
            raise ValueError(f"{rule} has an empty part: remove the extra \";\" (parts are "
                             "NAME=VALUE, separated by one \";\").")
        name, equals, value = (piece.strip() for piece in part.partition("="))
        if not equals or not name:
            raise ValueError(f"In {rule}, {part.strip()} is not NAME=VALUE (e.g. BYDAY=SU).")
        if name not in RULE_NAMES:
            raise ValueError(f"In {rule}, {name} is not an RRULE part; known parts: "
                             f"{', '.join(RULE_NAMES)}.")
        if name in seen:
            raise ValueError(f"In {rule}, {name} is given twice; give it once (a list is "
                             "comma-separated, e.g. BYDAY=SA,SU).")
        seen.add(name)
        problem = _value_problem(name, value)
        if problem:
            raise ValueError(f"In {rule}, {name}={value}: {problem}.")
    if "FREQ" not in seen:
        raise ValueError(f"{rule} has no FREQ: say how often it repeats, e.g. "
                         f"FREQ=WEEKLY;{rule}.")


def _value_problem(name: str, value: str) -> str:
    """What is wrong with ``value`` as the value of RRULE part ``name``; empty if nothing."""
    if not value:
        return "the value is missing"
    if name == "FREQ":
        return "" if value in FREQUENCIES else f"FREQ is one of {', '.join(FREQUENCIES)}"
    if name in ("COUNT", "INTERVAL"):
        return "" if value.isdigit() and (int(value) > 0 or name == "COUNT") \
            else f"{name} is a whole number of at least 1"
    if name == "WKST":
        return "" if value in WEEKDAYS else f"WKST is a weekday: {', '.join(WEEKDAYS)}"
    if name == "UNTIL":
        return _until_problem(value)
    items = value.split(",")
    if name == "BYDAY":
        wrong = [item for item in items if not BYDAY_ITEM.match(item.strip())]
        return f"{', '.join(repr(w) for w in wrong)} is not a weekday such as SU, MO or 1SA " \
               "(the first Saturday) or -1FR (the last Friday)" if wrong else ""
    low, high, signed = NUMBER_RANGES[name]
    for item in items:
        item = item.strip()
        if not item.lstrip("+-" if signed else "").isdigit():
            return f"{item!r} is not a whole number"
        number = int(item)
        if name in UNRANGED_HERE:
            if number == 0:
                return f"{name} counts from 1 (or from -1 backwards); 0 is none"
        elif not (low <= abs(number) <= high if signed else low <= number <= high):
            sign = f" or -{high} to -{low}" if signed else ""
            return f"{item} is outside {low} to {high}{sign}"
    return ""


def _until_problem(value: str) -> str:
    """UNTIL must be a date (YYYYMMDD) or a UTC date and time (YYYYMMDDTHHMMSSZ)."""
    if not UNTIL_VALUE.match(value):
        return "UNTIL is a date such as 20271231, or a UTC time such as 20271231T235959Z"
    if "T" in value and not value.endswith("Z"):
        # The start names its zone, so RFC 5545 wants UNTIL in UTC, marked with Z.
        return f"UNTIL must be in UTC: end it with Z ({value}Z)"
    try:
        _parse_until(value)
    except ValueError:
        return "UNTIL is not a real date and time"
    return ""


def _refuse_unbounded(parts: dict[str, str]) -> None:
    for name, most in (("COUNT", MAX_COUNT), ("INTERVAL", MAX_INTERVAL)):
        value = parts.get(name)
        if value is not None and value.isdigit() and int(value) > most:
            raise ValueError(f"{name}={value} is more than a restart window needs (at most "
                             f"{most}).")


def _refuse_impossible_dates(parts: dict[str, str]) -> None:
    """ValueError, in words, for a rule that names only dates no calendar has."""
    months = _numbers(parts.get("BYMONTH")) or list(MONTH_DAYS)
    longest = max(MONTH_DAYS.get(month, 31) for month in months)
    monthdays = _numbers(parts.get("BYMONTHDAY"))
    if monthdays and all(abs(day) > longest for day in monthdays):
        names = ", ".join(calendar.month_name[m] for m in months if m in MONTH_DAYS)
        raise ValueError(f"This rule matches no date: BYMONTHDAY={parts['BYMONTHDAY']} never "
                         f"falls in {names} (at most {longest} days).")
    yeardays = _numbers(parts.get("BYYEARDAY"))
    if yeardays and all(abs(day) > 366 for day in yeardays):
        raise ValueError(f"This rule matches no date: BYYEARDAY={parts['BYYEARDAY']}, but a "
                         "year has at most 366 days.")
    weeks = _numbers(parts.get("BYWEEKNO"))
    if weeks and all(abs(week) > 53 for week in weeks):
        raise ValueError(f"This rule matches no date: BYWEEKNO={parts['BYWEEKNO']}, but a year "
                         "has at most 53 weeks.")


def _numbers(value: str | None) -> list[int]:
    """The integers of a BYxxx list; what is not a number is left for dateutil to refuse."""
    found = []
    for item in (value or "").split(","):
        item = item.strip()
        if item.lstrip("+-").isdigit():
            found.append(int(item))
    return found


def _rule_parts(rule: str) -> dict[str, str]:
    parts: dict[str, str] = {}
    for part in rule.split(";"):
        name, _, value = part.partition("=")
        parts[name.strip().upper()] = value.strip().upper()
    return parts
