"""Migration 0015 folds the raw samples of a running installation, a row per figure, into a
reading per collection (host) and per engine and collection, and unfolds them again backwards:
every figure, its time (an interval minimum's own), and why an unknown one was unknown."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.migrating import migrate, newest

BEFORE = [("collectors", "0014_fleet_nodes_and_spans")]
AFTER = [("collectors", "0015_raw_readings")]
T0 = datetime(2026, 10, 1, 0, 0, tzinfo=UTC)
COLLECTIONS = [T0 + timedelta(seconds=5 * i) for i in range(3)]


@pytest.fixture
def migrations_undone():
    """The test database taken back before 0015, and to the newest migrations afterwards."""
    yield
    migrate(newest())


def _figures(apps) -> tuple[set, set]:
    host = {(row.node_id, row.metric, row.at, row.value, row.note)
            for row in apps.get_model("collectors", "Sample").objects.all()}
    engine = {(row.engine_id, row.metric, row.at, row.value)
              for row in apps.get_model("collectors", "EngineSample").objects.all()}
    return host, engine


# Migrates the whole test database back and forth: seconds, not milliseconds.
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_raw_samples_fold_into_readings_and_back(migrations_undone):
    old = migrate(BEFORE)
    node = old.get_model("collectors", "Node").objects.create(name="spark-old")
    engine = old.get_model("collectors", "Engine").objects.create(
        node=node, name="gemma", container_id="a" * 64, container_state="running")
    sample = old.get_model("collectors", "Sample")
    engine_sample = old.get_model("collectors", "EngineSample")
    for index, at in enumerate(COLLECTIONS):
        sample.objects.create(node=node, metric=3, at=at, value=30.0 + index)  # MemAvailable
        # Its interval minimum, seen 2 s before the collection ended, inside its window.
        sample.objects.create(node=node, metric=4, at=at - timedelta(seconds=2),
                              value=20.0 + index)
        engine_sample.objects.create(engine=engine, metric=5, at=at, value=40.0 + index)
        engine_sample.objects.create(engine=engine, metric=1, at=at, value=1.0)
    sample.objects.create(node=node, metric=15, at=COLLECTIONS[1], value=None,
                          note="no /proc/pressure/memory (kernel without PSI)")
    engine_sample.objects.create(engine=engine, metric=2, at=COLLECTIONS[2], value=None)
    before = _figures(old)

    new = migrate(AFTER)
    readings = list(new.get_model("collectors", "HostReading").objects.order_by("at"))
    engine_readings = list(new.get_model("collectors", "EngineReading").objects.order_by("at"))

    assert [reading.at for reading in readings] == COLLECTIONS
    assert [(r.mem_available, r.mem_available_min, r.mem_available_min_at) for r in readings] == [
        (30.0 + i, 20.0 + i, at - timedelta(seconds=2)) for i, at in enumerate(COLLECTIONS)]
    assert [reading.notes for reading in readings] == [
        {}, {"15": "no /proc/pressure/memory (kernel without PSI)"}, {}]
    assert readings[1].psi_some_avg10 is None
    assert [(r.at, r.decode_tps, r.requests_running, r.requests_waiting, r.notes)
            for r in engine_readings] == [
        (COLLECTIONS[0], 40.0, 1.0, None, {}), (COLLECTIONS[1], 41.0, 1.0, None, {}),
        (COLLECTIONS[2], 42.0, 1.0, None, {"2": ""})]

    assert _figures(migrate(BEFORE)) == before
