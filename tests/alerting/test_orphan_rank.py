"""The orphan-rank rule over engine rows on two nodes: a head on spark-a, its rank on spark-b.

Each row's span is what collection stores for the command line (``collectors.spanning``); the
rank's memory is its node's ledger share, as collection writes it.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from collectors.models import Engine, Event, Node
from collectors.spanning import span_of
from collectors.vllm.flags import parse_command_line
from dashboard.alerting import lifecycle
from dashboard.alerting.models import Alert
from dashboard.alerting.rules import RULES, engine_down, orphan_rank
from dashboard.restarts.models import Restart
from sparkops.units import GIB
from tests.alerting.helpers import T0, at

pytestmark = pytest.mark.django_db

DEFAULTS = {spec.key: spec.default for spec in orphan_rank.RULE.thresholds}
# vLLM 0.33.0, docs/serving/parallelism_scaling.md:145-159, on two GB10s.
HEAD = ("vllm serve nvidia/Gemma-4-26B-A4B-NVFP4 --tensor-parallel-size 2 --nnodes 2 "
        "--node-rank 0 --master-addr 10.0.0.1")
RANK = HEAD.replace("--node-rank 0", "--node-rank 1") + " --headless"
HELD = int(38.2 * GIB)


def _row(node: Node, name: str, command: str, **fields) -> Engine:
    config = parse_command_line(command).as_dict()
    span = span_of("vllm", config, [command], {}, {})
    values = {"container_id": f"{name}-id", "container_state": "running", "phase": "ready",
              "config": config, "span_key": span.key, "span": span.as_dict(),
              "last_seen": T0, **fields}
    return Engine.objects.create(node=node, name=name, **values)


def _held_in_ledger(node: Node, engine: Engine, held: int) -> None:
    node.ledger = {"engines": [{"engine_id": engine.pk, "name": engine.name, "actual": held,
                                "reserved": held - GIB}]}
    node.save(update_fields=["ledger"])


@pytest.fixture
def nodes():
    return Node.objects.create(name="spark-a"), Node.objects.create(name="spark-b")


def _evaluate(node: Node, now=T0, **thresholds):
    engines = list(Engine.objects.filter(node=node, present=True))
    node.refresh_from_db()
    return orphan_rank.evaluate(node, node.ledger or {}, engines, {**DEFAULTS, **thresholds},
                                now)


def _stop(engine: Engine, when) -> None:
    engine.container_state, engine.exit_code, engine.phase = "exited", 0, "stopped"
    engine.save()
    Event.objects.create(node=engine.node, engine=engine, at=when, kind="engine-exited",
                         severity="warning", message=f"Engine {engine.name} stopped")


def test_head_stopped_while_the_rank_holds_memory_is_one_alert_naming_node_and_amount(
        nodes, monkeypatch):
    node_a, node_b = nodes
    head = _row(node_a, "gemma-tp2", HEAD)
    rank = _row(node_b, "gemma-tp2-rank1", RANK, memory_usage_bytes=512 * 1024**2)
    _held_in_ledger(node_b, rank, HELD)
    _stop(head, T0 - timedelta(minutes=4))

    [condition] = _evaluate(node_b)

    assert condition.crosses_threshold()
    assert condition.value == pytest.approx(38.2, abs=0.01)
    assert condition.summary.startswith(
        "rank 1 of gemma-tp2 on spark-b still holds 38.2 GiB; its head on spark-a stopped "
        "(container exited) 4 min ago (2026-03-02 08:56:00 UTC)")
    assert condition.details["head_node"] == "spark-a"

    # Through the alert lifecycle, as once the rule is listed in RULES: one alert, firing once
    # the condition held for the rule's for_seconds.
    monkeypatch.setitem(RULES, orphan_rank.RULE.name, orphan_rank.RULE)
    lifecycle.evaluate(node_b, _evaluate(node_b, T0), T0)
    later = at(orphan_rank.RULE.for_seconds + 1)
    lifecycle.evaluate(node_b, _evaluate(node_b, later), later)
    [alert] = Alert.objects.filter(rule="orphan-rank")
    assert alert.state == "firing" and alert.node == node_b and alert.engine == rank
    assert "spark-b" in alert.summary and "38.2 GiB" in alert.summary
    # The head's own node has nothing to say: a stopped head is engine-down's.
    assert [c.crosses_threshold() for c in _evaluate(node_a)] == [False]


def test_head_and_rank_both_running_is_no_alert(nodes):
    node_a, node_b = nodes
    head = _row(node_a, "gemma-tp2", HEAD)
    rank = _row(node_b, "gemma-tp2-rank1", RANK)
    _held_in_ledger(node_a, head, HELD)
    _held_in_ledger(node_b, rank, HELD)

    conditions = [*_evaluate(node_a), *_evaluate(node_b)]

    assert [c.value for c in conditions] == [0.0, 0.0]
    assert conditions[0].summary == "gemma-tp2 on spark-a runs with all 2 ranks"
    assert "its head on spark-a runs" in conditions[1].summary


def test_head_and_rank_both_stopped_is_no_alert(nodes):
    node_a, node_b = nodes
    head = _row(node_a, "gemma-tp2", HEAD)
    rank = _row(node_b, "gemma-tp2-rank1", RANK)
    _held_in_ledger(node_b, rank, HELD)  # the last ledger before its stop
    _stop(head, T0 - timedelta(minutes=6))
    _stop(rank, T0 - timedelta(minutes=5))

    conditions = [*_evaluate(node_a), *_evaluate(node_b)]

    assert [c.value for c in conditions] == [0.0, 0.0]
    assert "holds nothing (container exited)" in conditions[1].summary


def test_head_running_without_its_rank_names_the_rank_its_node_and_what_the_head_pins(nodes):
    node_a, node_b = nodes
    head = _row(node_a, "gemma-tp2", HEAD)
    rank = _row(node_b, "gemma-tp2-rank1", RANK)
    _held_in_ledger(node_a, head, HELD)
    rank.container_state, rank.exit_code = "exited", 137
    rank.save()

    [condition] = _evaluate(node_a)

    assert condition.crosses_threshold()
    assert condition.summary == (
        "gemma-tp2 on spark-a runs without rank 1 of 2 (rank 1 on spark-b: container exited, "
        "exit code 137); it holds 38.2 GiB it cannot serve with")
    assert condition.details["missing_ranks"] == [1]


def test_rank_whose_container_is_gone_counts_as_missing(nodes):
    node_a, node_b = nodes
    head = _row(node_a, "gemma-tp2", HEAD)
    _row(node_b, "gemma-tp2-rank1", RANK, present=False, phase="gone")
    _held_in_ledger(node_a, head, HELD)

    [condition] = _evaluate(node_a)

    assert condition.crosses_threshold()
    assert "rank 1 on spark-b: container gone" in condition.summary


def test_a_rank_below_the_floor_is_not_named(nodes):
    node_a, node_b = nodes
    head = _row(node_a, "gemma-tp2", HEAD)
    rank = _row(node_b, "gemma-tp2-rank1", RANK)
    _held_in_ledger(node_b, rank, 300 * 1024**2)
    _stop(head, T0 - timedelta(minutes=1))

    [condition] = _evaluate(node_b)

    assert condition.value == pytest.approx(0.29, abs=0.01)
    assert not condition.crosses_threshold()


def test_a_planned_restart_of_the_span_is_not_judged(nodes):
    node_a, node_b = nodes
    head = _row(node_a, "gemma-tp2", HEAD)
    rank = _row(node_b, "gemma-tp2-rank1", RANK)
    _held_in_ledger(node_b, rank, HELD)
    _stop(head, T0 - timedelta(minutes=1))
    Restart.objects.create(node=node_a, engine=head, kind="planned", status="running",
                           requested_at=T0 - timedelta(minutes=2),
                           deadline=T0 + timedelta(minutes=20))

    [condition] = _evaluate(node_b)

    assert condition.value is None
    assert "planned restart" in condition.summary
    # Past its deadline the restart no longer covers it.
    [late] = _evaluate(node_b, T0 + timedelta(minutes=21))
    assert late.crosses_threshold()


def test_a_head_never_seen_is_unknown_not_an_alert(nodes):
    _, node_b = nodes
    rank = _row(node_b, "gemma-tp2-rank1", RANK)
    _held_in_ledger(node_b, rank, HELD)

    [condition] = _evaluate(node_b)

    assert condition.value is None
    assert "no head of it was ever seen on a node SparkOps watches" in condition.summary


def test_ray_workers_fill_the_ranks_their_head_expects(nodes):
    node_a, node_b = nodes
    head_cmd = ["bash", "-c", "ray start --head --node-ip-address=10.0.0.1 && vllm serve m "
                "--tensor-parallel-size 2 --distributed-executor-backend ray"]
    worker_cmd = ["bash", "-c", "ray start --block --address=10.0.0.1:6379"]
    head_span = span_of("vllm", parse_command_line(head_cmd).as_dict(), head_cmd, {}, {})
    worker_span = span_of("vllm", None, worker_cmd, {}, {})
    head = Engine.objects.create(node=node_a, name="ray-head", container_id="h",
                                 container_state="running", span_key=head_span.key,
                                 span=head_span.as_dict(), last_seen=T0)
    worker = Engine.objects.create(node=node_b, name="ray-worker", container_id="w",
                                   container_state="running", span_key=worker_span.key,
                                   span=worker_span.as_dict(), last_seen=T0,
                                   memory_usage_bytes=HELD)
    _held_in_ledger(node_a, head, HELD)

    assert [c.value for c in _evaluate(node_a)] == [0.0]
    worker.container_state = "exited"
    worker.save()
    [condition] = _evaluate(node_a)
    assert condition.crosses_threshold() and "without rank 1 of 2" in condition.summary

    worker.container_state = "running"
    worker.save()
    _stop(head, T0 - timedelta(seconds=40))
    [orphan] = _evaluate(node_b)
    assert orphan.summary.startswith("a Ray worker of ray-head on spark-b still holds 38.2 GiB")
    assert "40 s ago" in orphan.summary


def test_engine_down_judges_a_headless_rank_by_its_container_only(nodes):
    _, node_b = nodes
    rank = _row(node_b, "gemma-tp2-rank1", RANK, phase="kv_allocated")

    assert engine_down.evaluate(node_b, {}, [rank], {}, T0)[0].details["reason"] == ""
    rank.container_state, rank.exit_code = "exited", 1
    assert engine_down.evaluate(node_b, {}, [rank], {}, T0)[0].details["reason"] == \
        "container exited (exit code 1)"
