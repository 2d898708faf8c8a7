"""``bin/sparkops demo``: SparkOps with emulated engines replaying the seeds' story, scaled.

The command starts a private Podman Docker-API service, runs the story's two engines (a
Gemma-like and a Nemotron-like vLLM, see :mod:`sparkops.demo.node`) as real containers, runs the
stack (web, worker, beat) on the demo's own data directory (:mod:`sparkops.demo.stack`), and then
tells the story (:mod:`sparkops.demo.story`) on a timer, printing each act as it happens.

Ctrl-C stops the stack, removes the containers and stops the Podman service. ``--speed``
compresses the story's pauses and the engines' emulated start-up; the engines' speeds and the
alert rules' timings stay real.
"""

from __future__ import annotations

import math
import os
import sys
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from collectors.meminfo import parse_meminfo
from collectors.nodes import local_node, local_procfs
from sparkops.address import bind_argument
from sparkops.demo.node import (
    INSTALL_HINT,
    DemoError,
    Scale,
    change_fraction_for,
    choose_scale,
    missing_programs,
    story_peak_gib,
)
from sparkops.demo.stack import run_demo
from sparkops.demo.story import ACTS, reset_squeeze_calibration
from sparkops.units import GIB


def parse_acts(text: str) -> list[str]:
    """``"all"`` or a comma-separated subset of :data:`~sparkops.demo.story.ACTS`."""
    if text.strip() == "all":
        return list(ACTS)
    acts = [a.strip() for a in text.split(",") if a.strip()]
    unknown = [a for a in acts if a not in ACTS]
    if unknown:
        raise CommandError(f"--acts: unknown act {', '.join(unknown)}; choose from "
                           f"{', '.join(ACTS)} or all")
    return acts


class Command(BaseCommand):
    help = ("Demo mode: emulated engines in real containers replay a scaled GB10 story while the "
            "stack runs. Start it with `bin/sparkops demo`.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--speed", type=float, default=1.0,
                            help="compress the story's pauses and the engines' start-up by this "
                                 "factor (default 1: a few minutes per act)")
        parser.add_argument("--acts", default="all",
                            help=f"comma-separated acts to play: {', '.join(ACTS)} (default all)")
        parser.add_argument("--mib-per-gib", type=int, default=None,
                            help="MiB of real memory per GiB of the story (default: chosen from "
                                 "MemAvailable, at most a quarter of it and 8 GiB in all)")
        parser.add_argument("--bind", type=bind_argument, default=settings.SPARKOPS_BIND,
                            help="address of the web server (SPARKOPS_BIND)")

    def say(self, text: str) -> None:
        self.stdout.write(f"[{datetime.now():%H:%M:%S}] {text}")
        self.stdout.flush()

    def handle(self, *args: Any, **options: Any) -> None:
        _require_demo_mode()
        speed = options["speed"]
        if not (math.isfinite(speed) and speed > 0):
            raise CommandError("--speed must be a positive number")
        acts = parse_acts(options["acts"])
        info = parse_meminfo(local_procfs().meminfo())
        mem_available, mem_total = info.get("MemAvailable"), info.get("MemTotal")
        if not mem_available or not mem_total:
            raise CommandError("cannot read MemAvailable and MemTotal from /proc/meminfo")
        try:
            scale = choose_scale(mem_available, options["mib_per_gib"])
        except DemoError as error:
            raise CommandError(str(error)) from None
        node = local_node()
        self.announce(scale, speed, acts, mem_available, mem_total)
        reset_squeeze_calibration()
        if run_demo(node=node, scale=scale, speed=speed, acts=acts, bind=options["bind"],
                    say=self.say, complain=self.stderr.write):
            sys.exit(1)

    def announce(self, scale: Scale, speed: float, acts: list[str], mem_available: int,
                 mem_total: int) -> None:
        """Say what the demo is, at which scale and speed; lower the ledger's change threshold
        to the scaled growth (the stack inherits the environment)."""
        self.say("SparkOps demo — emulated engines replaying a scaled GB10 story; not real data.")
        self.say(f"Data: {settings.DATA_DIR} (the demo's own; real data is never touched).")
        self.say(f"Scale: {scale.describe()}. This machine has {mem_available / GIB:.1f} GiB "
                 f"available; the story's peak ({story_peak_gib():g} GiB on a GB10) takes "
                 f"{scale.peak_bytes / GIB:.2f} GiB here.")
        self.say(f"Speed ×{speed:g}: the story's pauses and the engines' start-up are compressed;"
                 " engine speeds and alert timings are real. Acts: steady, "
                 f"{', '.join(a for a in ACTS if a in acts) or '(none)'}.")
        fraction = change_fraction_for(scale, mem_total)
        if fraction is not None:
            # The stack inherits the environment: its ledger records the scaled growth as a
            # change an alert can name as its cause.
            os.environ["SPARKOPS_LEDGER_CHANGE_FRACTION"] = f"{fraction:.6f}"
            self.say(f"Ledger change threshold lowered to {fraction:.4%} of MemTotal so that the "
                     "neighbour's scaled growth is recorded as a cause.")


def _require_demo_mode() -> None:
    """Refuse to run outside demo mode or without Podman and runc, saying what to do."""
    if not settings.SPARKOPS_DEMO:
        raise CommandError("demo mode runs only with SPARKOPS_DEMO=1 and a data directory of "
                           "its own; start it with `bin/sparkops demo`")
    missing = missing_programs()
    if missing:
        raise CommandError(
            "demo mode runs the emulated engines as real containers and finds them through "
            f"Podman's Docker-compatible API, but {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed. Install with: "
            f"{INSTALL_HINT}")
