"""The start-up summary ``manage.py runstack`` prints on every start, before its processes run.

A few lines an admin reads once in a terminal or in journald: the release, where the web server
listens, this node and its queue, the database and the broker (passwords masked), where the
first admin's generated password is, and what the log will show. The password line is printed
on every start for as long as the file in the data directory still holds the admin's password,
and no longer once it has been changed: the file then says nothing true.
"""

from __future__ import annotations

import logging
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import DatabaseError

from sparkops.backends import describe_broker, describe_database
from sparkops.celery import node_queue
from sparkops.version import VERSION

ADMIN_PASSWORD_FILE_NAME = "admin-password"
log = logging.getLogger(__name__)


def admin_password_file() -> Path:
    """Where ``manage.py bootstrap`` writes the first admin's generated password (0600)."""
    return Path(settings.DATA_DIR) / ADMIN_PASSWORD_FILE_NAME


def generated_password_owner() -> str | None:
    """The superuser whose password is still the generated one in the data directory; None when
    there is no such file or it no longer matches anyone's (the password was changed)."""
    try:
        password = admin_password_file().read_text().strip()
    except OSError:
        return None
    if not password:
        return None
    try:
        for user in get_user_model().objects.filter(is_superuser=True).order_by("pk")[:10]:
            if user.check_password(password):
                return user.get_username()
    except DatabaseError as error:
        log.warning("cannot tell whether the generated admin password is still in use: %s",
                    error)
    return None


def summary_lines(*, bind: str, parts: str) -> list[str]:
    """The start-up summary, one line each."""
    node = settings.SPARKOPS_NODE_NAME
    lines = [
        f"SparkOps {VERSION} is starting on http://{bind}/ ({parts}); Ctrl-C stops it.",
        *([f"  public:   {settings.SPARKOPS_PUBLIC_URL} (SPARKOPS_PUBLIC_URL)"]
          if settings.SPARKOPS_PUBLIC_URL.rstrip("/") != f"http://{bind}" else []),
        f"  node:     {node} (queue {node_queue(node)})",
        f"  database: {describe_database()}",
        f"  broker:   {describe_broker()}",
    ]
    owner = generated_password_owner()
    if owner is not None:
        lines.append(f"  admin:    the password of {owner!r} is in {admin_password_file()} "
                     "(until it is changed)")
    level = settings.SPARKOPS_LOG_LEVEL
    if level == "DEBUG":
        shown = "every request and every task, and debugging detail"
    elif level == "INFO":
        shown = "failures and deliveries; SPARKOPS_LOG_LEVEL=DEBUG adds every request and task"
    else:
        shown = f"messages at {level} and above only"
    lines.append(f"  logs:     {level}: {shown}")
    lines.append(f"  probes:   http://{bind}/healthz (alive), http://{bind}/readyz (ready)")
    return lines
