"""Write the audit row every dangerous action leaves behind, allowed or not."""

from __future__ import annotations

from typing import Any

from dashboard.restarts.models import AuditEntry


def audit(action: str, *, allowed: bool, user: Any = None, actor: str = "", node: Any = None,
          engine: Any = None, restart: Any = None, outcome: str = "",
          details: dict[str, Any] | None = None) -> AuditEntry:
    """Record ``action`` (e.g. "plan-restart", "stop", "drop-caches") and what came of it.

    ``user`` is the admin who asked (None for the worker, which names itself in ``actor``).
    """
    return AuditEntry.objects.create(
        action=action, allowed=allowed,
        user=user if getattr(user, "is_authenticated", False) else None,
        actor=actor or (getattr(user, "get_username", lambda: "")() if user else ""),
        node=node, engine=engine, restart=restart, outcome=outcome, details=details or {},
    )
