"""Run the web server, the Celery worker and beat together, and stop them together.

``./sparkops start`` ends here. The web server is gunicorn (a production server, static files
served by WhiteNoise); the worker consumes this node's queue and the central ``sparkops`` queue.
If any of the three exits, the others are stopped and the command exits non-zero, so a
supervisor (systemd, a container) sees the failure instead of a half-running stack.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from django.conf import settings
from django.core.management.base import BaseCommand

from sparkops.celery import node_queue


def stack_commands(*, bind: str, workers: int, node: str) -> dict[str, list[str]]:
    python = sys.executable
    return {
        "web": [
            python, "-m", "gunicorn", "sparkops.wsgi:application", "--bind", bind,
            "--workers", str(workers), "--access-logfile", "-", "--graceful-timeout", "10",
        ],
        "worker": [
            python, "-m", "celery", "-A", "sparkops", "worker", "--loglevel", "INFO",
            "--queues", f"{node_queue(node)},sparkops", "--hostname", f"{node}@%h",
            # A host collection holds a process for its whole interval and a planned restart
            # for its whole runbook (~10 min); four leave room for scrapes, alerts and mail.
            "--concurrency", "4", "--without-mingle", "--without-gossip",
        ],
        "beat": [
            python, "-m", "celery", "-A", "sparkops", "beat", "--loglevel", "INFO",
            "--schedule", settings.CELERY_BEAT_SCHEDULE_FILENAME,
        ],
    }


class Command(BaseCommand):
    help = "Run gunicorn, the Celery worker of this node, and Celery beat, supervised together."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--bind", default=settings.SPARKOPS_BIND)
        parser.add_argument("--web-workers", type=int, default=2)
        parser.add_argument("--no-beat", action="store_true",
                            help="for a fleet: only one node (or the central host) runs beat")

    def handle(self, *args, **options) -> None:
        commands = stack_commands(
            bind=options["bind"], workers=options["web_workers"], node=settings.SPARKOPS_NODE_NAME
        )
        if options["no_beat"]:
            commands.pop("beat")
        processes = {name: subprocess.Popen(argv) for name, argv in commands.items()}
        self.stdout.write(f"SparkOps is starting on http://{options['bind']}/ "
                          f"({', '.join(processes)}); Ctrl-C stops it.")
        stopping = False

        def stop(signum: int, _frame: object) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        exited: str | None = None
        while not stopping and exited is None:
            exited = next((n for n, p in processes.items() if p.poll() is not None), None)
            time.sleep(0.5)
        for process in processes.values():
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + 15
        for process in processes.values():
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                process.kill()
        if exited is not None:
            code = processes[exited].returncode
            self.stderr.write(f"{exited} exited with status {code}; stopped the others.")
            sys.exit(1)
