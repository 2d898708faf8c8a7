"""Channel pages, included into the "dashboard" namespace by ``dashboard.urls``."""

from __future__ import annotations

from django.urls import URLPattern, path

from dashboard.notify import views

urlpatterns: list[URLPattern] = [
    path("channels/", views.channels, name="channels"),
    path("channels/new/", views.channel_new, name="channel-new"),
    path("channels/<int:pk>/", views.channel_edit, name="channel-edit"),
    path("channels/<int:pk>/toggle/", views.channel_toggle, name="channel-toggle"),
    path("channels/<int:pk>/test/", views.channel_test, name="channel-test"),
    path("channels/<int:pk>/delete/", views.channel_delete, name="channel-delete"),
]
