"""The emulated V1 engine: a continuous-batching scheduler that runs on the wall clock.

Model (vLLM V1's scheduler as configured by `--max-num-batched-tokens` and `--max-num-seqs`):

* One engine step at a time. Each step has a token budget of `max_num_batched_tokens`. Running
  requests are scheduled first, in arrival order: a decoding request costs one token of budget, a
  prefilling one takes as many prompt tokens as the budget leaves (a chunk). New requests are
  admitted from the waiting queue only while budget, a free slot (`max_num_seqs`) and free KV
  blocks remain — so a request blocked behind a long prompt is *waiting*, as in vLLM.
* A step lasts `prefill tokens / prefill_tps` plus, when anything decodes, one decode interval
  (`1 / decode_tps`, per sequence and independent of batch size). Because the prefill chunk and
  the decode tokens share one step, a long prompt stalls every other sequence on the engine: they
  get one token per chunk instead of `decode_tps` per second. That is the "no concurrent partial
  prefill" behaviour of vLLM V1: on a GB10 the other sequences fall from about 16 tok/s to 0–1
  while a long prompt prefills.
* While a step carries prefill tokens, the engine holds a transient activation buffer of
  `prefill tokens × activation_bytes_per_token` (at most `max_num_batched_tokens × …`), really
  resident, and releases it when no prefill runs.
* KV blocks are allocated as tokens are computed. When a running request needs a block and none is
  free, the most recently admitted request is preempted (its blocks freed, recomputed later), and
  `num_preemptions` counts it.
* The step that completes a prefill samples the first token (TTFT); the whole prompt is then
  counted in `prompt_tokens`, as vLLM does.

* With speculative decoding (`num_speculative_tokens` k), each decode step of a request drafts
  k tokens and accepts a share of them (`spec_acceptance`, spread evenly over the steps), so the
  step yields 1 + accepted tokens and costs 1 + k tokens of the budget, as vLLM schedules it.
  Accepted tokens past a request's end are counted as vLLM's rejection sampler counts them, and
  dropped from the output.
* `pause` stops scheduling (vLLM's `pause_scheduler` before a sleep: running requests are
  aborted, new ones wait); `resume` starts it again.

High decode rates are stepped in groups of tokens so a step never lasts less than ~10 ms.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .memory import TransientBuffer
from .metrics import EngineGauges, EngineMetrics, FinishedRequest

MIN_STEP_SECONDS = 0.01
IDLE_POLL_SECONDS = 0.5


@dataclass(eq=False)
class Request:
    """One generation request; `done` is set when it leaves the engine (finished or aborted)."""

    request_id: str
    prompt_tokens: int
    max_tokens: int
    output_tokens: int  # tokens it will produce before stopping (<= max_tokens)
    arrival: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    num_computed: int = 0  # tokens whose KV is in the cache
    generated: int = 0
    blocks: int = 0
    cached_tokens: int = 0
    prefix_checked: bool = False
    num_preemptions: int = 0
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    finished_at: float | None = None
    finish_reason: str | None = None

    @property
    def known_tokens(self) -> int:
        """Prompt plus sampled tokens: what the KV must hold before the next token is sampled."""
        return self.prompt_tokens + self.generated

    @property
    def natural_finish(self) -> str:
        """`length` when it ran into max_tokens, `stop` when it ended earlier (EOS)."""
        return "length" if self.output_tokens >= self.max_tokens else "stop"


@dataclass(frozen=True)
class EngineSettings:
    """Scheduler limits and speeds, all fixed at engine start."""

    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    num_gpu_blocks: int
    max_model_len: int
    prefill_tps: float
    decode_tps: float
    activation_bytes_per_token: int
    prefix_hit_rate: float
    num_speculative_tokens: int = 0  # 0: no speculative decoding
    spec_acceptance: float = 0.0


@dataclass(frozen=True)
class EngineTotals:
    """Cumulative counts since start, for the periodic stats line."""

    prompt_tokens: int
    generation_tokens: int
    preemptions: int
    prefix_queries: int
    prefix_hits: int
    running: int
    waiting: int
    kv_usage: float
    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted: int = 0
    spec_accepted_per_position: tuple[int, ...] = ()


@dataclass
class _Scheduled:
    request: Request
    tokens: int  # tokens whose KV this step computes
    decode: bool
    drafts: int = 0  # speculative drafts in this decode step (one per real step)
    accepted: int = 0  # drafted tokens accepted


class Engine:
    """Thread-safe scheduler; `run` is the engine loop and belongs to one dedicated thread."""

    def __init__(
        self,
        settings: EngineSettings,
        metrics: EngineMetrics,
        buffer: TransientBuffer,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self._buffer = buffer
        self._clock = clock
        self._cond = threading.Condition()
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []
        self._used_blocks = 0
        self._decode_group = max(1, math.ceil(settings.decode_tps * MIN_STEP_SECONDS))
        self._prompt_total = 0
        self._generation_total = 0
        self._preemption_total = 0
        self._prefix_queries = 0
        self._prefix_hits = 0
        self._paused = False
        self._draining = False  # pausing in mode "wait": the running finish, nothing is admitted
        self._spec_credit = 0.0  # accepted tokens owed by the acceptance rate, not yet drafted
        self._spec_drafts = 0
        self._spec_draft_tokens = 0
        self._spec_accepted = 0
        self._spec_per_position = [0] * settings.num_speculative_tokens

    # --- public, any thread ------------------------------------------------------------------

    def submit(self, request: Request) -> None:
        """Queue a request; raise ValueError if it could never fit `max_model_len`."""
        total = request.prompt_tokens + request.output_tokens
        if request.prompt_tokens < 1 or request.output_tokens < 1:
            raise ValueError("a request needs at least one prompt and one output token")
        if total > self.settings.max_model_len:
            raise ValueError(f"{total} tokens exceed max_model_len {self.settings.max_model_len}")
        with self._cond:
            self._waiting.append(request)
            self._cond.notify()

    def abort_all(self) -> None:
        """Finish every queued and running request with `abort` (used at shutdown)."""
        with self._cond:
            now = self._clock()
            for request in [*self._running, *self._waiting]:
                self._finish(request, "abort", now)
            self._waiting.clear()
            self._cond.notify()

    def abort(self, request: Request) -> None:
        """Finish one request with `abort` (its client went away)."""
        with self._cond:
            if request in self._waiting:
                self._waiting.remove(request)
            self._finish(request, "abort", self._clock())

    def pause(self, mode: str = "abort") -> None:
        """Stop scheduling until :meth:`resume`; waiting requests stay queued. The running ones,
        by vLLM's pause modes (vllm/v1/engine/core.py ``pause_scheduler``): "abort" (the
        default) finishes them as aborted, "keep" puts them back to wait (their KV dropped, so
        they are recomputed after resuming), "wait" lets them finish first, admitting nothing
        new meanwhile."""
        with self._cond:
            if mode == "wait":
                self._draining = True
                while self._running:
                    self._cond.wait(IDLE_POLL_SECONDS / 10)
            self._paused, self._draining = True, False
            now = self._clock()
            for request in list(reversed(self._running)):
                if mode == "keep":
                    self._requeue(request)
                else:
                    self._finish(request, "abort", now)
            self._cond.notify_all()

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify()

    @property
    def paused(self) -> bool:
        with self._cond:
            return self._paused

    def gauges(self) -> EngineGauges:
        with self._cond:
            return EngineGauges(len(self._running), len(self._waiting), self._kv_usage())

    def totals(self) -> EngineTotals:
        with self._cond:
            return EngineTotals(
                prompt_tokens=self._prompt_total,
                generation_tokens=self._generation_total,
                preemptions=self._preemption_total,
                prefix_queries=self._prefix_queries,
                prefix_hits=self._prefix_hits,
                running=len(self._running),
                waiting=len(self._waiting),
                kv_usage=self._kv_usage(),
                spec_drafts=self._spec_drafts,
                spec_draft_tokens=self._spec_draft_tokens,
                spec_accepted=self._spec_accepted,
                spec_accepted_per_position=tuple(self._spec_per_position),
            )

    def running_requests(self) -> list[tuple[int, int]]:
        """(prompt tokens, tokens generated so far) of each running request, oldest first:
        what llama.cpp's `/slots` shows of a busy slot."""
        with self._cond:
            return [(request.prompt_tokens, request.generated) for request in self._running]

    def in_flight(self) -> int:
        """`/load`'s `server_load`: requests inside the engine."""
        with self._cond:
            return len(self._running) + len(self._waiting)

    def run(self, stop: threading.Event) -> None:
        """The engine loop: schedule a step, spend its duration, apply it; until `stop` is set."""
        deadline: float | None = None  # when the previous step was due to end
        try:
            while not stop.is_set():
                with self._cond:
                    now = self._clock()
                    plan = self._schedule(now)
                    if not plan:
                        deadline = None
                        self._buffer.release()
                        self._cond.wait(IDLE_POLL_SECONDS)
                        continue
                # Back-to-back steps are timed from the previous deadline, so the scheduler's
                # own overhead does not slow the configured rates down.
                started = deadline if deadline is not None and now - deadline < 0.05 else now
                prefill_tokens = sum(item.tokens for item in plan if not item.decode)
                duration = prefill_tokens / self.settings.prefill_tps
                if any(item.decode for item in plan):
                    duration += self._decode_group / self.settings.decode_tps
                deadline = started + duration
                # Held for the whole step, like the activations of a real prefill chunk.
                self._buffer.hold(prefill_tokens * self.settings.activation_bytes_per_token)
                remaining = deadline - self._clock()
                if remaining > 0 and stop.wait(remaining):
                    break
                with self._cond:
                    self._apply(plan, max(self._clock(), deadline))
                    self._cond.notify_all()
        finally:
            self._buffer.release()

    # --- scheduler internals, called with the lock held -----------------------------------------

    def _kv_usage(self) -> float:
        blocks = self.settings.num_gpu_blocks
        return self._used_blocks / blocks if blocks else 0.0

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.settings.block_size)

    def _schedule(self, now: float) -> list[_Scheduled]:
        if self._paused:
            return []
        budget = self.settings.max_num_batched_tokens
        plan: list[_Scheduled] = []
        preempted = False
        index = 0
        while index < len(self._running) and budget > 0:
            request = self._running[index]
            missing = request.known_tokens - request.num_computed
            decode = request.generated > 0 and missing == 1
            drafts = accepted = 0
            if decode:
                remaining = request.output_tokens - request.generated
                drafts = min(self._decode_group, remaining)
                accepted = self._accepted(drafts)
                tokens = min(drafts + accepted, remaining)
                cost = 1 + self.settings.num_speculative_tokens
            else:
                tokens = cost = min(missing, budget)
            fitted, preempted_any = self._allocate(request, tokens)
            preempted = preempted or preempted_any
            if not fitted:
                continue  # the request preempted itself; the one now at `index` is next
            plan.append(_Scheduled(request, tokens, decode,
                                   drafts if self.settings.num_speculative_tokens else 0,
                                   accepted))
            budget -= cost
            index += 1
        # vLLM does not admit new work in a step that had to preempt.
        while not preempted and not self._draining and self._waiting and budget > 0:
            if len(self._running) >= self.settings.max_num_seqs:
                break
            request = self._waiting[0]
            if not request.prefix_checked:
                self._apply_prefix_cache(request)
            tokens = min(request.known_tokens - request.num_computed, budget)
            need = self._blocks_for(request.num_computed + tokens) - request.blocks
            if need > self.settings.num_gpu_blocks - self._used_blocks:
                break
            self._waiting.popleft()
            request.blocks += need
            self._used_blocks += need
            if request.first_scheduled is None:
                request.first_scheduled = now
            self._running.append(request)
            plan.append(_Scheduled(request, tokens, decode=False))
            budget -= tokens
        return plan

    def _accepted(self, drafts: int) -> int:
        """Drafted tokens accepted over ``drafts`` steps: the acceptance rate's share of the k
        tokens each drafts, carried over between steps so the rate holds exactly over time."""
        k = self.settings.num_speculative_tokens
        if not k:
            return 0
        self._spec_credit += self.settings.spec_acceptance * k * drafts
        accepted = min(int(self._spec_credit), k * drafts)
        self._spec_credit -= accepted
        return accepted

    def _record_drafts(self, item: _Scheduled) -> None:
        """vLLM's `SpecDecodingStats.observe_draft` for each draft of the step: the accepted
        tokens spread evenly over the drafts, each accepting a prefix of its k positions."""
        k = self.settings.num_speculative_tokens
        base, extra = divmod(item.accepted, item.drafts)
        per_position = [sum(1 for d in range(item.drafts) if base + (d < extra) > p)
                        for p in range(k)]
        self._spec_drafts += item.drafts
        self._spec_draft_tokens += k * item.drafts
        self._spec_accepted += item.accepted
        self._spec_per_position = [a + b for a, b in zip(self._spec_per_position, per_position,
                                                          strict=True)]
        self.metrics.record_spec_decode(item.drafts, k * item.drafts, item.accepted, per_position)

    def _apply_prefix_cache(self, request: Request) -> None:
        """First scheduling: whole blocks of the prompt may be served from the prefix cache."""
        request.prefix_checked = True
        block = self.settings.block_size
        hits = int(request.prompt_tokens * self.settings.prefix_hit_rate) // block * block
        hits = min(hits, (request.prompt_tokens - 1) // block * block)  # the last token is computed
        request.cached_tokens = hits
        request.num_computed = hits
        self._prefix_queries += request.prompt_tokens
        self._prefix_hits += hits
        self.metrics.record_prefix(request.prompt_tokens, hits)

    def _allocate(self, request: Request, tokens: int) -> tuple[bool, bool]:
        """Grow `request`'s blocks for `tokens` more, preempting from the tail if needed.

        Returns (request still scheduled, anything preempted).
        """
        need = self._blocks_for(request.num_computed + tokens) - request.blocks
        preempted = False
        while need > self.settings.num_gpu_blocks - self._used_blocks:
            victim = self._running[-1]
            self._preempt(victim)
            preempted = True
            if victim is request:
                return False, True
        request.blocks += need
        self._used_blocks += need
        return True, preempted

    def _preempt(self, request: Request) -> None:
        self._requeue(request)
        request.num_preemptions += 1
        self._preemption_total += 1
        self.metrics.record_preemption()

    def _requeue(self, request: Request) -> None:
        """Back to the head of the waiting queue, its KV dropped (computed again later)."""
        self._running.remove(request)
        self._used_blocks -= request.blocks
        request.blocks = 0
        request.num_computed = 0
        self._waiting.appendleft(request)

    def _apply(self, plan: list[_Scheduled], now: float) -> None:
        scheduled_tokens = 0
        sampled = 0
        for item in plan:
            request = item.request
            if request.finish_reason is not None or request not in self._running:
                continue  # aborted or preempted while the step ran
            request.num_computed += item.tokens
            if item.decode:
                scheduled_tokens += 1 + self.settings.num_speculative_tokens
                if item.drafts:
                    self._record_drafts(item)
                request.generated += item.tokens
                sampled += item.tokens
                gap = now - (request.last_token if request.last_token is not None else now)
                self.metrics.record_inter_token(gap / item.tokens, item.tokens)
                request.last_token = now
            else:
                scheduled_tokens += item.tokens
                if request.num_computed >= request.known_tokens:
                    sampled += 1
                    self._sample_after_prefill(request, now)
            if request.generated >= request.output_tokens:
                self._finish(request, request.natural_finish, now)
        self._generation_total += sampled
        self.metrics.record_step(scheduled_tokens, sampled)

    def _sample_after_prefill(self, request: Request, now: float) -> None:
        request.generated += 1
        if request.first_token is None:
            request.first_token = now
            self._prompt_total += request.prompt_tokens
            self.metrics.record_first_token(now - request.arrival)
            self.metrics.record_prompt(request.prompt_tokens, request.cached_tokens)
        elif request.last_token is not None:  # resumed after a preemption
            self.metrics.record_inter_token(now - request.last_token)
        request.last_token = now

    def _finish(self, request: Request, reason: str, now: float) -> None:
        if request.finish_reason is not None:
            return
        if request in self._running:
            self._running.remove(request)
        self._used_blocks -= request.blocks
        request.blocks = 0
        request.finish_reason = reason
        request.finished_at = now
        scheduled = request.first_scheduled if request.first_scheduled is not None else now
        first = request.first_token if request.first_token is not None else now
        self.metrics.record_finished(
            FinishedRequest(
                finished_reason=reason,
                prompt_tokens=request.prompt_tokens,
                computed_prompt_tokens=request.prompt_tokens - request.cached_tokens,
                generation_tokens=request.generated,
                max_tokens=request.max_tokens,
                num_preemptions=request.num_preemptions,
                queue_seconds=scheduled - request.arrival,
                prefill_seconds=first - scheduled,
                decode_seconds=now - first,
                inference_seconds=now - scheduled,
                e2e_seconds=now - request.arrival,
            )
        )
        request.done.set()
