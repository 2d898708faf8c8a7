"""``manage.py backup [FILE]`` (``bin/sparkops backup``): a consistent copy of the database.

Safe while the stack runs. Without FILE the copy goes into the data directory, named with the
time in UTC (``sparkops-backup-20261201T031500Z.sqlite3``, or ``.pgdump`` on PostgreSQL). See
``sparkops.backup``.
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from sparkops.backends import describe_database
from sparkops.backup import BackupError, backup, default_backup_path


class Command(BaseCommand):
    help = ("Write a consistent copy of the database to FILE (default: a new file in the data "
            "directory named with the UTC time), created 0600; safe while SparkOps runs.")
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", nargs="?", type=Path,
                            help="the new file to write (it must not exist)")

    def handle(self, *args, **options) -> None:
        target = options["file"] or default_backup_path(Path(settings.DATA_DIR))
        try:
            written = backup(target)
        except BackupError as error:
            raise CommandError(str(error)) from None
        size = written.stat().st_size
        self.stdout.write(f"Backed up {describe_database()} to {written} ({size:,} bytes).")
