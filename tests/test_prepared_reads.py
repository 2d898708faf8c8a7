"""Prepared reads (``sparkops.prepared``) give exactly what the ORM gives, and keep their SQL
only where they can prove it.

Each read is run both ways on the same rows: through the ORM (``list(queryset)``) and from the
kept SQL, for model instances (datetimes read back from SQLite's text, JSON decoded,
annotations), tuples, single values, lists of several lengths, None, and aware datetimes. The
reads the ORM rewrites (a ``contains`` pattern, an empty list) stay with the ORM and still give
the same rows. Runs on SQLite here and on PostgreSQL in a process of its own.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.db.models import Count, Max, OuterRef, Subquery
from django.test.utils import CaptureQueriesContext

from collectors.models import Engine, Event, Node
from sparkops.prepared import PreparedRead
from tests.conftest import rerun_on_postgresql

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 12, 1, 8, 0, 0, 250000, tzinfo=UTC)


@pytest.fixture
def rows():
    """Two nodes; engines with JSON, times and flags; events over an hour."""
    one = Node.objects.create(name="prepared-one", mem_total_bytes=128 << 30)
    two = Node.objects.create(name="prepared-two", mem_total_bytes=128 << 30)
    engines = []
    for number, node in enumerate([one, one, one, two]):
        engines.append(Engine.objects.create(
            node=node, name=f"engine-{number}", container_id=f"c{number}" * 8,
            container_state="running" if number != 2 else "exited", present=number != 1,
            started_at=T0 - timedelta(minutes=number), labels={"n": number, "x": [1, 2]}))
    for minute in range(60):
        engine = engines[minute % 4]
        Event.objects.create(node=engine.node, engine=engine, at=T0 - timedelta(minutes=minute),
                             kind="engine-restarted" if minute % 3 else "engine-exited",
                             severity="warning", message=f"event {minute} %s ' \" ;")
    return one, two, engines


def both_ways(read: PreparedRead, *values):
    """(the ORM's rows, the prepared read's rows on its second call), as comparable values."""
    through_orm = list(read.build(*values))
    read(*values)
    prepared = read(*values)
    return _comparable(through_orm), _comparable(prepared)


def _comparable(found: list) -> list:
    if found and hasattr(found[0], "_meta"):
        return [(type(obj), {name: getattr(obj, name) for name in vars(obj)
                             if not name.startswith("_")}) for obj in found]
    return found


def test_model_instances_match_the_orm_and_the_sql_is_kept(rows):
    one, _, _ = rows
    read = PreparedRead(lambda node_id, present: Engine.objects
                        .filter(node_id=node_id, present=present).order_by("name"))
    orm, prepared = both_ways(read, one.pk, True)
    assert orm == prepared and len(orm) == 2
    assert read.is_prepared(one.pk, True)
    # The JSON is decoded, the times are aware datetimes, the instances know their database.
    engine = read(one.pk, True)[0]
    assert engine.labels == {"n": 0, "x": [1, 2]} and engine.started_at == T0
    assert engine._state.db == "default" and not engine._state.adding
    engine.container_state = "paused"
    engine.save(update_fields=["container_state"])  # an instance that saves as the ORM's does
    assert Engine.objects.get(pk=engine.pk).container_state == "paused"


def test_a_bool_is_part_of_the_shape(rows):
    one, _, _ = rows
    read = PreparedRead(lambda node_id, present: Engine.objects
                        .filter(node_id=node_id, present=present).order_by("name"))
    read(one.pk, True)
    assert [e.name for e in read(one.pk, False)] == ["engine-1"]
    assert [e.name for e in read(one.pk, True)] == ["engine-0", "engine-2"]


def test_values_change_the_rows_read_not_the_sql(rows):
    one, two, _ = rows
    read = PreparedRead(lambda node_id, since, kinds: Event.objects
                        .filter(node_id=node_id, at__gte=since, kind__in=kinds)
                        .order_by("-at").values_list("pk", "at", "kind", "message"))
    for node, minutes, kinds in [(one, 10, ("engine-exited",)), (two, 30, ("engine-exited",)),
                                 (one, 59, ("engine-restarted",))]:
        since = T0 - timedelta(minutes=minutes)
        orm, prepared = both_ways(read, node.pk, since, kinds)
        assert orm == prepared and orm
        assert all(at >= since for _, at, _, _ in prepared)
    # A list of another length is another shape, prepared in its turn.
    orm, prepared = both_ways(read, one.pk, T0 - timedelta(hours=1),
                              ["engine-exited", "engine-restarted"])
    assert orm == prepared and len(orm) == 45
    with CaptureQueriesContext(connection) as captured:
        read(one.pk, T0 - timedelta(hours=1), ["engine-exited", "engine-restarted"])
    assert len(captured.captured_queries) == 1  # the read is logged as any query


def test_a_time_in_another_zone_reads_the_same_instant(rows):
    one, _, _ = rows
    read = PreparedRead(lambda node_id, since: Event.objects
                        .filter(node_id=node_id, at__gte=since).values_list("pk", flat=True))
    read(one.pk, T0 - timedelta(minutes=5))
    plus_two = T0.astimezone(__import__("zoneinfo").ZoneInfo("Europe/Athens"))
    assert sorted(read(one.pk, plus_two - timedelta(minutes=20))) == sorted(
        Event.objects.filter(node=one, at__gte=T0 - timedelta(minutes=20))
        .values_list("pk", flat=True))


def test_none_and_annotations(rows):
    one, _, engines = rows
    newest = Event.objects.filter(engine_id=OuterRef("pk")).order_by("-at").values("message")[:1]
    read = PreparedRead(lambda node_id, started: Engine.objects
                        .filter(node_id=node_id, started_at=started)
                        .annotate(newest=Subquery(newest)).order_by("name"))
    orm, prepared = both_ways(read, one.pk, None)
    assert orm == prepared == []
    orm, prepared = both_ways(read, one.pk, T0)
    assert orm == prepared and prepared[0][1]["newest"] == "event 0 %s ' \" ;"
    grouped = PreparedRead(lambda ids: Event.objects.filter(engine_id__in=ids)
                           .values("engine_id").annotate(last=Max("at"), n=Count("pk"))
                           .values_list("engine_id", "last", "n").order_by("engine_id"))
    orm, prepared = both_ways(grouped, tuple(engine.pk for engine in engines))
    assert orm == prepared and [n for _, _, n in prepared] == [15, 15, 15, 15]


def test_reads_the_orm_rewrites_stay_with_it(rows):
    one, _, _ = rows
    pattern = PreparedRead(lambda text: Event.objects.filter(message__contains=text)
                           .values_list("pk", flat=True))
    orm, prepared = both_ways(pattern, "event 1")
    assert orm == prepared and len(orm) == 11  # 1, 10…19
    assert not pattern.is_prepared("event 1")
    empty = PreparedRead(lambda ids: Engine.objects.filter(pk__in=ids).values_list("pk"))
    assert both_ways(empty, ()) == ([], [])
    repeated = PreparedRead(lambda ids: Engine.objects.filter(pk__in=ids)
                            .values_list("pk", flat=True).order_by("pk"))
    ids = [Engine.objects.get(name="engine-0").pk] * 2
    orm, prepared = both_ways(repeated, ids)  # the ORM drops the repeated value
    assert orm == prepared == ids[:1]
    assert not repeated.is_prepared(ids)
    naive = PreparedRead(lambda since: Event.objects.filter(at__gte=since).values_list("pk"))
    assert not naive.is_prepared(datetime(2026, 1, 1))


def test_each_thread_keeps_its_own(rows):
    import threading

    one, _, _ = rows
    read = PreparedRead(lambda node_id: Engine.objects.filter(node_id=node_id)
                        .values_list("name", flat=True).order_by("name"))
    read(one.pk)
    seen = {}

    def other() -> None:  # its own connection, which has compiled nothing yet
        try:
            seen["prepared"] = read.is_prepared(one.pk)
        finally:
            connection.close()

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert read.is_prepared(one.pk) and seen["prepared"] is False


@pytest.mark.slow
def test_the_same_on_postgresql(postgres_url, tmp_path):
    """The tests above, in a process of its own on a fresh PostgreSQL database."""
    rerun_on_postgresql(__file__, postgres_url, tmp_path / "data")
