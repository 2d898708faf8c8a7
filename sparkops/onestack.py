"""The stack of one node as one process: the web server in a thread of the Celery worker's.

``manage.py runstack`` (``bin/sparkops start``) replaces itself with
``python -m sparkops.onestack OPTIONS -- CELERY-ARGS`` unless ``SPARKOPS_STACK=processes``. One
Django process then holds everything a single node runs:

* **the Celery worker** in the main thread (Celery wants it, for its signal handlers): the same
  worker ``runstack`` runs as a process of its own otherwise (``sparkops.stackworker``, its
  queues, its thread pool, beat as a thread, its liveness file), built by the same
  ``runstack.worker_arguments`` and run by the same ``stackworker.run_worker``;
* **the web server**, waitress (a threaded pure-Python WSGI server, which runs inside a process
  where gunicorn, a pre-fork master, cannot) serving ``sparkops.wsgi:application`` (WhiteNoise
  included) with ``--web-threads`` threads, in a thread of its own (``WebServer``). It starts
  first, so ``/healthz`` answers while the worker still connects to its broker;
* **a watchdog** thread (``Watchdog``), so that the process never hangs silently: its own
  supervisor (systemd's ``Restart=on-failure``, a container's restart policy, or an admin at a
  terminal) restarts it only if it exits non-zero. The process exits 1 when the web server's
  thread ends, when its loop stops turning, when the beat thread ends
  (``stackworker.stop_failed``) or when the worker stops touching its liveness file (the same
  bounds as ``runstack``'s supervisor: ``SPARKOPS_WORKER_LIVENESS_TIMEOUT``, and a longer one
  after the start). It first asks for a warm shutdown; a worker that has not stopped
  ``STOP_GRACE_SECONDS`` later is wedged, and the process ends at once.

SIGTERM or SIGINT (Ctrl-C) is Celery's warm shutdown: the web server stops accepting at once
and finishes the requests it has (``WEB_GRACE_SECONDS``, gunicorn's graceful timeout in the
multi-process stack), the worker finishes its tasks, beat saves its schedule, and the process
exits 0 (a second Ctrl-C is Celery's cold shutdown, and exits 0 as well: it was asked for).

What runs is kept in ``<data dir>/stack-state.json`` (``sparkops.stackstate``), in the format of
``runstack``'s supervisor: the process is its own supervisor, with no processes below it, and the
file says ``"layout": "one-process"``. It is written before the web server starts and removed,
with the liveness file, when the process ends.

Logs as in the multi-process stack: the web server's warnings and errors only, and with
``--access-log`` (``SPARKOPS_LOG_LEVEL=DEBUG``) a line per request (``AccessLog``).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sparkops.stackstate import ONE_PROCESS
from sparkops.supervise import GRACE_SECONDS, StateFile, process_entry

log = logging.getLogger("sparkops.onestack")
# How long one turn of the web server's loop waits for a socket at most (waitress' own default):
# the watchdog counts turns, and a stop is noticed within one.
WEB_LOOP_SECONDS = 1.0
# How long a stopping web server lets the requests it has finish (gunicorn's --graceful-timeout
# in the multi-process stack).
WEB_GRACE_SECONDS = 10.0
# How long a warm shutdown the watchdog asked for may take before the process ends at once
# (runstack's supervisor gives its processes as long).
STOP_GRACE_SECONDS = GRACE_SECONDS


class AccessLog:
    """WSGI middleware: one INFO line per request (``--access-log``), as gunicorn's access log."""

    logger = logging.getLogger("sparkops.access")

    def __init__(self, application: Callable) -> None:
        self.application = application

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        def logged_start_response(status: str, headers: list, *args: Any) -> Callable:
            query = environ.get("QUERY_STRING")
            self.logger.info('%s "%s %s%s %s" %s', environ.get("REMOTE_ADDR", "-"),
                             environ.get("REQUEST_METHOD"), environ.get("PATH_INFO"),
                             f"?{query}" if query else "", environ.get("SERVER_PROTOCOL"),
                             status.split(" ", 1)[0])
            return start_response(status, headers, *args)

        return self.application(environ, logged_start_response)


class WebServer:
    """waitress serving ``application`` on ``bind`` from a thread of its own.

    The listening sockets are opened here (a bind that fails fails the start); ``start`` runs
    waitress' loop in the thread ``web``, one turn at a time, so that ``silent_for`` tells how
    long ago it last turned and ``stop`` is noticed within a turn. A stopping server closes its
    listening sockets, lets the requests it has finish for ``WEB_GRACE_SECONDS`` and then closes
    every connection and its threads.
    """

    def __init__(self, application: Callable, bind: str, threads: int) -> None:
        from waitress import create_server

        # Forwarded headers pass through to Django, as gunicorn passes them: Django alone decides
        # what X-Forwarded-Proto means (SECURE_PROXY_SSL_HEADER, behind a TLS proxy).
        self.server = create_server(application, listen=bind, threads=threads,
                                    clear_untrusted_proxy_headers=False)
        # One listening socket: the server is that socket's dispatcher; several (a host name
        # with more than one address): a MultiSocketServer holding them.
        self.map: dict = self.server.map if hasattr(self.server, "map") else self.server._map
        self.listeners = [dispatcher for dispatcher in self.map.values()
                          if hasattr(dispatcher, "effective_port")]
        self.turned = time.monotonic()
        self._stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="web", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stopping.set()

    def join(self, timeout: float) -> None:
        if self.thread.is_alive():
            self.thread.join(timeout)

    def silent_for(self) -> float:
        """Seconds since the loop last turned."""
        return time.monotonic() - self.turned

    def _turn(self) -> None:
        from waitress import wasyncore

        self.turned = time.monotonic()
        wasyncore.loop(timeout=WEB_LOOP_SECONDS, map=self.map, use_poll=True, count=1)

    def _busy(self) -> bool:
        """Whether a connection still has a request in hand or a response to send."""
        return any(getattr(channel, "requests", None) or getattr(channel, "total_outbufs_len", 0)
                   for channel in list(self.map.values()))

    def _serve(self) -> None:
        from waitress import wasyncore

        try:
            while not self._stopping.is_set():
                self._turn()
            for listener in self.listeners:  # no new connections; the trigger stays
                wasyncore.dispatcher.close(listener)
            deadline = time.monotonic() + WEB_GRACE_SECONDS
            while self._busy() and time.monotonic() < deadline:
                self._turn()
        except Exception:
            log.exception("the web server failed")
        finally:
            self.server.task_dispatcher.shutdown(timeout=WEB_GRACE_SECONDS)
            wasyncore.close_all(self.map)


class Watchdog:
    """The process's own supervision: every ``interval`` seconds, whether the web server's thread
    and loop and the worker still run (see the module's docstring); at the first that does not,
    ``fail`` stops the process with a failure."""

    def __init__(self, web: WebServer, heartbeat: Path, *, timeout: float, startup: float,
                 interval: float) -> None:
        self.web = web
        self.heartbeat = heartbeat
        self.timeout = timeout
        self.startup = startup
        self.interval = interval
        self.started = time.monotonic()
        self._stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="watchdog", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stopping.set()

    def problem(self) -> str | None:
        """What has died or fallen silent, in words; None while everything runs."""
        if not self.web.thread.is_alive():
            return "the web server's thread has ended"
        silent = self.web.silent_for()
        if silent > self.timeout:
            return f"the web server's loop has not turned for {silent:.0f} s"
        try:
            age = time.time() - self.heartbeat.stat().st_mtime
        except FileNotFoundError:
            since_start = time.monotonic() - self.started
            if since_start > self.startup:
                return (f"the worker has not touched its liveness file {self.heartbeat} in the "
                        f"{since_start:.0f} s since it started")
            return None
        if age > self.timeout:
            return f"the worker has not touched its liveness file {self.heartbeat} for {age:.0f} s"
        return None

    def _run(self) -> None:
        while not self._stopping.wait(self.interval):
            problem = self.problem()
            if problem is not None:
                self.fail(problem)
                return

    def fail(self, problem: str) -> None:
        """Ask for a warm shutdown that exits 1; end the process at once if the worker has not
        returned ``STOP_GRACE_SECONDS`` later (its main thread is wedged)."""
        from sparkops.stackworker import stop_failed

        stop_failed(problem)
        if _exited.wait(STOP_GRACE_SECONDS):
            return
        log.error("the worker did not stop within %g s; exiting now", STOP_GRACE_SECONDS)
        on_exit()
        os._exit(1)


# Set by ``main`` once the worker has returned; what the process removes when it ends.
_exited = threading.Event()
_cleanup: list[Callable[[], None]] = []


def on_exit() -> None:
    """Remove what says the stack runs (the state and liveness files): nothing runs any more."""
    while _cleanup:
        _cleanup.pop()()


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sparkops.onestack",
        description="The stack of one node in one process (see the module's docstring).")
    parser.add_argument("--bind", required=True, help="HOST:PORT of the web server")
    parser.add_argument("--web-threads", type=int, default=4)
    parser.add_argument("--access-log", action="store_true", help="a line per request")
    parser.add_argument("--name", default="web, worker", help="what runs, for the state file")
    parser.add_argument("--state-file", type=Path, default=None)
    parser.add_argument("--liveness-file", type=Path, required=True)
    parser.add_argument("--liveness-timeout", type=float, required=True)
    parser.add_argument("--liveness-startup", type=float, required=True)
    parser.add_argument("--watch-interval", type=float, default=5.0)
    parser.add_argument("celery", nargs=argparse.REMAINDER,
                        help="-- and the arguments of `celery worker` (sparkops.stackworker)")
    return parser


def _stop_before_the_worker(_signum: int, _frame: object) -> None:
    raise SystemExit(0)


def _quiet_web_logs(access_log: bool) -> None:
    """waitress' INFO is its start (the summary says it); its queue warns whenever a page asks for
    more files at once than it has threads, which gunicorn does silently."""
    if not access_log:
        logging.getLogger("waitress").setLevel(logging.WARNING)
        logging.getLogger("waitress.queue").setLevel(logging.ERROR)


def main(argv: list[str]) -> int:
    """Run the stack (see the module's docstring); the exit status: 0 when asked to stop, 1 when
    a part failed, else the worker's."""
    options = parser().parse_args(argv)
    # Until Celery installs its own (as the worker starts), a stop request ends the start-up
    # through the cleanup below, rather than killing the process with its files left behind.
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop_signal, _stop_before_the_worker)
    celery_args = options.celery[1:] if options.celery[:1] == ["--"] else options.celery
    # Celery's SIGHUP restart re-runs sys.executable with sys.argv: this module again, by name.
    sys.argv = ["-m", "sparkops.onestack", *argv]
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    options.liveness_file.unlink(missing_ok=True)  # a file of the last run
    state = StateFile(str(options.state_file) if options.state_file else None)
    _cleanup.extend([lambda: options.liveness_file.unlink(missing_ok=True), state.remove])

    from celery.signals import worker_shutting_down

    from sparkops import stackworker
    from sparkops.wsgi import application  # sets Django up

    _quiet_web_logs(options.access_log)
    try:
        web = WebServer(AccessLog(application) if options.access_log else application,
                        options.bind, options.web_threads)
    except OSError as error:
        log.error("the web server cannot listen on %s: %s", options.bind, error)
        on_exit()
        return 1
    state.write_entries(process_entry(options.name, os.getpid(), started_at, 0), [],
                        layout=ONE_PROCESS)
    watchdog = Watchdog(web, options.liveness_file, timeout=options.liveness_timeout,
                        startup=options.liveness_startup, interval=options.watch_interval)
    asked_to_stop = threading.Event()

    def shutting_down(**_kwargs: Any) -> None:
        # Sent from the signal handler, in the main thread, at the first SIGTERM or SIGINT.
        if not stackworker.failures:
            asked_to_stop.set()
        watchdog.stop()
        web.stop()

    worker_shutting_down.connect(shutting_down, weak=False)
    web.start()
    watchdog.start()
    code: int | None = 1
    try:
        code = stackworker.run_worker(celery_args)
    finally:
        watchdog.stop()
        web.stop()
        web.join(WEB_GRACE_SECONDS + WEB_LOOP_SECONDS * 2)
        on_exit()
        _exited.set()
    if stackworker.failures:
        return 1
    if asked_to_stop.is_set():
        return 0
    return code or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
