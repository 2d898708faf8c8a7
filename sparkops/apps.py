"""The project's own app: start-up work that needs the settings and logging in place."""

from __future__ import annotations

import logging

from django.apps import AppConfig
from django.conf import settings

from sparkops.datadir import tighten

log = logging.getLogger("sparkops.datadir")


class SparkOpsConfig(AppConfig):
    name = "sparkops"
    label = "sparkops"
    verbose_name = "SparkOps"

    def ready(self) -> None:
        # Every process passes here once at start: an installation whose data directory was
        # created readable by others (before the private umask) is made private, and says so.
        changed = tighten(settings.DATA_DIR)
        if changed:
            log.warning("made the data directory %s private (folders 0700, files 0600): "
                        "removed group and other permissions from %d entries",
                        settings.DATA_DIR, len(changed))
