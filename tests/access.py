"""Granting the permissions that configuration changes need, for tests of who may do what."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import Permission


def grant(user: Any, *codenames: str) -> Any:
    """Give ``user`` the ``dashboard`` permissions named (e.g. "change_silences"); returns the
    user reloaded, since Django caches permissions on the instance."""
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="dashboard",
                                                         codename__in=codenames))
    return type(user).objects.get(pk=user.pk)
