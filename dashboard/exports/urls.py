"""Export endpoints, in the "dashboard" namespace (reverse as "dashboard:export-metrics").

``/metrics`` sits at the site root, where Prometheus looks by default; the JSON API is
versioned under ``/api/v1/`` so that a future shape change can live beside it.
"""

from __future__ import annotations

from django.urls import URLPattern, path, re_path

from dashboard.exports import api, metrics

urlpatterns: list[URLPattern] = [
    path("metrics", metrics.metrics, name="export-metrics"),
    path("api/v1/nodes", api.nodes, name="api-nodes"),
    path("api/v1/nodes/<slug:node>/ledger", api.node_ledger, name="api-node-ledger"),
    path("api/v1/nodes/<slug:node>/engines", api.node_engines, name="api-node-engines"),
    path("api/v1/nodes/<slug:node>/restarts", api.node_restarts, name="api-node-restarts"),
    path("api/v1/alerts", api.alerts, name="api-alerts"),
    # Last: any other path under the API prefix answers 404 in JSON, not Django's HTML page.
    re_path(r"^api/v1/(?P<rest>.*)$", api.not_found, name="api-not-found"),
]
