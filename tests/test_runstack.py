"""``manage.py runstack``: its process model, the light supervisor it becomes, the worker's beat
thread and its file-system broker.

The whole stack serving pages and samples is ``tests/test_stack.py``; here each part on its own,
then (slow) the processes that ``runstack`` really leaves running.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from kombu import Connection
from kombu.transport import filesystem, virtual

from collectors.management.commands import runstack
from sparkops import fsbroker, stackworker
from tests.conftest import PROJECT, free_port, subprocess_env, wait_for_port

SUPERVISE = PROJECT / "sparkops" / "supervise.py"


# --- the command lines ----------------------------------------------------------------------------


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_default_stack_is_one_web_process_with_threads_and_one_worker_with_beat():
    commands = runstack.stack_commands(bind="127.0.0.1:9", node="n1")

    assert list(commands) == ["web", "worker"]
    web, worker = commands["web"], commands["worker"]
    assert _option(web, "--workers") == "1" and _option(web, "--threads") == "4"
    assert _option(web, "--worker-class") == "gthread"
    assert _option(worker, "-A") == "sparkops.stackworker"
    assert _option(worker, "--pool") == "threads" and _option(worker, "--concurrency") == "8"
    assert _option(worker, "--queues") == "node.n1,sparkops"
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


def test_supervisor_argv_carries_the_commands_and_their_environment():
    argv = runstack.supervisor_argv({"a": ["x", "1"]}, {"a": {"K": "v"}})
    assert argv[:3] == [sys.executable, "-P", str(SUPERVISE)]
    assert json.loads(argv[3]) == {"processes": [{"name": "a", "argv": ["x", "1"],
                                                  "env": {"K": "v"}}]}


# --- the supervisor -------------------------------------------------------------------------------


def _spec(**processes: str) -> str:
    return json.dumps({"processes": [
        {"name": name, "argv": [sys.executable, "-c", code], "env": {"SPEC_VALUE": name}}
        for name, code in processes.items()]})


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_supervisor_imports_nothing_but_the_standard_library():
    code = ("import runpy, sys; runpy.run_path(sys.argv[1], run_name='probe'); "
            "print(','.join(sorted(m.split('.')[0] for m in sys.modules)))")
    out = subprocess.run([sys.executable, "-P", "-c", code, str(SUPERVISE)], check=True,
                         capture_output=True, text=True, cwd=PROJECT).stdout
    loaded = set(out.strip().split(","))
    assert not loaded & {"django", "celery", "kombu", "sparkops", "collectors", "dashboard"}


def test_supervisor_stops_the_others_when_one_exits(tmp_path):
    pids = tmp_path / "pids"
    sleeper = (f"import os, time; open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n'); "
               "time.sleep(60)")
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-P", str(SUPERVISE),
         _spec(web=sleeper, worker="import os, time; time.sleep(1); "
                                   "raise SystemExit(3 if os.environ['SPEC_VALUE'] == 'worker' "
                                   "else 0)")],
        capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 1
    assert "worker exited with status 3; stopped the others." in result.stderr
    assert time.monotonic() - started < 15
    assert not _alive(int(pids.read_text().split()[0]))


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
    return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")


@pytest.mark.slow
def test_runstack_leaves_a_light_supervisor_one_web_worker_and_one_celery_worker(tmp_path):
    port = free_port()
    env = subprocess_env(SPARKOPS_DATA_DIR=str(tmp_path / "data"), SPARKOPS_NODE_NAME="rs-test")
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
        assert sum("celery" in line for line in lines.values()) == 1  # beat is a thread in it
        assert len(pids) == 4
        workers = [pid for pid, line in lines.items() if "celery" in line]
        environ = Path(f"/proc/{workers[0]}/environ").read_bytes().split(b"\0")
        assert b"CELERY_SKIP_CHECKS=1" in environ

        stack.send_signal(signal.SIGTERM)
        assert stack.wait(timeout=30) == 0
        assert not any(_alive(pid) for pid in pids[1:])
    finally:
        if stack.poll() is None:
            os.killpg(stack.pid, signal.SIGKILL)
        log.close()
