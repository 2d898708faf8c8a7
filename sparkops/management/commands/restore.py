"""``manage.py restore FILE`` (``bin/sparkops restore``): replace the database with a backup.

Refused while SparkOps runs on this data directory. The database it replaces is backed up first
(its path is printed); then ``migrate`` brings a backup of an older release up to this one. See
``sparkops.backup``.
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from sparkops.backends import describe_database
from sparkops.backup import BackupError, restore


class Command(BaseCommand):
    help = ("Replace the database with the backup FILE (made by `backup`), then migrate it to "
            "this release. SparkOps must be stopped; the replaced database is kept as a backup.")
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", type=Path, help="a backup made by `bin/sparkops backup`")

    def handle(self, *args, **options) -> None:
        try:
            outcome = restore(options["file"], data_dir=Path(settings.DATA_DIR),
                              liveness_timeout=settings.SPARKOPS_WORKER_LIVENESS_TIMEOUT)
        except BackupError as error:
            raise CommandError(str(error)) from None
        if outcome.previous is not None:
            self.stdout.write(f"The replaced database is kept in {outcome.previous}.")
        self.stdout.write(f"Restored {outcome.source} into {describe_database()}.")
        executor = MigrationExecutor(connection)
        pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
        if pending:
            plural = "" if len(pending) == 1 else "s"
            self.stdout.write(f"The backup is from an older release: applying {len(pending)} "
                              f"migration{plural}.")
            call_command("migrate", interactive=False, verbosity=0)
        self.stdout.write("Done; start SparkOps again.")
