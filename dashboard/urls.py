from django.urls import path

from dashboard import views

app_name = "dashboard"

urlpatterns = [
    path("", views.home, name="home"),
    path("nodes/<slug:node>/", views.overview, name="overview"),
    path("api/nodes/<slug:node>/headroom.json", views.headroom_json, name="headroom-json"),
    path("api/nodes/<slug:node>/memory.json", views.memory_json, name="memory-json"),
]
