"""Every page and JSON endpoint under one namespace ("dashboard:<name>").

The pages are this app's own; each domain app exports a ``urlpatterns`` list that is included
here, so the names stayed the same when the domains became apps of their own.
"""

from django.urls import path

from dashboard import fleet_views, planner_views, views
from dashboard.alerting import urls as alerting_urls
from dashboard.audit import urls as audit_urls
from dashboard.exports import urls as exports_urls
from dashboard.notify import urls as notify_urls
from dashboard.restarts import urls as restart_urls

app_name = "dashboard"

urlpatterns = [
    path("", views.home, name="home"),
    path("fleet/", fleet_views.fleet_page, name="fleet"),
    path("nodes/<slug:node>/", views.overview, name="overview"),
    path("nodes/<slug:node>/planner/", planner_views.planner_page, name="planner"),
    path("nodes/<slug:node>/engines/cards/", views.engine_cards, name="engine-cards"),
    path("nodes/<slug:node>/engines/<str:engine>/", views.engine_detail, name="engine"),
    path("api/nodes/<slug:node>/engines.json", views.engines_json, name="engines-json"),
    path("api/nodes/<slug:node>/engines/<str:engine>/series.json", views.engine_series_json,
         name="engine-series-json"),
    path("api/nodes/<slug:node>/headroom.json", views.headroom_json, name="headroom-json"),
    path("api/nodes/<slug:node>/timeline.json", views.timeline_json, name="timeline-json"),
]

urlpatterns += audit_urls.urlpatterns
urlpatterns += alerting_urls.urlpatterns + notify_urls.urlpatterns + restart_urls.urlpatterns
urlpatterns += exports_urls.urlpatterns
