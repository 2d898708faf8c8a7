"""The kept writes of ``sparkops.rowwrites`` write what the ORM writes.

``save_fields`` is ``save(update_fields=...)``: the named columns and no other, each value as
its field prepares it (JSON, aware times, None), the same error when the row is gone, and a
refusal of a field ``save`` would treat otherwise (the key). ``insert_rows`` is ``bulk_create``
(a host reading with unknown figures and their notes). The engines' rows and readings are
compared in ``tests/test_engine_collection_equivalence.py``. Runs on SQLite here and on
PostgreSQL in a process of its own."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import DatabaseError, connection
from django.test.utils import CaptureQueriesContext

from collectors.models import Engine, HostReading, Metric, Node
from collectors.readings import HOST, Sample
from sparkops.rowwrites import insert_rows, save_fields
from tests.conftest import rerun_on_postgresql

pytestmark = pytest.mark.django_db
AT = datetime(2026, 12, 7, 21, 30, 0, 125000, tzinfo=UTC)


def _row(model, pk) -> dict:
    """Every column of the row as the ORM reads it back."""
    return model.objects.filter(pk=pk).values().get()


def _changed(node: Node) -> None:
    node.ledger = {"at": AT.isoformat(), "engines": [{"name": "a", "kv": 3 << 30}],
                   "others_total": None}
    node.last_collection_at = AT
    node.mem_total_bytes = 121 << 30
    node.hostname = "not written"


def test_the_row_is_what_save_with_update_fields_writes():
    by_save = Node.objects.create(name="by-save", hostname="h", mem_total_bytes=1 << 30)
    by_us = Node.objects.create(name="by-us", hostname="h", mem_total_bytes=1 << 30)
    fields = ["ledger", "last_collection_at", "mem_total_bytes"]
    for node in (by_save, by_us):
        _changed(node)
    by_save.save(update_fields=fields)
    with CaptureQueriesContext(connection) as queries:
        save_fields(by_us, fields)

    assert len(queries) == 1 and queries[0]["sql"].startswith("UPDATE")
    ours, theirs = _row(Node, by_us.pk), _row(Node, by_save.pk)
    for row in (ours, theirs):
        del row["id"], row["name"], row["created_at"]
    assert ours == theirs
    assert ours["hostname"] == "h"  # a field not named keeps its stored value
    assert ours["ledger"]["engines"][0]["kv"] == 3 << 30
    assert ours["last_collection_at"] == AT


def test_none_and_a_second_set_of_fields_of_the_same_model():
    node = Node.objects.create(name="n", mem_total_bytes=1 << 30, ledger={"a": 1},
                               last_collection_at=AT)
    node.mem_total_bytes, node.last_collection_at = None, None
    save_fields(node, ["mem_total_bytes", "last_collection_at"])
    node.gpu = {"state": "absent"}
    save_fields(node, ["gpu"])
    row = _row(Node, node.pk)
    assert (row["mem_total_bytes"], row["last_collection_at"], row["gpu"], row["ledger"]) == \
        (None, None, {"state": "absent"}, {"a": 1})


def test_a_row_deleted_meanwhile_is_saves_error():
    node = Node.objects.create(name="gone", mem_total_bytes=1 << 30)
    engine = Engine.objects.create(node=node, name="e", container_id="c" * 64)
    Engine.objects.filter(pk=engine.pk).delete()
    engine.phase = "ready"
    with pytest.raises(DatabaseError, match="did not affect any rows"):
        save_fields(engine, ["phase"])


def test_the_key_is_not_a_field_it_writes():
    node = Node.objects.create(name="key", mem_total_bytes=1 << 30)
    with pytest.raises(ValueError, match="Node.id is not written"):
        save_fields(node, ["id"])


def test_the_kept_statements_stay_bounded_as_the_changed_fields_vary(monkeypatch):
    from sparkops import rowwrites

    monkeypatch.setattr(rowwrites, "KEPT_STATEMENTS", 3)
    monkeypatch.setattr(rowwrites, "_statements", {})
    node = Node.objects.create(name="bounded", mem_total_bytes=1 << 30)
    names = ["hostname", "mem_total_bytes", "last_collection_at", "ledger", "gpu"]
    node.hostname, node.mem_total_bytes, node.last_collection_at = "b", 2 << 30, AT
    node.ledger, node.gpu = {"n": 1}, {"state": "absent"}
    for count in range(1, len(names) + 1):
        save_fields(node, names[:count])
        assert len(rowwrites._statements) <= 3
    row = _row(Node, node.pk)
    assert (row["hostname"], row["mem_total_bytes"], row["ledger"], row["gpu"]) == \
        ("b", 2 << 30, {"n": 1}, {"state": "absent"})


def test_a_host_reading_is_inserted_as_bulk_create_inserts_it():
    node = Node.objects.create(name="readings", mem_total_bytes=1 << 30)
    samples = [Sample(Metric.MEM_AVAILABLE, AT, 7.5 * 2**30),
               Sample(Metric.MEM_AVAILABLE_MIN, AT, 7 * 2**30),
               Sample(Metric.SWAP_FREE, AT, None, note="no swap file")]
    with CaptureQueriesContext(connection) as queries:
        insert_rows([HOST.reading(node, AT, samples)])
    assert len(queries) == 1 and "INSERT INTO" in queries[0]["sql"]
    ours = list(HostReading.objects.values())
    HostReading.objects.all().delete()
    HostReading.objects.bulk_create([HOST.reading(node, AT, samples)])
    theirs = list(HostReading.objects.values())
    assert [{**row, "id": None} for row in ours] == [{**row, "id": None} for row in theirs]
    assert ours[0]["notes"] == {str(int(Metric.SWAP_FREE)): "no swap file"}
    with CaptureQueriesContext(connection) as queries:
        insert_rows([])
    assert not queries


@pytest.mark.slow
def test_the_same_on_postgresql(postgres_url, tmp_path):
    """The tests above, in a process of its own on a fresh PostgreSQL database."""
    rerun_on_postgresql(__file__, postgres_url, tmp_path / "data")
