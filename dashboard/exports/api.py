"""The read-only JSON API, ``/api/v1/…``: the same figures as ``/metrics``, for scripts.

Access: the export rule (``dashboard.exports.access``: bearer token or allowlisted address; a
browser session is not enough). Only GET (and HEAD); anything else is 405. Every response is
JSON. Errors are ``{"error": "<reason>"}``: 400 for a bad query parameter (an unknown name, a
repeated one, or a value out of range), 404 for an unknown node or any other path under
``/api/v1/`` (after the access rule, so a refused client learns nothing of what exists).

Conventions: sizes in bytes (``*_bytes``), durations in seconds (``*_seconds``), ratios 0–1
(``*_ratio``), times as ISO 8601 with their UTC offset. **An unknown value is null**, never 0.
Shapes only grow: a field may be added, none is renamed or removed within ``v1``.

``GET /api/v1/nodes`` — every watched node, with its current host figures::

    {"nodes": [{
        "name": "spark-a", "hostname": "spark-a", "mem_total_bytes": 130662547456,
        "collection": {"at": "…", "age_seconds": 2.1, "ok": true, "error": null,
                       "stale": false},
        "memory": {"mem_available_bytes": …, "mem_available_interval_min_bytes": …,
                   "mem_free_bytes": …, "page_cache_reclaimable_bytes": …,
                   "swap_used_bytes": …, "psi_some_avg10_ratio": …,
                   "psi_full_avg10_ratio": …, "headroom_bytes": …},
        "unknown_reasons": {"<memory key>": "<why it is null>"},
        "alerts_firing": 0,
        "links": {"ledger": "/api/v1/nodes/spark-a/ledger", "engines": "…",
                  "restarts": "…"}}]}

  ``collection.ok`` is null before the first collection; ``error`` is null unless it failed.
  Host figures are null when the latest collection failed or is stale (see ``figures``).

``GET /api/v1/nodes/<node>/ledger`` — who holds the node's memory (``"ledger": null`` before
the first one)::

    {"node": "spark-a", "ledger": {
        "at": "…", "age_seconds": 3.0, "mem_total_bytes": …, "mem_available_bytes": …,
        "mem_available_interval_min_bytes": …, "headroom_bytes": …,
        "page_cache_reclaimable_bytes": …, "swap_used_bytes": …, "others_bytes": …,
        "engines": [{"engine": "gemma", "model": "…", "weights_bytes": …,
                     "kv_pool_bytes": …, "cuda_graphs_bytes": …, "reserved_bytes": …,
                     "actual_bytes": …, "non_kv_bytes": …, "prefill_estimate_bytes": …,
                     "prefill_observed_bytes": …, "prefill_need_bytes": …,
                     "prefill_need_source": "observed" | "estimate" | null}],
        "processes": [{"name": "python3", "rss_bytes": …, "count": 2}]}}

``GET /api/v1/nodes/<node>/engines`` — the overview's engine cards (present engines), with the
card's own field names and units, plus ``scrape_up``::

    {"node": "spark-a", "engines": [{
        "name", "model", "phase", "container_state", "present", "version", "kv_gib",
        "kv_pinned", "kv_tokens", "max_concurrency", "concurrency_for_tokens", "kv_usage_pct",
        "running", "waiting", "max_num_seqs", "prefill_tps", "decode_tps", "ttft_p95_s",
        "restarted", "scrape_error" (empty string when the last scrape succeeded),
        "findings": [{"code", "severity", "message"}], "memory_gib",
        "scrape_up": true | false | null}]}

``GET /api/v1/alerts`` — alerts, newest first. Query: ``state`` (``firing``, ``pending`` or
``resolved``; default all), ``node`` (a node name), ``limit`` (1–1000, default 100)::

    {"limit": 100, "alerts": [{
        "id": 7, "rule": "prefill-squeeze", "node": "spark-a", "engine": "gemma" | null,
        "scope": "…", "state": "firing", "severity": "critical", "summary": "…",
        "cause": "…" | null, "value": 1.5 | null, "threshold": 2.0, "clear": … | null,
        "direction": "below" | null, "details": {…}, "started_at": "…", "fired_at": … | null,
        "resolved_at": … | null, "last_evaluated_at": "…", "resolve_reason": … | null}]}

``GET /api/v1/nodes/<node>/restarts`` — the restart ledger, newest first. Query: ``kind``
(``planned``/``unplanned``), ``status`` (``scheduled``, ``running``, ``succeeded``, ``failed``,
``aborted``, ``interrupted``, ``refused``, ``cancelled``, ``detected``), ``engine`` (a name on
that node), ``limit`` (1–1000, default 100)::

    {"node": "spark-a", "limit": 100, "restarts": [{
        "id": 3, "engine": "gemma", "kind": "planned", "status": "succeeded",
        "reason": "…" | null, "window": "Sunday nights" | null,
        "requested_by": "admin" | null, "requested_at": "…", "scheduled_for": … | null,
        "expected_drain_seconds": 120, "expected_startup_seconds": 600,
        "expected_back_by": … | null, "started_at": … | null, "finished_at": … | null,
        "deadline": … | null, "phase": … | null, "outcome": … | null,
        "startup_seconds": 512.3 | null, "before": {…}, "after": {…}}]}
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import Count
from django.http import HttpRequest, JsonResponse
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from collectors.enginecard import engine_card
from collectors.models import Engine, Node
from collectors.reads import node_named
from dashboard.alerting.models import Alert, AlertState
from dashboard.exports.access import export_view, refusal
from dashboard.exports.figures import (
    HostReading,
    age_seconds,
    engine_model,
    host_reading,
    scrape_up,
)
from dashboard.restarts.models import Restart

__all__ = ["alerts", "node_engines", "node_ledger", "node_restarts", "nodes", "not_found"]

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
# The card fields the API promises; new card fields stay out of v1 until listed here.
CARD_FIELDS = (
    "name", "model", "phase", "container_state", "present", "version", "kv_gib", "kv_pinned",
    "kv_tokens", "max_concurrency", "concurrency_for_tokens", "kv_usage_pct", "running",
    "waiting", "max_num_seqs", "prefill_tps", "decode_tps", "ttft_p95_s", "restarted",
    "scrape_error", "findings", "memory_gib",
)
# Ledger dict keys (collectors.ledger.Ledger.as_dict) -> API keys.
_LEDGER_KEYS = {
    "mem_total": "mem_total_bytes",
    "mem_available": "mem_available_bytes",
    "mem_available_min": "mem_available_interval_min_bytes",
    "headroom": "headroom_bytes",
    "page_cache_reclaimable": "page_cache_reclaimable_bytes",
    "swap_used": "swap_used_bytes",
    "others_total": "others_bytes",
}
_SHARE_KEYS = {
    "weights": "weights_bytes",
    "kv_pool": "kv_pool_bytes",
    "cuda_graphs": "cuda_graphs_bytes",
    "reserved": "reserved_bytes",
    "actual": "actual_bytes",
    "non_kv": "non_kv_bytes",
    "prefill_estimate": "prefill_estimate_bytes",
    "prefill_observed": "prefill_observed_bytes",
    "prefill_need": "prefill_need_bytes",
    "prefill_need_source": "prefill_need_source",
}


class BadRequest(Exception):
    """A query the API cannot answer as asked; ``reason`` goes back to the client (400)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class NotFound(Exception):
    """A path naming something that does not exist (404)."""


Parser = Callable[[str], Any]


def _choice(name: str, choices: list[str]) -> Parser:
    def parse(value: str) -> str:
        if value not in choices:
            raise BadRequest(f"{name} must be one of {', '.join(choices)}, not {value!r}")
        return value

    return parse


def _limit(value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= MAX_LIMIT:
        raise BadRequest(f"limit must be a whole number from 1 to {MAX_LIMIT}, not {value!r}")
    return int(value)


def _query(request: HttpRequest, parsers: Mapping[str, Parser]) -> dict[str, Any]:
    """The query parameters parsed by ``parsers``; an unknown or repeated name is refused, so a
    typo (``?stat=firing``) never silently returns everything."""
    parsed: dict[str, Any] = {}
    for name in request.GET:
        if name not in parsers:
            takes = ", ".join(parsers) or "no query parameters"
            raise BadRequest(f"unknown query parameter {name!r}; this endpoint takes {takes}")
        values = request.GET.getlist(name)
        if len(values) != 1:
            raise BadRequest(f"{name} is given {len(values)} times; give it once")
        parsed[name] = parsers[name](values[0])
    return parsed


def _api(view: Callable[..., dict[str, Any]]) -> Callable[..., JsonResponse]:
    """Adapt a function returning a payload into an export view with JSON errors."""

    @functools.wraps(view)
    def respond(request: HttpRequest, *args: Any, **kwargs: Any) -> JsonResponse:
        try:
            return JsonResponse(view(request, *args, **kwargs))
        except BadRequest as error:
            return JsonResponse({"error": error.reason}, status=400)
        except NotFound as error:
            return JsonResponse({"error": str(error)}, status=404)

    return export_view(respond)


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


def _node(name: str) -> Node:
    node = node_named(name)
    if node is None:
        raise NotFound(f"no node named {name!r}")
    return node


def _node_document(node: Node, reading: HostReading, firing: int) -> dict[str, Any]:
    return {
        "name": node.name,
        "hostname": node.hostname or None,
        "mem_total_bytes": node.mem_total_bytes,
        "collection": {
            "at": _iso(reading.collected_at),
            "age_seconds": None if reading.age_seconds is None else round(reading.age_seconds, 1),
            "ok": reading.collection_ok,
            "error": reading.error or None,
            "stale": reading.stale,
        },
        "memory": {**reading.values, "headroom_bytes": reading.headroom_bytes},
        "unknown_reasons": reading.unknown_reasons,
        "alerts_firing": firing,
        "links": {
            "ledger": reverse("dashboard:api-node-ledger", args=[node.name]),
            "engines": reverse("dashboard:api-node-engines", args=[node.name]),
            "restarts": reverse("dashboard:api-node-restarts", args=[node.name]),
        },
    }


@_api
def nodes(request: HttpRequest) -> dict[str, Any]:
    """``GET /api/v1/nodes``. Cost: two queries per node, one for the firing counts."""
    _query(request, {})
    now = timezone.now()
    firing = dict(Alert.objects.filter(state=AlertState.FIRING).values_list("node_id")
                  .annotate(n=Count("id")))
    return {"nodes": [
        _node_document(node, host_reading(node, now, settings.SPARKOPS_COLLECT_INTERVAL),
                       firing.get(node.pk, 0))
        for node in Node.objects.order_by("name")
    ]}


@_api
def node_ledger(request: HttpRequest, node: str) -> dict[str, Any]:
    """``GET /api/v1/nodes/<node>/ledger``: the node's latest memory ledger, renamed to the
    API's unit-suffixed keys."""
    _query(request, {})
    watched = _node(node)
    ledger = watched.ledger or {}
    if not ledger:
        return {"node": watched.name, "ledger": None}
    shares = ledger.get("engines", [])
    models = {e.pk: engine_model(e)
              for e in Engine.objects.filter(pk__in=[s.get("engine_id") for s in shares])}
    age = age_seconds(ledger.get("at"), timezone.now())
    return {"node": watched.name, "ledger": {
        "at": ledger.get("at"),
        "age_seconds": None if age is None else round(age, 1),
        **{api: ledger.get(key) for key, api in _LEDGER_KEYS.items()},
        "engines": [
            {"engine": share.get("name"), "model": models.get(share.get("engine_id")),
             **{api: share.get(key) for key, api in _SHARE_KEYS.items()}}
            for share in shares
        ],
        "processes": [{"name": p.get("name"), "rss_bytes": p.get("rss_bytes"),
                       "count": p.get("count")} for p in ledger.get("processes", [])],
    }}


@_api
def node_engines(request: HttpRequest, node: str) -> dict[str, Any]:
    """``GET /api/v1/nodes/<node>/engines``: the overview's cards of its present engines."""
    _query(request, {})
    watched = _node(node)
    documents = []
    for engine in Engine.objects.filter(node=watched, present=True).order_by("name"):
        card = engine_card(engine)
        documents.append({**{key: card.get(key) for key in CARD_FIELDS},
                          "scrape_up": scrape_up(engine)})
    return {"node": watched.name, "engines": documents}


def _alert_document(alert: Alert) -> dict[str, Any]:
    return {
        "id": alert.pk,
        "rule": alert.rule,
        "node": alert.node.name,
        "engine": alert.engine.name if alert.engine is not None else None,
        "scope": alert.scope,
        "state": alert.state,
        "severity": alert.severity,
        "summary": alert.summary,
        "cause": alert.cause or None,
        "value": alert.value,
        "threshold": alert.threshold,
        "clear": alert.clear,
        "direction": alert.direction or None,
        "details": alert.details or {},
        "started_at": _iso(alert.started_at),
        "fired_at": _iso(alert.fired_at),
        "resolved_at": _iso(alert.resolved_at),
        "last_evaluated_at": _iso(alert.last_evaluated_at),
        "resolve_reason": alert.resolve_reason or None,
    }


@_api
def alerts(request: HttpRequest) -> dict[str, Any]:
    """``GET /api/v1/alerts?state=…&node=…&limit=…``. Cost: one query (node-state index)."""
    query = _query(request, {"state": _choice("state", AlertState.values),
                             "node": str, "limit": _limit})
    rows = Alert.objects.select_related("node", "engine").order_by("-started_at", "-id")
    if "state" in query:
        rows = rows.filter(state=query["state"])
    if "node" in query:
        if not Node.objects.filter(name=query["node"]).exists():
            raise BadRequest(f"node: no node named {query['node']!r}")
        rows = rows.filter(node__name=query["node"])
    limit = query.get("limit", DEFAULT_LIMIT)
    return {"limit": limit, "alerts": [_alert_document(alert) for alert in rows[:limit]]}


def _restart_document(restart: Restart) -> dict[str, Any]:
    return {
        "id": restart.pk,
        "engine": restart.engine.name,
        "kind": restart.kind,
        "status": restart.status,
        "reason": restart.reason or None,
        "window": restart.window.name if restart.window is not None else None,
        "requested_by": restart.requested_by.get_username()
        if restart.requested_by is not None else None,
        "requested_at": _iso(restart.requested_at),
        "scheduled_for": _iso(restart.scheduled_for),
        "expected_drain_seconds": restart.expected_drain_seconds,
        "expected_startup_seconds": restart.expected_startup_seconds,
        "expected_back_by": _iso(restart.expected_back_by),
        "started_at": _iso(restart.started_at),
        "finished_at": _iso(restart.finished_at),
        "deadline": _iso(restart.deadline),
        "phase": restart.phase or None,
        "outcome": restart.outcome or None,
        "startup_seconds": restart.startup_seconds,
        "before": restart.before or {},
        "after": restart.after or {},
    }


@_api
def node_restarts(request: HttpRequest, node: str) -> dict[str, Any]:
    """``GET /api/v1/nodes/<node>/restarts?kind=…&status=…&engine=…&limit=…``."""
    query = _query(request, {"kind": _choice("kind", Restart.Kind.values),
                             "status": _choice("status", Restart.Status.values),
                             "engine": str, "limit": _limit})
    watched = _node(node)
    rows = Restart.objects.filter(node=watched) \
        .select_related("engine", "window", "requested_by").order_by("-requested_at", "-id")
    for name in ("kind", "status"):
        if name in query:
            rows = rows.filter(**{name: query[name]})
    if "engine" in query:
        if not Engine.objects.filter(node=watched, name=query["engine"]).exists():
            raise BadRequest(f"engine: no engine named {query['engine']!r} on {watched.name}")
        rows = rows.filter(engine__name=query["engine"])
    limit = query.get("limit", DEFAULT_LIMIT)
    return {"node": watched.name, "limit": limit,
            "restarts": [_restart_document(restart) for restart in rows[:limit]]}


ENDPOINTS = ("/api/v1/nodes", "/api/v1/nodes/<node>/ledger", "/api/v1/nodes/<node>/engines",
             "/api/v1/nodes/<node>/restarts", "/api/v1/alerts")


@csrf_exempt
def not_found(request: HttpRequest, rest: str = "") -> JsonResponse:
    """Any path under ``/api/v1/`` that no endpoint answers: 404 in JSON, whatever the method.

    Clients of a JSON API parse every answer as JSON; Django's own 404 is an HTML page.
    """
    response = refusal(request) or JsonResponse(
        {"error": f"no API endpoint at {request.path}; the endpoints are "
                  + ", ".join(ENDPOINTS)}, status=404)
    response["Cache-Control"] = "no-store"
    return response
