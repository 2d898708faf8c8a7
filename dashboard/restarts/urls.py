"""Restart pages, included into the "dashboard" namespace (reverse as "dashboard:restarts")."""

from __future__ import annotations

from django.urls import URLPattern, path

from dashboard.restarts import views

urlpatterns: list[URLPattern] = [
    path("restarts/", views.restarts, name="restarts"),
    path("restarts/<int:pk>/", views.restart_detail, name="restart"),
    path("restarts/<int:pk>/cancel/", views.restart_cancel, name="restart-cancel"),
    path("restarts/plan/<slug:node>/", views.restart_plan, name="restart-plan"),
    path("api/restarts/<int:pk>.json", views.restart_json, name="restart-json"),
    path("restarts/windows/", views.windows, name="windows"),
    path("restarts/windows/new/", views.window_new, name="window-new"),
    path("restarts/windows/<int:pk>/", views.window_edit, name="window-edit"),
]
