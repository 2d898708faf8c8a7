"""Restart windows: RFC 5545 rules in a named zone become the right UTC instants."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from dateutil.rrule import rrulestr

from dashboard.restarts.forms import RestartWindowForm
from dashboard.restarts.models import RestartWindow
from dashboard.restarts.windows import (
    MAX_ITERATIONS,
    WindowOccurrence,
    build_recurrence,
    check_window,
    current_or_next,
    expansion_cost,
    occurrences,
    split_recurrence,
    window_containing,
)
from tests.restarts.plan_factories import make_engine, make_window


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def test_build_recurrence_writes_dtstart_with_its_zone_and_the_rule_line():
    text = build_recurrence(datetime(2026, 11, 1, 3, 0), "Asia/Seoul", "rrule:freq=weekly;byday=su")

    assert text == "DTSTART;TZID=Asia/Seoul:20261101T030000\nRRULE:FREQ=WEEKLY;BYDAY=SU"
    assert split_recurrence(text) == (datetime(2026, 11, 1, 3, 0), "Asia/Seoul",
                                      "FREQ=WEEKLY;BYDAY=SU")


def test_weekly_sunday_seoul_window_falls_on_saturday_evening_utc_across_months(node):
    window = make_window(node, minutes=120)

    found = occurrences(window, utc(2026, 10, 25), utc(2026, 12, 15))

    # Seoul is UTC+9 all year: Sunday 03:00 KST is Saturday 18:00 UTC.
    assert [occ.start for occ in found] == [
        utc(2026, 10, 31, 18), utc(2026, 11, 7, 18), utc(2026, 11, 14, 18),
        utc(2026, 11, 21, 18), utc(2026, 11, 28, 18), utc(2026, 12, 5, 18),
        utc(2026, 12, 12, 18),
    ]
    assert all(occ.end - occ.start == timedelta(hours=2) for occ in found)


def test_occurrences_include_the_one_already_open_at_the_range_start(node):
    window = make_window(node, minutes=120)

    found = occurrences(window, utc(2026, 11, 7, 19), utc(2026, 11, 8))

    assert found == [WindowOccurrence(utc(2026, 11, 7, 18), utc(2026, 11, 7, 20))]


def test_berlin_window_keeps_three_oclock_local_across_both_daylight_saving_changes(node):
    window = make_window(node, local_start=datetime(2026, 3, 1, 3, 0), zone="Europe/Berlin",
                         minutes=60)

    march = occurrences(window, utc(2026, 3, 20), utc(2026, 4, 3))
    october = occurrences(window, utc(2026, 10, 16), utc(2026, 10, 30))

    # Clocks go forward on 29 March 2026 and back on 25 October 2026.
    assert [occ.start for occ in march] == [utc(2026, 3, 22, 2), utc(2026, 3, 29, 1)]
    assert [occ.start for occ in october] == [utc(2026, 10, 18, 1), utc(2026, 10, 25, 2)]
    berlin = ZoneInfo("Europe/Berlin")
    assert {occ.start.astimezone(berlin).hour for occ in march + october} == {3}


def test_current_or_next_gives_the_open_occurrence_then_the_following_one(node):
    window = make_window(node, minutes=120)

    assert current_or_next(window, utc(2026, 11, 7, 19)) == WindowOccurrence(
        utc(2026, 11, 7, 18), utc(2026, 11, 7, 20))
    assert current_or_next(window, utc(2026, 11, 7, 20)) == WindowOccurrence(
        utc(2026, 11, 14, 18), utc(2026, 11, 14, 20))


@pytest.mark.parametrize(("zone", "rule", "message"), [
    ("Asia/Seoul", "FREQ=WEKLY;BYDAY=SU", "FREQ=WEKLY: FREQ is one of YEARLY, MONTHLY"),
    ("Asia/Seoul", "FREQ=WEEKLY;BYDAY=XX", "BYDAY=XX: 'XX' is not a weekday such as SU"),
    ("Asia/Seoul", "FREQ=WEEKLY;COUNT=0", "COUNT=0 gives no occurrence at all"),
    ("Asia/Seoul", "FREQ=MINUTELY", "recurs at most hourly"),
    ("Asia/Seoul", "FREQ=WEEKLY;UNTIL=20271231T000000",
     "UNTIL must be in UTC: end it with Z (20271231T000000Z)"),
    ("Asia/Seoul", "DTSTART:20261101T030000\nRRULE:FREQ=WEEKLY", "Give only the RRULE line"),
    ("Asia/Seoul", "", "Give a recurrence rule"),
    ("Mars/Olympus_Mons", "FREQ=WEEKLY", "Unknown time zone 'Mars/Olympus_Mons'"),
    ("", "FREQ=WEEKLY", "Choose a time zone"),
])
def test_bad_rules_and_zones_are_refused_with_a_message(zone, rule, message):
    with pytest.raises(ValueError) as refused:
        build_recurrence(datetime(2026, 11, 1, 3, 0), zone, rule)

    assert message in str(refused.value)


@pytest.mark.parametrize(("rule", "message"), [
    ("FREQ=HOURLY;BYDAY", "In FREQ=HOURLY;BYDAY, BYDAY is not NAME=VALUE"),
    ("FREQ=WEEKLY;;BYDAY=SU", "has an empty part: remove the extra \";\""),
    ("FREQ=WEEKLY;BYDAY=SU;", "has an empty part"),
    ("BYDAY=SU", "BYDAY=SU has no FREQ: say how often it repeats, e.g. FREQ=WEEKLY;BYDAY=SU"),
    ("FREQ=WEEKLY;COLOR=RED", "COLOR is not an RRULE part"),
    ("FREQ=WEEKLY;BYDAY=SU;BYDAY=MO", "BYDAY is given twice"),
    ("FREQ=WEEKLY;BYDAY=", "BYDAY=: the value is missing"),
    ("FREQ=WEEKLY;INTERVAL=0", "INTERVAL=0: INTERVAL is a whole number of at least 1"),
    ("FREQ=WEEKLY;COUNT=two", "COUNT=TWO: COUNT is a whole number of at least 1"),
    ("FREQ=DAILY;BYHOUR=24", "BYHOUR=24: 24 is outside 0 to 23"),
    ("FREQ=YEARLY;BYMONTH=13", "BYMONTH=13: 13 is outside 1 to 12"),
    ("FREQ=MONTHLY;BYMONTHDAY=1,X", "BYMONTHDAY=1,X: 'X' is not a whole number"),
    ("FREQ=MONTHLY;BYMONTHDAY=0", "BYMONTHDAY counts from 1"),
    ("FREQ=WEEKLY;WKST=XX", "WKST=XX: WKST is a weekday"),
    ("FREQ=WEEKLY;UNTIL=next-year", "UNTIL is a date such as 20271231"),
    ("FREQ=WEEKLY;UNTIL=20271332", "UNTIL is not a real date"),
])
def test_every_malformed_rule_is_refused_naming_the_part_at_fault(rule, message):
    with pytest.raises(ValueError) as refused:
        build_recurrence(datetime(2026, 11, 1, 3, 0), "Asia/Seoul", rule)

    assert message in str(refused.value)
    assert "unpack" not in str(refused.value)


@pytest.mark.parametrize("minutes", [0, 24 * 60 + 1])
def test_a_window_of_no_time_or_more_than_a_day_is_refused(minutes):
    recurrence = build_recurrence(datetime(2026, 11, 1, 3, 0), "Asia/Seoul", "FREQ=WEEKLY")

    with pytest.raises(ValueError, match="A window lasts from 1 to 1440 minutes"):
        check_window(recurrence, minutes, utc(2026, 10, 1))


@pytest.mark.parametrize("rule", ["FREQ=WEEKLY;COUNT=2", "FREQ=DAILY;UNTIL=20261201T000000Z",
                                  "FREQ=YEARLY;BYYEARDAY=60;BYMONTH=1"])
def test_a_rule_with_no_future_occurrence_is_refused(rule):
    recurrence = build_recurrence(datetime(2026, 11, 1, 3, 0), "Asia/Seoul", rule)

    with pytest.raises(ValueError, match="no occurrence from now on"):
        check_window(recurrence, 60, utc(2027, 1, 1))


def test_a_valid_window_reports_its_next_opening():
    recurrence = build_recurrence(datetime(2026, 11, 1, 3, 0), "Asia/Seoul", "FREQ=WEEKLY")

    assert check_window(recurrence, 120, utc(2026, 11, 2)) == WindowOccurrence(
        utc(2026, 11, 7, 18), utc(2026, 11, 7, 20))


def test_node_windows_apply_to_every_engine_and_engine_windows_to_theirs_only(node):
    gemma, nemotron = make_engine(node, "gemma"), make_engine(node, "nemotron")
    make_window(node, name="node sunday", minutes=60)  # Sat 18:00–19:00 UTC
    engine_window = make_window(node, name="gemma long", engine=gemma, minutes=180)
    make_window(node, name="disabled", minutes=600, enabled=False)
    at = utc(2026, 11, 7, 19, 30)  # after the node window, inside gemma's

    assert window_containing(node, gemma, at).window == engine_window
    assert window_containing(node, nemotron, at) is None
    assert window_containing(node, nemotron, utc(2026, 11, 7, 18, 30)).window.name == "node sunday"
    # Both open: the one that stays open longest wins.
    assert window_containing(node, gemma, utc(2026, 11, 7, 18, 30)) == WindowOccurrence(
        utc(2026, 11, 7, 18), utc(2026, 11, 7, 21))


def test_windows_of_another_node_do_not_apply(node):
    other = type(node).objects.create(name="spark-b")
    gemma = make_engine(node, "gemma")
    make_window(other, minutes=120)

    assert window_containing(node, gemma, utc(2026, 11, 7, 18, 30)) is None


# --- bounded expansion: no rule costs more than MAX_ITERATIONS steps --------------------------
def stored_window(node, recurrence: str, minutes: int = 60) -> RestartWindow:
    """A window saved without the form's checks, as an old or hand-made row would be."""
    return RestartWindow.objects.create(name="stored", node=node, recurrence=recurrence,
                                        time_zone="Asia/Seoul", duration_minutes=minutes)


def test_an_hourly_window_from_1800_expands_from_near_now_with_the_same_openings(node):
    recurrence = "DTSTART;TZID=Asia/Seoul:18000101T001500\nRRULE:FREQ=HOURLY;INTERVAL=7"
    window = stored_window(node, recurrence)
    start, end = utc(2026, 11, 2), utc(2026, 11, 4)

    found = occurrences(window, start, end)

    # Every 7 hours of wall-clock time from 1800-01-01 00:15 KST (no daylight saving there).
    first_local, step = datetime(1800, 1, 1, 0, 15), timedelta(hours=7)
    local = datetime(2026, 11, 2, 9, 0)  # start, in KST
    local = first_local + step * -(-(local - timedelta(hours=1) - first_local) // step)
    expected = []
    while local < datetime(2026, 11, 4, 9, 0):
        expected.append(local.replace(tzinfo=ZoneInfo("Asia/Seoul")).astimezone(UTC))
        local += step
    assert [occ.start for occ in found] == expected
    assert expansion_cost(recurrence, start, end) <= MAX_ITERATIONS
    assert current_or_next(window, start).start in expected[:2]


def test_a_rule_that_matches_no_date_is_refused_in_words_before_it_is_expanded(node):
    rule = "FREQ=HOURLY;BYMONTH=2;BYMONTHDAY=30"
    with pytest.raises(ValueError, match="matches no date: BYMONTHDAY=30 never falls in "
                                         "February"):
        build_recurrence(datetime(2026, 11, 1, 3), "Asia/Seoul", rule)
    # A stored one is refused the same way wherever it is expanded (the page shows the words).
    window = stored_window(node, f"DTSTART;TZID=Asia/Seoul:18000101T000000\nRRULE:{rule}")
    with pytest.raises(ValueError, match="matches no date"):
        current_or_next(window, utc(2026, 11, 1))


@pytest.mark.parametrize("rule", ["FREQ=HOURLY;BYYEARDAY=60;BYMONTH=1",
                                  "FREQ=DAILY;BYMONTHDAY=31;BYMONTH=4,6,9,11,1",
                                  "FREQ=DAILY;UNTIL=20261201T000000Z"])
def test_a_rule_that_stops_matching_costs_a_bounded_search(node, rule):
    # Day 60 is never in January: dateutil alone would search every day up to the year 9999.
    recurrence = f"DTSTART;TZID=Asia/Seoul:18000101T000000\nRRULE:{rule}"
    now = utc(2026, 12, 15)

    assert expansion_cost(recurrence, now, now + timedelta(days=366)) <= MAX_ITERATIONS
    found = current_or_next(stored_window(node, recurrence), now)
    assert found is None or found.start.month == 1


def test_a_count_rule_from_long_ago_is_refused_by_its_cost_not_expanded(node):
    recurrence = "DTSTART;TZID=Asia/Seoul:18000101T000000\nRRULE:FREQ=DAILY;COUNT=900"
    with pytest.raises(ValueError, match=r"would take about [\d,]+ steps"):
        current_or_next(stored_window(node, recurrence), utc(2026, 11, 1))
    with pytest.raises(ValueError, match="must be within the last year"):
        check_window(recurrence, 60, utc(2026, 11, 1))


@pytest.mark.parametrize(("zone", "local_start", "rule"), [
    ("Asia/Seoul", datetime(2001, 1, 7, 3), "FREQ=WEEKLY;BYDAY=SU"),
    ("Europe/Berlin", datetime(2001, 1, 2, 2, 30), "FREQ=WEEKLY;INTERVAL=3;BYDAY=TU,SA"),
    ("Europe/Berlin", datetime(2001, 1, 31, 3), "FREQ=MONTHLY"),
    ("Asia/Seoul", datetime(2001, 1, 13, 1), "FREQ=MONTHLY;INTERVAL=5;BYDAY=1SA"),
    ("Asia/Seoul", datetime(2001, 3, 1, 4), "FREQ=MONTHLY;BYSETPOS=-1;BYDAY=MO,TU,WE,TH,FR"),
    ("America/New_York", datetime(2000, 2, 29, 23), "FREQ=YEARLY"),
    ("America/New_York", datetime(2001, 1, 1, 5), "FREQ=DAILY;INTERVAL=5"),
    ("Europe/Berlin", datetime(2001, 1, 1, 0, 45), "FREQ=HOURLY;INTERVAL=5;BYHOUR=1,2,3,4"),
    ("Asia/Seoul", datetime(2026, 1, 1, 3), "FREQ=WEEKLY;COUNT=60;BYDAY=MO"),
    ("Asia/Seoul", datetime(2001, 1, 1, 3), "FREQ=DAILY;UNTIL=20261120T000000Z"),
])
def test_bounded_expansion_gives_exactly_what_dateutil_gives_from_dtstart(node, zone, local_start,
                                                                          rule):
    recurrence = build_recurrence(local_start, zone, rule)
    window = RestartWindow.objects.create(name="w", node=node, recurrence=recurrence,
                                          time_zone=zone, duration_minutes=30)
    # Across both daylight-saving changes of 2026 and a leap year's end of February.
    start, end = utc(2026, 3, 1), utc(2028, 3, 15)
    direct = rrulestr(recurrence, tzids=ZoneInfo).between(start - timedelta(minutes=30), end,
                                                          inc=True)

    found = occurrences(window, start, end)

    assert [occ.start for occ in found] == [opened.astimezone(UTC) for opened in direct
                                            if opened + timedelta(minutes=30) > start
                                            and opened < end]
    assert found, "the range should hold openings"


def test_the_window_form_shows_why_a_rule_is_refused(node):
    form = RestartWindowForm(data={
        "name": "never", "node": node.pk, "local_start": "2026-11-01T03:00",
        "time_zone": "Asia/Seoul", "rrule": "FREQ=HOURLY;BYMONTH=2;BYMONTHDAY=30",
        "duration_minutes": 60, "enabled": "on"}, now=utc(2026, 10, 1))

    assert not form.is_valid()
    assert "never falls in February (at most 29 days)" in form.errors["rrule"][0]
