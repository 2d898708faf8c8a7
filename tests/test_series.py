"""Which tier a chart reads, and how the tiers are stitched up to now."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from collectors.models import Metric, Rollup
from dashboard.downsample import epoch_ms, from_epoch_ms
from dashboard.series import host_points, resolution_for, source_label
from tests.stored import host_sample

NOW = datetime(2026, 11, 20, 12, 0, 7, tzinfo=UTC)


@pytest.mark.parametrize(("span", "resolution", "label"), [
    (timedelta(hours=1), 0, "raw"),
    (timedelta(hours=6), 60, "1 min"),
    (timedelta(hours=24), 60, "1 min"),
    (timedelta(days=7), 600, "10 min"),
    (timedelta(days=30), 3600, "1 h"),
    (timedelta(days=365), 3600, "1 h"),
])
def test_each_range_reads_the_finest_tier_with_at_most_1500_buckets(span, resolution, label):
    assert resolution_for(span, 5.0) == resolution
    assert source_label(resolution) == label


def _rollup(node, resolution, start, value):
    return Rollup(node=node, metric=Metric.MEM_AVAILABLE, resolution=resolution, start=start,
                  min=value, max=value + 1, mean=value, count=1)


def test_a_longer_collection_interval_keeps_raw_samples_for_longer_ranges():
    assert resolution_for(timedelta(hours=6), 5.0) == 60
    assert resolution_for(timedelta(hours=6), 15.0) == 0  # 1,440 raw samples


def test_an_hourly_chart_ends_with_minutes_and_raw_samples_not_an_hour_early(node):
    """Hours up to the watermark's hour, minutes up to the watermark, raw samples after it."""
    node.rolled_up_until = datetime(2026, 11, 20, 11, 59, tzinfo=UTC)
    Rollup.objects.bulk_create([
        _rollup(node, 3600, datetime(2026, 11, 20, 10, tzinfo=UTC), 10.0),
        # Covered by the hour above: must not be read twice.
        _rollup(node, 60, datetime(2026, 11, 20, 10, 30, tzinfo=UTC), 99.0),
        _rollup(node, 60, datetime(2026, 11, 20, 11, 0, tzinfo=UTC), 20.0),
        _rollup(node, 600, datetime(2026, 11, 20, 11, 0, tzinfo=UTC), 50.0),  # not the chosen tier
    ])
    host_sample(node, Metric.MEM_AVAILABLE, NOW - timedelta(seconds=30), 5.0)
    host_sample(node, Metric.MEM_AVAILABLE, NOW - timedelta(seconds=3), 6.0)
    # Rolled up already (before the watermark): read from the minute tier, not twice.
    host_sample(node, Metric.MEM_AVAILABLE, NOW - timedelta(minutes=5), 1.0)

    points = host_points(node, [Metric.MEM_AVAILABLE], NOW - timedelta(days=30),
                         3600)[Metric.MEM_AVAILABLE]

    assert [(p.low, p.high) for p in points] == [(10.0, 11.0), (20.0, 21.0), (5.0, 5.0),
                                                 (6.0, 6.0)]


def test_before_the_first_roll_up_a_long_chart_reads_raw_samples(node):
    host_sample(node, Metric.MEM_AVAILABLE, NOW - timedelta(hours=2), 4.0)

    points = host_points(node, [Metric.MEM_AVAILABLE], NOW - timedelta(days=7),
                         600)[Metric.MEM_AVAILABLE]

    assert [(p.low, p.high) for p in points] == [(4.0, 4.0)]


def test_roll_ups_are_grouped_into_the_chart_buckets_by_the_database(node):
    """A chart whose buckets are wider than the tier's gets one row per bucket: the lowest
    minimum and the highest maximum in it, at the bucket's start."""
    node.rolled_up_until = datetime(2026, 11, 20, 4, 0, tzinfo=UTC)
    Rollup.objects.bulk_create([
        _rollup(node, 3600, datetime(2026, 11, 20, hour, tzinfo=UTC), value)
        for hour, value in [(0, 5.0), (1, 2.0), (2, 7.0), (3, 6.0)]
    ])

    points = host_points(node, [Metric.MEM_AVAILABLE], NOW - timedelta(days=30), 3600,
                         bucket_seconds=7200)[Metric.MEM_AVAILABLE]

    assert [(from_epoch_ms(p.at).hour, p.low, p.high) for p in points] == [(0, 2.0, 6.0),
                                                                           (2, 6.0, 8.0)]


def test_times_leave_the_database_as_the_epoch_milliseconds_python_computes(node):
    """The database turns each stored time into whole milliseconds since the epoch, rounding
    half a millisecond up, exactly as ``epoch_ms`` does for the times computed in Python (a
    failed collection, the end of the range): the two kinds of instants meet on one axis."""
    moments = [NOW - timedelta(minutes=1, microseconds=us)
               for us in (0, 1, 499, 500, 501, 123_456, 999_499, 999_500, 999_999)]
    for at in moments:
        host_sample(node, Metric.MEM_AVAILABLE, at, 1.0)

    points = host_points(node, [Metric.MEM_AVAILABLE], NOW - timedelta(hours=1),
                         0)[Metric.MEM_AVAILABLE]

    assert [p.at for p in points] == sorted(epoch_ms(at) for at in moments)
    assert epoch_ms(datetime(1970, 1, 1, 0, 0, 1, 500, tzinfo=UTC)) == 1001
    assert from_epoch_ms(epoch_ms(NOW)) == NOW
