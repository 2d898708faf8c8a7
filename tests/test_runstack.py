"""``manage.py runstack``: its two layouts (one process, the default, and processes under the
light supervisor it becomes otherwise), the one process's web server and watchdog, the worker's
beat thread and its file-system broker.

The whole stack serving pages and samples is ``tests/test_stack.py``; here each part on its own,
then (slow) the processes that ``runstack`` really leaves running, in each layout.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests
from django.core.management import CommandError, call_command
from kombu import Connection
from kombu.transport import filesystem, virtual

from collectors.management.commands import runstack
from sparkops import fsbroker, onestack, stackworker
from sparkops.stackstate import read_stack_state, running_reason
from sparkops.testing.ports import free_port, wait_for_port
from tests.conftest import PROJECT, subprocess_env

SUPERVISE = PROJECT / "sparkops" / "supervise.py"


# --- the command lines ----------------------------------------------------------------------------


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_the_processes_layout_is_one_web_process_with_threads_and_one_worker_with_beat():
    commands = runstack.stack_commands(bind="127.0.0.1:9", node="n1")

    assert list(commands) == ["web", "worker"]
    web, worker = commands["web"], commands["worker"]
    assert _option(web, "--workers") == "1" and _option(web, "--threads") == "4"
    assert _option(web, "--worker-class") == "gthread"
    assert worker[:4] == [sys.executable, "-m", "sparkops.runworker", "--quiet"]
    assert _option(worker, "--pool") == "threads" and _option(worker, "--concurrency") == "8"
    assert _option(worker, "--queues") == "node.n1,sparkops,notify"
    assert "--beat-thread" in worker and "--beat" not in worker and "-B" not in worker
    assert _option(worker, "--schedule-filename").endswith("celerybeat-schedule")


def test_admins_can_ask_for_more_processes_and_slots():
    commands = runstack.stack_commands(bind="127.0.0.1:9", node="n1", web_workers=3,
                                       web_threads=8, worker_concurrency=12, beat=False)
    assert _option(commands["web"], "--workers") == "3"
    assert _option(commands["web"], "--threads") == "8"
    assert _option(commands["worker"], "--concurrency") == "12"
    assert "--beat-thread" not in commands["worker"]

    prefork = runstack.stack_commands(bind="127.0.0.1:9", node="n1", worker_pool="prefork")
    assert _option(prefork["worker"], "--pool") == "prefork"
    assert _option(prefork["worker"], "--concurrency") == "4"


def test_stack_environment_keeps_an_admins_malloc_setting():
    assert runstack.stack_env({})["worker"] == {"MALLOC_ARENA_MAX": "2",
                                                "CELERY_SKIP_CHECKS": "1"}
    assert runstack.stack_env({"MALLOC_ARENA_MAX": "8"}) == {
        "web": {}, "worker": {"CELERY_SKIP_CHECKS": "1"}}


def test_supervisor_argv_carries_the_commands_their_environment_and_heartbeats():
    argv = runstack.supervisor_argv({"a": ["x", "1"], "b": ["y"]}, {"a": {"K": "v"}},
                                    {"b": {"path": "/d/b.alive", "timeout": 9}})
    assert argv[:3] == [sys.executable, "-P", str(SUPERVISE)]
    assert json.loads(argv[3]) == {"processes": [
        {"name": "a", "argv": ["x", "1"], "env": {"K": "v"}},
        {"name": "b", "argv": ["y"], "env": {}, "heartbeat": {"path": "/d/b.alive",
                                                              "timeout": 9}}]}


def test_the_worker_shows_it_is_alive_in_the_data_directory_and_the_supervisor_watches(settings):
    settings.SPARKOPS_WORKER_LIVENESS_TIMEOUT = 20
    worker = runstack.stack_commands(bind="127.0.0.1:9", node="n1")["worker"]
    heartbeat = runstack.stack_heartbeats()["worker"]

    assert _option(worker, "--liveness-file") == heartbeat["path"]
    assert Path(heartbeat["path"]).parent == settings.DATA_DIR
    assert float(_option(worker, "--liveness-interval")) == 5.0  # 4 chances within 20 s
    assert heartbeat["timeout"] == 20 and heartbeat["startup"] >= 20


def test_each_stack_runs_gunicorn_without_the_per_user_control_socket():
    """gunicorn's control socket defaults to one path per user (~/.gunicorn/gunicorn.ctl), so
    two stacks of one user would share it and one stopping would remove the other's."""
    web = runstack.stack_commands(bind="127.0.0.1:9", node="n1")["web"]
    assert "--no-control-socket" in web
    assert "--control-socket" not in web


# --- the one process -----------------------------------------------------------------------------


def test_the_default_stack_is_one_process_with_the_same_worker_and_waitress(settings):
    settings.SPARKOPS_WORKER_LIVENESS_TIMEOUT = 20
    argv = runstack.one_process_command(bind="127.0.0.1:9", node="n1")
    ours, worker = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    heartbeat = runstack.stack_heartbeats()["worker"]

    assert settings.SPARKOPS_STACK == "one-process"
    assert ours[:3] == [sys.executable, "-m", "sparkops.onestack"]
    assert _option(ours, "--bind") == "127.0.0.1:9" and _option(ours, "--web-threads") == "4"
    # The worker of the processes layout, queues, pool, beat thread and liveness file alike.
    assert worker == runstack.stack_commands(bind="127.0.0.1:9", node="n1")["worker"][3:]
    assert _option(ours, "--liveness-file") == heartbeat["path"]
    assert float(_option(ours, "--liveness-timeout")) == heartbeat["timeout"] == 20
    assert float(_option(ours, "--liveness-startup")) == heartbeat["startup"]
    assert float(_option(ours, "--watch-interval")) == 5.0
    assert _option(ours, "--state-file") == str(settings.DATA_DIR / "stack-state.json")
    assert "--access-log" not in ours
    debug = runstack.one_process_command(bind="127.0.0.1:9", node="n1", log_level="DEBUG")
    assert "--access-log" in debug[:debug.index("--")]
    assert "--beat-thread" not in runstack.one_process_command(bind="h:1", node="n1", beat=False)


def test_the_one_process_runs_the_worker_command_without_celerys_shell(tmp_path):
    # The worker's own options are there (--help lists them and exits 0), and nothing of the
    # command-line group's other subcommands is imported: the amqp shell's prompt_toolkit alone
    # was over a hundred modules.
    code = ("import sys, django; django.setup(); from sparkops import stackworker; "
            "code = stackworker.run_worker(['--quiet', 'worker', '--help']); "
            "shells = sorted({m.split('.')[0] for m in sys.modules} & "
            "{'click_repl', 'prompt_toolkit'} | "
            "{'celery.bin.celery', 'celery.bin.amqp'} & set(sys.modules)); "
            "print('exit', code, 'shells', shells)")
    result = subprocess.run([sys.executable, "-c", code], cwd=PROJECT, capture_output=True,
                            text=True, timeout=120, check=True,
                            env=subprocess_env(SPARKOPS_DATA_DIR=str(tmp_path / "data")))

    assert "--beat-thread" in result.stdout and "--liveness-file" in result.stdout
    assert "--queues" in result.stdout
    assert result.stdout.strip().endswith("exit 0 shells []"), result.stdout[-500:]
    with pytest.raises(ValueError, match="not the arguments of a worker"):
        stackworker.run_worker(["beat"])


@pytest.mark.parametrize("option", [["--web-workers", "2"], ["--worker-pool", "prefork"]])
def test_more_processes_than_one_are_refused_in_one_process(option):
    with pytest.raises(CommandError, match="run them with --stack processes"):
        call_command("runstack", "--stack", "one-process", *option)


def _hello(environ: dict, start_response) -> list[bytes]:
    time.sleep(float(environ.get("QUERY_STRING") or 0))
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"hello"]


def _refused(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


def test_the_web_server_finishes_its_requests_when_it_stops_and_then_listens_no_more():
    port = free_port()
    web = onestack.WebServer(_hello, f"127.0.0.1:{port}", threads=2)
    web.start()
    answers: list[requests.Response] = []
    try:
        assert requests.get(f"http://127.0.0.1:{port}/", timeout=5).text == "hello"
        slow = threading.Thread(target=lambda: answers.append(
            requests.get(f"http://127.0.0.1:{port}/?1.5", timeout=10)))
        slow.start()
        time.sleep(0.5)  # the request is in a thread of the server
        web.stop()
        slow.join(timeout=15)
        web.join(timeout=15)
    finally:
        web.stop()
        web.join(timeout=15)

    assert [answer.text for answer in answers] == ["hello"]
    assert not web.thread.is_alive()
    assert _refused(port)


def test_the_watchdog_names_a_web_server_or_a_worker_that_died_or_fell_silent(tmp_path):
    alive = tmp_path / "worker.alive"
    web = onestack.WebServer(_hello, f"127.0.0.1:{free_port()}", threads=1)
    watchdog = onestack.Watchdog(web, alive, timeout=10, startup=30, interval=1)
    web.start()
    try:
        assert watchdog.problem() is None  # no liveness file yet: within its start-up bound
        watchdog.started -= 31
        assert watchdog.problem() == (f"the worker has not touched its liveness file {alive} "
                                      "in the 31 s since it started")
        alive.touch()
        assert watchdog.problem() is None
        old = time.time() - 12
        os.utime(alive, (old, old))
        assert watchdog.problem() == (f"the worker has not touched its liveness file {alive} "
                                      "for 12 s")
        alive.touch()
    finally:
        web.stop()
        web.join(timeout=15)
    assert watchdog.problem() == "the web server's thread has ended"


# --- the supervisor -------------------------------------------------------------------------------


def _spec(restart: dict | None = None, heartbeats: dict | None = None, **processes: str) -> str:
    spec: dict = {"processes": [
        {"name": name, "argv": [sys.executable, "-c", code], "env": {"SPEC_VALUE": name},
         **({"heartbeat": heartbeats[name]} if name in (heartbeats or {}) else {})}
        for name, code in processes.items()]}
    if restart is not None:
        spec["restart"] = restart
    return json.dumps(spec)


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (or is stopped); a zombie no one has reaped yet counts as gone."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _wait_for(condition, what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {seconds} s"
        time.sleep(0.1)


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def _record_pid(path: Path) -> str:
    return f"import os, time; open({str(path)!r}, 'a').write(f'{{os.getpid()}}\\n'); "


def test_supervisor_imports_nothing_but_the_standard_library():
    code = ("import runpy, sys; runpy.run_path(sys.argv[1], run_name='probe'); "
            "print(','.join(sorted(m.split('.')[0] for m in sys.modules)))")
    out = subprocess.run([sys.executable, "-P", "-c", code, str(SUPERVISE)], check=True,
                         capture_output=True, text=True, cwd=PROJECT).stdout
    loaded = set(out.strip().split(","))
    assert not loaded & {"django", "celery", "kombu", "sparkops", "collectors", "dashboard"}


@pytest.mark.slow
def test_supervisor_restarts_a_part_that_crashes_and_leaves_the_others_running(tmp_path):
    web_pids, worker_pids, log = tmp_path / "web", tmp_path / "worker", tmp_path / "log"
    # The worker crashes on its first two starts, then stays up.
    worker = (_record_pid(worker_pids)
              + f"n = len(open({str(worker_pids)!r}).read().split()); "
              "raise SystemExit(3) if n < 3 else time.sleep(60)")
    with log.open("w") as stderr:
        supervisor = subprocess.Popen(
            [sys.executable, "-P", str(SUPERVISE),
             _spec(restart={"initial": 0.2, "crashes": 10},
                   web=_record_pid(web_pids) + "time.sleep(60)", worker=worker)],
            stderr=stderr)
    try:
        _wait_for(lambda: len(_lines(worker_pids)) == 3, "the worker's third start")
        assert supervisor.poll() is None
        assert len(_lines(web_pids)) == 1  # the web part was never touched
        running = [int(_lines(web_pids)[0]), int(_lines(worker_pids)[2])]
        assert all(_alive(pid) for pid in running)

        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=30) == 0
        assert not any(_alive(pid) for pid in running)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
    # Each consecutive crash waits twice as long as the one before.
    assert log.read_text().splitlines()[:2] == [
        "supervise: worker exited with status 3; restarting it in 0.2 s",
        "supervise: worker exited with status 3; restarting it in 0.4 s",
    ]


def test_restart_delays_double_to_their_maximum_and_reset_after_a_good_run():
    from sparkops.supervise import Child

    policy = {"initial": 1.0, "max": 4.0, "stable": 10.0, "crashes": 100, "window": 300.0}
    child = Child({"name": "worker", "argv": ["true"]}, policy)
    child.process = SimpleNamespace(returncode=1)
    delays = []
    for now in (1.0, 2.0, 3.0, 4.0):
        child.started = now - 0.5  # each run lasted half a second
        assert child.crashed(now)
        delays.append(child.restart_at - now)
    child.started = 10.0
    assert child.crashed(25.0)  # this run lasted 15 s, longer than "stable"

    assert delays == [1.0, 2.0, 4.0, 4.0]
    assert child.restart_at - 25.0 == 1.0


@pytest.mark.slow
def test_supervisor_gives_up_and_stops_all_when_a_part_keeps_crashing(tmp_path):
    web_pids, worker_pids = tmp_path / "web", tmp_path / "worker"
    result = subprocess.run(
        [sys.executable, "-P", str(SUPERVISE),
         _spec(restart={"initial": 0.1, "crashes": 3, "window": 60},
               web=_record_pid(web_pids) + "time.sleep(60)",
               worker=_record_pid(worker_pids) + "raise SystemExit(3)")],
        capture_output=True, text=True, timeout=60,
    )

    assert result.returncode == 1
    assert len(_lines(worker_pids)) == 3  # started, restarted twice, then given up
    assert ("supervise: worker exited with status 3, 3 times within 60 s; stopping the stack"
            in result.stderr)
    assert not _alive(int(_lines(web_pids)[0]))


@pytest.mark.slow
def test_supervisor_kills_and_restarts_a_worker_whose_heartbeat_stops(tmp_path):
    pids, beat, helper = tmp_path / "pids", tmp_path / "alive", tmp_path / "helper"
    # A worker that beats every 0.1 s and has a child process of its own (as a prefork pool).
    worker = (_record_pid(pids)
              + "import pathlib, subprocess, sys; "
              + "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
              + f"open({str(helper)!r}, 'a').write(f'{{c.pid}}\\n')\n"
              + f"while True:\n    pathlib.Path({str(beat)!r}).touch(); time.sleep(0.1)")
    log = tmp_path / "log"
    with log.open("w") as stderr:
        supervisor = subprocess.Popen(
            [sys.executable, "-P", str(SUPERVISE),
             _spec(restart={"initial": 0.1},
                   heartbeats={"worker": {"path": str(beat), "timeout": 1, "startup": 30}},
                   worker=worker)],
            stderr=stderr)
    try:
        _wait_for(lambda: _lines(helper) and beat.exists(), "the worker's first heartbeat")
        first, first_helper = int(_lines(pids)[0]), int(_lines(helper)[0])
        os.kill(first, signal.SIGSTOP)  # alive, but silent

        _wait_for(lambda: len(_lines(pids)) == 2, "a new worker after the silent one")
        assert supervisor.poll() is None
        assert not _alive(first) and not _alive(first_helper)

        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=30) == 0
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
        for pid in map(int, _lines(helper)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert "supervise: worker sent no heartbeat for" in log.read_text()


@pytest.mark.slow
def test_supervisor_stops_everything_on_sigterm(tmp_path):
    ready = tmp_path / "ready"
    code = (f"import os, time; open({str(ready)!r} + os.environ['SPEC_VALUE'], 'w')"
            ".write(str(os.getpid())); time.sleep(60)")
    supervisor = subprocess.Popen([sys.executable, "-P", str(SUPERVISE), _spec(a=code, b=code)])
    try:
        deadline = time.monotonic() + 20
        while not all((tmp_path / f"ready{n}").exists() for n in "ab"):
            assert time.monotonic() < deadline, "the children did not start"
            time.sleep(0.1)
        children = [int((tmp_path / f"ready{n}").read_text()) for n in "ab"]
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=20) == 0
        assert not any(_alive(pid) for pid in children)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()


# --- beat as a thread of the worker ---------------------------------------------------------------


class _FailingService:
    def __init__(self, *args, **kwargs) -> None:
        self.app = SimpleNamespace(set_current=lambda: None)

    def start(self) -> None:
        raise RuntimeError("schedule file unreadable")


def test_a_beat_thread_that_dies_stops_the_worker(monkeypatch, tmp_path):
    kills: list[tuple[int, int]] = []
    monkeypatch.setattr(stackworker, "Service", _FailingService)
    monkeypatch.setattr(stackworker.os, "kill", lambda pid, sig: kills.append((pid, sig)))
    parent = SimpleNamespace(app=stackworker.app, schedule_filename=str(tmp_path / "s"),
                             scheduler=None, steps=[])
    step = stackworker.BeatThread(parent, beat_thread=True)
    step.create(parent)
    step.start(parent)
    step.thread.join(timeout=10)

    assert kills == [(os.getpid(), signal.SIGTERM)]


def test_the_beat_thread_is_off_unless_asked_for():
    parent = SimpleNamespace(app=stackworker.app)
    assert stackworker.BeatThread(parent).enabled is False
    assert stackworker.BeatThread(parent, beat_thread=True).enabled is True
    assert "--beat-thread" in {opt for option in stackworker.app.user_options["worker"]
                               for opt in option.opts}


@pytest.mark.slow
def test_a_beat_thread_stopped_with_the_worker_does_not_stop_it_again(monkeypatch, tmp_path):
    kills: list[tuple[int, int]] = []
    monkeypatch.setattr(stackworker.os, "kill", lambda pid, sig: kills.append((pid, sig)))
    monkeypatch.setitem(stackworker.app.conf, "beat_schedule", {})  # nothing to send
    parent = SimpleNamespace(app=stackworker.app, schedule_filename=str(tmp_path / "schedule"),
                             scheduler="celery.beat:PersistentScheduler", steps=[])
    step = stackworker.BeatThread(parent, beat_thread=True)
    step.create(parent)
    step.start(parent)
    time.sleep(0.5)
    started = time.monotonic()
    step.stop(parent)

    assert not step.thread.is_alive()
    assert time.monotonic() - started < stackworker.MAX_INTERVAL_SECONDS + 1
    assert kills == []
    assert list(tmp_path.glob("schedule*"))  # the schedule was saved on the way out


def test_the_liveness_step_touches_its_file_from_the_workers_timer(tmp_path):
    from celery.utils.timer2 import Timer

    alive = tmp_path / "worker.alive"
    parent = SimpleNamespace(app=stackworker.app, timer=Timer())
    step = stackworker.Liveness(parent, liveness_file=str(alive), liveness_interval=0.1)
    assert stackworker.Liveness(parent).enabled is False
    try:
        step.start(parent)
        assert alive.exists()  # at once, before the first tick
        old = time.time() - 3600
        os.utime(alive, (old, old))
        _wait_for(lambda: alive.stat().st_mtime > old, "a touch from the timer")
        step.stop(parent)
    finally:
        parent.timer.stop()


# --- the file-system broker -----------------------------------------------------------------------


def _connection(folder: Path, transport: str | type) -> Connection:
    return Connection("filesystem://", transport=transport, transport_options={
        "data_folder_in": str(folder), "data_folder_out": str(folder),
        "processed_folder": str(folder / "processed"), "control_folder": str(folder / "control"),
        "store_processed": False,
    })


def test_a_reader_never_sees_a_message_before_it_is_written(monkeypatch, tmp_path):
    """Writers in threads of the reading process (the stack's worker: beat, follow-up tasks) and
    a plain kombu writer in the same race; every message arrives whole, exactly once. (kombu's
    own reader loses some here, and raises JSONDecodeError for them.)"""
    # Bindings live in process-wide state; start from none, as a worker does.
    monkeypatch.setattr(filesystem.Transport, "global_state", virtual.BrokerState())
    per_writer = 150
    writers: list[str | type] = [fsbroker.Transport] * 3 + ["filesystem"]
    expected = {f"w{w}-{i}" for w in range(len(writers)) for i in range(per_writer)}
    received: list[str] = []
    errors: list[BaseException] = []

    def write(index: int, transport: str | type) -> None:
        try:
            with _connection(tmp_path, transport) as connection:
                queue = connection.SimpleQueue("race")
                for i in range(per_writer):
                    queue.put({"id": f"w{index}-{i}", "pad": "x" * 2000})
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    with _connection(tmp_path, fsbroker.Transport) as connection:
        queue = connection.SimpleQueue("race")
        threads = [threading.Thread(target=write, args=(index, transport))
                   for index, transport in enumerate(writers)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 60
        while len(received) < len(expected) and time.monotonic() < deadline:
            try:
                message = queue.get(timeout=0.5)
            except queue.Empty:
                continue
            received.append(message.payload["id"])
            message.ack()
        for thread in threads:
            thread.join()

    assert errors == []
    assert sorted(received) == sorted(expected)


def test_a_message_written_in_the_readers_process_ends_its_wait_between_polls(tmp_path):
    """The reader waits up to its polling interval between two looks at its queues (capped by
    its own timeout, here 20 s); a message written by another thread of its process ends the
    wait at once instead of at the end of it."""
    with (_connection(tmp_path, fsbroker.Transport) as reader,
          _connection(tmp_path, fsbroker.Transport) as writer):
        reader.transport.polling_interval = 60.0
        queue = reader.SimpleQueue("wake")
        with pytest.raises(queue.Empty):
            queue.get(timeout=0.2)  # the queue exists, empty, before the reader waits
        timer = threading.Timer(0.5, lambda: writer.SimpleQueue("wake").put({"id": "woken"}))
        started = time.monotonic()
        timer.start()
        try:
            message = queue.get(timeout=20)
        finally:
            timer.cancel()
        waited = time.monotonic() - started

    assert message.payload == {"id": "woken"}
    assert waited < 10, f"the reader slept {waited:.1f} s: the write did not wake it"


def test_a_message_file_is_private_whatever_the_umask(tmp_path):
    previous = os.umask(0)
    try:
        with _connection(tmp_path, fsbroker.Transport) as connection:
            connection.default_channel._put("q", {"body": "task arguments"})
    finally:
        os.umask(previous)
    (message,) = [p for p in tmp_path.iterdir() if p.name.endswith(".q.msg")]
    assert oct(message.stat().st_mode & 0o777) == "0o600"


def test_a_message_file_being_written_is_left_for_the_next_poll(tmp_path):
    import fcntl

    with _connection(tmp_path, fsbroker.Transport) as connection:
        channel = connection.default_channel
        channel._put("q", {"body": "whole"})
        (complete,) = [p for p in tmp_path.iterdir() if p.name.endswith(".q.msg")]
        empty = tmp_path / "0_early.q.msg"  # a plain writer between creating and writing it
        empty.touch()
        with open(complete, "rb") as held:  # a plain writer in the middle of its write
            fcntl.flock(held.fileno(), fcntl.LOCK_EX)
            with pytest.raises(fsbroker.Empty):
                channel._get("q")
        assert channel._get("q") == {"body": "whole"}
        assert empty.exists()

        old = time.time() - fsbroker.ABANDONED_SECONDS - 1
        os.utime(empty, (old, old))
        with pytest.raises(fsbroker.Empty):
            channel._get("q")
        assert not empty.exists()  # abandoned by its writer: removed


# --- the real thing -------------------------------------------------------------------------------


def _tree(pid: int) -> list[int]:
    children: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError):
            children += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text()
                         .split()]
    return [pid] + [p for child in children for p in _tree(child)]


def _cmdline(pid: int) -> str:
    """The command line of ``pid``; empty once it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except (FileNotFoundError, ProcessLookupError):
        return ""


@pytest.mark.slow
def test_the_processes_layout_leaves_a_light_supervisor_one_web_worker_and_one_celery_worker(
        tmp_path):
    port = free_port()
    home = tmp_path / "home"
    home.mkdir()
    env = subprocess_env(SPARKOPS_DATA_DIR=str(tmp_path / "data"), SPARKOPS_NODE_NAME="rs-test",
                         HOME=str(home), SPARKOPS_WORKER_LIVENESS_TIMEOUT="10",
                         SPARKOPS_STACK="processes")
    env.pop("XDG_RUNTIME_DIR", None)  # gunicorn would put its control socket there instead
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=PROJECT, env=env,
                   check=True, capture_output=True, timeout=120)
    log = (tmp_path / "stack.log").open("w")
    stack = subprocess.Popen([sys.executable, "manage.py", "runstack", "--bind",
                              f"127.0.0.1:{port}"], cwd=PROJECT, env=env, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_port(port, timeout=60)
        deadline = time.monotonic() + 30
        while "ready." not in (tmp_path / "stack.log").read_text():
            assert time.monotonic() < deadline, (tmp_path / "stack.log").read_text()[-3000:]
            time.sleep(0.3)
        pids = _tree(stack.pid)
        lines = {pid: _cmdline(pid) for pid in pids[1:]}  # the supervisor's names them all

        assert str(SUPERVISE) in _cmdline(stack.pid)  # the same pid, now the plain supervisor
        status = Path(f"/proc/{stack.pid}/status").read_text()
        rss_kib = int(status.split("VmRSS:")[1].split()[0])
        assert rss_kib < 30 * 1024  # a bare interpreter; any Django process is above 50 MiB
        assert sum("gunicorn" in line for line in lines.values()) == 2  # master + 1 worker
        assert sum("sparkops.runworker" in line for line in lines.values()) == 1  # beat: a thread
        assert len(pids) == 4
        workers = [pid for pid, line in lines.items() if "sparkops.runworker" in line]
        environ = Path(f"/proc/{workers[0]}/environ").read_bytes().split(b"\0")
        assert b"CELERY_SKIP_CHECKS=1" in environ
        # No control socket shared with the user's other stacks (gunicorn's default path).
        assert not (home / ".gunicorn").exists(), list(home.rglob("*"))

        # A stopped worker is alive but does nothing: the supervisor sees its liveness file
        # age, kills it and starts another, and the stack carries on.
        assert (tmp_path / "data" / "worker.alive").exists()
        os.kill(workers[0], signal.SIGSTOP)

        def new_worker() -> list[int]:
            return [pid for pid in _tree(stack.pid)[1:]
                    if pid != workers[0] and "sparkops.runworker" in _cmdline(pid)]

        _wait_for(new_worker, "a new Celery worker after the stopped one", seconds=90)
        assert not _alive(workers[0])
        assert stack.poll() is None
        assert "worker sent no heartbeat for" in (tmp_path / "stack.log").read_text()

        pids = _tree(stack.pid)
        stack.send_signal(signal.SIGTERM)
        assert stack.wait(timeout=30) == 0
        assert not any(_alive(pid) for pid in pids[1:])
    finally:
        if stack.poll() is None:
            os.killpg(stack.pid, signal.SIGKILL)
        log.close()


def _one_process_stack(tmp_path: Path, node: str) -> tuple[subprocess.Popen, int, Path]:
    port = free_port()
    env = subprocess_env(SPARKOPS_DATA_DIR=str(tmp_path / "data"), SPARKOPS_NODE_NAME=node)
    env.pop("SPARKOPS_STACK", None)  # the default
    env.pop("MALLOC_ARENA_MAX", None)
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=PROJECT, env=env,
                   check=True, capture_output=True, timeout=120)
    log = tmp_path / "stack.log"
    with log.open("w") as output:
        stack = subprocess.Popen([sys.executable, "manage.py", "runstack", "--bind",
                                  f"127.0.0.1:{port}"], cwd=PROJECT, env=env, stdout=output,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    return stack, port, log


def _collections(database: Path, node: str) -> int:
    with contextlib.closing(sqlite3.connect(database)) as connection:
        return connection.execute(
            "select count(*) from collectors_collection c join collectors_node n "
            "on n.id = c.node_id where n.name = ? and c.ok", (node,)).fetchone()[0]


@pytest.mark.slow
@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_the_one_process_stack_serves_collects_and_stops_cleanly(tmp_path, stop_signal):
    data = tmp_path / "data"
    stack, port, log = _one_process_stack(tmp_path, "one-test")
    try:
        wait_for_port(port, timeout=60)
        assert requests.get(f"http://127.0.0.1:{port}/healthz", timeout=10).json()["status"] \
            == "ok"
        _wait_for(lambda: "ready." in log.read_text(), "the worker ready", seconds=60)

        # runstack became the one process (same pid), and it started nothing.
        assert "-m sparkops.onestack" in _cmdline(stack.pid)
        assert _tree(stack.pid) == [stack.pid]
        environ = Path(f"/proc/{stack.pid}/environ").read_bytes().split(b"\0")
        assert b"MALLOC_ARENA_MAX=2" in environ
        state = read_stack_state(data)
        assert state.running and state.layout == "one-process"
        assert state.supervisor.pid == stack.pid and state.processes == ()
        assert running_reason(data, 60).startswith(f"the stack runs (one process, pid {stack.pid}")
        # Beat's schedule, sent by its thread, taken by the worker's: live collections.
        _wait_for(lambda: _collections(data / "sparkops.sqlite3", "one-test") >= 2,
                  "collections sent by beat", seconds=40)
        assert (data / "worker.alive").exists()

        stack.send_signal(stop_signal)
        assert stack.wait(timeout=40) == 0, log.read_text()[-3000:]
    finally:
        if stack.poll() is None:
            os.killpg(stack.pid, signal.SIGKILL)
            stack.wait()
    assert not _alive(stack.pid)
    assert _refused(port)
    assert not (data / "stack-state.json").exists() and not (data / "worker.alive").exists()
    assert "Warm shutdown" in log.read_text()
    assert "Traceback" not in log.read_text()


@pytest.mark.slow
def test_the_one_process_stack_exits_non_zero_when_its_beat_thread_dies(tmp_path):
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    # A schedule beat can neither open nor remove: its thread fails as it starts.
    (data / "celerybeat-schedule.dat").mkdir()
    stack, port, log = _one_process_stack(tmp_path, "one-fail")
    try:
        assert stack.wait(timeout=90) == 1, log.read_text()[-3000:]
    finally:
        if stack.poll() is None:
            os.killpg(stack.pid, signal.SIGKILL)
            stack.wait()
    assert "the beat thread stopped while the worker runs; stopping the worker" in log.read_text()
    assert not (data / "stack-state.json").exists()
    assert _refused(port)


@pytest.mark.slow
def test_the_one_process_stack_exits_non_zero_when_its_address_is_taken(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = subprocess_env(SPARKOPS_DATA_DIR=str(tmp_path / "data"),
                             SPARKOPS_NODE_NAME="one-taken")
        env.pop("SPARKOPS_STACK", None)
        subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=PROJECT,
                       env=env, check=True, capture_output=True, timeout=120)
        stack = subprocess.run([sys.executable, "manage.py", "runstack", "--bind",
                                f"127.0.0.1:{port}"], cwd=PROJECT, env=env, capture_output=True,
                               text=True, timeout=120)

    assert stack.returncode == 1
    assert f"the web server cannot listen on 127.0.0.1:{port}" in stack.stderr
    assert not (tmp_path / "data" / "stack-state.json").exists()
