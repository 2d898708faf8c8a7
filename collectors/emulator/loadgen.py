"""The built-in request generator (`--emulator-load RPS:PROMPT:GEN`).

Arrivals are evenly spaced (every 1/RPS seconds, on a fixed schedule that does not drift), so the
prompt-token counter grows at RPS × PROMPT per second and the generation counter at RPS × GEN, as
long as the engine keeps up. When it does not, requests queue as real ones would: the generator
never waits for the engine.
"""

from __future__ import annotations

import itertools
import threading
import time

from .cli import LoadSpec
from .engine import Engine, Request
from .logs import VllmLog


class LoadGenerator:
    """Submits synthetic requests to `engine` from its own thread until `stop` is set."""

    def __init__(self, spec: LoadSpec, engine: Engine, log: VllmLog) -> None:
        self._spec = spec
        self._engine = engine
        self._log = log

    def run(self, stop: threading.Event) -> None:
        interval = 1.0 / self._spec.rps
        start = time.monotonic()
        for n in itertools.count():
            delay = start + n * interval - time.monotonic()
            if delay > 0 and stop.wait(delay):
                return
            if stop.is_set():
                return
            request = Request(
                request_id=f"cmpl-load-{n}",
                prompt_tokens=self._spec.prompt_tokens,
                max_tokens=self._spec.gen_tokens,
                output_tokens=self._spec.gen_tokens,
            )
            try:
                self._engine.submit(request)
            except ValueError as exc:
                self._log.api("loadgen.py:45", f"Emulator load generator stopped: {exc}", "WARNING")
                return
