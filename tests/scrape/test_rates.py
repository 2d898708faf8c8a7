"""compute_rates: rates, ratios, latency quantiles from bucket deltas, and restart detection."""

from __future__ import annotations

import dataclasses
import math

import pytest

from collectors.vllm.metrics import Histogram, MetricsSnapshot
from collectors.vllm.rates import Observation, Rates, compute_rates, histogram_quantile

INF = math.inf
T0 = 1_792_700_000.0


def hist(*buckets: tuple[float, int]) -> Histogram:
    return Histogram(buckets=tuple(buckets), count=buckets[-1][1], sum=None)


BEFORE = MetricsSnapshot(
    model_name="gemma-4-26b",
    engine="0",
    prompt_tokens_total=100_000,
    generation_tokens_total=20_000,
    preemptions_total=3,
    prefix_cache_queries_total=80_000,
    prefix_cache_hits_total=20_000,
    spec_decode_drafts_total=1_000,
    spec_decode_draft_tokens_total=3_000,
    spec_decode_accepted_tokens_total=2_000,
    ttft=hist((0.1, 10), (0.5, 20), (1.0, 30), (INF, 30)),
    inter_token_latency=hist((0.025, 100), (0.05, 900), (0.1, 1000), (INF, 1000)),
    process_start_time_seconds=1_792_690_000.5,
    created={"prompt_tokens_total": 1_792_690_100.25, "ttft": 1_792_690_100.5},
)
# Ten seconds later.
AFTER = dataclasses.replace(
    BEFORE,
    prompt_tokens_total=120_000,
    generation_tokens_total=20_415,
    preemptions_total=4,
    prefix_cache_queries_total=100_000,
    prefix_cache_hits_total=35_000,
    spec_decode_drafts_total=1_100,
    spec_decode_draft_tokens_total=3_300,
    spec_decode_accepted_tokens_total=2_240,
    ttft=hist((0.1, 10), (0.5, 30), (1.0, 90), (INF, 100)),
    inter_token_latency=hist((0.025, 100), (0.05, 1300), (0.1, 1400), (INF, 1400)),
)


def rates(before: MetricsSnapshot, after: MetricsSnapshot, *, seconds: float = 10.0,
          identities: tuple[str | None, str | None] = ("c1", "c1")) -> Rates:
    return compute_rates(Observation(before, T0, identities[0]),
                         Observation(after, T0 + seconds, identities[1]))


def assert_no_rates(result: Rates) -> None:
    values = result.as_dict()
    for key in ("restarted", "reason", "interval_seconds"):
        values.pop(key)
    assert set(values.values()) == {None}


def test_rates_over_a_normal_interval() -> None:
    result = rates(BEFORE, AFTER)
    assert not result.restarted and result.reason is None
    assert result.interval_seconds == 10.0
    assert result.prefill_tokens_per_s == 2000.0
    assert result.decode_tokens_per_s == 41.5
    assert result.preemptions_per_s == 0.1
    assert result.prefix_cache_hit_rate == 0.75
    assert result.spec_decode_acceptance_rate == 0.8
    assert result.spec_decode_mean_acceptance_length == 3.4


def test_quantiles_come_from_the_bucket_deltas_of_the_interval() -> None:
    result = rates(BEFORE, AFTER)
    # Interval TTFT buckets: 0 <= 0.1, 10 <= 0.5, 60 <= 1.0, 70 in all.
    # p50: rank 35 falls in (0.5, 1.0] holding 50, 25 into it: 0.5 + 0.5 * 25/50.
    assert result.ttft_p50_s == pytest.approx(0.75)
    # p95: rank 66.5 is beyond the last finite bucket: its bound, as Prometheus does.
    assert result.ttft_p95_s == 1.0
    # Since-start buckets would say otherwise: 0.5 + 0.5 * (50 - 30)/60.
    assert histogram_quantile(0.5, AFTER.ttft.buckets) == pytest.approx(0.6667, abs=1e-4)
    # ITL interval: 400 observations, all in (0.025, 0.05]: 0.025 + 0.025 * 200/400.
    assert result.itl_p50_s == pytest.approx(0.0375)
    assert result.itl_p95_s == pytest.approx(0.025 + 0.025 * 380 / 400)


def test_no_observations_in_the_interval_gives_no_quantiles_or_ratios() -> None:
    idle = dataclasses.replace(
        BEFORE, prompt_tokens_total=BEFORE.prompt_tokens_total, ttft=BEFORE.ttft)
    result = rates(BEFORE, idle)
    assert not result.restarted
    assert (result.ttft_p50_s, result.ttft_p95_s, result.itl_p50_s) == (None, None, None)
    assert result.prefix_cache_hit_rate is None  # no queries: unknown, not 0 %
    assert result.spec_decode_acceptance_rate is None
    assert result.prefill_tokens_per_s == 0.0  # a rate of zero is a real zero


def test_missing_metrics_give_none_not_zero() -> None:
    bare_before = MetricsSnapshot(model_name="m", engine=None, prompt_tokens_total=10)
    bare_after = MetricsSnapshot(model_name="m", engine=None, prompt_tokens_total=30)
    result = rates(bare_before, bare_after, seconds=4.0, identities=(None, None))
    assert result.prefill_tokens_per_s == 5.0
    assert result.decode_tokens_per_s is None
    assert result.ttft_p50_s is None


@pytest.mark.parametrize(
    ("after", "identities", "reason"),
    [
        (dataclasses.replace(AFTER, generation_tokens_total=512), ("c1", "c1"),
         "generation_tokens_total went down (20000 -> 512)"),
        # Counters climbed past their old values: only the start time shows the restart.
        (dataclasses.replace(AFTER, process_start_time_seconds=1_792_699_990.0), ("c1", "c1"),
         "process_start_time_seconds changed"),
        (dataclasses.replace(AFTER, created={"prompt_tokens_total": 1_792_699_991.0}),
         ("c1", "c1"), "prompt_tokens_total _created changed"),
        (AFTER, ("c1", "c2"), "engine identity changed (c1 -> c2)"),
        (dataclasses.replace(AFTER, ttft=hist((0.1, 1), (0.5, 2), (1.0, 3), (INF, 3))),
         ("c1", "c1"), "ttft histogram went down (30 -> 3 observations)"),
        (dataclasses.replace(AFTER, ttft=hist((0.2, 50), (INF, 100))), ("c1", "c1"),
         "ttft histogram buckets changed"),
        (dataclasses.replace(AFTER, model_name="qwen3"), ("c1", "c1"), "engine changed"),
    ],
)
def test_restart_gives_no_rates_never_negative_ones(
    after: MetricsSnapshot, identities: tuple[str, str], reason: str
) -> None:
    result = rates(BEFORE, after, identities=identities)
    assert result.restarted
    assert result.reason is not None and result.reason.startswith(reason)
    assert_no_rates(result)


def test_unknown_identity_on_one_side_is_not_a_restart() -> None:
    result = rates(BEFORE, AFTER, identities=(None, "c1"))
    assert not result.restarted
    assert result.prefill_tokens_per_s == 2000.0


def test_non_positive_interval_gives_no_rates_without_claiming_a_restart() -> None:
    result = rates(BEFORE, AFTER, seconds=0.0)
    assert not result.restarted
    assert result.reason == "no time passed between the scrapes (0.000 s)"
    assert_no_rates(result)


# --- histogram_quantile -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("q", "buckets", "expected"),
    [
        (0.5, ((1.0, 2), (2.0, 4), (4.0, 4), (INF, 4)), 1.0),
        (0.25, ((1.0, 2), (2.0, 4), (4.0, 4), (INF, 4)), 0.5),  # lowest bucket starts at 0
        (0.75, ((1.0, 2), (2.0, 4), (4.0, 4), (INF, 4)), 1.5),
        (0.99, ((1.0, 2), (2.0, 4), (INF, 8)), 2.0),  # in +Inf: highest finite bound
        (0.5, ((-1.0, 3), (INF, 4)), -1.0),  # a non-positive first bound is returned as is
        (0.5, ((1.0, 0), (INF, 0)), None),  # nothing observed
        (0.5, ((INF, 5),), None),  # no finite bucket to interpolate in
        (0.5, None, None),
    ],
)
def test_histogram_quantile_matches_prometheus(
    q: float, buckets: tuple[tuple[float, int], ...] | None, expected: float | None
) -> None:
    assert histogram_quantile(q, buckets) == expected


def test_histogram_quantile_rejects_a_quantile_outside_0_1() -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        histogram_quantile(1.5, ((1.0, 1), (INF, 1)))
