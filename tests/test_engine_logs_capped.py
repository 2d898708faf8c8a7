"""Engine logs read from a real container engine: capped per read, cut per line, continued
from a cursor so that nothing is read twice."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from collectors import docker_api, engines
from collectors.docker_api import LOG_LINE_MAX_BYTES, LOG_READ_MAX_BYTES, cut_mark, read_logs
from collectors.engines import collect_engines
from sparkops.testing.ports import wait_for
from tests.containers import run_container, unique_name

pytestmark = [pytest.mark.slow]

HUGE = 20 * 1024 * 1024
STARTUP_LINES = [
    "INFO 12-01 10:00:00 [api_server.py:1] vLLM API server version 0.11.0",
    "INFO 12-01 10:00:01 [gpu_model_runner.py:1] Model loading took 16.00 GiB and 3.2 seconds",
    "INFO 12-01 10:00:02 [gpu_worker.py:1] Available KV cache memory: 20.00 GiB",
    "INFO 12-01 10:00:03 [launcher.py:1] Application startup complete.",
]
# 20 MB without a newline, then the normal startup lines; then the engine stays up, quiet. Once
# everything is written to its output, a file in /written says so.
SCRIPT = ("import pathlib, sys, time\n"
          f"sys.stdout.write('x' * {HUGE}); sys.stdout.flush()\n"
          "sys.stdout.write('\\n' + '\\n'.join({lines!r}) + '\\n'); sys.stdout.flush()\n"
          "pathlib.Path('/written/done').touch()\n"
          "time.sleep(600)\n").format(lines=STARTUP_LINES)


@pytest.fixture
def api(docker_host):
    client = docker_api.client(docker_host)
    yield client
    client.close()


def _read_until_settled(api, cid, timeout=60.0):
    """Every read from the start until one is not capped and holds the last startup line."""
    reads, cursor = [], None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        read = read_logs(api, cid, cursor=cursor)
        reads.append(read)
        cursor = read.cursor or cursor
        if not read.capped and any(STARTUP_LINES[-1] in r.text for r in reads):
            return reads, cursor
    raise AssertionError(f"log not read through within {timeout} s: {reads[-1:]}")


def test_a_huge_line_is_capped_cut_and_the_later_lines_read_once(api, tmp_path):
    cid = run_container(unique_name("hugeline"), ["python3", "-c", SCRIPT],
                        labels={"sparkops.engine": "vllm"}, volumes=[f"{tmp_path}:/written"])
    # A read made while the huge line was still being written would end at its unfinished end,
    # shorter than the line cap, with nothing to cut: read once all of it is logged. The log is
    # not asked before the container has written everything: asked for its last line while
    # only pieces of the huge line were logged, the engine reads back through all of them.
    wait_for((tmp_path / "done").exists, 60, "the container's output written")
    wait_for(lambda: STARTUP_LINES[-1] in api.containers.get(cid).logs(tail=1).decode(
        errors="replace"), 60, "the container's startup lines after its huge line")

    reads, cursor = _read_until_settled(api, cid)

    # No read took in more than its cap, nor kept more than the cap plus the cut marks.
    assert all(read.bytes_read <= LOG_READ_MAX_BYTES for read in reads)
    assert all(len(read.text.encode()) <= LOG_READ_MAX_BYTES for read in reads)
    # The huge line alone is more than one read's cap (a read may come before any output).
    assert sum(read.capped for read in reads) >= HUGE // LOG_READ_MAX_BYTES // 2
    kept = [line for read in reads for line in read.text.splitlines()]
    assert all(len(line.encode()) <= LOG_LINE_MAX_BYTES + len(cut_mark(LOG_LINE_MAX_BYTES).encode())
               for line in kept)
    assert kept[0].endswith(cut_mark(LOG_LINE_MAX_BYTES))
    # Each startup line was read exactly once, in order, after the huge line.
    assert [line for line in kept if line.startswith("INFO")] == STARTUP_LINES

    again = read_logs(api, cid, cursor=cursor)
    assert again.text == "" and again.bytes_read == 0 and not again.capped


@pytest.mark.django_db
def test_collection_parses_the_lines_after_a_huge_one_and_does_not_read_them_again(node, api,
                                                                                  tmp_path):
    name = unique_name("hugeline")
    cid = run_container(name, ["python3", "-c", SCRIPT], labels={"sparkops.engine": "vllm"},
                        volumes=[f"{tmp_path}:/written"])

    now = timezone.now()
    deadline = time.monotonic() + 60
    while True:
        found = {e.name: e for e in collect_engines(node, api, now)}.get(name)
        if found is not None and found.startup.get("phase") == "ready":
            break
        assert time.monotonic() < deadline, f"startup not parsed: {found and found.startup}"
        now += timedelta(seconds=5)
    assert found.startup["version"] == "0.11.0" and found.startup["kv_cache_gib"] == 20.0
    lines_read = engines._followed[cid].parser.lines_read

    # Due again (a minute on): the read continues after the last line, nothing is parsed twice.
    found = {e.name: e for e in collect_engines(node, api, now + timedelta(minutes=2))}[name]
    assert engines._followed[cid].parser.lines_read == lines_read
    assert found.startup["startup_count"] == 1 and found.startup["phase"] == "ready"
