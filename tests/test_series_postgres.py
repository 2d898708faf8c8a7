"""Roll-up tiers and chart reads on PostgreSQL (the production database), in a process of its
own with a fresh database migrated from scratch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sparkops.testing.postgres import fresh_database
from tests.conftest import PROJECT, subprocess_env

pytestmark = pytest.mark.slow


def test_tiers_read_back_the_same_on_postgresql(postgres_url, tmp_path):
    env = subprocess_env(DATABASE_URL=fresh_database(postgres_url, "series"),
                         SPARKOPS_DATA_DIR=str(tmp_path / "data"))
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=PROJECT, env=env,
                   check=True, timeout=120)

    run = subprocess.run([sys.executable, "-m", "tests.series_check"], cwd=PROJECT, env=env,
                         capture_output=True, text=True, timeout=120)

    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["watermark"] == "2026-11-01T02:34:00+00:00"
    # Epoch milliseconds as dashboard.downsample.epoch_ms computes them, in time order.
    assert result["rounding"] is True
    grouped = result["tiers"].pop("grouped")
    tiers = {int(k): v for k, v in result["tiers"].items()}
    # Every source covers the same stretch, keeps the one-sample dip and the highest rate.
    for tier in tiers.values():
        assert tier["first"] == "2026-11-01T00:00:00+00:00"
        assert tier["last"] == "2026-11-01T02:34:55+00:00"
        assert tier["host_min"] == 1.0 and tier["engine_max"] == 6.0
    assert tiers[0]["host_points"] == 12 * 155
    # The tier up to the watermark's bucket, minutes up to the watermark, then raw samples.
    assert tiers[60]["host_points"] == 154 + 12
    assert tiers[600]["host_points"] == 15 + 4 + 12
    assert tiers[3600]["host_points"] == 2 + 34 + 12
    # Ten-minute buckets grouped by the database into half hours, the minutes after them into
    # one more, then the raw samples after the watermark.
    assert grouped == {"host_points": 5 + 1 + 12, "host_min": 1.0,
                       "first": "2026-11-01T00:00:00+00:00",
                       "second": "2026-11-01T00:30:00+00:00"}
