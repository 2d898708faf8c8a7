"""Restart windows: RFC 5545 rules in a named zone become the right UTC instants."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from dashboard.restarts.windows import (
    WindowOccurrence,
    build_recurrence,
    check_window,
    current_or_next,
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
    ("Asia/Seoul", "FREQ=WEKLY;BYDAY=SU", "Not a valid RRULE (invalid 'FREQ': WEKLY)"),
    ("Asia/Seoul", "FREQ=WEEKLY;BYDAY=XX", "Not a valid RRULE (invalid 'BYDAY': XX)"),
    ("Asia/Seoul", "FREQ=WEEKLY;COUNT=0", "COUNT=0 gives no occurrence at all"),
    ("Asia/Seoul", "FREQ=MINUTELY", "recurs at most hourly"),
    ("Asia/Seoul", "FREQ=WEEKLY;UNTIL=20271231T000000", "UNTIL values must be specified in UTC"),
    ("Asia/Seoul", "DTSTART:20261101T030000\nRRULE:FREQ=WEEKLY", "Give only the RRULE line"),
    ("Asia/Seoul", "", "Give a recurrence rule"),
    ("Mars/Olympus_Mons", "FREQ=WEEKLY", "Unknown time zone 'Mars/Olympus_Mons'"),
    ("", "FREQ=WEEKLY", "Choose a time zone"),
])
def test_bad_rules_and_zones_are_refused_with_a_message(zone, rule, message):
    with pytest.raises(ValueError) as refused:
        build_recurrence(datetime(2026, 11, 1, 3, 0), zone, rule)

    assert message in str(refused.value)


@pytest.mark.parametrize("minutes", [0, 24 * 60 + 1])
def test_a_window_of_no_time_or_more_than_a_day_is_refused(minutes):
    recurrence = build_recurrence(datetime(2026, 11, 1, 3, 0), "Asia/Seoul", "FREQ=WEEKLY")

    with pytest.raises(ValueError, match="A window lasts from 1 to 1440 minutes"):
        check_window(recurrence, minutes, utc(2026, 10, 1))


@pytest.mark.parametrize("rule", ["FREQ=WEEKLY;COUNT=2", "FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=30",
                                  "FREQ=DAILY;UNTIL=20261201T000000Z"])
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
