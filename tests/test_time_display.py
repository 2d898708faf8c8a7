"""One clock: the |when filter, the zone labels for the pages' scripts, and the viewer's zone
taken from the sparkops_tz cookie."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
from django.template import Context, Template
from django.test import RequestFactory, override_settings
from django.utils import timezone

from dashboard.templatetags.sparkops_time import offset_text, when, zone_abbreviations
from dashboard.zone import COOKIE, ViewerZoneMiddleware, viewer_zone

AT = datetime(2026, 12, 1, 13, 9, 16, tzinfo=UTC)


def test_a_moment_is_written_in_the_active_zone_with_its_abbreviation_and_instant():
    with timezone.override(ZoneInfo("Asia/Seoul")):
        html = when(AT)
    assert html == ('<time datetime="2026-12-01T13:09:16Z" title="Asia/Seoul">'
                    "2026-12-01 22:09:16 KST</time>")


def test_a_zone_without_letters_is_labelled_by_its_offset():
    with timezone.override(ZoneInfo("Asia/Dubai")):
        assert "2026-12-01 17:09:16 UTC+04:00</time>" in when(AT)
    with timezone.override(ZoneInfo("America/St_Johns")):  # -03:30 in December: NST
        assert "2026-12-01 09:39:16 NST" in when(AT)
    assert offset_text(datetime(2026, 1, 1, tzinfo=ZoneInfo("America/Caracas")).utcoffset()) \
        == "UTC-04:00"


def test_summer_time_changes_the_label():
    with timezone.override(ZoneInfo("Europe/Berlin")):
        assert "2026-12-01 14:09:16 CET" in when(AT)
        assert "2026-07-01 14:09:16 CEST" in when(datetime(2026, 7, 1, 12, 9, 16, tzinfo=UTC))


def test_iso_strings_none_and_relative_style():
    with timezone.override(ZoneInfo("UTC")):
        assert "2026-12-01 13:09:16 UTC" in when("2026-12-01T13:09:16+00:00")
        assert when(None) == "" and when("") == "" and when("not a time") == ""
        assert " data-relative>" in when(AT, "relative")
    dashed = Template('{% load sparkops_time %}{{ at|when|default:"—" }}')
    out = dashed.render(Context({"at": None}))
    assert out == "—"


def test_the_pages_scripts_get_the_zone_and_its_abbreviations():
    assert zone_abbreviations(ZoneInfo("Europe/Berlin"), 2026) == {"60": "CET", "120": "CEST"}
    assert zone_abbreviations(ZoneInfo("Asia/Dubai"), 2026) == {}
    with timezone.override(ZoneInfo("Asia/Seoul")):
        out = Template("{% load sparkops_time %}<html {% zone_attributes %}>").render(Context())
    assert 'data-zone="Asia/Seoul"' in out
    labels = out.split('data-zone-labels="')[1].split('"', 1)[0].replace("&quot;", '"')
    assert json.loads(labels) == {"540": "KST"}


@pytest.mark.parametrize("name", ["Asia/Seoul", "America/Argentina/Buenos_Aires", "Etc/GMT+5",
                                  "UTC"])
def test_known_zone_names_are_taken(name):
    assert viewer_zone(name).key == name


@pytest.mark.parametrize("name", [None, "", "Mars/Olympus", "../../etc/passwd", "/etc/localtime",
                                  "Asia/Seoul; x", "A" * 200])
def test_other_names_are_refused(name):
    assert viewer_zone(name) is None


@override_settings(TIME_ZONE="Europe/Berlin")
def test_the_middleware_activates_the_cookies_zone_or_the_configured_one():
    seen = []

    def view(request):
        seen.append(timezone.get_current_timezone_name())
        return None

    middleware = ViewerZoneMiddleware(view)
    factory = RequestFactory()
    for value in ["Asia/Seoul", "Mars/Olympus", None]:
        request = factory.get("/")
        if value:
            request.COOKIES[COOKIE] = value
        middleware(request)
    assert seen == ["Asia/Seoul", "Europe/Berlin", "Europe/Berlin"]
    assert timezone.get_current_timezone_name() == "Europe/Berlin"  # nothing left active
