"""Create the first admin account, once.

The password comes from ``SPARKOPS_ADMIN_PASSWORD`` when set, and must pass the password
validators of the settings like any other (else start-up stops with one line saying why);
otherwise a random one is written to ``<data dir>/admin-password``, created with mode 0600, and
its path printed, never the password itself. ``manage.py runstack`` prints that path again on
every start for as long as the file holds the admin's password (``sparkops.startup``).
"""

from __future__ import annotations

import os
import secrets

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from collectors.nodes import local_node
from sparkops.datadir import create_private_file
from sparkops.startup import admin_password_file


class Command(BaseCommand):
    help = "Create the first admin account (if there is none) and this node's row."

    def handle(self, *args, **options) -> None:
        local_node()  # this node's row, with its MemTotal (runstack's summary names the node)
        users = get_user_model()
        if users.objects.filter(is_superuser=True).exists():
            return
        username = os.environ.get("SPARKOPS_ADMIN_USER", "admin")
        password = os.environ.get("SPARKOPS_ADMIN_PASSWORD")
        if password:
            try:
                validate_password(password, users(username=username))
            except ValidationError as exc:
                # CommandError: one line on stderr, exit status 1, no traceback.
                raise CommandError(
                    "SPARKOPS_ADMIN_PASSWORD is not accepted: " + " ".join(exc.messages)
                ) from None
            users.objects.create_superuser(username, "", password)
            self.stdout.write(f"Created admin account {username!r} with SPARKOPS_ADMIN_PASSWORD.")
            return
        password = secrets.token_urlsafe(16)
        path = admin_password_file()
        path.unlink(missing_ok=True)  # left by an installation whose database was removed
        create_private_file(path, password + "\n")
        users.objects.create_superuser(username, "", password)
        self.stdout.write(f"Created admin account {username!r}; its password is in {path}")
