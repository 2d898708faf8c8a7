"""What the SGLang and TensorRT-LLM dialects share: engines that size one KV pool at start and
run every prefill step through a transient activation buffer, as vLLM does.

Both are PyTorch servers: the weights load, the KV pool is sized from a share of the memory
(SGLang's ``--mem-fraction-static``, TensorRT-LLM's ``--kv_cache_free_gpu_memory_fraction``)
or a fixed token count, CUDA graphs are captured, then the scheduler runs. A prefill step holds
activations for the tokens it computes (``--chunked-prefill-size``, ``--max_num_tokens`` wide
at most) and gives them back when no prefill runs, which is what lets a neighbour's prefill be
squeezed. The memory is really reserved (MiB where the real engine has GiB), as the other
dialects'.

:class:`PooledServer` holds the memory, the scheduler and the counters a dialect renders;
:class:`Tally` is the scheduler's metrics sink (token counters, TTFT and inter-token
histograms, finished requests). Standard library only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .engine import Engine, EngineSettings, Request
from .exposition import Series
from .knobs import Knobs
from .memory import Reservation, TransientBuffer, host_memory
from .metrics import FinishedRequest
from .serving import Counters

# The memory the emulator reserves stands for 1024 times as much on a GB10.
SCALE = 1024


class Tally(Counters):
    """:class:`~serving.Counters` plus the latency histograms and finished-request count that
    SGLang and TensorRT-LLM expose. Prompt tokens are counted whole (cached ones included),
    as both engines count them."""

    def __init__(self, ttft_buckets: Sequence[float], itl_buckets: Sequence[float]) -> None:
        super().__init__()
        self.ttft = Series(ttft_buckets)
        self.itl = Series(itl_buckets)
        self.finished = 0
        self.prompt_whole = 0

    def record_prompt(self, prompt_tokens: int, cached_tokens: int) -> None:
        super().record_prompt(prompt_tokens, cached_tokens)
        with self._lock:
            self.prompt_whole += prompt_tokens

    def record_first_token(self, ttft_seconds: float) -> None:
        with self._lock:
            self.ttft.observe(ttft_seconds)

    def record_inter_token(self, seconds: float, tokens: int = 1) -> None:
        with self._lock:
            self.itl.observe(seconds, tokens)

    def record_finished(self, done: FinishedRequest) -> None:
        super().record_finished(done)
        with self._lock:
            self.finished += 1

    def read(self, reader: Callable[[Tally], object]) -> object:
        """``reader(self)`` under the lock: one consistent view for a scrape."""
        with self._lock:
            return reader(self)


@dataclass(frozen=True)
class Plan:
    """What one engine reserves and schedules, fixed at start."""

    slots: int
    batch: int  # prompt tokens one step computes at most
    block_size: int
    context: int  # tokens one request may hold
    weights_bytes: int
    graph_bytes: int
    knobs: Knobs


def scaled_free_memory() -> tuple[int, int]:
    """(MemTotal, MemFree) as the emulated engine sees them: divided by :data:`SCALE`, since
    every reservation is too."""
    total, free = host_memory()
    return total // SCALE, free // SCALE


class PooledServer:
    """One engine process's memory and scheduler: ``load`` reserves the weights (over the
    loading time), ``allocate_kv`` the pool, ``capture_graphs`` the graphs; ``start`` runs the
    scheduler, whose prefill steps hold a transient buffer."""

    def __init__(self, plan: Plan, tally: Tally) -> None:
        self.plan = plan
        self.tally = tally
        self.stop = threading.Event()
        self.ready = False
        self.reservations: list[Reservation] = []
        self.kv_bytes = 0
        self.kv_tokens = 0
        self.engine: Engine | None = None
        self._buffer = TransientBuffer()

    def load(self) -> bool:
        """Reserve the weights tensor by tensor over the loading time; False if stopped."""
        weights = Reservation(self.plan.weights_bytes)
        self.reservations.append(weights)
        for step in range(1, 21):
            weights.touch(self.plan.weights_bytes * step // 20)
            if self.stop.wait(self.plan.knobs.load_seconds / 20):
                return False
        return True

    def allocate_kv(self, pool_bytes: int) -> None:
        """Reserve a pool of ``pool_bytes`` (whole blocks) and build the scheduler over it."""
        per_token = self.plan.knobs.kv_bytes_per_token
        blocks = max(pool_bytes // (per_token * self.plan.block_size), 0)
        self.kv_tokens = blocks * self.plan.block_size
        self.kv_bytes = self.kv_tokens * per_token
        self.reservations.append(Reservation(self.kv_bytes, populate=True))
        settings = EngineSettings(
            max_num_seqs=self.plan.slots, max_num_batched_tokens=self.plan.batch,
            block_size=self.plan.block_size, num_gpu_blocks=blocks,
            max_model_len=min(self.plan.context, max(self.kv_tokens, 1)),
            prefill_tps=self.plan.knobs.prefill_tps, decode_tps=self.plan.knobs.decode_tps,
            activation_bytes_per_token=self.plan.knobs.activation_bytes_per_token,
            prefix_hit_rate=0.0)
        self.engine = Engine(settings, self.tally, self._buffer)  # type: ignore[arg-type]

    def capture_graphs(self) -> None:
        if self.plan.graph_bytes:
            self.reservations.append(Reservation(self.plan.graph_bytes, populate=True))

    def start(self) -> threading.Thread:
        assert self.engine is not None
        thread = threading.Thread(target=self.engine.run, args=(self.stop,), name="engine",
                                  daemon=True)
        thread.start()
        self.ready = True
        return thread

    def generate(self, prompt_tokens: int, output_tokens: int, request_id: str) -> Request:
        """Run one request to its end (ValueError if it can never fit)."""
        assert self.engine is not None
        request = Request(request_id=request_id, prompt_tokens=prompt_tokens,
                          max_tokens=output_tokens, output_tokens=output_tokens)
        self.engine.submit(request)
        while not request.done.wait(0.5):
            pass
        return request

    def free(self) -> None:
        self.stop.set()
        if self.engine is not None:
            self.engine.abort_all()
        self._buffer.release()
        for reservation in self.reservations:
            reservation.free()
        self.reservations.clear()


def gib(nbytes: float) -> float:
    """Bytes in GiB, the "GB" of both engines' log lines."""
    return nbytes / (1 << 30)


def now_stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")
