"""Who may change what: the permissions configuration changes need, and the guard views use.

Everyone signed in may read every page. Changing something needs its own permission, named here
once (superusers hold them all; "staff" alone grants none):

- ``notify.change_channels``: create, edit, enable and disable notification channels;
- ``alerting.change_rules``: change a rule's settings (thresholds, timings, enabled);
- ``alerting.change_silences``: create and expire silences;
- ``restarts.change_windows``: create and edit restart windows;
- ``audit.view_audit``: read the audit log;
- ``audit.unlock_logins``: see login lockouts and lift them.

(``restarts.run_restarts`` for planning and cancelling restarts lives with the planning code.)
Each permission belongs to the app whose model declares it; an upgrade from the single
``dashboard`` app moved the rows and every grant with them.

A change asked for without the permission answers 403 with the missing permission in words and
writes an audit row "refused" (who, from where, what was asked); merely opening a form (GET) is
refused without a row, because looking is not an action.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any, NoReturn

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse

from dashboard.audit.records import audit_request, from_request

__all__ = [
    "CHANGE_CHANNELS",
    "CHANGE_RULES",
    "CHANGE_SILENCES",
    "CHANGE_WINDOWS",
    "UNLOCK_LOGINS",
    "VIEW_AUDIT",
    "Permission",
    "guarded",
    "refuse",
]

View = Callable[..., HttpResponse]


@dataclass(frozen=True)
class Permission:
    """A Django permission (``app_label.codename``) and what it lets someone do, in words."""

    name: str
    does: str

    def held_by(self, user: Any) -> bool:
        return bool(getattr(user, "is_authenticated", False) and user.has_perm(self.name))

    def missing(self, user: Any) -> str:
        """The refusal, e.g. "viewer lacks the permission to create and expire silences
        (alerting.change_silences)"."""
        who = user.get_username() if getattr(user, "is_authenticated", False) else "anonymous"
        return f"{who} lacks the permission to {self.does} ({self.name})"


CHANGE_CHANNELS = Permission("notify.change_channels",
                             "create, edit, enable and disable notification channels")
CHANGE_RULES = Permission("alerting.change_rules", "change alert rule settings")
CHANGE_SILENCES = Permission("alerting.change_silences", "create and expire silences")
CHANGE_WINDOWS = Permission("restarts.change_windows", "create and edit restart windows")
VIEW_AUDIT = Permission("audit.view_audit", "read the audit log")
UNLOCK_LOGINS = Permission("audit.unlock_logins", "see login lockouts and lift them")


def refuse(request: HttpRequest, permission: Permission, action: str, *,
           details: dict[str, Any] | None = None, **context: Any) -> NoReturn:
    """Audit ``action`` as refused for lack of ``permission``, then answer 403 saying so."""
    reason = permission.missing(request.user)
    audit_request(request, action, allowed=False, outcome=reason,
                  details={"path": request.path, **(details or {})}, **context)
    raise PermissionDenied(reason)


def guarded(permission: Permission, action: str) -> Callable[[View], View]:
    """Decorate a view that changes something: sign-in first (redirect), then ``permission``.

    Without it, a POST is refused and audited as ``action`` (with the URL's arguments in the
    details); any other method is refused without an audit row. With it, the view runs inside
    :func:`dashboard.audit.records.from_request`, so its audit rows carry the client address.
    """

    def decorate(view: View) -> View:
        @login_required
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not permission.held_by(request.user):
                if request.method == "POST":
                    refuse(request, permission, action, details=dict(kwargs))
                raise PermissionDenied(permission.missing(request.user))
            with from_request(request):
                return view(request, *args, **kwargs)

        return wrapper

    return decorate
