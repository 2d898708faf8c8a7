"""A row's changed fields written as ``Model.save(update_fields=...)`` writes them, for the
writes every collection makes.

After every collection the node's row takes its new figures (the last collection's time, the
ledger, the GPU report) and each engine's row what changed. ``save(update_fields=...)`` spends
about a quarter of a millisecond of CPU building its statement through the ORM, more than
running it (the node's ledger: 0.41 ms through ``save``, 0.17 ms so). :func:`save_fields`
writes the same statement, kept per model and fields, with the values each field prepares.

It does what ``save`` does for the models it is used on: no signal is connected to them and no
field of theirs sets itself on save (``auto_now``), which :func:`save_fields` checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError, connections, router
from django.db.models import Field, Model

__all__ = ["save_fields"]


def save_fields(instance: Model, names: Sequence[str]) -> None:
    """``instance.save(update_fields=names)``: one UPDATE of those columns of its row, each
    value as its field prepares it for the database; DatabaseError with ``save``'s words when
    the row is gone (deleted meanwhile)."""
    model = type(instance)
    alias = router.db_for_write(model, instance=instance)
    connection = connections[alias]
    fields, sql = _statement(model, tuple(names), connection)
    values = [field.get_db_prep_save(getattr(instance, field.attname), connection)
              for field in fields]
    with connection.cursor() as cursor:
        cursor.execute(sql, [*values, instance.pk])
        if cursor.rowcount != 1:
            raise DatabaseError("Save with update_fields did not affect any rows.")
    instance._state.db = alias  # as save leaves it


# (model, field names, database vendor) -> the fields and their UPDATE
_statements: dict[tuple[type[Model], tuple[str, ...], str], tuple[list[Field], str]] = {}


def _statement(model: type[Model], names: tuple[str, ...], connection: Any
               ) -> tuple[list[Field], str]:
    """The fields named and the UPDATE that writes them, made once per model, fields and
    database vendor."""
    key = (model, names, connection.vendor)
    found = _statements.get(key)
    if found is None:
        meta = model._meta
        fields = [meta.get_field(name) for name in names]
        for field in fields:
            if field.primary_key or not field.concrete or getattr(field, "auto_now", False):
                raise ValueError(f"{model.__name__}.{field.name} is not written by "
                                 f"save_fields: it is the key, not a column, or set on save")
        quote = connection.ops.quote_name
        assignments = ", ".join(f"{quote(field.column)} = %s" for field in fields)
        found = _statements[key] = (fields, f"UPDATE {quote(meta.db_table)} SET {assignments} "
                                            f"WHERE {quote(meta.pk.column)} = %s")
    return found
