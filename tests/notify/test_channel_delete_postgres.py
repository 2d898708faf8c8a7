"""Deleting a channel while the alert pipeline queues a notice for it, on PostgreSQL (the
production database): the notice waits for the deletion and is left out, and the pipeline sees
no error (a failed insert would lose every other notice of its evaluation)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sparkops.testing.postgres import fresh_database
from tests.conftest import PROJECT, subprocess_env

pytestmark = pytest.mark.slow


def test_a_notice_queued_during_the_deletion_waits_and_is_left_out(postgres_url, tmp_path):
    env = subprocess_env(DATABASE_URL=fresh_database(postgres_url, "channel_race"),
                         SPARKOPS_DATA_DIR=str(tmp_path / "data"))
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=PROJECT, env=env,
                   check=True, timeout=120)

    run = subprocess.run([sys.executable, "-m", "tests.notify.delete_race_check"], cwd=PROJECT,
                         env=env, capture_output=True, text=True, timeout=120)

    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result == {"rows": 0, "waited": True, "left": 0}
