"""A node's beat: the centre's clock from the database, the node's skew beside it, in one write."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from collectors.heartbeat import beat
from collectors.models import Node

pytestmark = pytest.mark.django_db


@pytest.fixture
def node() -> Node:
    return Node.objects.create(name="beating")


def test_a_beat_stamps_the_database_s_clock_and_the_node_s_skew(node):
    before = timezone.now() - timedelta(milliseconds=1)  # SQLite's clock keeps milliseconds
    beat(node.name, node_clock=timezone.now() + timedelta(seconds=30))
    node.refresh_from_db()
    assert before <= node.heartbeat_at <= timezone.now()
    assert node.clock_skew_seconds == pytest.approx(30, abs=2)


def test_a_beat_is_one_write_of_both_figures(node):
    with CaptureQueriesContext(connection) as queries:
        beat(node.name)
    writes = [query["sql"] for query in queries if query["sql"].startswith("UPDATE")]
    assert len(writes) == 1
    assert "heartbeat_at" in writes[0] and "clock_skew_seconds" in writes[0]


@pytest.mark.django_db(transaction=True)  # each statement commits on its own, as in a worker
def test_a_beat_that_cannot_be_written_leaves_the_last_beat_as_it_was(node):
    """A locked table (SQLite's shared cache answers "database table is locked" at once) fails
    the beat whole: no fresh beat beside an older skew."""
    node.heartbeat_at, node.clock_skew_seconds = timezone.now() - timedelta(minutes=5), 1.5
    node.save()

    def locked(execute, sql, params, many, context):
        if sql.startswith("UPDATE") and "clock_skew_seconds" in sql:
            raise OperationalError("database table is locked: collectors_node")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(locked), pytest.raises(OperationalError):
        beat(node.name, node_clock=timezone.now() + timedelta(seconds=30))
    stored = Node.objects.get(pk=node.pk)
    assert (stored.heartbeat_at, stored.clock_skew_seconds) == (node.heartbeat_at, 1.5)


def test_a_beat_of_an_unknown_node_writes_nothing():
    beat("nobody")
    assert not Node.objects.exists()
