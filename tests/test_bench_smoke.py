"""The benchmark suite itself runs: ``bench/run --smoke`` writes a results file with every
section filled.

The figures of a smoke run mean nothing (one engine, one sample each); what is checked is that
every benchmark's code path ran to the end against the real servers — SparkOps' stack, the
Prometheus trio, real containers, SQLite and PostgreSQL, and a fleet's centre on PostgreSQL and
Redis with two nodes writing into it — and reported a figure. Timing
targets are never asserted here; that is what ``bench/run`` is for.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.conftest import PROJECT, subprocess_env

pytestmark = pytest.mark.slow

# Each section, with a line that only appears when its benchmark measured something.
SECTIONS = {
    "## Headline": r"\| Memory, RSS sum after .* \| \d+ MiB \| \d+ MiB \|",
    "## Machine and versions": r"\| Prometheus \| prometheus, version ",
    "## 1. Footprint": r"\| SparkOps \| \d+ MiB .*\| \d+ MiB",
    "## 2. Collection cost": r"\| 1 \| [\d.]+ ms ",
    "## 3. Alert latency": r"\| SparkOps \(`runstack`\) \| .* \| [\d.]+ s \(n=1\) \|",
    "## 4. Chart latency": r"\| `timeline\.json\?range=30d` \| \d+ ms.* \| \d+ ms.* \|",
    "## 5. Storage": r"\| Measured total \| \d+ MiB for [\d.]+ days \| \d+ MiB for",
    "## 6. Fleet": r"\| Fleet view \(`/fleet/`, signed in\): p50 / p95 / worst \| "
                   r"\d+ / \d+ / \d+ ms \(n=\d+\) \|",
    "## 7. Dip capture": r"\| `paced` \| \d+/\d+ \(\d+%\) \| \d+ / \d+ \(\d+\) MiB \|",
}
# Every target of the headline is judged, CPU while monitoring against the trio's included.
JUDGED_TARGETS = (r"\| CPU while monitoring \(% of one core\) \| [\d.]+ % \| [\d.]+ % \| .* \| "
                  r"≤ 2× the trio \| \*\*(met|missed)\*\* \|",
                  r"no worse than the 13\.6 s median recorded before .*: \*\*(met|missed)\*\*")
# The fleet's centre, measured: its CPU share and its memory.
FLEET_CENTRE = (r"\| Central CPU \(web, worker with beat; % of one core\) \| [\d.]+ % .*\n"
                r"\| Central memory: RSS sum; distinct resident pages \| \d+ MiB ")


@pytest.mark.timeout(900)
def test_smoke_run_writes_every_section(tmp_path):
    results = tmp_path / "RESULTS.md"
    run = subprocess.run(
        [str(PROJECT / "bench" / "run"), "--smoke", "--results", str(results),
         "--workdir", str(tmp_path / "work")],
        cwd=PROJECT, env=subprocess_env(), capture_output=True, text=True, timeout=850,
    )
    assert run.returncode == 0, f"{run.stdout[-4000:]}\n{run.stderr[-4000:]}"
    text = results.read_text()
    for heading, measured in SECTIONS.items():
        assert heading in text, f"{heading} missing from the results"
        assert re.search(measured, text), f"{heading}: no figure in\n{text}"
    assert re.search(FLEET_CENTRE, text), f"the fleet's centre unmeasured in\n{text}"
    for judged in JUDGED_TARGETS:
        assert re.search(judged, text), f"not judged: {judged}"
    assert "Not measured" not in text
    assert "FAILED" not in text
