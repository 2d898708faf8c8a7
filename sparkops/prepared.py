"""Reads whose SQL the ORM writes once and that run again with new values.

Every collection is followed by reads that are the same each time but for their values (this
node, this engine list, "since five minutes ago"). Building a queryset and compiling it cost the
ORM about a third of a millisecond of CPU each, several times what SQLite takes to answer
such a read: in the alert round, 5 of its 12 ms went to compiling its 15 queries.

A :class:`PreparedRead` is made from a function that builds the queryset from its values. The
first time it runs with a *shape* of values (their types, the length of each list, which of
them are None) on a database connection, it builds the queryset with stand-ins for the values
(markers that cannot occur in data), lets the ORM compile it, and finds each marker among the
compiled parameters. It then checks what it found: the SQL and parameters it would run for the
real values must be exactly those the ORM compiles for them. If they are, the compiled SQL, the
selected columns and their converters are kept for that shape and connection; every later read
of that shape fills in the values and runs the SQL, and converts the columns with the ORM's own
converters (datetimes read from SQLite's text, JSON decoded). If not (a value the ORM rewrites,
such as a ``contains`` pattern, or a lookup that the values themselves change), that shape keeps
running through the ORM: always the same rows, only not cheaper.

What it reads: model instances (a plain ``filter``, with annotations; ``select_related`` and
``prefetch_related`` are not kept, the caller prefetches) or tuples (``values_list``); any other
queryset runs through the ORM. Values are ints, strings, floats, bools, datetimes, None, and
lists or tuples of ints and strings (for ``__in``). Each connection (one per thread) keeps its
own compiled reads, so threads never share one.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.exceptions import EmptyResultSet, FullResultSet
from django.db import connections
from django.db.models import Model, QuerySet
from django.db.models.expressions import ColPairs
from django.db.models.query import FlatValuesListIterable, ModelIterable, ValuesListIterable

__all__ = ["PreparedRead"]

_MARKER_INT = 7_340_032_000_000_000  # above any primary key or figure stored as an integer
_MARKER_TIME = datetime(1901, 1, 1, tzinfo=UTC)
_MARKER_FLOAT = 1.0e-300


@dataclass(frozen=True)
class _Compiled:
    """One shape's read on one connection: its SQL, where each parameter comes from (the index
    of a value and the place in it of a list's item, or None for a constant of the query) with
    the constants, and how to turn a row into what the ORM returns."""

    sql: str
    slots: tuple[tuple[int, int | None] | None, ...]
    constants: tuple[Any, ...]
    converters: tuple[tuple[int, list, Any], ...]
    model: type[Model] | None  # model instances; None: tuples
    init_list: tuple[str, ...]
    model_slice: slice
    annotations: tuple[tuple[str, int], ...]
    flat: bool


class PreparedRead:
    """A read built by ``build(*values)`` whose compiled SQL is kept for each shape of values.

    ``build`` must give a queryset whose SQL depends on its values only through their shape
    (see the module's docstring); a value that decides the SQL itself (a column, a direction)
    belongs in a separate read. Calling the read returns a list: of model instances or of
    tuples (of single values for ``values_list(flat=True)``), as listing the queryset would.
    """

    def __init__(self, build: Callable[..., QuerySet]) -> None:
        self.build = build
        # connection -> shape -> the compiled read, or None where the ORM keeps it
        self._by_connection: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __call__(self, *values: Any) -> list:
        shape = tuple(_shape(value) for value in values)
        queryset = None
        if None in shape:
            return list(self.build(*values))
        alias = getattr(self, "_alias", None)
        if alias is None:
            queryset = self.build(*values)
            alias = self._alias = queryset.db
        connection = connections[alias]
        compiled_reads = self._by_connection.setdefault(connection, {})
        if shape not in compiled_reads:
            compiled_reads[shape] = _prepare(self.build, values, connection)
        compiled = compiled_reads[shape]
        if compiled is None:
            return list(queryset if queryset is not None else self.build(*values))
        return _run(compiled, _parameters(compiled, values, connection), connection, alias)

    def is_prepared(self, *values: Any) -> bool:
        """Whether reads of the shape of ``values`` run from kept SQL on this thread's
        connection (after a first read of that shape)."""
        alias = getattr(self, "_alias", None)
        if alias is None:
            return False
        compiled_reads = self._by_connection.get(connections[alias], {})
        return compiled_reads.get(tuple(_shape(value) for value in values)) is not None


def _shape(value: Any) -> Any:
    """What of ``value`` may change the SQL: its kind, a bool's value and a list's length.
    None for a value this module does not prepare (a naive datetime, a set: the ORM's ``__in``
    takes a set in its own order)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int):
        return "int"
    if isinstance(value, str):
        return "str"
    if isinstance(value, float):
        return "float"
    if isinstance(value, datetime):
        return "datetime" if value.tzinfo is not None else None
    if isinstance(value, list | tuple) and all(
            isinstance(item, int | str) and not isinstance(item, bool) for item in value):
        return ("list", tuple(_shape(item) for item in value))
    return None


def _markers(values: Sequence[Any]) -> tuple[list[Any], dict[Any, tuple[int, int | None]]]:
    """Stand-ins for ``values``, and where each marker comes from: (index of the value, place
    in its list or None). None and bools are kept: the ORM writes no parameter for None, and a
    bool is part of the shape."""
    stand_ins: list[Any] = []
    origin: dict[Any, tuple[int, int | None]] = {}

    def marker(value: Any, index: int, place: int | None) -> Any:
        number = len(origin) + 1
        if isinstance(value, str):
            stand_in: Any = f"\x1fprepared-read-marker-{number}\x1f"
        elif isinstance(value, float):
            stand_in = _MARKER_FLOAT * (number + 1)
        elif isinstance(value, datetime):
            stand_in = _MARKER_TIME + timedelta(microseconds=number)
        else:
            stand_in = _MARKER_INT + number
        origin[stand_in] = (index, place)
        return stand_in

    for index, value in enumerate(values):
        if value is None or isinstance(value, bool):
            stand_ins.append(value)
        elif isinstance(value, list | tuple):
            stand_ins.append(type(value)(marker(item, index, place)
                                         for place, item in enumerate(value)))
        else:
            stand_ins.append(marker(value, index, None))
    return stand_ins, origin


def _adapted(value: Any, connection: Any) -> Any:
    """A value as the ORM passes it to the database (an aware datetime as the backend keeps
    it; on SQLite, text in UTC)."""
    if isinstance(value, datetime):
        return connection.ops.adapt_datetimefield_value(value)
    return value


def _prepare(build: Callable[..., QuerySet], values: Sequence[Any],
             connection: Any) -> _Compiled | None:
    """The read of the shape of ``values`` compiled once, or None where it is left to the ORM
    (see the module's docstring)."""
    stand_ins, origin = _markers(values)
    try:
        sql, parameters, layout = _compile(build(*stand_ins), connection)
        real_sql, real_parameters, _ = _compile(build(*values), connection)
    except (EmptyResultSet, FullResultSet, _NotKept):
        return None
    by_adapted = {_key(_adapted(marker, connection)): place for marker, place in origin.items()}
    slots: list[tuple[int, int | None] | None] = []
    constants: list[Any] = []
    for parameter in parameters:
        slot = by_adapted.get(_key(parameter))
        slots.append(slot)
        constants.append(parameter if slot is None else None)
    compiled = _Compiled(sql=sql, slots=tuple(slots), constants=tuple(constants), **layout)
    if real_sql != sql or _parameters(compiled, values, connection) != list(real_parameters):
        return None
    return compiled


class _NotKept(Exception):
    """A queryset this module leaves to the ORM."""


def _key(parameter: Any) -> tuple[type, Any]:
    """A parameter as a dictionary key that tells 1 from 1.0 and True (an unhashable one,
    such as a JSON value, is never a marker)."""
    try:
        hash(parameter)
    except TypeError:
        return type(parameter), id(parameter)
    return type(parameter), parameter


def _compile(queryset: QuerySet, connection: Any) -> tuple[str, tuple, dict]:
    """``queryset``'s SQL, parameters and row layout, as its iterable would read them."""
    if queryset._prefetch_related_lookups or queryset._known_related_objects:
        raise _NotKept
    flat = queryset._iterable_class is FlatValuesListIterable
    if queryset._iterable_class not in (ModelIterable, ValuesListIterable,
                                        FlatValuesListIterable):
        raise _NotKept
    query = queryset.query
    if queryset._iterable_class is ValuesListIterable and (
            query.extra_select
            or list(queryset._fields) != [*query.values_select, *query.annotation_select]):
        raise _NotKept  # values_list puts these columns in its own order in Python: the ORM's
    compiler = queryset.query.get_compiler(connection=connection)
    sql, parameters = compiler.as_sql()
    fields = [column[0] for column in compiler.select[:compiler.col_count]]
    if any(isinstance(field, ColPairs) for field in fields):
        raise _NotKept
    converters = tuple((position, convs, expression) for position, (convs, expression)
                       in compiler.get_converters(fields).items())
    layout: dict[str, Any] = {"converters": converters, "model": None, "init_list": (),
                              "model_slice": slice(0), "annotations": (), "flat": flat}
    if queryset._iterable_class is ModelIterable:
        klass_info = compiler.klass_info
        if klass_info.get("related_klass_infos"):
            raise _NotKept
        start, end = klass_info["select_fields"][0], klass_info["select_fields"][-1] + 1
        layout.update(model=klass_info["model"], model_slice=slice(start, end),
                      init_list=tuple(column[0].target.attname
                                      for column in compiler.select[start:end]),
                      annotations=tuple((compiler.annotation_col_map or {}).items()))
    return sql, tuple(parameters), layout


def _parameters(compiled: _Compiled, values: Sequence[Any], connection: Any) -> list:
    """The compiled read's parameters for ``values``."""
    parameters = []
    for slot, constant in zip(compiled.slots, compiled.constants, strict=True):
        if slot is None:
            parameters.append(constant)
        else:
            index, place = slot
            value = values[index] if place is None else values[index][place]
            parameters.append(_adapted(value, connection))
    return parameters


def _run(compiled: _Compiled, parameters: list, connection: Any, alias: str) -> list:
    """Run the kept SQL and turn its rows into what the queryset gives."""
    with connection.cursor() as cursor:
        cursor.execute(compiled.sql, parameters)
        rows = cursor.fetchall()
    if compiled.converters:
        converted = []
        for row in rows:
            row = list(row)
            for position, convs, expression in compiled.converters:
                value = row[position]
                for converter in convs:
                    value = converter(value, expression, connection)
                row[position] = value
            converted.append(row)
        rows = converted
    if compiled.model is None:
        return [row[0] for row in rows] if compiled.flat else [tuple(row) for row in rows]
    objects = []
    for row in rows:
        obj = compiled.model.from_db(alias, list(compiled.init_list),
                                     tuple(row[compiled.model_slice]))
        for name, position in compiled.annotations:
            setattr(obj, name, row[position])
        objects.append(obj)
    return objects
