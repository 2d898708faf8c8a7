"""An alert round reads only what its rules use, and judges exactly as when it read every row.

Queue backlog and prefill stall read the engines' newest figure, the largest, or the figures
without their times, instead of every sample with its time; the restarts and predicted starts
take their engines from the round's instead of joining them in; the node's silences are read
only once an alert needs them. Each test builds samples where the figures that matter sit at
the edges (nothing waits, a queue since before the window, more rows than a rule looks at, no
samples, unknown figures) and compares with the figures the rules gave when they read every
row (:func:`_waited_by_every_row`, :func:`_decode_by_every_row`, as the rules computed them).
"""

from __future__ import annotations

import statistics
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from collectors.models import Engine, EngineMetric, EngineReading, EngineStart
from collectors.readings import ENGINE, Sample, engine_readings
from dashboard.alerting.evaluation import evaluate_rules
from dashboard.alerting.models import Alert
from dashboard.alerting.pipeline import run_alerts
from dashboard.alerting.recent import one_read
from dashboard.alerting.restart_reads import judged_restarts
from dashboard.alerting.restart_reads import one_read as restarts_once
from dashboard.alerting.rules import predicted_squeeze, prefill_stall, queue_backlog
from dashboard.alerting.rules.queue_backlog import _waited_seconds
from dashboard.alerting.settings import rule_settings
from dashboard.restarts.models import Restart

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 11, 30, 14, 0, 0, 123456, tzinfo=UTC)
WAITING, DECODE = EngineMetric.REQUESTS_WAITING, EngineMetric.DECODE_TPS


def _engine(node, name: str, **fields) -> Engine:
    return Engine.objects.create(node=node, name=name, container_id=name * 8,
                                 container_state="running", phase="ready",
                                 rates={"prefill_tokens_per_s": 900.0}, **fields)


def _store(engine: Engine, figures: dict[int, list[tuple[float, float | None]]]) -> None:
    """``(seconds before T0, value)`` of each metric as samples (a reading per instant); None is
    read as unknown."""
    EngineReading.objects.bulk_create(engine_readings(
        [(engine, Sample(metric, T0 - timedelta(seconds=seconds), value,
                         "scrape failed" if value is None else ""))
         for metric, samples in figures.items() for seconds, value in samples]))


def _every_row(engine: Engine, metric: int, since: datetime) -> list[tuple[datetime, float]]:
    return list(ENGINE.holding(metric).filter(engine=engine, at__gte=since)
                .order_by("at").values_list("at", "value"))


def _waited_by_every_row(engine: Engine, now: datetime) -> float | None:
    """The rule's own reckoning over every row of the last 30 minutes (the newest 400): what
    differs between the two is only which rows reach it."""
    rows = _every_row(engine, WAITING, now - timedelta(minutes=30))[::-1][:400]
    return _waited_seconds(rows, now)


def _decode_by_every_row(engine: Engine, now: datetime,
                         seconds: float) -> tuple[float | None, float | None]:
    """(peak of the last ``seconds``, baseline of the last 10 min)."""
    recent = [value for _, value in _every_row(engine, DECODE, now - timedelta(seconds=seconds))]
    usual = [value for _, value in _every_row(engine, DECODE, now - timedelta(minutes=10))
             if value is not None and value > 0][:500]
    return (max(recent) if recent else None,
            statistics.median(usual) if len(usual) >= 3 else None)


@pytest.fixture
def engines(node) -> list[Engine]:
    """Engines whose samples sit at the edges of what the two rules read."""
    idle = _engine(node, "idle")  # nobody waits now, though someone did before
    _store(idle, {WAITING: [(0, 0.0), (5, 3.0), (10, 2.0)],
                  DECODE: [(s, 20.0 + s % 7) for s in range(0, 600, 5)]})
    queued = _engine(node, "queued")  # a queue since 95 s, after an empty one
    _store(queued, {
        WAITING: [(s, 2.0) for s in range(0, 100, 5)] + [(100, 0.0), (105, 4.0)],
        DECODE: [(0, 0.0), (4, 0.0), (30, 12.5), (40, 0.0), (50, 11.0), (60, 13.0)]})
    always = _engine(node, "always")  # waiting since before the window, 900 samples in it
    # And 1200 decode rates in 10 min, some 0, the older ones higher: the baseline takes the
    # oldest 500 positive ones.
    _store(always, {WAITING: [(s, 1.0 + s % 3) for s in range(0, 1800, 2)] + [(1802, 1.0)],
                    DECODE: [(s / 2, s % 11 + (100.0 if s >= 600 else 0.0))
                             for s in range(0, 1200)]})
    _engine(node, "silent")  # no samples at all
    unknown = _engine(node, "unknown")  # figures read as unknown only, and older ones
    _store(unknown, {WAITING: [(0, None), (5, None), (1900, 9.0)],
                     DECODE: [(0, None), (3, None), (700, 40.0)]})
    return list(Engine.objects.filter(node=node).order_by("name"))


def test_waiting_is_what_every_row_said(node, engines):
    alone = queue_backlog._seconds_waiting(engines, T0)
    with one_read(engines):
        together = queue_backlog._seconds_waiting(engines, T0)

    expected = {engine.pk: _waited_by_every_row(engine, T0) for engine in engines}
    assert alone == together == expected
    by_name = {engine.name: expected[engine.pk] for engine in engines}
    assert by_name == {"idle": 0.0, "queued": pytest.approx(95.0),
                       "always": pytest.approx(798.0), "silent": None, "unknown": None}


def test_decode_peak_and_baseline_are_what_every_row_said(node, engines):
    for seconds in (10.0, 45.0, 900.0):
        expected = {engine.pk: _decode_by_every_row(engine, T0, seconds) for engine in engines}
        alone = {engine.pk: (prefill_stall._recent_decode_peak(engine, T0, seconds),
                             prefill_stall._decode_baseline(engine, T0)) for engine in engines}
        with one_read(engines):
            together = {engine.pk: (prefill_stall._recent_decode_peak(engine, T0, seconds),
                                    prefill_stall._decode_baseline(engine, T0))
                        for engine in engines}
        assert alone == together == expected, seconds
    by_name = {engine.name: _decode_by_every_row(engine, T0, 10.0) for engine in engines}
    assert by_name["queued"] == (0.0, 12.5)  # only zeros lately: a peak of 0, not unknown
    assert by_name["always"][1] > 100  # the oldest 500
    assert by_name["silent"] == by_name["unknown"] == (None, None)


def test_the_rules_conditions_are_the_same_in_a_round_and_alone(node, engines):
    def judged() -> list[tuple]:
        return [(c.rule, c.engine_id, c.value, c.summary, c.details)
                for rule, name in ((queue_backlog, "queue-backlog"),
                                   (prefill_stall, "prefill-stall"))
                for c in rule.evaluate(node, {}, engines,
                                       dict(rule_settings(name).thresholds), T0)]

    alone = judged()
    with one_read(engines):
        together = judged()
    assert together == alone
    waits = {c[1]: c[2] for c in alone if c[0] == "queue-backlog"}
    assert waits == {engine.pk: _waited_by_every_row(engine, T0) for engine in engines}


def test_an_empty_queue_reads_no_rows_with_their_times(node, engines):
    idle = [engine for engine in engines if engine.name in ("idle", "silent")]
    with CaptureQueriesContext(connection) as captured, one_read(idle):
        queue_backlog._seconds_waiting(idle, T0)
    assert len(captured.captured_queries) == 1
    assert '"at"' not in captured.captured_queries[0]["sql"].split(" FROM ")[0]


def _restart(node, engine: Engine, minutes: float) -> Restart:
    at = T0 - timedelta(minutes=minutes)
    return Restart.objects.create(node=node, engine=engine, kind="unplanned", status="detected",
                                  requested_at=at, started_at=at, reason="container exited")


def test_judged_restarts_come_with_their_engines_also_one_no_longer_present(node):
    here = _engine(node, "gemma")
    gone = _engine(node, "nemotron", present=False)
    for engine, minutes in ((here, 3), (gone, 2), (here, 1)):
        _restart(node, engine, minutes)
    round_engines = list(Engine.objects.filter(node=node, present=True))

    with CaptureQueriesContext(connection) as captured, restarts_once(round_engines):
        judged = judged_restarts(node, lambda restart: True)
        again = judged_restarts(node, lambda restart: restart.engine_id == here.pk)

    assert [restart.engine.name for restart in judged] == ["gemma", "nemotron", "gemma"]
    assert [restart.engine.name for restart in again] == ["gemma", "gemma"]
    assert len(captured.captured_queries) == 2  # the restarts, the engine no longer present
    Restart.objects.filter(engine=gone).delete()
    with CaptureQueriesContext(connection) as only_present, restarts_once(round_engines):
        assert [r.engine.name for r in judged_restarts(node, lambda r: True)] == ["gemma"] * 2
    assert len(only_present.captured_queries) == 1


def test_restart_alerts_name_the_engines_as_before(node):
    here = _engine(node, "gemma")
    gone = _engine(node, "nemotron", present=False)
    _restart(node, here, 3)
    _restart(node, gone, 2)
    summaries = {c.summary for c in evaluate_rules(node, T0).conditions
                 if c.rule == "unplanned-restart"}
    assert summaries == {
        f"gemma: unplanned restart detected at {T0 - timedelta(minutes=3):%Y-%m-%d %H:%M:%S} "
        "UTC: container exited",
        f"nemotron: unplanned restart detected at {T0 - timedelta(minutes=2):%Y-%m-%d %H:%M:%S}"
        " UTC: container exited"}


def test_a_settled_start_of_an_engine_gone_is_named(node):
    here = _engine(node, "gemma")
    gone = _engine(node, "nemotron", present=False)
    for engine, finished in ((here, 5), (gone, 1)):
        EngineStart.objects.create(
            engine=engine, node=node, identity=f"{engine.name}-start",
            container_started_at=T0 - timedelta(minutes=20), seen_at=T0 - timedelta(minutes=20),
            predicted={"held": {"value": 10 * 2**30, "confidence": "high"}},
            outcome=EngineStart.Outcome.READY, finished_at=T0 - timedelta(minutes=finished))

    loading, settled = predicted_squeeze._starts(node, T0, {here.pk: here})

    assert loading == [] and settled is not None
    assert settled.engine.name == "nemotron"
    conditions = predicted_squeeze.evaluate(node, {}, [here], {"hysteresis_gib": 0.5}, T0)
    assert {c.details["starting_engine"] for c in conditions} == {"nemotron"}


def test_a_quiet_round_reads_no_silences_and_a_moving_one_does(node):
    idle = _engine(node, "idle")
    _store(idle, {WAITING: [(0, 0.0)], DECODE: [(s, 20.0) for s in range(0, 60, 5)]})

    def silence_reads(now: datetime) -> int:
        with CaptureQueriesContext(connection) as captured:
            run_alerts(node, now)
        return sum('"dashboard_silence"' in q["sql"] for q in captured.captured_queries)

    assert silence_reads(T0) == 0
    _store(idle, {WAITING: [(-5 - s, 3.0) for s in range(0, 60, 5)]})  # a queue after T0
    assert silence_reads(T0 + timedelta(seconds=65)) == 0  # pending: no notice to mute yet
    assert silence_reads(T0 + timedelta(seconds=100)) == 1  # firing
    assert Alert.objects.get(rule="queue-backlog").state == "firing"


def test_a_quiet_round_compiles_none_of_its_reads_again(node, engines, monkeypatch):
    """After a first round, every read of a quiet round runs from SQL kept for it
    (``sparkops.prepared``): the ORM compiles none (compiling was 5 of a round's 12 ms at four
    engines). Its conditions are those of the first round."""
    from django.db.models.sql.compiler import SQLCompiler

    from dashboard.alerting.tasks import evaluate_alerts

    node.ledger = {"mem_total": 128 << 30, "mem_available": 100 << 30, "engines": []}
    node.save(update_fields=["ledger"])
    first = evaluate_rules(node, T0)
    evaluate_alerts(node.name)
    compiled = []
    plain = SQLCompiler.as_sql

    def counted(self, *args, **kwargs):
        sql, params = plain(self, *args, **kwargs)
        compiled.append(sql)
        return sql, params

    monkeypatch.setattr(SQLCompiler, "as_sql", counted)
    with CaptureQueriesContext(connection) as captured:
        again = evaluate_rules(node, T0)
        evaluate_alerts(node.name)
    assert [(c.rule, c.engine_id, c.value) for c in again.conditions] == \
        [(c.rule, c.engine_id, c.value) for c in first.conditions]
    selects = [q["sql"] for q in captured.captured_queries if q["sql"].startswith("SELECT")]
    assert len(selects) >= 10
    assert [sql for sql in compiled if sql.startswith("SELECT")] == []
