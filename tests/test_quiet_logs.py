"""What an admin reads when SparkOps starts: a summary, then failures and deliveries only; a
malformed setting stops start-up with one line.

In-process: the command lines runstack builds for each log level, the worker's quiet-tasks
step, the summary and its admin-password line (shown while the generated password is still the
admin's). Slow, through ``bin/sparkops start`` as an admin runs it: the first seconds of output
on the defaults (the summary, no line per task or request; ``/readyz`` ready once collected,
``status`` exit 0, a delivery logged, the probes on plain HTTP with ``SPARKOPS_HTTPS=1``), the
same with ``SPARKOPS_LOG_LEVEL=DEBUG`` (the per-task and access lines are back), and a bad value
that fails fast.
"""

from __future__ import annotations

import logging
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests

from collectors.management.commands import runstack
from sparkops import stackworker
from sparkops.startup import generated_password_owner, summary_lines
from sparkops.testing.ports import free_port, wait_for, wait_for_port
from sparkops.testing.webhooks import WebhookReceiver
from sparkops.version import VERSION
from tests.conftest import PROJECT, subprocess_env
from tests.processes import stop_group

NODE = "quiet-test"
# Lines Celery, kombu and gunicorn write per task, per beat send, per connection or per
# request, and the banners a summary replaces.
NOISE = {
    "task received": re.compile(r"Task \S+\[[0-9a-f-]+\] received"),
    "task succeeded": re.compile(r"Task \S+\[[0-9a-f-]+\] succeeded in"),
    "beat send": re.compile(r"Scheduler: Sending due task"),
    "broker connection": re.compile(r"Connected to |No hostname was supplied"),
    "access log": re.compile(r'"(GET|POST) /\S* HTTP/1\.[01]" \d{3}'),
    "celery banner": re.compile(r"\[tasks\]|-------------- \[queues\]|\.> transport:"),
    "gunicorn start-up": re.compile(r"Booting worker with pid|Listening at: "),
    "waitress start-up and queue": re.compile(r"Serving on http|Task queue depth is"),
}


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


# --- the command lines and the worker's step ------------------------------------------------------


def test_by_default_no_process_logs_a_line_per_request_or_per_task():
    commands = runstack.stack_commands(bind="127.0.0.1:9", node="n1", log_level="INFO")
    web, worker = commands["web"], commands["worker"]

    assert "--access-logfile" not in web and _option(web, "--log-level") == "warning"
    assert worker.index("--quiet") < worker.index("worker")  # celery's banner off
    assert "--quiet-tasks" in worker and _option(worker, "--loglevel") == "INFO"


def test_debug_brings_the_access_log_and_the_per_task_lines_back():
    commands = runstack.stack_commands(bind="127.0.0.1:9", node="n1", log_level="DEBUG")
    web, worker = commands["web"], commands["worker"]

    assert _option(web, "--access-logfile") == "-" and _option(web, "--log-level") == "info"
    assert "--quiet" not in worker and "--quiet-tasks" not in worker
    assert _option(worker, "--loglevel") == "DEBUG"


def test_the_one_process_logs_a_line_per_request_only_at_debug():
    quiet = runstack.one_process_command(bind="127.0.0.1:9", node="n1", log_level="INFO")
    debug = runstack.one_process_command(bind="127.0.0.1:9", node="n1", log_level="DEBUG")

    assert "--access-log" not in quiet and "--quiet-tasks" in quiet
    assert quiet.index("--quiet") > quiet.index("--")  # celery's banner off, as in its process
    assert "--access-log" in debug and "--quiet-tasks" not in debug


def test_the_supervisor_is_told_where_to_keep_its_state(settings):
    argv = runstack.supervisor_argv({"a": ["x"]}, state=runstack.state_file())
    assert '"state": "' + str(settings.DATA_DIR / "stack-state.json") + '"' in argv[3]


def test_the_quiet_tasks_step_raises_celerys_per_task_loggers_to_warnings():
    saved = {name: logging.getLogger(name).level for name in stackworker.PER_TASK_LOGGERS}
    try:
        for name in saved:
            logging.getLogger(name).setLevel(logging.NOTSET)
        assert not stackworker.QuietTasks(SimpleNamespace()).enabled
        assert logging.getLogger("celery.app.trace").level == logging.NOTSET

        assert stackworker.QuietTasks(SimpleNamespace(), quiet_tasks=True).enabled
        assert logging.getLogger("celery.app.trace").level == logging.WARNING
        assert logging.getLogger("celery.worker.strategy").level == logging.WARNING
        assert logging.getLogger("celery.beat").level == logging.WARNING
        # Failures still pass: Celery logs them as errors.
        assert logging.getLogger("celery.app.trace").isEnabledFor(logging.ERROR)
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def test_the_log_level_setting_drives_logging_and_4xx_answers_write_no_line():
    from django.conf import settings

    assert settings.LOGGING["root"]["level"] == settings.SPARKOPS_LOG_LEVEL
    assert settings.LOGGING["loggers"]["django.request"]["level"] == "ERROR"


# --- the summary and the admin password line ------------------------------------------------------


@pytest.fixture
def generated_admin(db, settings, tmp_path, django_user_model):
    settings.DATA_DIR = tmp_path
    (tmp_path / "admin-password").write_text("generated-password-1\n")
    return django_user_model.objects.create_superuser("admin", "", "generated-password-1")


def test_the_summary_says_where_the_generated_password_is_while_it_is_the_admins(
        generated_admin, tmp_path, settings):
    settings.SPARKOPS_NODE_NAME = "spark-a"
    lines = summary_lines(bind="127.0.0.1:8470", parts="web, worker with beat")

    assert lines[0] == (f"SparkOps {VERSION} is starting on http://127.0.0.1:8470/ "
                        "(web, worker with beat); Ctrl-C stops it.")
    assert "  node:     spark-a (queue node.spark-a)" in lines
    assert any(line.startswith("  database: ") for line in lines)
    assert any(line.startswith("  broker:   ") for line in lines)
    assert f"  admin:    the password of 'admin' is in {tmp_path / 'admin-password'} " \
           "(until it is changed)" in lines
    assert lines[-1] == ("  probes:   http://127.0.0.1:8470/healthz (alive), "
                         "http://127.0.0.1:8470/readyz (ready)")


def test_once_the_password_is_changed_the_summary_no_longer_points_at_the_file(generated_admin):
    assert generated_password_owner() == "admin"
    generated_admin.set_password("chosen-by-the-admin-9")
    generated_admin.save()

    assert generated_password_owner() is None
    assert not any("admin:" in line for line in summary_lines(bind="h:1", parts="web"))


def test_without_a_generated_password_there_is_no_admin_line(db, settings, tmp_path):
    settings.DATA_DIR = tmp_path
    assert generated_password_owner() is None


# --- the stack, as an admin starts it -------------------------------------------------------------


def _start(tmp_path: Path, **extra: str) -> tuple[subprocess.Popen, int, Path]:
    port = free_port()
    env = subprocess_env(SPARKOPS_DATA_DIR=str(tmp_path / "data"),
                         SPARKOPS_BIND=f"127.0.0.1:{port}", SPARKOPS_NODE_NAME=NODE, **extra)
    env.pop("SPARKOPS_ADMIN_PASSWORD", None)
    log = tmp_path / "stack.log"
    with log.open("w") as output:
        process = subprocess.Popen([str(PROJECT / "bin" / "sparkops"), "start"], env=env,
                                   stdout=output, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    return process, port, log


def _noise(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        for what, pattern in NOISE.items():
            if pattern.search(line):
                found.setdefault(what, []).append(line)
    return found


QUEUE_A_NOTICE = """
from dashboard.notify.models import Channel
from dashboard.notify.outbox import enqueue
channel = Channel.objects.create(name="chat", kind="webhook", config={"url": "%s"})
enqueue(kind="test", payload={"type": "test"}, subject="s", text="t", html="",
        channels=[channel])
"""


@pytest.mark.slow
def test_the_first_twenty_seconds_of_a_start_are_a_summary_and_no_per_task_lines(tmp_path):
    env = subprocess_env(SPARKOPS_DATA_DIR=str(tmp_path / "data"), SPARKOPS_NODE_NAME=NODE)
    with WebhookReceiver() as receiver:
        process, port, log = _start(tmp_path, SPARKOPS_HTTPS="1",
                                    SPARKOPS_WEBHOOK_ALLOWED_NETWORKS="127.0.0.1/32")
        base = f"http://127.0.0.1:{port}"
        try:
            wait_for_port(port, timeout=120)
            started = time.monotonic()
            wait_for(lambda: requests.get(f"{base}/readyz", timeout=10).status_code == 200, 60,
                     "ready once collected")
            # Plain HTTP although SPARKOPS_HTTPS=1: a local probe needs no certificate.
            assert requests.get(f"{base}/healthz", timeout=10).json()["version"] == VERSION
            login = requests.get(f"{base}/login/", timeout=10, allow_redirects=False)
            assert login.status_code == 301
            assert login.headers["Location"].startswith("https://")
            # A 404 (through the TLS proxy's header) is no line either; it was a warning.
            missing = requests.get(f"{base}/nowhere", headers={"X-Forwarded-Proto": "https"},
                                   timeout=10, allow_redirects=False)
            assert missing.status_code == 404
            status = subprocess.run([str(PROJECT / "bin" / "sparkops"), "status"],
                                    cwd=PROJECT, env=env, capture_output=True, text=True,
                                    timeout=120)
            assert status.returncode == 0, status.stdout + status.stderr
            assert "ready:      yes" in status.stdout
            # A delivery is one of the lines an admin reads the log for.
            subprocess.run([sys.executable, "manage.py", "shell", "-c",
                            QUEUE_A_NOTICE % receiver.url()], cwd=PROJECT, env=env,
                           check=True, capture_output=True, timeout=120)
            wait_for(lambda: receiver.requests, 30, "the notice delivered")
            wait_for(lambda: "notifications: {'delivered': 1" in log.read_text(), 15,
                     "the delivery logged")
            time.sleep(max(0.0, 20 - (time.monotonic() - started)))  # collections, beat
        finally:
            stop_group(process)
    text = log.read_text()

    assert _noise(text) == {}
    assert f"SparkOps {VERSION} is starting on http://127.0.0.1:{port}/" in text
    assert f"  node:     {NODE} (queue node.{NODE})" in text
    assert f"  database: SQLite {tmp_path / 'data' / 'sparkops.sqlite3'}" in text
    assert f"  broker:   embedded file-system broker in {tmp_path / 'data' / 'broker'}" in text
    assert f"  admin:    the password of 'admin' is in {tmp_path / 'data' / 'admin-password'}" \
        in text
    assert re.search(rf"INFO/MainProcess\] {NODE}@\S+ ready\.", text)
    after_the_summary = text.split("  probes:   ", 1)[1].splitlines()
    assert len(after_the_summary) < 25, text  # the worker's "ready", a warning or two


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["one-process", "processes"])
def test_debug_shows_every_task_and_request_again(tmp_path, layout):
    process, port, log = _start(tmp_path, SPARKOPS_LOG_LEVEL="DEBUG", SPARKOPS_STACK=layout)
    try:
        wait_for_port(port, timeout=120)
        requests.get(f"http://127.0.0.1:{port}/healthz", timeout=10)
        wait_for(lambda: {"task succeeded", "beat send", "access log"} <= set(
            _noise(log.read_text())), 60, "per-task and access lines")
    finally:
        stop_group(process)
    assert "logs:     DEBUG: every request and every task" in log.read_text()


@pytest.mark.slow
@pytest.mark.parametrize(("variable", "value", "line"), [
    ("SPARKOPS_COLLECT_INTERVAL", "5s", "sparkops: SPARKOPS_COLLECT_INTERVAL='5s': expected a "
                                        "number"),
    ("SPARKOPS_LOG_LEVEL", "loud", "sparkops: SPARKOPS_LOG_LEVEL='loud': expected one of DEBUG, "
                                   "INFO, WARNING, ERROR, CRITICAL"),
    ("DATABASE_URL", "mysql-ish://db/x", "sparkops: DATABASE_URL: Scheme 'mysql-ish://' is "
                                         "unknown."),
])
def test_a_malformed_setting_stops_start_up_with_one_line(tmp_path, variable, value, line):
    process, port, log = _start(tmp_path, **{variable: value})
    try:
        returncode = process.wait(timeout=120)
    finally:
        stop_group(process)
    text = log.read_text()

    assert returncode == 1
    named = [row for row in text.splitlines() if variable in row]
    assert len(named) == 1 and named[0].startswith(line), text
    assert "Traceback" not in text
    assert not (tmp_path / "data" / "sparkops.sqlite3").exists()  # stopped before migrating
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0  # and never served
