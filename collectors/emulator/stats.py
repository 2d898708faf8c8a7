"""The periodic `Engine 000: Avg prompt throughput: …` line (vllm/v1/metrics/loggers.py).

vLLM's frontend logs it every VLLM_LOG_STATS_INTERVAL seconds, at INFO only when this interval
or the previous one had non-zero throughput (otherwise at DEBUG, which is silent); so an idle
engine, or one stuck in a long prefill that has not finished yet, prints nothing.

The prefix-cache hit rate is cumulative since start (vLLM averages over recent requests); it is
shown only when prefix caching is on. With speculative decoding an interval that drafted is
followed by vLLM's `SpecDecoding metrics:` line (vllm/v1/spec_decode/metrics.py).
"""

from __future__ import annotations

import threading
import time

from . import messages
from .engine import Engine
from .logs import VllmLog


class StatsLogger:
    """Logs the stats line from a thread of its own until `stop` is set."""

    def __init__(
        self, engine: Engine, log: VllmLog, *, interval: float, enabled: bool, prefix_caching: bool
    ) -> None:
        self._engine = engine
        self._log = log
        self._interval = interval
        self._enabled = enabled
        self._prefix_caching = prefix_caching

    def run(self, stop: threading.Event) -> None:
        if not self._enabled:
            return
        last = self._engine.totals()
        last_time = time.monotonic()
        last_busy = False
        while not stop.wait(self._interval):
            now_totals = self._engine.totals()
            now = time.monotonic()
            elapsed = max(now - last_time, 1e-9)
            prompt_tps = (now_totals.prompt_tokens - last.prompt_tokens) / elapsed
            generation_tps = (now_totals.generation_tokens - last.generation_tokens) / elapsed
            busy = bool(prompt_tps or generation_tps)
            if busy or last_busy:
                queries = now_totals.prefix_queries
                hit_rate: float | None = None
                if self._prefix_caching:
                    hit_rate = now_totals.prefix_hits / queries if queries else 0.0
                self._log.api(
                    *messages.stats_line(
                        self._log.style,
                        prompt_tps=prompt_tps,
                        generation_tps=generation_tps,
                        running=now_totals.running,
                        waiting=now_totals.waiting,
                        preemptions=now_totals.preemptions - last.preemptions,
                        kv_usage=now_totals.kv_usage,
                        prefix_hit_rate=hit_rate,
                    )
                )
            drafts = now_totals.spec_drafts - last.spec_drafts
            if drafts > 0:
                per_position = [(b - a) / drafts for a, b in zip(
                    last.spec_accepted_per_position, now_totals.spec_accepted_per_position,
                    strict=True)]
                self._log.api(*messages.spec_decode_line(
                    drafts=drafts,
                    draft_tokens=now_totals.spec_draft_tokens - last.spec_draft_tokens,
                    accepted=now_totals.spec_accepted - last.spec_accepted,
                    seconds=elapsed, per_position=per_position))
            last, last_time, last_busy = now_totals, now, busy
