"""``manage.py status`` (``bin/sparkops status``): what runs and whether SparkOps is ready.

Prints the report of ``dashboard.status`` and exits 0 when ready (as ``/readyz`` would answer
200), 1 otherwise, so a script or a monitoring check can use it as it is.
"""

from __future__ import annotations

import sys

from django.core.management.base import BaseCommand

from dashboard.status import status_report


class Command(BaseCommand):
    help = ("Show the release, node, database, broker, the stack's processes, the last "
            "collection and delivery, and readiness; exit 0 when ready, 1 otherwise.")
    requires_system_checks: list[str] = []

    def handle(self, *args, **options) -> None:
        report = status_report()
        for line in report.lines:
            self.stdout.write(line)
        self.stdout.flush()
        if not report.ready:
            sys.exit(1)
