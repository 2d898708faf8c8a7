"""Demo mode, the stack: a private Podman service, SparkOps' own processes, and the story
between their start and their stop.

:func:`run_demo` starts the Podman Docker-API service on the demo's data directory, runs
``manage.py runstack`` (web, worker, beat) against it, tells the story, and on Ctrl-C (or when
the stack exits) stops the stack, removes the demo containers and stops the service, in that
order.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone

from collectors.models import Node
from sparkops.demo.node import DemoError, PodmanService, Scale
from sparkops.demo.story import Story, StoryInterrupted, close_fresh_start, record_fresh_start

# Lines of the stack's log shown when the demo ends in a failure.
LOG_TAIL_LINES = 20


class StackPacer:
    """Sleeps while the stack collects; raises :class:`StoryInterrupted` on Ctrl-C or when the
    stack exited."""

    def __init__(self, stop: threading.Event, stack: subprocess.Popen[bytes] | None) -> None:
        self.stop, self.stack = stop, stack

    def pause(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while True:
            if self.stop.is_set():
                raise StoryInterrupted("stopped (Ctrl-C)")
            if self.stack is not None and self.stack.poll() is not None:
                raise StoryInterrupted(f"the stack exited with status {self.stack.returncode}",
                                       failed=True)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self.stop.wait(min(0.5, remaining))


def run_demo(*, node: Node, scale: Scale, speed: float, acts: Iterable[str], bind: str,
             say: Callable[[str], None], complain: Callable[[str], None]) -> bool:
    """Start the Podman service and the stack, tell the story, and stop everything in order
    once interrupted; whether the demo failed (then the stack log's tail was complained of).

    Blocks until Ctrl-C (SIGINT or SIGTERM) or until the stack exits.
    """
    # Planning a restart publishes to the file-system broker, which has no host name; kombu
    # warns about that on every publish, which would interrupt the story's output.
    logging.getLogger("kombu.connection").setLevel(logging.ERROR)
    stop = _stop_on_signals()
    service = PodmanService(settings.DATA_DIR)
    stack: subprocess.Popen[bytes] | None = None
    log_path = settings.DATA_DIR / "demo-stack.log"
    failed = False
    # Before the stack collects: the previous run's containers vanish when the service starts.
    record_fresh_start(node, timezone.now())
    try:
        url = service.start()
        os.environ["SPARKOPS_DOCKER_HOST"] = url
        say(f"Podman's Docker API: {url} (SPARKOPS_DOCKER_HOST for the stack).")
        stack = start_stack(bind, log_path)
        say(f"SparkOps is starting on http://{bind}/ — {login_hint()} "
            f"Stack log: {log_path}. Ctrl-C stops the demo.")
        story = Story(node=node, containers=service.containers, scale=scale, speed=speed,
                      pace=StackPacer(stop, stack), say=say)
        story.tell(acts)
        say("The story is told. SparkOps keeps watching the two engines; Ctrl-C stops the demo.")
        while True:
            story.pace.pause(3600)
    except StoryInterrupted as interrupted:
        failed = interrupted.failed
        say(f"Stopping: {interrupted}.")
    except DemoError as error:
        failed = True
        complain(f"demo: {error}")
    finally:
        say("Stopping the stack, removing the demo containers and the Podman service…")
        close_fresh_start(node.pk, timezone.now())
        stop_stack(stack)
        try:
            service.stop()
        except DemoError as error:
            failed = True
            complain(f"demo: {error}")
        say("Demo stopped; its data stays in the data directory for the next run.")
    if failed and log_path.exists():
        tail = log_path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        complain("Last lines of the stack log:\n" + "\n".join(tail))
    return failed


def _stop_on_signals() -> threading.Event:
    """An event set by Ctrl-C or SIGTERM: the story stops at its next pause."""
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    return stop


def login_hint() -> str:
    """Whom to log in as, and where that account's password is."""
    user = get_user_model().objects.filter(is_superuser=True).order_by("pk").first()
    name = user.get_username() if user else os.environ.get("SPARKOPS_ADMIN_USER", "admin")
    path = Path(settings.DATA_DIR) / "admin-password"
    where = f"its password is in {path}" if path.exists() \
        else "its password is SPARKOPS_ADMIN_PASSWORD"
    return f"log in as {name!r}; {where}."


def start_stack(bind: str, log_path: Path) -> subprocess.Popen[bytes]:
    """``manage.py runstack`` in its own session (Ctrl-C reaches the demo, which stops it in
    order), its output in the data directory so the story stays readable."""
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "runstack",
             "--bind", bind],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )


def stop_stack(stack: subprocess.Popen[bytes] | None) -> None:
    """Stop the stack (runstack stops gunicorn, the worker and beat itself); killed after 30 s."""
    if stack is None or stack.poll() is not None:
        return
    stack.terminate()
    try:
        stack.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(stack.pid, signal.SIGKILL)
        stack.wait(timeout=10)
