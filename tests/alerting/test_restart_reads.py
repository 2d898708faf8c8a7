"""One read of the node's restarts per evaluation round serves the four rules that judge them,
and each rule still picks exactly the restarts its own filter named."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from collectors.models import Engine
from dashboard.alerting.evaluation import evaluate_rules
from dashboard.alerting.restart_reads import JUDGED, judged_restarts, one_read
from dashboard.alerting.rules import (
    engine_down,
    memory_not_returned,
    restart_failed,
    unplanned_restart,
)
from dashboard.restarts.fit import MemoryReturn
from dashboard.restarts.models import Restart
from sparkops.units import GIB

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 11, 30, 14, 0, tzinfo=UTC)
RESTART_READS = re.compile(r'^SELECT .* FROM "dashboard_restart"\s')
ENDED = ["succeeded", "failed", "aborted", "interrupted", "refused", "cancelled", "detected"]


def _not_returned(minutes_ago: float) -> dict:
    return {"memory_return": {
        "verdict": "not returned", "stopped_at": (T0 - timedelta(minutes=minutes_ago)).isoformat(),
        "accounts": [MemoryReturn("host", 20 * GIB, 24 * GIB, GIB, best=30 * GIB).as_dict()],
        "engines_held": {}}}


@pytest.fixture
def history(node):
    """Two engines with restarts of every kind and status, some of them judged "not returned";
    a restart of another node that no question about this one may see."""
    engines = [Engine.objects.create(node=node, name=name, container_id=name * 8,
                                     container_state="running", phase="ready")
               for name in ("gemma", "nemotron")]
    minutes = 0
    for engine in engines:
        for status in ENDED:
            for kind in ("planned", "unplanned"):
                minutes += 3
                started = T0 - timedelta(minutes=minutes)
                Restart.objects.create(
                    node=node, engine=engine, kind=kind, status=status, requested_at=started,
                    started_at=started, finished_at=started + timedelta(minutes=1),
                    after=_not_returned(minutes - 1) if status == "succeeded" else {})
    # At most one open plan per engine, and one running per node.
    Restart.objects.create(node=node, engine=engines[0], kind="planned", status="running",
                           requested_at=T0 - timedelta(minutes=1), started_at=T0)
    Restart.objects.create(node=node, engine=engines[1], kind="planned", status="scheduled",
                           requested_at=T0 - timedelta(minutes=2))
    other = type(node).objects.create(name="spark-b", hostname="spark-b")
    stranger = Engine.objects.create(node=other, name="qwen", container_id="q" * 12)
    Restart.objects.create(node=other, engine=stranger, kind="unplanned", status="detected",
                           requested_at=T0)
    return engines


@pytest.mark.parametrize(("which", "as_its_own_query"), [
    (unplanned_restart._unplanned, {"kind": "unplanned"}),
    (restart_failed._planned_and_ended_badly,
     {"kind": "planned", "status__in": ["failed", "interrupted", "aborted"]}),
    (engine_down._planned_and_running, {"kind": "planned", "status": "running"}),
    (memory_not_returned._not_returned, {"after__memory_return__verdict": "not returned"}),
])
def test_each_rule_picks_what_its_own_query_read(node, history, which, as_its_own_query):
    expected = list(Restart.objects.filter(node=node, **as_its_own_query)
                    .order_by("requested_at", "pk"))
    assert expected
    assert judged_restarts(node, which) == expected
    with one_read():
        assert judged_restarts(node, which) == expected


def test_the_shared_read_holds_no_restart_that_no_rule_judges(node, history):
    with one_read():
        judged = set(judged_restarts(node, lambda restart: True))
    picked = {restart for which in (unplanned_restart._unplanned,
                                    restart_failed._planned_and_ended_badly,
                                    engine_down._planned_and_running,
                                    memory_not_returned._not_returned)
              for restart in judged_restarts(node, which)}
    assert judged == picked == set(Restart.objects.filter(JUDGED, node=node))
    assert not Restart.objects.filter(node=node, kind="planned", status="cancelled",
                                      pk__in=[r.pk for r in judged]).exists()


def test_a_round_reads_the_node_s_restarts_once_for_every_rule(node, history):
    with CaptureQueriesContext(connection) as captured:
        round_ = evaluate_rules(node, T0)
    reads = [q["sql"] for q in captured.captured_queries if RESTART_READS.match(q["sql"])]
    assert len(reads) == 1, reads
    judged = {condition.rule for condition in round_.conditions}
    assert {"unplanned-restart", "restart-failed", "memory-not-returned"} <= judged
