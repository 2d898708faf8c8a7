"""A webhook receiver that hangs cannot starve collection or alert evaluation.

Real processes throughout: the stack's Celery worker (threads pool, the stack's queues, beat in
a thread, as ``runstack`` starts it, with ``--worker-concurrency 4``) and a loopback webhook
receiver that accepts and sleeps. 40 notifications are queued for it. While it hangs, host-memory
collection and alert evaluation must keep their 2 s schedule; once it answers, every queued
notification is delivered, each answered exactly once.

Before delivery had its own bounds, each 5 s beat tick started a delivery run that sent the rows
one after another at 10 s each: by the fourth tick every pool slot waited on the receiver, and
collection and evaluation were discarded as expired for as long as it hung.
"""

from __future__ import annotations

import re
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sparkops.celery import worker_queues
from sparkops.testing.ports import wait_for
from sparkops.testing.webhooks import WebhookReceiver
from tests.conftest import PROJECT, subprocess_env

pytestmark = pytest.mark.slow

INTERVAL = 2.0
HANG = 30.0  # seconds the receiver accepts and sleeps
QUEUED = 40
# A gap between two collections (or evaluations) longer than this is a missed schedule: one
# interval late on top of the interval itself, and a second for a loaded test machine.
MAX_GAP = 2 * INTERVAL + 1.0
NODE = "fault"

SETUP = """
from dashboard.notify.models import Channel
from dashboard.notify.outbox import enqueue
channel = Channel.objects.create(name="hangs", kind="webhook", config={"url": "%s"})
for n in range(%d):
    enqueue(kind="firing", payload={"type": "alert.firing", "n": n}, subject="s", text="t",
            html="", channels=[channel])
print(channel.secret)
"""


def _manage(env: dict[str, str], *args: str) -> str:
    result = subprocess.run([sys.executable, "manage.py", *args], cwd=PROJECT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _worker(env: dict[str, str], data: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "sparkops.stackworker", "worker",
         "--loglevel", "INFO", "--queues", ",".join(worker_queues(NODE)),
         "--hostname", f"{NODE}@%h", "--pool", "threads", "--concurrency", "4",
         "--without-mingle", "--without-gossip",
         "--beat-thread", "--schedule-filename", str(data / "celerybeat-schedule")],
        cwd=PROJECT, env=env, stdout=log.open("a"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _query(data: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(data / "sparkops.sqlite3", timeout=30) as db:
        return db.execute(sql).fetchall()


def _collections(data: Path, since: datetime, until: datetime) -> list[datetime]:
    rows = _query(data, "select at from collectors_collection order by at")
    times = [datetime.fromisoformat(at).replace(tzinfo=None) for (at,) in rows]
    return [t for t in times if since <= t <= until]


_EVALUATED = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): INFO/MainProcess\] "
                        r"Task dashboard\.alerting\.tasks\.evaluate_alerts\[[^\]]+\] succeeded")


def _evaluations(log: Path, since: datetime, until: datetime) -> list[datetime]:
    times = [datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
             for m in map(_EVALUATED.match, log.read_text().splitlines()) if m]
    return [t for t in times if since <= t <= until]


def _largest_gap(times: list[datetime], since: datetime, until: datetime) -> float:
    edges = [since, *times, until]
    return max((b - a).total_seconds() for a, b in zip(edges, edges[1:], strict=False))


def _utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def test_collection_and_evaluation_keep_their_schedule_while_a_receiver_hangs(tmp_path):
    data = tmp_path / "data"
    env = subprocess_env(
        SPARKOPS_DATA_DIR=str(data), SPARKOPS_NODE_NAME=NODE, SPARKOPS_BEAT_NODES=NODE,
        SPARKOPS_COLLECT_INTERVAL=str(INTERVAL), SPARKOPS_DIP_PERIOD="0.25",
        SPARKOPS_WEBHOOK_ALLOWED_NETWORKS="127.0.0.1/32", TZ="UTC",
        DJANGO_SETTINGS_MODULE="tests.notify.fault_settings")
    log = tmp_path / "worker.log"
    with WebhookReceiver() as receiver:
        _manage(env, "migrate", "--noinput")
        receiver.secret = _manage(env, "shell", "-c",
                                  SETUP % (receiver.url(), QUEUED)).split()[-1]
        receiver.hold()
        worker = _worker(env, data, log)
        try:
            wait_for(lambda: _evaluations(log, datetime.min, datetime.max), 60,
                     "the first alert evaluation", period=0.25)
            wait_for(lambda: receiver.requests, 30, "the first send to the hanging receiver",
                     period=0.25)
            hang_started = _utcnow()
            time.sleep(HANG)  # the receiver hangs for this long: the fault under test
            hang_ended = _utcnow()
            receiver.release()
            wait_for(lambda: len(set(receiver.answered)) >= QUEUED, 90,
                     "delivery of the queued notifications", period=0.25)
            wait_for(lambda: not _query(data, "select 1 from dashboard_notification "
                                              "where delivered_at is null"), 30,
                     "recording every delivery", period=0.25)
            time.sleep(3 * INTERVAL)  # room for a duplicate send to show up
        finally:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(timeout=10)

    collected = _collections(data, hang_started, hang_ended)
    evaluated = _evaluations(log, hang_started, hang_ended)
    assert _largest_gap(collected, hang_started, hang_ended) <= MAX_GAP, collected
    assert _largest_gap(evaluated, hang_started, hang_ended) <= MAX_GAP, evaluated

    # Delivered once the receiver answered: each row once (duplicates would be a second 2xx).
    ids = [message_id for (message_id,) in _query(data, "select message_id from "
                                                        "dashboard_notification")]
    assert sorted(receiver.answered) == sorted(ids) and len(ids) >= QUEUED
    # One send in flight to the channel, each held for the webhook's 10 s deadline: the
    # hanging receiver saw a few probes, not a send per queued row.
    assert len(receiver.requests) - len(receiver.answered) <= HANG / 10 + 2
