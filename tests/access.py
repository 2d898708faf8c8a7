"""Granting the permissions that configuration changes need, for tests of who may do what."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import Permission

# The app each permission belongs to (the app of the model that declares it).
APP_OF = {
    "change_channels": "notify",
    "change_rules": "alerting",
    "change_silences": "alerting",
    "change_windows": "restarts",
    "run_restarts": "restarts",
    "unlock_logins": "audit",
    "view_audit": "audit",
}


def grant(user: Any, *codenames: str) -> Any:
    """Give ``user`` the permissions named (e.g. "change_silences"); returns the user reloaded,
    since Django caches permissions on the instance."""
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(
            content_type__app_label=APP_OF[codename], codename=codename))
    return type(user).objects.get(pk=user.pk)
