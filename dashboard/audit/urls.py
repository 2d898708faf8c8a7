"""Audit and login pages, included into the "dashboard" namespace (reverse as
"dashboard:audit")."""

from __future__ import annotations

from django.urls import URLPattern, path

from dashboard.audit import views

urlpatterns: list[URLPattern] = [
    path("audit/", views.audit_log, name="audit"),
    path("logins/", views.login_lockouts, name="logins"),
    path("logins/unlock/", views.login_unlock, name="login-unlock"),
]
