"""Thin views: pick the node and range, call the dashboard modules, render or return JSON."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone

from collectors.docker_api import DETAIL_SEPARATOR
from collectors.models import Engine, Node
from collectors.nodes import local_node
from collectors.reads import node_named
from collectors.rescue import audit_for_page
from dashboard.alerting.models import Alert, AlertState
from dashboard.engines import (
    engine_card,
    engine_series,
    engine_span,
    humanise_ledger,
    node_engine_cards,
    recent_events,
    restart_history,
    start_predictions,
)
from dashboard.fleet_views import render_fleet
from dashboard.gpuseries import current_gpus
from dashboard.heap import collector_paused
from dashboard.ledger import ledger_bar
from dashboard.memory import RANGES, current_headroom
from dashboard.roofline.figure import engine_roofline
from dashboard.timeline import timeline

DEFAULT_RANGE = "1h"
FIRING_LIMIT = 10  # the overview's strip; the alerts page lists them all


def _node_or_404(name: str) -> Node:
    """The node called ``name`` (a prepared read: every poll of an open page asks), or 404."""
    node = node_named(name)
    if node is None:
        raise Http404(f"No node is called {name!r}.")
    return node


def _range_error(range_key: str) -> JsonResponse | None:
    if range_key in RANGES:
        return None
    return JsonResponse(
        {"error": f"unknown range {range_key!r}; choose one of {', '.join(RANGES)}"}, status=400,
    )


def _cards_context(node: Node) -> dict:
    """What the engine-cards fragment shows: firing alerts, the ledger, the cards."""
    firing = Alert.objects.filter(node=node, state=AlertState.FIRING) \
        .select_related("engine").order_by("-fired_at", "-pk")
    error, _, detail = node.engine_discovery_error.partition(DETAIL_SEPARATOR)
    return {
        "node": node,
        "discovery_error": error,
        "discovery_detail": detail,
        "cards": node_engine_cards(node),
        "ledger": humanise_ledger(ledger_bar(node)),
        "firing": list(firing[:FIRING_LIMIT]),
        "firing_count": firing.count(),
    }


@login_required
def home(request: HttpRequest) -> HttpResponse:
    """The fleet page where there is more than one node; else the one node's overview (this
    node's, created on first use)."""
    nodes = list(Node.objects.order_by("name").values_list("name", flat=True)[:2])
    if len(nodes) > 1:
        return render_fleet(request)
    return redirect("dashboard:overview", node=nodes[0] if nodes else local_node().name)


@login_required
def overview(request: HttpRequest, node: str) -> HttpResponse:
    watched = _node_or_404(node)
    range_key = request.GET.get("range", DEFAULT_RANGE)
    if range_key not in RANGES:
        range_key = DEFAULT_RANGE
    headroom = current_headroom(watched, timezone.now(), settings.SPARKOPS_COLLECT_INTERVAL)
    return render(request, "dashboard/overview.html", {
        **_cards_context(watched),
        "nodes": Node.objects.all(),
        "headroom": headroom,
        "gpus": current_gpus(watched),
        "rescue": audit_for_page(watched, timezone.now()),
        "ranges": list(RANGES),
        "range_key": range_key,
        "headroom_url": reverse("dashboard:headroom-json", args=[watched.name]),
        "timeline_url": reverse("dashboard:timeline-json", args=[watched.name]),
        "engines_url": reverse("dashboard:engine-cards", args=[watched.name]),
    })


@login_required
def engine_cards(request: HttpRequest, node: str) -> HttpResponse:
    """The overview's firing alerts, ledger and engine cards as an HTML fragment, for the
    page's live refresh."""
    return render(request, "dashboard/_engine_cards.html", _cards_context(_node_or_404(node)))


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
        "restarts": restart_history(found),
        "starts": start_predictions(found),
        "span": engine_span(found),
        "roofline": engine_roofline(
            found, timezone.now(), bandwidth_gbps=settings.SPARKOPS_MEMORY_BANDWIDTH_GBPS,
            interval=settings.SPARKOPS_COLLECT_INTERVAL,
        ),
        "ranges": list(RANGES),
        "range_key": DEFAULT_RANGE,
        "series_url": reverse("dashboard:engine-series-json", args=[watched.name, found.name]),
    })


@login_required
def engine_series_json(request: HttpRequest, node: str, engine: str) -> JsonResponse:
    range_key = request.GET.get("range", DEFAULT_RANGE)
    if (error := _range_error(range_key)) is not None:
        return error
    found = get_object_or_404(Engine, node=_node_or_404(node), name=engine)
    with collector_paused():  # a chart's many short-lived tuples (dashboard.heap)
        return JsonResponse(engine_series(found, range_key, timezone.now(),
                                          settings.SPARKOPS_MAX_CHART_POINTS,
                                          settings.SPARKOPS_COLLECT_INTERVAL))


@login_required
def headroom_json(request: HttpRequest, node: str) -> JsonResponse:
    payload = current_headroom(
        _node_or_404(node), timezone.now(), settings.SPARKOPS_COLLECT_INTERVAL
    )
    return JsonResponse(payload)


def _max_points(request: HttpRequest) -> int | None:
    """``?max_points=`` within [3, SPARKOPS_MAX_CHART_POINTS]; None when not a whole number."""
    try:
        asked = int(request.GET.get("max_points", settings.SPARKOPS_MAX_CHART_POINTS))
    except ValueError:
        return None
    return max(3, min(asked, settings.SPARKOPS_MAX_CHART_POINTS))


@login_required
def timeline_json(request: HttpRequest, node: str) -> JsonResponse:
    """The overview's timeline (``dashboard.timeline.timeline``) over ``?range=``."""
    range_key = request.GET.get("range", DEFAULT_RANGE)
    if (error := _range_error(range_key)) is not None:
        return error
    max_points = _max_points(request)
    if max_points is None:
        return JsonResponse({"error": "max_points must be a whole number"}, status=400)
    with collector_paused():  # a chart's many short-lived tuples (dashboard.heap)
        return JsonResponse(timeline(_node_or_404(node), range_key, timezone.now(), max_points,
                                     settings.SPARKOPS_COLLECT_INTERVAL))
