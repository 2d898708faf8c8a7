"""Thin views: pick the node and range, call dashboard.memory, render or return JSON."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone

from collectors.models import Engine, Node
from collectors.nodes import local_node
from dashboard.engines import engine_card, engine_series, node_engine_cards, recent_events
from dashboard.ledger import ledger_bar
from dashboard.memory import RANGES, chart_series, current_headroom

DEFAULT_RANGE = "1h"


def _node_or_404(name: str) -> Node:
    return get_object_or_404(Node, name=name)


@login_required
def home(request: HttpRequest) -> HttpResponse:
    return redirect("dashboard:overview", node=local_node().name)


@login_required
def overview(request: HttpRequest, node: str) -> HttpResponse:
    watched = _node_or_404(node)
    range_key = request.GET.get("range", DEFAULT_RANGE)
    if range_key not in RANGES:
        range_key = DEFAULT_RANGE
    headroom = current_headroom(watched, timezone.now(), settings.SPARKOPS_COLLECT_INTERVAL)
    return render(request, "dashboard/overview.html", {
        "node": watched,
        "nodes": Node.objects.all(),
        "headroom": headroom,
        "ranges": list(RANGES),
        "range_key": range_key,
        "headroom_url": reverse("dashboard:headroom-json", args=[watched.name]),
        "chart_url": reverse("dashboard:memory-json", args=[watched.name]),
        "engines_url": reverse("dashboard:engine-cards", args=[watched.name]),
        "cards": node_engine_cards(watched),
        "ledger": ledger_bar(watched),
    })


@login_required
def engine_cards(request: HttpRequest, node: str) -> HttpResponse:
    """The overview's engine cards as an HTML fragment, for the page's live refresh."""
    watched = _node_or_404(node)
    return render(request, "dashboard/_engine_cards.html",
                  {"node": watched, "cards": node_engine_cards(watched),
                   "ledger": ledger_bar(watched)})


@login_required
def engines_json(request: HttpRequest, node: str) -> JsonResponse:
    return JsonResponse({"node": node, "engines": node_engine_cards(_node_or_404(node))})


@login_required
def engine_detail(request: HttpRequest, node: str, engine: str) -> HttpResponse:
    watched = _node_or_404(node)
    found = get_object_or_404(Engine, node=watched, name=engine)
    return render(request, "dashboard/engine.html", {
        "node": watched,
        "engine": found,
        "card": engine_card(found),
        "config_rows": sorted((found.config or {}).get("all_flags", {}).items()),
        "events": recent_events(found),
        "ranges": list(RANGES),
        "range_key": DEFAULT_RANGE,
        "series_url": reverse("dashboard:engine-series-json", args=[watched.name, found.name]),
    })


@login_required
def engine_series_json(request: HttpRequest, node: str, engine: str) -> JsonResponse:
    range_key = request.GET.get("range", DEFAULT_RANGE)
    if range_key not in RANGES:
        return JsonResponse(
            {"error": f"unknown range {range_key!r}; choose one of {', '.join(RANGES)}"},
            status=400,
        )
    found = get_object_or_404(Engine, node=_node_or_404(node), name=engine)
    return JsonResponse(engine_series(found, range_key, timezone.now(),
                                      settings.SPARKOPS_MAX_CHART_POINTS,
                                      settings.SPARKOPS_COLLECT_INTERVAL))


@login_required
def headroom_json(request: HttpRequest, node: str) -> JsonResponse:
    payload = current_headroom(
        _node_or_404(node), timezone.now(), settings.SPARKOPS_COLLECT_INTERVAL
    )
    return JsonResponse(payload)


@login_required
def memory_json(request: HttpRequest, node: str) -> JsonResponse:
    range_key = request.GET.get("range", DEFAULT_RANGE)
    if range_key not in RANGES:
        return JsonResponse(
            {"error": f"unknown range {range_key!r}; choose one of {', '.join(RANGES)}"},
            status=400,
        )
    try:
        max_points = int(request.GET.get("max_points", settings.SPARKOPS_MAX_CHART_POINTS))
    except ValueError:
        return JsonResponse({"error": "max_points must be a whole number"}, status=400)
    max_points = max(3, min(max_points, settings.SPARKOPS_MAX_CHART_POINTS))
    payload = chart_series(
        _node_or_404(node), range_key, timezone.now(), max_points,
        settings.SPARKOPS_COLLECT_INTERVAL,
    )
    return JsonResponse(payload)
