"""The viewer's time zone for each request.

static/js/clock.js writes the browser's zone (``Intl.DateTimeFormat().resolvedOptions()
.timeZone``) into the cookie ``sparkops_tz``. ``ViewerZoneMiddleware`` activates that zone for
the request when it is a zone the zone database knows, and ``SPARKOPS_TIME_ZONE``
(``settings.TIME_ZONE``) otherwise; templates then render times in it
(``dashboard.templatetags.sparkops_time``).
"""

from __future__ import annotations

import functools
import re
import zoneinfo

from django.utils import timezone

COOKIE = "sparkops_tz"
# IANA names are letters, digits, "/", "_", "+" and "-" ("America/Argentina/Buenos_Aires",
# "Etc/GMT+5"); the longest is well under 64 characters.
_NAME = re.compile(r"[A-Za-z0-9_+\-]+(/[A-Za-z0-9_+\-]+)*")


@functools.cache
def _known() -> frozenset[str]:
    # Cost: one walk of the zone database (a few ms), once per process.
    return frozenset(zoneinfo.available_timezones())


def viewer_zone(name: str | None) -> zoneinfo.ZoneInfo | None:
    """The zone called ``name``, or ``None`` when ``name`` is not a known IANA zone."""
    if not name or len(name) > 64 or not _NAME.fullmatch(name) or name not in _known():
        return None
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return None


class ViewerZoneMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        zone = viewer_zone(request.COOKIES.get(COOKIE))
        if zone is None:
            timezone.deactivate()  # settings.TIME_ZONE
        else:
            timezone.activate(zone)
        try:
            return self.get_response(request)
        finally:
            timezone.deactivate()
