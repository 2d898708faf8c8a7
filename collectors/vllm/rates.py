"""Rates of one vLLM engine between two scrapes, with counter-reset detection.

Pure functions over two :class:`Observation` values; nothing here does I/O or keeps state.
Cost: linear in the number of histogram buckets (about twenty per histogram: vLLM's defaults in
vllm/v1/metrics/buckets.py).

Counters restart from zero when an engine restarts, and a restart is not always visible as a
decrease: a restarted engine's counter can climb past its old value between two scrapes.
So an interval is treated as a restart when the caller-supplied engine identity (for example
the container ID and start time), the ``process_start_time_seconds``, any ``_created`` timestamp,
the model or engine label changed, or when any counter or histogram bucket went down. A
restarted interval has no rates at all: never a negative one, and never the Prometheus
convention of counting from zero, because the restart time within the interval is unknown.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from collectors.vllm.metrics import Histogram, MetricsSnapshot

__all__ = ["Observation", "Rates", "compute_rates", "histogram_quantile", "restart_reason"]

_COUNTER_FIELDS = (
    "prompt_tokens_total",
    "generation_tokens_total",
    "preemptions_total",
    "prefix_cache_queries_total",
    "prefix_cache_hits_total",
    "spec_decode_drafts_total",
    "spec_decode_draft_tokens_total",
    "spec_decode_accepted_tokens_total",
)
_HISTOGRAM_FIELDS = ("ttft", "inter_token_latency")
# process_start_time_seconds is printed with full float precision by the same process, so any
# difference beyond rounding noise is a different process.
_START_TIME_TOLERANCE_S = 1e-3


@dataclass(frozen=True)
class Observation:
    """One scrape of one engine: the snapshot, when it was taken and who answered.

    ``wall_time`` is Unix seconds when the scrape completed. ``identity`` is an opaque string
    that changes when the engine restarts (container ID plus ``State.StartedAt``); None when
    unknown, in which case it is not compared.
    """

    snapshot: MetricsSnapshot
    wall_time: float
    identity: str | None = None


@dataclass(frozen=True)
class Rates:
    """Per-second rates and ratios over one interval; None where they cannot be known.

    ``restarted`` is True when the engine restarted within the interval; ``reason`` then says
    how that was detected. ``reason`` is also set, with ``restarted`` False, when the interval
    is not positive. A single value is None when its metric is missing from either scrape or,
    for ratios and quantiles, when nothing was observed in the interval.

    * ``prefill_tokens_per_s``: prompt tokens, including prefix-cache hits (vLLM's
      ``prompt_tokens`` counts cached ones too).
    * ``decode_tokens_per_s``: generated tokens.
    * ``prefix_cache_hit_rate``: hits / queries, 0-1.
    * ``spec_decode_acceptance_rate``: accepted / drafted tokens, 0-1;
      ``spec_decode_mean_acceptance_length``: 1 + accepted / drafts, the tokens one step of a
      request yields (the bonus token included), as vLLM's own ``SpecDecoding metrics`` line
      computes it (vllm/v1/spec_decode/metrics.py ``SpecDecodingLogging.log``, 0.33: "Mean
      acceptance length"); ``spec_decode_position_acceptance``: accepted / drafts at each draft
      position, position 0 first (its "Per-position acceptance rate"). None where no draft was
      made in the interval: an engine that drafted nothing has no acceptance, not 0.
    * ``*_p50_s`` / ``*_p95_s``: quantiles in seconds of the observations made in the interval,
      interpolated within buckets as Prometheus ``histogram_quantile`` does.
    """

    interval_seconds: float
    restarted: bool = False
    reason: str | None = None
    prefill_tokens_per_s: float | None = None
    decode_tokens_per_s: float | None = None
    prefix_cache_hit_rate: float | None = None
    spec_decode_acceptance_rate: float | None = None
    spec_decode_mean_acceptance_length: float | None = None
    spec_decode_position_acceptance: tuple[float, ...] | None = None
    preemptions_per_s: float | None = None
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    itl_p50_s: float | None = None
    itl_p95_s: float | None = None

    def as_dict(self) -> dict[str, float | bool | str | None]:
        """JSON-ready dict of every field."""
        return asdict(self)


def compute_rates(previous: Observation, current: Observation) -> Rates:
    """Rates between two observations of the same engine, ``previous`` taken first."""
    interval = current.wall_time - previous.wall_time
    reason = restart_reason(previous, current)
    if reason is not None:
        return Rates(interval_seconds=interval, restarted=True, reason=reason)
    if not (math.isfinite(interval) and interval > 0):
        return Rates(interval_seconds=interval,
                     reason=f"no time passed between the scrapes ({interval:.3f} s)")
    before, after = previous.snapshot, current.snapshot
    delta = _counter_deltas(before, after)
    ttft = _bucket_delta(before.ttft, after.ttft)
    itl = _bucket_delta(before.inter_token_latency, after.inter_token_latency)
    return Rates(
        interval_seconds=interval,
        prefill_tokens_per_s=_per_second(delta.get("prompt_tokens_total"), interval),
        decode_tokens_per_s=_per_second(delta.get("generation_tokens_total"), interval),
        preemptions_per_s=_per_second(delta.get("preemptions_total"), interval),
        prefix_cache_hit_rate=_ratio(
            delta.get("prefix_cache_hits_total"), delta.get("prefix_cache_queries_total")),
        spec_decode_acceptance_rate=_ratio(
            delta.get("spec_decode_accepted_tokens_total"),
            delta.get("spec_decode_draft_tokens_total")),
        spec_decode_mean_acceptance_length=_mean_acceptance_length(
            delta.get("spec_decode_accepted_tokens_total"), delta.get("spec_decode_drafts_total")),
        spec_decode_position_acceptance=_position_acceptance(
            before, after, delta.get("spec_decode_drafts_total")),
        ttft_p50_s=histogram_quantile(0.5, ttft),
        ttft_p95_s=histogram_quantile(0.95, ttft),
        itl_p50_s=histogram_quantile(0.5, itl),
        itl_p95_s=histogram_quantile(0.95, itl),
    )


def restart_reason(previous: Observation, current: Observation) -> str | None:
    """Why the engine must have restarted between the two observations, or None."""
    before, after = previous.snapshot, current.snapshot
    for check in (
        _identity_changed(previous.identity, current.identity),
        _labels_changed(before, after),
        _process_restarted(before.process_start_time_seconds, after.process_start_time_seconds),
        _created_changed(before, after),
        _counter_went_down(before, after),
        _positions_went_down(before, after),
        _histogram_went_down(before, after),
    ):
        if check is not None:
            return check
    return None


def histogram_quantile(
    q: float, buckets: Sequence[tuple[float, float]] | None
) -> float | None:
    """The ``q`` quantile of cumulative ``(upper_bound, count)`` buckets ending with +Inf.

    Follows Prometheus ``histogram_quantile``: linear interpolation inside the bucket that holds
    the rank, the lowest bucket starting at 0, and the highest finite bound when the rank falls
    in the +Inf bucket. None when there are no observations or fewer than two buckets.
    """
    if not 0 <= q <= 1:
        raise ValueError(f"quantile must be between 0 and 1, not {q!r}")
    if buckets is None or len(buckets) < 2 or buckets[-1][0] != math.inf:
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    index = next(
        (i for i, (_bound, count) in enumerate(buckets[:-1]) if count >= rank),
        len(buckets) - 1,
    )
    if index == len(buckets) - 1:
        return buckets[-2][0]
    upper, count = buckets[index]
    if index == 0 and upper <= 0:
        return upper
    lower, below = (0.0, 0.0) if index == 0 else buckets[index - 1]
    in_bucket = count - below
    if in_bucket <= 0:
        return lower
    return lower + (upper - lower) * (rank - below) / in_bucket


# --- restart checks ---------------------------------------------------------------------------


def _identity_changed(before: str | None, after: str | None) -> str | None:
    if before is None or after is None or before == after:
        return None
    return f"engine identity changed ({before} -> {after})"


def _labels_changed(before: MetricsSnapshot, after: MetricsSnapshot) -> str | None:
    if (before.model_name, before.engine) == (after.model_name, after.engine):
        return None
    return (f"engine changed (model {before.model_name!r} engine {before.engine!r} -> "
            f"model {after.model_name!r} engine {after.engine!r})")


def _process_restarted(before: float | None, after: float | None) -> str | None:
    if before is None or after is None or abs(after - before) <= _START_TIME_TOLERANCE_S:
        return None
    return f"process_start_time_seconds changed ({before!r} -> {after!r})"


def _created_changed(before: MetricsSnapshot, after: MetricsSnapshot) -> str | None:
    for name, created in after.created.items():
        earlier = before.created.get(name)
        if earlier is not None and earlier != created:
            return f"{name} _created changed ({earlier!r} -> {created!r})"
    return None


def _counter_went_down(before: MetricsSnapshot, after: MetricsSnapshot) -> str | None:
    for name in _COUNTER_FIELDS:
        earlier, later = getattr(before, name), getattr(after, name)
        if earlier is not None and later is not None and later < earlier:
            return f"{name} went down ({earlier} -> {later})"
    return None


def _positions_went_down(before: MetricsSnapshot, after: MetricsSnapshot) -> str | None:
    earlier = before.spec_decode_accepted_per_position_total
    later = after.spec_decode_accepted_per_position_total
    if earlier is None or later is None:
        return None
    if len(earlier) != len(later):
        return (f"speculative draft positions changed ({len(earlier)} -> {len(later)}): "
                "num_speculative_tokens is another")
    for position, (a, b) in enumerate(zip(earlier, later, strict=True)):
        if b < a:
            return f"accepted tokens at draft position {position} went down ({a} -> {b})"
    return None


def _histogram_went_down(before: MetricsSnapshot, after: MetricsSnapshot) -> str | None:
    for name in _HISTOGRAM_FIELDS:
        earlier, later = getattr(before, name), getattr(after, name)
        if earlier is None or later is None:
            continue
        if [bound for bound, _ in earlier.buckets] != [bound for bound, _ in later.buckets]:
            return f"{name} histogram buckets changed"
        if any(b < a for (_, a), (_, b) in zip(earlier.buckets, later.buckets, strict=True)):
            return f"{name} histogram went down ({earlier.count} -> {later.count} observations)"
    return None


# --- deltas -----------------------------------------------------------------------------------


def _counter_deltas(before: MetricsSnapshot, after: MetricsSnapshot) -> dict[str, int]:
    """Increase of each counter known in both snapshots (never negative after the checks)."""
    deltas: dict[str, int] = {}
    for name in _COUNTER_FIELDS:
        earlier, later = getattr(before, name), getattr(after, name)
        if earlier is not None and later is not None:
            deltas[name] = later - earlier
    return deltas


def _bucket_delta(
    before: Histogram | None, after: Histogram | None
) -> tuple[tuple[float, int], ...] | None:
    """Cumulative buckets of the observations made between the two snapshots."""
    if before is None or after is None:
        return None
    return tuple(
        (bound, later - earlier)
        for (bound, earlier), (_, later) in zip(before.buckets, after.buckets, strict=True)
    )


def _per_second(delta: int | None, interval: float) -> float | None:
    return None if delta is None else delta / interval


def _ratio(part: int | None, whole: int | None) -> float | None:
    if part is None or whole is None or whole <= 0:
        return None
    return part / whole


def _position_acceptance(before: MetricsSnapshot, after: MetricsSnapshot,
                         drafts: int | None) -> tuple[float, ...] | None:
    earlier = before.spec_decode_accepted_per_position_total
    later = after.spec_decode_accepted_per_position_total
    if earlier is None or later is None or drafts is None or drafts <= 0:
        return None
    return tuple((b - a) / drafts for a, b in zip(earlier, later, strict=True))


def _mean_acceptance_length(accepted: int | None, drafts: int | None) -> float | None:
    ratio = _ratio(accepted, drafts)
    return None if ratio is None else 1 + ratio
