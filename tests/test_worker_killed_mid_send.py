"""A Celery worker killed while it sends a webhook loses nothing: a new worker delivers it.

Real processes throughout: the worker is SIGKILLed (as the OOM killer would) while the receiver
holds its request open; the notification's claim goes stale after the lease and the next worker
sends it again with the same ``webhook-id``, so the receiver can drop the duplicate.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkops.testing.ports import wait_for
from sparkops.testing.webhooks import Reply, WebhookReceiver
from tests.conftest import PROJECT, subprocess_env

pytestmark = pytest.mark.slow

SETUP = """
from dashboard.notify.models import Channel
from dashboard.notify.outbox import enqueue
channel = Channel.objects.create(name="chat", kind="webhook", config={"url": "%s"})
enqueue(kind="firing", payload={"type": "alert.firing"}, subject="s", text="t", html="h",
        channels=[channel])
print(channel.secret)
"""


def _manage(env: dict[str, str], *args: str) -> str:
    result = subprocess.run([sys.executable, "manage.py", *args], cwd=PROJECT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _worker(env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "sparkops", "worker",
         "--queues", "sparkops,notify", "--pool", "prefork", "--concurrency", "1",
         "--without-mingle", "--without-gossip", "--loglevel", "INFO"],
        cwd=PROJECT, env=env, stdout=log.open("a"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _kick(env: dict[str, str]) -> None:
    _manage(env, "shell", "-c", "from dashboard.notify.tasks import deliver_notifications; "
                                "deliver_notifications.delay()")


def test_notification_survives_a_worker_killed_mid_send(tmp_path):
    data = tmp_path / "data"
    env = subprocess_env(SPARKOPS_DATA_DIR=str(data), SPARKOPS_NODE_NAME="kill-test",
                         SPARKOPS_WEBHOOK_ALLOWED_NETWORKS="127.0.0.1/32",
                         SPARKOPS_NOTIFY_LEASE_SECONDS="3")
    log = tmp_path / "worker.log"
    with WebhookReceiver(script=[Reply(hang=True)]) as receiver:
        _manage(env, "migrate", "--noinput")
        # The shell prints a banner line first; the secret is the last line.
        receiver.secret = _manage(env, "shell", "-c", SETUP % receiver.url()).split()[-1]

        first = _worker(env, log)
        try:
            _kick(env)
            wait_for(lambda: len(receiver.requests) == 1, 30, "the first send", period=0.2)
            os.killpg(first.pid, signal.SIGKILL)  # mid-send: the receiver never answered
            first.wait(timeout=10)
        finally:
            if first.poll() is None:
                os.killpg(first.pid, signal.SIGKILL)

        delivered_at, claimed_at = _row(data, "delivered_at, claimed_at")
        assert delivered_at is None and claimed_at is not None  # claimed by the dead one, unsent

        second = _worker(env, log)
        try:
            time.sleep(3.5)  # the dead worker's claim goes stale
            _kick(env)
            wait_for(lambda: len(receiver.requests) == 2, 30, "the redelivery", period=0.2)
            wait_for(lambda: _delivered(data), 10, "recording the delivery", period=0.2)
        finally:
            os.killpg(second.pid, signal.SIGTERM)
            second.wait(timeout=20)

    ids = [r.headers["webhook-id"] for r in receiver.requests]
    assert ids[0] == ids[1]  # the same message: a receiver can drop the duplicate
    assert receiver.requests[1].verified
    assert json.loads(receiver.requests[1].body)["type"] == "alert.firing"


def _row(data: Path, columns: str) -> tuple:
    with sqlite3.connect(data / "sparkops.sqlite3") as db:
        return db.execute(f"select {columns} from dashboard_notification").fetchone()


def _delivered(data: Path) -> bool:
    return _row(data, "delivered_at")[0] is not None
