from datetime import UTC, datetime

import pytest

from dashboard.downsample import SeriesPoint, break_long_gaps, downsample, epoch_ms

T0 = epoch_ms(datetime(2026, 11, 1, tzinfo=UTC))
SECOND = 1000  # the series' unit: milliseconds since the epoch
MINUTE = 60 * SECOND


def _raw(values, step=5):
    return [SeriesPoint(T0 + i * step * SECOND, v, v) for i, v in enumerate(values)]


def test_a_one_sample_dip_survives_heavy_reduction():
    values = [50.0] * 120_960  # 7 days at 5 s
    values[77_777] = 12.5
    out = downsample(_raw(values), 2000)

    assert len(out) <= 2000
    assert min(v for _, v in out) == 12.5
    assert (T0 + 77_777 * 5 * SECOND, 12.5) in out


def test_short_series_is_returned_whole():
    points = _raw([1.0, 2.0, 3.0])
    assert downsample(points, 2000) == [(p.at, p.low) for p in points]


def test_gaps_are_kept_as_none():
    values = [5.0] * 10_000
    values[5000] = None
    out = downsample(_raw(values), 300)

    assert len(out) <= 300
    assert any(v is None for _, v in out)
    assert [t for t, _ in out] == sorted(t for t, _ in out)


def test_rollup_points_keep_their_minimum_and_maximum():
    points = [SeriesPoint(T0 + i * MINUTE, 10.0, 20.0) for i in range(50_000)]
    points[123] = SeriesPoint(points[123].at, 1.0, 20.0)
    points[456] = SeriesPoint(points[456].at, 10.0, 99.0)
    out = downsample(points, 1500)

    assert len(out) <= 1500
    values = [v for _, v in out]
    assert min(values) == 1.0 and max(values) == 99.0


def test_too_small_budget_is_refused():
    with pytest.raises(ValueError):
        downsample(_raw([1.0] * 10), 2)


def test_long_silences_become_gaps():
    series = [(T0, 1.0), (T0 + 5 * SECOND, 1.0), (T0 + 300 * SECOND, 2.0)]
    out = break_long_gaps(series, max_step_seconds=20)

    assert [v for _, v in out] == [1.0, 1.0, None, 2.0]
