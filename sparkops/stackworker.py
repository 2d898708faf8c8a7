"""The Celery app of ``manage.py runstack``'s worker: the project's app, plus beat in a thread.

``celery -A sparkops.stackworker worker --beat-thread`` runs Celery beat's scheduler as a thread
of the worker's main process. Celery's own ``worker --beat`` forks a process for it, a second
copy of Django and the tasks (about 80 MiB resident); beat only reads its schedule, keeps it in
a file and publishes a few messages every 5 s, which a thread does as well. Without
``--beat-thread`` this is the project's app unchanged (``runstack --no-beat``: a fleet runs beat
once, on the central host).

If the beat thread ends while the worker is not shutting down, it stops the worker: whoever
supervises the worker (``runstack``) then sees the stack fail, as it would have seen a separate
beat process exit, instead of a worker that silently receives no more schedule.

On the embedded file-system broker every process uses ``sparkops.fsbroker`` (see the settings):
kombu's own transport lets a reader take a message file before its writer has written it, which
a worker publishing from its own threads (beat, follow-up tasks) hits within a minute.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

from celery import bootsteps
from celery.beat import Service
from click import Option

from sparkops.celery import app

__all__ = ["BeatThread", "app"]

log = logging.getLogger(__name__)
# How long the scheduler sleeps at most between two looks at its schedule, and so how long a
# stop waits for it: short, as Celery's own threaded beat (the schedule's entries are due every
# 5 s or more; a look costs well under a millisecond).
MAX_INTERVAL_SECONDS = 1.0


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
            schedule_filename=parent.schedule_filename, scheduler_cls=parent.scheduler,
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
            log.error("the beat thread stopped while the worker runs; stopping the worker")
            os.kill(os.getpid(), signal.SIGTERM)


app.user_options["worker"].add(Option(
    ["--beat-thread"], is_flag=True, default=False,
    help="Run beat's scheduler as a thread of this worker (runstack on a single node).",
))
app.steps["worker"].add(BeatThread)
