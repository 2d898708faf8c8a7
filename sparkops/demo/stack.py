"""Demo mode, the stack: a private Podman service, SparkOps' own processes, and the story
between their start and their stop.

:func:`run_demo` starts the Podman Docker-API service on the demo's data directory, makes the
engines' memory budget (:mod:`sparkops.demo.budget`, where this machine allows it), runs
``manage.py runstack`` (web, worker, beat) against them, tells the story, and on Ctrl-C (or when
the stack exits) stops the stack, removes the demo containers, stops the service and removes the
budget's cgroup, in that order.
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
from sparkops.demo.budget import (
    BUDGET_ENV,
    BudgetUnavailable,
    DemoBudget,
    budget_limit,
    budget_name,
    create_budget,
    remove_budget,
)
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
    """Start the Podman service, the engines' memory budget and the stack, tell the story, and
    stop everything in order once interrupted (the budget's cgroup is removed last, once the
    containers are gone); whether the demo failed (then the stack log's tail was complained of).

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
    budget: DemoBudget | None = None
    # Before the stack collects: the previous run's containers vanish when the service starts.
    record_fresh_start(node, timezone.now())
    try:
        url = service.start()
        os.environ["SPARKOPS_DOCKER_HOST"] = url
        say(f"Podman's Docker API: {url} (SPARKOPS_DOCKER_HOST for the stack).")
        budget = open_budget(scale, say)
        if budget is not None:
            service.containers.cgroup_parent = budget.parent
            # The stack inherits the environment: its collectors measure the budget.
            os.environ[BUDGET_ENV] = str(budget.path)
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
        say("Stopping the stack, removing the demo containers, the Podman service and the "
            "memory budget…" if budget is not None else
            "Stopping the stack, removing the demo containers and the Podman service…")
        close_fresh_start(node.pk, timezone.now())
        stop_stack(stack)
        try:
            service.stop()
        except DemoError as error:
            failed = True
            complain(f"demo: {error}")
        left = remove_budget(budget.name) if budget is not None else []
        if left:
            failed = True
            complain(f"demo: the memory budget's cgroups are still there: {', '.join(left)}")
        say("Demo stopped; its data stays in the data directory for the next run.")
    if failed and log_path.exists():
        tail = log_path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        complain("Last lines of the stack log:\n" + "\n".join(tail))
    return failed


def open_budget(scale: Scale, say: Callable[[str], None]) -> DemoBudget | None:
    """Make the engines' memory budget (:mod:`sparkops.demo.budget`) and say so; where it
    cannot be made, say why and go on with the host's headroom (None)."""
    name = budget_name(settings.DATA_DIR)
    remove_budget(name)  # a killed demo's, emptied when the service cleared its containers
    try:
        budget = create_budget(name, budget_limit(scale))
    except BudgetUnavailable as why:
        say(f"No memory budget for the engines ({why}): they share the host's headroom, which "
            "other programs' memory moves too.")
        return None
    say(budget.describe())
    return budget


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
