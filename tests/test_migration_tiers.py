"""Migration 0004 keeps a running installation's history: its per-minute roll-ups become the
minute tier and seed the ten-minute and hourly tiers, and the roll-up watermark is reset so the
raw engine samples still kept are rolled up too."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.migrating import migrate, newest

BEFORE = [("collectors", "0003_engine_env_managed")]
AFTER = [("collectors", "0004_rollup_tiers")]
T0 = datetime(2026, 10, 1, 0, 0, tzinfo=UTC)


@pytest.fixture
def migrations_undone():
    """The test database taken back before 0004, and to the newest migrations afterwards."""
    yield
    migrate(newest())


# Migrates the whole test database back and forth: seconds, not milliseconds.
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_existing_minute_roll_ups_seed_the_coarser_tiers(migrations_undone):
    old = migrate(BEFORE)
    node = old.get_model("collectors", "Node").objects.create(
        name="spark-old", rolled_up_until=T0 + timedelta(hours=2))
    old.get_model("collectors", "Rollup").objects.bulk_create([
        old.get_model("collectors", "Rollup")(
            node_id=node.pk, metric=3, minute=T0 + timedelta(minutes=m),
            min=10.0 - (m == 25) * 9, max=10.0 + m / 100, mean=10.0, count=12)
        for m in range(90)  # an hour and a half of minutes, with one dip at minute 25
    ])

    new = migrate(AFTER)
    rollup = new.get_model("collectors", "Rollup")
    tiers = {}
    for row in rollup.objects.order_by("resolution", "start"):
        tiers.setdefault(row.resolution, []).append(row)

    assert len(tiers[60]) == 90  # the minutes themselves, now the minute tier
    assert [r.start for r in tiers[600]] == [T0 + timedelta(minutes=10 * i) for i in range(9)]
    assert [r.start for r in tiers[3600]] == [T0, T0 + timedelta(hours=1)]
    first_hour = tiers[3600][0]
    assert (first_hour.min, first_hour.max, first_hour.count) == (1.0, 10.59, 720)
    assert tiers[600][2].min == 1.0  # the dip survives in its ten minutes
    assert new.get_model("collectors", "Node").objects.get().rolled_up_until is None
