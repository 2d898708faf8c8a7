"""The Celery app of ``manage.py runstack``'s worker: the project's app, plus beat in a thread.

``celery -A sparkops.stackworker worker --beat-thread`` runs Celery beat's scheduler as a thread
of the worker's main process. Celery's own ``worker --beat`` forks a process for it, a second
copy of Django and the tasks (about 80 MiB resident); beat only reads its schedule, keeps it in
a file and publishes a few messages every 5 s, which a thread does as well. Without
``--beat-thread`` this is the project's app unchanged (``runstack --no-beat``: a fleet runs beat
once, on the central host).

Its scheduler is ``collectors.fleetbeat.FleetScheduler`` (``sparkops.celery.FLEET_SCHEDULER``,
named by path: this package imports none of the apps) unless ``--scheduler`` names another: the
configured schedule plus the collections of every node whose own agent registered it, so that a
fleet's agents, which run no beat, are collected from here.

If the beat thread ends while the worker is not shutting down, it stops the worker
(``stop_failed``): whoever supervises the worker (``runstack``'s supervisor, or the one process's
own, ``sparkops.onestack``, which then exits non-zero) sees the stack fail, as it would have seen
a separate beat process exit, instead of a worker that silently receives no more schedule.

With ``--liveness-file PATH``, the worker's main process touches that file every
``--liveness-interval`` seconds from the worker's timer (``Liveness``): the supervisor of
``runstack`` kills and restarts a worker whose file grows old (the one process's watchdog,
``sparkops.onestack``, exits non-zero), which a stopped (SIGSTOP) or
frozen worker would otherwise never show, since its process stays alive. On the event-loop pools
(prefork with Redis) the timer runs in the main loop itself, so a wedged loop shows as well.

With ``--quiet-tasks`` (what ``runstack`` passes unless ``SPARKOPS_LOG_LEVEL=DEBUG``), Celery's
lines for every task received and succeeded, every beat send and every broker connection are
left out (``QuietTasks``): about ten lines every 5 s that bury what an admin reads the log for.
A task that fails or raises is still logged (Celery writes those as errors), and so is what the
tasks themselves log (failed collections, deliveries).

With ``--fleet-node`` (what a fleet node's agent passes, ``runagent``), the worker shares as
little of the broker with other nodes as kombu lets it (``FleetNode``), so that a node's broker
user can be confined to its own keys (docs/DEPLOY.md, "A fleet"): it neither listens for
Celery's broadcast commands nor keeps a reply queue (nothing of SparkOps sends them; Celery's
fleet-wide ``celery.pidbox`` channel and binding keys stay untouched), and on Redis it keeps
the messages it has taken but not yet acknowledged under keys of its own node
(``unacked.node.<name>``, ``unacked_index.node.<name>``, ``unacked_mutex.node.<name>``)
instead of kombu's ``unacked`` hash shared by every worker of the broker. Only that node's
worker takes messages of its queue, so only it need ever put them back.

On the embedded file-system broker every process uses ``sparkops.fsbroker`` (see the settings):
kombu's own transport lets a reader take a message file before its writer has written it, which
a worker publishing from its own threads (beat, follow-up tasks) hits within a minute.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

from celery import bootsteps
from celery.beat import Service
from click import Option

from sparkops.celery import FLEET_SCHEDULER, app, fleet_node_unacked_keys

__all__ = ["BeatThread", "FleetNode", "Liveness", "QuietTasks", "app", "failures", "run_worker",
           "scheduler_for", "stop_failed"]

log = logging.getLogger(__name__)
# How long the scheduler sleeps at most between two looks at its schedule, and so how long a
# stop waits for it: short, as Celery's own threaded beat (the schedule's entries are due every
# 5 s or more; a look costs well under a millisecond).
MAX_INTERVAL_SECONDS = 1.0
# Celery's own default scheduler: what the worker's ``scheduler`` is unless --scheduler was given.
CELERY_DEFAULT_SCHEDULER = "celery.beat:PersistentScheduler"
# Seconds between two touches of the liveness file, unless --liveness-interval says otherwise.
LIVENESS_INTERVAL_SECONDS = 5.0
# Celery's loggers that write a line per task or per beat send at INFO (their failures are
# warnings or errors), and kombu's, which warns "No hostname was supplied" at every connection to
# a broker without a host (the file-system broker).
PER_TASK_LOGGERS = {
    "celery.worker.strategy": logging.WARNING,  # "Task ... received"
    "celery.app.trace": logging.WARNING,  # "Task ... succeeded in ...", retries
    "celery.beat": logging.WARNING,  # "Scheduler: Sending due task ..."
    "celery.worker.consumer.connection": logging.WARNING,  # "Connected to ..."
    "kombu.connection": logging.ERROR,  # "No hostname was supplied. Reverting to ..."
}


def run_worker(arguments: list[str]) -> int:
    """Run ``celery worker`` in this process with ``arguments`` as ``worker_arguments`` gives
    them (``[--quiet] worker ...``, without ``-A``: the app is this module's); its exit status.

    Celery's ``app.start`` parses them with its whole command-line group, which imports every
    subcommand; the ``amqp`` shell's brings click_repl and prompt_toolkit, some 150 modules and
    about 7 MiB resident in a worker that never opens a shell. This runs the worker command
    alone, set up as the group sets it up for a worker: the app and ``--quiet`` in the
    command's context, the app's own worker options (``--beat-thread`` and the others below)
    added to the command's.
    """
    from celery.bin.base import CLIContext
    from celery.bin.worker import worker

    quiet = arguments[:1] == ["--quiet"]
    if quiet:
        arguments = arguments[1:]
    if arguments[:1] != ["worker"]:
        raise ValueError(f"not the arguments of a worker: {arguments!r}")
    worker.params.extend(option for option in app.user_options["worker"]
                         if option not in worker.params)
    return worker.main(args=arguments[1:], prog_name="celery worker", standalone_mode=False,
                       obj=CLIContext(app=app, no_color=None, workdir=None, quiet=quiet))


# What stopped the worker from within (a part of it that died), in words; empty when it runs or
# was asked to stop. ``sparkops.onestack`` exits non-zero when it is not empty.
failures: list[str] = []


def stop_failed(reason: str) -> None:
    """Stop the worker because a part of it failed: a warm shutdown, as SIGTERM asks (handled in
    the main thread whichever thread calls this), recorded in ``failures``."""
    log.error("%s; stopping the worker", reason)
    failures.append(reason)
    os.kill(os.getpid(), signal.SIGTERM)


def scheduler_for(parent: Any) -> str:
    """The beat scheduler of the worker ``parent``: the one --scheduler names, else the fleet's
    (``FLEET_SCHEDULER``) in place of Celery's default."""
    chosen = getattr(parent, "scheduler", None)
    if not chosen or chosen == CELERY_DEFAULT_SCHEDULER:
        return FLEET_SCHEDULER
    return chosen


class BeatThread(bootsteps.StartStopStep):
    """Worker bootstep: beat's scheduler in a thread, enabled by ``--beat-thread``."""

    label = "Beat thread"
    conditional = True
    # After the pool: a prefork pool's children are forked before the thread exists.
    requires = ("celery.worker.components:Pool",)

    def __init__(self, parent: Any, beat_thread: bool = False, **kwargs: Any) -> None:
        self.enabled = bool(beat_thread)
        self.service: Service | None = None
        self.thread: threading.Thread | None = None
        self._stopping = threading.Event()
        super().__init__(parent, **kwargs)

    def create(self, parent: Any) -> None:
        self.service = Service(
            parent.app, max_interval=MAX_INTERVAL_SECONDS,
            schedule_filename=parent.schedule_filename, scheduler_cls=scheduler_for(parent),
            remote_control=False,
        )
        self.thread = threading.Thread(target=self._run, name="beat", daemon=True)

    def start(self, parent: Any) -> None:
        if self.thread is not None:
            self.thread.start()

    def stop(self, parent: Any) -> None:
        self._stopping.set()
        if self.service is not None and self.thread is not None and self.thread.is_alive():
            self.service.stop()  # the scheduler notices within its interval and saves the file
            self.thread.join(timeout=MAX_INTERVAL_SECONDS + 5)

    terminate = stop

    def _run(self) -> None:
        assert self.service is not None
        self.service.app.set_current()
        try:
            self.service.start()
        except BaseException:
            log.exception("beat thread failed")
        if not self._stopping.is_set():
            stop_failed("the beat thread stopped while the worker runs")


class Liveness(bootsteps.StartStopStep):
    """Worker bootstep: touch ``--liveness-file`` every ``--liveness-interval`` seconds.

    Enabled by ``--liveness-file``. The file is touched once as the step starts, then from the
    worker's timer. Cost: one ``utime`` call per interval.
    """

    label = "Liveness file"
    conditional = True
    requires = ("celery.worker.components:Timer",)

    def __init__(self, parent: Any, liveness_file: str | None = None,
                 liveness_interval: float | None = None, **kwargs: Any) -> None:
        self.enabled = bool(liveness_file)
        self.path = Path(liveness_file) if liveness_file else None
        self.interval = float(liveness_interval or LIVENESS_INTERVAL_SECONDS)
        self.timer_entry: Any = None
        super().__init__(parent, **kwargs)

    def start(self, parent: Any) -> None:
        self.touch()
        self.timer_entry = parent.timer.call_repeatedly(self.interval, self.touch)

    def stop(self, parent: Any) -> None:
        if self.timer_entry is not None:
            self.timer_entry.cancel()
            self.timer_entry = None

    terminate = stop

    def touch(self) -> None:
        assert self.path is not None
        try:
            self.path.touch()
        except OSError:
            # A full or read-only disk: the supervisor will see the file age and restart us,
            # which is the right outcome for a worker that cannot write its data directory.
            log.exception("cannot touch the liveness file %s", self.path)


class QuietTasks(bootsteps.Step):
    """Worker bootstep: with ``--quiet-tasks``, no line per task (``PER_TASK_LOGGERS``)."""

    label = "Quiet tasks"
    conditional = True

    def __init__(self, parent: Any, quiet_tasks: bool = False, **kwargs: Any) -> None:
        self.enabled = bool(quiet_tasks)
        if self.enabled:
            # Celery has set up its logging before the steps are built; levels of these named
            # loggers are left alone by it and by Django's LOGGING.
            for name, level in PER_TASK_LOGGERS.items():
                logging.getLogger(name).setLevel(level)
        super().__init__(parent, **kwargs)


class FleetNode(bootsteps.Step):
    """Worker bootstep: with ``--fleet-node``, no remote control (as
    ``worker_enable_remote_control = False``) and, on Redis, the node's own unacknowledged-
    message keys (``fleet_node_unacked_keys``)."""

    label = "Fleet node"
    conditional = True

    def __init__(self, parent: Any, fleet_node: bool = False, **kwargs: Any) -> None:
        self.enabled = bool(fleet_node)
        if self.enabled:
            from django.conf import settings

            # Every step is built before any is created: the consumer and its broker
            # connection, created after this, read these when they are made.
            conf = parent.app.conf
            conf.worker_enable_remote_control = False
            conf.broker_transport_options = {
                **(conf.broker_transport_options or {}),
                **fleet_node_unacked_keys(settings.SPARKOPS_NODE_NAME)}
        super().__init__(parent, **kwargs)


app.user_options["worker"].add(Option(
    ["--fleet-node"], is_flag=True, default=False,
    help="A fleet node's agent: no remote control, and its own keys for unacknowledged "
         "messages on Redis.",
))
app.user_options["worker"].add(Option(
    ["--quiet-tasks"], is_flag=True, default=False,
    help="No log line per task received or succeeded, nor per beat send (failures still are).",
))
app.user_options["worker"].add(Option(
    ["--beat-thread"], is_flag=True, default=False,
    help="Run beat's scheduler as a thread of this worker (runstack on a single node).",
))
app.user_options["worker"].add(Option(
    ["--liveness-file"], default=None,
    help="Touch this file every --liveness-interval seconds (runstack's supervisor watches it).",
))
app.user_options["worker"].add(Option(
    ["--liveness-interval"], type=float, default=LIVENESS_INTERVAL_SECONDS,
    help="Seconds between two touches of --liveness-file.",
))
app.steps["worker"].add(BeatThread)
app.steps["worker"].add(Liveness)
app.steps["worker"].add(QuietTasks)
app.steps["worker"].add(FleetNode)
