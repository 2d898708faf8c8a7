"""Taking a database to given migrations and back, for the tests of data migrations."""

from __future__ import annotations

from collections.abc import Iterable

from django.apps.registry import Apps
from django.db import connection
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.migrations.executor import MigrationExecutor

Target = tuple[str, str | None]


def migrate(targets: Iterable[Target], using: BaseDatabaseWrapper = connection) -> Apps:
    """Migrate to ``targets`` (forwards or backwards); the models as of there."""
    targets = list(targets)
    executor = MigrationExecutor(using)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def newest(using: BaseDatabaseWrapper = connection) -> list[Target]:
    """Every app's latest migration."""
    return MigrationExecutor(using).loader.graph.leaf_nodes()
