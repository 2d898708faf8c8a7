"""Planning a restart of an engine that spans nodes: one restart of its head, a part per rank on
the rank's node; the barriers its runs meet at (dashboard.restarts.groups)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from collectors.models import Engine, Node
from dashboard.audit.models import AuditEntry
from dashboard.restarts.change import FlagChange
from dashboard.restarts.groups import (
    HEAD_ENDED,
    HEAD_STOPPED,
    PARTS_PRECHECKED,
    PARTS_STOPPED,
    Group,
    GroupEnded,
    wait_until,
)
from dashboard.restarts.models import Restart, RestartStep
from dashboard.restarts.planning import PlanRefused, cancel_restart, plan_restart

NOW = datetime(2026, 11, 7, 12, 0, tzinfo=UTC)
KEY = "vllm-mp|10.0.0.1:29501|nvidia/Gemma-4-26B-A4B-NVFP4"


@pytest.fixture
def admin(django_user_model):
    return django_user_model.objects.create_superuser("admin", "", None)


def _part(node: Node, name: str, role: str, rank: int, **fields) -> Engine:
    return Engine.objects.create(
        node=node, name=name, container_id=f"{name}-id", container_state="running",
        managed=True, present=True, span_key=KEY,
        span={"role": role, "rank": rank, "ranks": 3, "local": 1, "backend": "mp",
              "serves_api": role == "head"}, **fields)


@pytest.fixture
def span(node):
    """gemma over three nodes: its head on spark-a, ranks 1 and 2 on spark-b and spark-c."""
    b, c = Node.objects.create(name="spark-b"), Node.objects.create(name="spark-c")
    return (_part(node, "gemma", "head", 0), _part(b, "gemma-r1", "rank", 1),
            _part(c, "gemma-r2", "rank", 2))


def test_a_restart_of_the_head_has_a_part_on_every_ranks_node(span, admin):
    head, rank1, rank2 = span

    restart = plan_restart(head, user=admin, now=NOW)

    parts = list(restart.parts.order_by("node__name"))
    assert [(p.node.name, p.engine.name, p.status) for p in parts] == [
        ("spark-b", "gemma-r1", "scheduled"), ("spark-c", "gemma-r2", "scheduled")]
    assert {p.scheduled_for for p in parts} == {restart.scheduled_for}
    assert {p.expected_back_by for p in parts} == {restart.expected_back_by}
    # One plan, audited once, naming its parts.
    [entry] = AuditEntry.objects.filter(action="plan-restart")
    assert [p["node"] for p in entry.details["parts"]] == ["spark-b", "spark-c"]


def test_a_rank_is_not_restarted_alone_while_its_head_is_present(span, admin):
    head, rank1, _ = span

    with pytest.raises(PlanRefused, match="its head is gemma on spark-a: plan the restart of "
                                          "gemma"):
        plan_restart(rank1, user=admin, now=NOW)

    # An orphan rank (its head gone) may be restarted by itself, to free what it pins.
    Engine.objects.filter(pk=head.pk).update(present=False)
    alone = plan_restart(Engine.objects.get(pk=rank1.pk), user=admin, now=NOW)
    assert alone.part_of is None and not alone.parts.exists()


def test_a_rank_that_cannot_restart_refuses_the_whole_plan(span, admin):
    head, _, rank2 = span
    Engine.objects.filter(pk=rank2.pk).update(managed=False)

    with pytest.raises(PlanRefused, match="its rank gemma-r2 on spark-c is not enabled for "
                                          "management"):
        plan_restart(head, user=admin, now=NOW)
    assert not Restart.objects.exists()

    Engine.objects.filter(pk=rank2.pk).update(managed=True, present=False)
    with pytest.raises(PlanRefused, match="its rank gemma-r2 on spark-c is gone"):
        plan_restart(Engine.objects.get(pk=head.pk), user=admin, now=NOW)


def test_a_change_of_flags_is_not_planned_across_nodes(span, admin):
    with pytest.raises(PlanRefused, match="a change of its flags is not planned here"):
        plan_restart(span[0], user=admin, now=NOW,
                     change=FlagChange(command="vllm serve x", mode="note", margin_bytes=0))
    assert not Restart.objects.exists()


def test_cancelling_the_head_cancels_its_parts_and_a_part_is_not_cancelled_alone(span, admin):
    restart = plan_restart(span[0], user=admin, now=NOW)
    part = restart.parts.first()

    with pytest.raises(PlanRefused, match=f"of restart #{restart.pk} of an engine that spans"):
        cancel_restart(part, admin, now=NOW)
    cancel_restart(restart, admin, now=NOW)

    assert set(Restart.objects.values_list("status", flat=True)) == {"cancelled"}
    assert f"with its head's restart #{restart.pk}" in Restart.objects.get(pk=part.pk).outcome


# --- the barriers --------------------------------------------------------------------------


def _step(restart: Restart, name: str, ok: bool = True) -> None:
    RestartStep.objects.create(restart=restart, step=name, started_at=NOW, finished_at=NOW,
                               ok=ok)


def test_the_head_passes_a_barrier_once_every_part_did_its_step(span, admin):
    head = plan_restart(span[0], user=admin, now=NOW)
    first, second = head.parts.order_by("pk")
    group = Group.of(head)

    assert group.is_head and group.part_ids == (first.pk, second.pk)
    assert Group.of(first).head_id == head.pk and not Group.of(first).is_head
    assert Group.of(Restart.objects.create(node=head.node, engine=Engine.objects.create(
        node=head.node, name="alone"), kind="planned", status="scheduled")) is None

    _step(first, "precheck")
    assert not group.passed(PARTS_PRECHECKED)
    _step(second, "precheck", ok=False)  # a failed step is not passed
    assert not group.passed(PARTS_PRECHECKED)
    _step(second, "precheck")
    assert group.passed(PARTS_PRECHECKED) and not group.passed(PARTS_STOPPED)

    # A part waits for its head's stop, and for its head's end.
    part = Group.of(first)
    assert not part.passed(HEAD_STOPPED)
    _step(head, "stop")
    assert part.passed(HEAD_STOPPED) and not part.passed(HEAD_ENDED)
    Restart.objects.filter(pk=head.pk).update(status="succeeded", outcome="Ready.")
    assert part.passed(HEAD_ENDED)


def test_a_member_that_ends_badly_ends_the_others_at_their_next_read(span, admin):
    head = plan_restart(span[0], user=admin, now=NOW)
    first, second = head.parts.order_by("pk")
    Restart.objects.filter(pk=second.pk).update(
        status="aborted", outcome="Pre-check: gemma-r2 would not fit; nothing was touched.")

    with pytest.raises(GroupEnded, match=r"the restart of the rank gemma-r2 on spark-c "
                                         rf"\(#{second.pk}\) ended aborted: Pre-check"):
        Group.of(head).passed(PARTS_PRECHECKED)
    # The other part hears of it too, whatever it waits for.
    with pytest.raises(GroupEnded, match="gemma-r2 on spark-c"):
        Group.of(first).passed(HEAD_STOPPED)


def test_a_barrier_not_met_in_time_says_whom_it_waited_for(span, admin):
    head = plan_restart(span[0], user=admin, now=NOW)
    clock = [0.0]

    def pause(seconds: float) -> None:
        clock[0] += seconds

    with pytest.raises(TimeoutError, match=r"every rank stopped not within 30 s \(waiting for "
                                           r"gemma-r1 on spark-b .*gemma-r2 on spark-c"):
        wait_until(Group.of(head), PARTS_STOPPED, limit=30, mono=lambda: clock[0], pause=pause,
                   poll=5)
    assert clock[0] == 30


# --- the pages ------------------------------------------------------------------------------


def test_the_pages_show_one_restart_with_its_parts_under_it(span, admin, client):
    from django.urls import reverse

    head = plan_restart(span[0], user=admin, now=NOW)
    first, second = head.parts.order_by("pk")
    client.force_login(admin)

    scheduled = client.get(reverse("dashboard:restart", args=[first.pk])).content.decode()
    assert f'data-part-of="{head.pk}"' in scheduled and "Cancel" not in scheduled

    Restart.objects.filter(pk__in=[head.pk, first.pk, second.pk]).update(
        status="succeeded", finished_at=NOW, outcome="Ready.")
    listed = client.get(reverse("dashboard:restarts")).content.decode()
    assert listed.count(f'data-restart="{head.pk}"') == 1
    assert f'data-restart="{first.pk}"' not in listed
    assert listed.count(f'data-part-of="{head.pk}"') == 2
    detail = client.get(reverse("dashboard:restart", args=[head.pk])).content.decode()
    assert "gemma-r1 on spark-b" in detail and "gemma-r2 on spark-c" in detail
    part = client.get(reverse("dashboard:restart", args=[first.pk])).content.decode()
    assert "not measured for a rank" in part
