"""The fleet page: every node at a glance, and the drift between them (``dashboard.fleet``,
``dashboard.drift``)."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from dashboard.fleet import fleet_overview


def render_fleet(request: HttpRequest) -> HttpResponse:
    """The fleet page for ``request`` (the caller checked the login)."""
    return render(request, "dashboard/fleet.html", {
        "fleet": fleet_overview(timezone.now(), settings.SPARKOPS_COLLECT_INTERVAL),
    })


@login_required
def fleet_page(request: HttpRequest) -> HttpResponse:
    return render_fleet(request)
