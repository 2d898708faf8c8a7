from django.urls import path

from dashboard import security_views, views
from dashboard.alerting import urls as alerting_urls
from dashboard.exports import urls as exports_urls
from dashboard.notify import urls as notify_urls
from dashboard.restarts import urls as restart_urls

app_name = "dashboard"

urlpatterns = [
    path("", views.home, name="home"),
    path("nodes/<slug:node>/", views.overview, name="overview"),
    path("nodes/<slug:node>/engines/cards/", views.engine_cards, name="engine-cards"),
    path("nodes/<slug:node>/engines/<str:engine>/", views.engine_detail, name="engine"),
    path("api/nodes/<slug:node>/engines.json", views.engines_json, name="engines-json"),
    path("api/nodes/<slug:node>/engines/<str:engine>/series.json", views.engine_series_json,
         name="engine-series-json"),
    path("api/nodes/<slug:node>/headroom.json", views.headroom_json, name="headroom-json"),
    path("api/nodes/<slug:node>/memory.json", views.memory_json, name="memory-json"),
    path("api/nodes/<slug:node>/timeline.json", views.timeline_json, name="timeline-json"),
    path("audit/", security_views.audit_log, name="audit"),
    path("logins/", security_views.login_lockouts, name="logins"),
    path("logins/unlock/", security_views.login_unlock, name="login-unlock"),
]

# Alerting and notification pages share this app's namespace ("dashboard:<name>").
urlpatterns += alerting_urls.urlpatterns + notify_urls.urlpatterns + restart_urls.urlpatterns
urlpatterns += exports_urls.urlpatterns
