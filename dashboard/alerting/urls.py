"""Alerting pages, included into the "dashboard" namespace (reverse as "dashboard:alerts")."""

from __future__ import annotations

from django.urls import URLPattern, path

from dashboard.alerting import views

urlpatterns: list[URLPattern] = [
    path("alerts/", views.alerts, name="alerts"),
    path("alerts/<int:pk>/", views.alert, name="alert"),
    path("silences/", views.silences, name="silences"),
    path("silences/new/", views.silence_new, name="silence-new"),
    path("silences/<int:pk>/expire/", views.silence_expire, name="silence-expire"),
    path("rules/", views.rules, name="rules"),
    path("rules/<slug:rule>/", views.rule_edit, name="rule-edit"),
]
