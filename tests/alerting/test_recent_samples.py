"""One read per evaluation round serves every rule that asks: the engines' recent samples (the
queries do not grow with the engines, and each rule judges as it does on its own) and the rule
settings in force."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from collectors.models import Engine, EngineMetric, EngineReading
from collectors.readings import Sample, engine_readings
from dashboard.alerting.evaluation import evaluate_rules
from dashboard.alerting.models import Alert, RuleSetting
from dashboard.alerting.pipeline import run_alerts
from dashboard.alerting.recent import one_read, peak_value, values_since
from dashboard.alerting.rules import prefill_stall, queue_backlog
from dashboard.alerting.settings import rule_settings

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 11, 30, 14, 0, tzinfo=UTC)


def _busy_engine(node, name: str, decode: float) -> Engine:
    """A ready engine prefilling now, with 10 min of decode samples and a queue since 20 s."""
    engine = Engine.objects.create(
        node=node, name=name, container_id=name * 8, container_state="running", phase="ready",
        config={"max_num_seqs": 16}, rates={"prefill_tokens_per_s": 900.0})
    EngineReading.objects.bulk_create(engine_readings(
        [(engine, Sample(EngineMetric.DECODE_TPS, T0 - timedelta(seconds=5 * i),
                         decode if i > 2 else 1.0))
         for i in range(130)]
        + [(engine, Sample(EngineMetric.REQUESTS_WAITING, T0 - timedelta(seconds=s), v))
           for s, v in [(0, 4), (5, 3), (10, 2), (20, 1), (25, 0)]]))
    return engine


def _sample_queries(node) -> int:
    with CaptureQueriesContext(connection) as captured:
        evaluate_rules(node, T0)
    table = EngineReading._meta.db_table
    return sum(1 for query in captured.captured_queries if f'FROM "{table}"' in query["sql"])


def test_the_sample_queries_do_not_grow_with_the_engines(node):
    _busy_engine(node, "a", 16.0)
    one = _sample_queries(node)
    for name in "bcdef":
        _busy_engine(node, name, 16.0)

    # Decode rates: the peak and the values; waiting requests: the newest, and the last 30 min
    # of the engines with a queue.
    assert _sample_queries(node) == one == 4


def test_rules_judge_as_they_do_alone(node):
    engines = [_busy_engine(node, "a", 16.0), _busy_engine(node, "b", 32.0)]
    rules = [(prefill_stall, "prefill-stall"), (queue_backlog, "queue-backlog")]

    def judged():
        return [(c.engine_id, c.value, c.summary)
                for rule, name in rules
                for c in rule.evaluate(node, {}, engines, dict(rule_settings(name).thresholds),
                                       T0)]

    alone = judged()
    with one_read(engines):
        together = judged()

    assert together == alone
    assert [value for _, value, _ in alone] == [pytest.approx(1 / 16), pytest.approx(1 / 32),
                                                20.0, 20.0]


def test_each_question_reads_its_own_window(node):
    engine = _busy_engine(node, "a", 16.0)
    with one_read([engine]):
        recent = values_since(engine, EngineMetric.DECODE_TPS, T0 - timedelta(seconds=10))
        older = values_since(engine, EngineMetric.DECODE_TPS, T0 - timedelta(minutes=10))
        peak = peak_value(engine, EngineMetric.DECODE_TPS, T0 - timedelta(seconds=10))
    assert recent == [1.0, 1.0, 1.0] and peak == 1.0
    assert len(older) == 121 and older[-4:] == [16.0, 1.0, 1.0, 1.0]


def _queries_of(table: str, call) -> int:
    with CaptureQueriesContext(connection) as captured:
        call()
    return sum(1 for query in captured.captured_queries if f'FROM "{table}"' in query["sql"])


def test_a_round_reads_the_rule_settings_once_and_the_next_round_anew(node):
    engine = _busy_engine(node, "a", 16.0)
    table = RuleSetting._meta.db_table

    assert _queries_of(table, lambda: run_alerts(node, T0)) == 1
    stall = Alert.objects.get(rule="prefill-stall", engine=engine)
    assert stall.state == "firing"

    RuleSetting.objects.create(rule="prefill-stall", enabled=False)
    run_alerts(node, T0 + timedelta(seconds=5))
    stall.refresh_from_db()
    assert stall.state == "resolved"
