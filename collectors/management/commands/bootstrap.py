"""Create the first admin account, once.

The password comes from ``SPARKOPS_ADMIN_PASSWORD`` when set; otherwise a random one is written
to ``<data dir>/admin-password`` (mode 0600) and its path printed, never the password itself.
"""

from __future__ import annotations

import os
import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from collectors.nodes import local_node


class Command(BaseCommand):
    help = "Create the first admin account (if there is none) and this node's row."

    def handle(self, *args, **options) -> None:
        node = local_node()
        self.stdout.write(f"Node: {node.name} (queue {node.queue})")
        users = get_user_model()
        if users.objects.filter(is_superuser=True).exists():
            return
        username = os.environ.get("SPARKOPS_ADMIN_USER", "admin")
        password = os.environ.get("SPARKOPS_ADMIN_PASSWORD")
        if password:
            users.objects.create_superuser(username, "", password)
            self.stdout.write(f"Created admin account {username!r} with SPARKOPS_ADMIN_PASSWORD.")
            return
        password = secrets.token_urlsafe(16)
        users.objects.create_superuser(username, "", password)
        path = settings.DATA_DIR / "admin-password"
        path.write_text(password + "\n")
        path.chmod(0o600)
        self.stdout.write(f"Created admin account {username!r}; its password is in {path}")
