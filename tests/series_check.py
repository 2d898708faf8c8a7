"""Run as a program against the database of ``DATABASE_URL``: roll a day of samples up into
every tier with the project's own code, read them back as charts do, and print what came back.

``tests/test_series_postgres.py`` runs it on PostgreSQL, where timestamps travel differently
than on SQLite (the fast time parsing of ``dashboard.series`` must agree with Django's).
"""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime, timedelta

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sparkops.settings")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402

from collectors.models import (  # noqa: E402
    Engine,
    EngineMetric,
    EngineReading,
    HostReading,
    Metric,
    Node,
)
from collectors.readings import ENGINE, HOST, Sample  # noqa: E402
from collectors.retention import rollup_node  # noqa: E402
from dashboard.downsample import epoch_ms, from_epoch_ms  # noqa: E402
from dashboard.series import engine_points, host_points  # noqa: E402

T0 = datetime(2026, 11, 1, 0, 0, tzinfo=UTC)


def _iso(at: int) -> str:
    return from_epoch_ms(at).isoformat()


def main() -> None:
    node = Node.objects.create(name="pg-node")
    engine = Engine.objects.create(node=node, name="gemma", container_id="g" * 64,
                                   container_state="running")
    ticks = [T0 + timedelta(seconds=5 * i) for i in range(12 * 155)]  # 2 h 35 min
    HostReading.objects.bulk_create(
        HOST.reading(node, at, [Sample(Metric.MEM_AVAILABLE, at, 1.0 if i == 100 else 9.0)])
        for i, at in enumerate(ticks))
    EngineReading.objects.bulk_create(
        ENGINE.reading(engine, at, [Sample(EngineMetric.DECODE_TPS, at, float(i % 7))])
        for i, at in enumerate(ticks))
    now = ticks[-1] + timedelta(seconds=20)  # the last minute is not rolled up yet
    while rollup_node(node, now):
        pass
    node.refresh_from_db()
    engine.node = node
    out = {}
    for resolution in (0, 60, 600, 3600):
        host = host_points(node, [Metric.MEM_AVAILABLE], T0, resolution)[Metric.MEM_AVAILABLE]
        tps = engine_points([engine], [EngineMetric.DECODE_TPS], T0, None,
                            resolution)[engine.pk, EngineMetric.DECODE_TPS]
        out[resolution] = {
            "host_points": len(host), "host_min": min(p.low for p in host),
            "first": _iso(host[0].at), "last": _iso(host[-1].at),
            "engine_points": len(tps), "engine_max": max(p.high for p in tps),
        }
    grouped = host_points(node, [Metric.MEM_AVAILABLE], T0, 600,
                          bucket_seconds=1800)[Metric.MEM_AVAILABLE]
    out["grouped"] = {"host_points": len(grouped), "host_min": min(p.low for p in grouped),
                      "first": _iso(grouped[0].at), "second": _iso(grouped[1].at)}
    # Sub-millisecond times: the database rounds them to milliseconds as epoch_ms does. Stored
    # newest first, so that the table's order is not the series' order.
    odd = Node.objects.create(name="pg-rounding")
    moments = [T0 + timedelta(microseconds=us) for us in (0, 499, 500, 123_456, 999_500)]
    HostReading.objects.bulk_create(
        HOST.reading(odd, at, [Sample(Metric.MEM_AVAILABLE, at, 1.0)])
        for at in reversed(moments))
    with connection.cursor() as cursor:  # without index scans: in the table's order
        cursor.execute("SET enable_indexscan = off")
        cursor.execute("SET enable_indexonlyscan = off")
    read = host_points(odd, [Metric.MEM_AVAILABLE], T0 - timedelta(hours=1),
                       0)[Metric.MEM_AVAILABLE]
    rounding = [p.at for p in read] == [epoch_ms(at) for at in moments]
    print(json.dumps({"watermark": node.rolled_up_until.isoformat(), "tiers": out,
                      "rounding": rounding}))


if __name__ == "__main__":
    main()
