"""The raw layout (``collectors.readings``): a reading per collection holds each figure in its
metric's column, an interval minimum at its own time, and an unknown figure with why; the
minute roll-up and a chart read them back as they were when each figure was a row."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from collectors.models import Engine, EngineMetric, HostReading, Metric
from collectors.readings import ENGINE, HOST, Sample, engine_readings, stored_notes
from dashboard.downsample import epoch_ms
from dashboard.series import host_points

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


def test_a_reading_keeps_every_figure_its_time_and_why_one_is_unknown(node):
    seen = T0 - timedelta(seconds=2)
    reading = HOST.reading(node, T0, [
        Sample(Metric.MEM_AVAILABLE, T0, 30.0),
        Sample(Metric.MEM_AVAILABLE_MIN, seen, 20.0),
        Sample(Metric.PSI_SOME_AVG10, T0, None, "no /proc/pressure/memory"),
    ])
    reading.save()

    stored = HOST.samples(HostReading.objects.get())

    assert stored == {
        Metric.MEM_AVAILABLE: Sample(Metric.MEM_AVAILABLE, T0, 30.0),
        Metric.MEM_AVAILABLE_MIN: Sample(Metric.MEM_AVAILABLE_MIN, seen, 20.0),
        Metric.PSI_SOME_AVG10: Sample(Metric.PSI_SOME_AVG10, T0, None,
                                      "no /proc/pressure/memory"),
    }  # and nothing of the metrics it did not read
    assert list(HOST.holding(Metric.MEM_AVAILABLE).values_list("value", flat=True)) == [30.0]
    assert not HOST.holding(Metric.PSI_SOME_AVG10).exists()


def test_every_metric_has_a_column_and_a_later_figure_replaces_an_earlier_one(node):
    engine = Engine.objects.create(node=node, name="gemma", container_id="a" * 64,
                                   container_state="running")
    for layout in (HOST, ENGINE):
        for metric in layout.metrics:
            layout.model._meta.get_field(layout.column(metric))
            layout.model._meta.get_field(layout.time(metric))
    (reading,) = engine_readings([(engine, Sample(EngineMetric.DECODE_TPS, T0, None)),
                                  (engine, Sample(EngineMetric.DECODE_TPS, T0, 41.0))])
    assert (reading.decode_tps, reading.notes) == (41.0, {})


def test_minutes_and_charts_read_each_figure_at_its_own_time(node):
    # The minimum of the collection ending at 12:01:02 was seen at 12:00:59: the minute before.
    end, seen = T0 + timedelta(minutes=1, seconds=2), T0 + timedelta(seconds=59)
    HOST.reading(node, end, [Sample(Metric.MEM_AVAILABLE, end, 30.0),
                             Sample(Metric.MEM_AVAILABLE_MIN, seen, 20.0)]).save()
    HOST.reading(node, end + timedelta(seconds=5), [
        Sample(Metric.MEM_AVAILABLE, end + timedelta(seconds=5), None, "unreadable")]).save()

    minutes = HOST.minute_rows(HostReading.objects.filter(node=node), (), T0,
                               T0 + timedelta(minutes=2))
    points = host_points(node, [Metric.MEM_AVAILABLE, Metric.MEM_AVAILABLE_MIN], T0, 0)

    assert sorted((row["metric"], row["start"], row["min"], row["count"]) for row in minutes) == [
        (Metric.MEM_AVAILABLE, T0 + timedelta(minutes=1), 30.0, 1),
        (Metric.MEM_AVAILABLE_MIN, T0, 20.0, 1)]
    assert [(p.at, p.low) for p in points[Metric.MEM_AVAILABLE_MIN]] == [(epoch_ms(seen), 20.0)]
    assert [(p.at, p.low) for p in points[Metric.MEM_AVAILABLE]] == [
        (epoch_ms(end), 30.0), (epoch_ms(end + timedelta(seconds=5)), None)]  # a gap


def test_notes_as_either_database_returns_them():
    assert stored_notes(None) == stored_notes("{}") == stored_notes({}) == {}
    assert stored_notes('{"15": "why"}') == {"15": "why"} == stored_notes({"15": "why"})
