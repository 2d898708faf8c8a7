"""Real concurrency on the production database: worker processes racing for the same rows.

SQLite's in-memory test database cannot host this (concurrent writers get "table is locked"
instead of waiting), so the workers are separate processes on a private PostgreSQL server.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter

import psycopg
import pytest

from sparkops.testing.postgres import fresh_database
from tests.conftest import PROJECT, subprocess_env

pytestmark = pytest.mark.slow

ROWS = 60
WORKERS = 4
CHANNELS = 6


def test_worker_processes_send_every_row_exactly_once(postgres_url, tmp_path):
    url = fresh_database(postgres_url, "notify_race")
    env = subprocess_env(DATABASE_URL=url, SPARKOPS_DATA_DIR=str(tmp_path / "data"))
    python = sys.executable

    def run(*args: str) -> None:
        subprocess.run([python, *args], cwd=PROJECT, env=env, check=True, timeout=60)

    # The dashboard app has no migrations yet: sync it after the apps it refers to exist.
    run("manage.py", "migrate", "-v", "0")
    run("manage.py", "migrate", "--run-syncdb", "-v", "0")
    run("-m", "tests.notify.race_worker", "seed", str(ROWS), str(CHANNELS))
    log = tmp_path / "sent.log"
    start = time.time() + 2.0  # every worker has imported Django by then
    workers = [
        subprocess.Popen([python, "-m", "tests.notify.race_worker", "deliver", f"w{index}",
                          str(log), str(start)], cwd=PROJECT, env=env)
        for index in range(WORKERS)
    ]
    assert [worker.wait(timeout=60) for worker in workers] == [0] * WORKERS

    sends = [line.split() for line in log.read_text().splitlines()]
    per_message = Counter(message_id for message_id, _worker in sends)
    assert len(per_message) == ROWS
    assert set(per_message.values()) == {1}, per_message.most_common(3)
    assert len({worker for _message_id, worker in sends}) > 1  # they really raced
    with psycopg.connect(url) as connection:
        delivered, claimed_by = connection.execute(
            "SELECT count(*), count(DISTINCT claimed_by) FROM dashboard_notification "
            "WHERE delivered_at IS NOT NULL").fetchone()
    assert delivered == ROWS and claimed_by > 1
