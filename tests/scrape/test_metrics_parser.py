"""parse_metrics_text / parse_engines against real-format expositions of several vLLM versions."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from collectors.vllm.metrics import (
    MetricsParseError,
    MetricsSnapshot,
    parse_engines,
    parse_metrics_text,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "vllm_metrics"
REQUIRED_KEYS = {
    "model_name", "requests_running", "requests_waiting", "kv_cache_usage",
    "prompt_tokens_total", "generation_tokens_total", "kv_cache_size_tokens", "num_gpu_blocks",
    "block_size", "kv_cache_memory_bytes",
}


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def parse_fixture(name: str) -> MetricsSnapshot:
    return parse_metrics_text(fixture_text(name))


# --- vLLM 0.33 --------------------------------------------------------------------------------


def test_v033_scalar_values() -> None:
    snap = parse_fixture("vllm_0_33_hybrid_spec.txt")
    assert (snap.model_name, snap.engine) == ("nemotron-3-super", "0")
    assert (snap.requests_running, snap.requests_waiting) == (3, 1)
    assert snap.kv_cache_usage == 0.4375
    assert (snap.prompt_tokens_total, snap.generation_tokens_total) == (1834562, 402117)
    assert snap.preemptions_total == 2
    assert (snap.prefix_cache_queries_total, snap.prefix_cache_hits_total) == (1500000, 612000)
    assert snap.spec_decode_drafts_total == 120000
    assert snap.spec_decode_draft_tokens_total == 360000
    assert snap.spec_decode_accepted_tokens_total == 301500
    assert snap.process_start_time_seconds == 1792680812.47
    assert snap.legacy_names == ()


def test_v033_hybrid_capacity_comes_from_the_label_not_blocks_times_block_size() -> None:
    snap = parse_fixture("vllm_0_33_hybrid_spec.txt")
    assert (snap.num_gpu_blocks, snap.block_size) == (1180, 1056)
    assert snap.kv_cache_size_tokens == 1230848
    assert snap.kv_cache_size_tokens != snap.num_gpu_blocks * snap.block_size
    assert snap.kv_cache_size_source == "kv_cache_size_tokens"
    assert snap.kv_cache_memory_bytes == 20 * 1024**3
    assert snap.kv_cache_max_concurrency == 9.39
    assert snap.gpu_memory_utilization == 0.3
    assert snap.cache_dtype == "fp8"
    assert snap.cache_config["mamba_cache_mode"] == "align"


def test_v033_histograms_are_cumulative_and_itl_is_not_the_per_request_tpot() -> None:
    snap = parse_fixture("vllm_0_33_hybrid_spec.txt")
    assert snap.ttft is not None and snap.inter_token_latency is not None
    ttft = dict(snap.ttft.buckets)
    assert (ttft[0.04], ttft[0.25], ttft[0.5], ttft[0.75], ttft[2.5], ttft[5.0]) == (
        5, 5, 45, 75, 95, 100)
    assert snap.ttft.buckets[-1] == (math.inf, 100)
    # 22 default TTFT bounds (vllm/v1/metrics/buckets.py) plus +Inf
    assert len(snap.ttft.buckets) == 23
    assert snap.ttft.count == 100
    assert snap.ttft.sum == pytest.approx(82.4)
    # request_time_per_output_token_seconds in the same text has 150 observations.
    assert snap.inter_token_latency.count == 10000
    assert dict(snap.inter_token_latency.buckets)[0.05] == 6000


def test_v033_created_timestamps_per_field() -> None:
    snap = parse_fixture("vllm_0_33_hybrid_spec.txt")
    assert snap.created["prompt_tokens_total"] == 1.7926811000005493e09
    assert snap.created["ttft"] == 1.792681100002334e09
    assert set(snap.created) >= {"generation_tokens_total", "inter_token_latency"}


def test_as_dict_is_json_ready_with_the_required_keys() -> None:
    data = parse_fixture("vllm_0_33_hybrid_spec.txt").as_dict()
    assert data.keys() >= REQUIRED_KEYS
    encoded = json.loads(json.dumps(data, allow_nan=False))
    assert encoded["kv_cache_size_tokens"] == 1230848
    assert encoded["ttft"]["buckets"][-1] == ["+Inf", 100]
    assert encoded["ttft"]["buckets"][0] == ["0.001", 0]


def test_dp2_multiprocess_gives_one_snapshot_per_engine_with_its_own_cache_config() -> None:
    engines = parse_engines(fixture_text("vllm_0_33_dp2_multiprocess.txt"))
    assert [(e.model_name, e.engine) for e in engines] == [
        ("gemma-4-26b", "0"), ("gemma-4-26b", "1")]
    first, second = engines
    assert (first.requests_running, second.requests_running) == (7, 5)
    assert (first.requests_waiting, second.requests_waiting) == (0, 2)
    assert (first.kv_cache_usage, second.kv_cache_usage) == (0.21875, 0.3125)
    assert first.kv_cache_size_tokens == second.kv_cache_size_tokens == 1114112
    assert first.kv_cache_memory_bytes is None  # the label is "None": not pinned
    # Multiprocess mode (prometheus_client's) has neither process_* nor _created series.
    assert first.process_start_time_seconds is None
    assert first.created == {}
    assert parse_metrics_text(fixture_text("vllm_0_33_dp2_multiprocess.txt")) == first


# --- older versions ---------------------------------------------------------------------------


def test_v011_prefers_new_names_when_deprecated_ones_are_also_shown() -> None:
    snap = parse_fixture("vllm_0_11_deprecated_names.txt")
    assert snap.legacy_names == ()
    assert (snap.prefix_cache_queries_total, snap.prefix_cache_hits_total) == (2048000, 1024000)
    assert snap.inter_token_latency is not None
    # The _created value identifies which of the two identical histograms was read.
    assert snap.created["inter_token_latency"] == 1.7609441000019016e09
    assert snap.kv_cache_usage == 0.96875
    assert snap.preemptions_total == 17


def test_v011_capacity_falls_back_to_blocks_times_block_size() -> None:
    snap = parse_fixture("vllm_0_11_deprecated_names.txt")
    assert (snap.num_gpu_blocks, snap.block_size) == (26589, 16)
    assert snap.kv_cache_size_tokens == 26589 * 16
    assert snap.kv_cache_size_source == "num_gpu_blocks*block_size"
    assert snap.kv_cache_memory_bytes is None
    assert snap.kv_cache_max_concurrency is None


def test_v08_old_names_without_engine_label() -> None:
    snap = parse_fixture("vllm_0_8_v1_model_name_only.txt")
    assert (snap.model_name, snap.engine) == ("Qwen/Qwen2.5-Coder-32B-Instruct", None)
    assert (snap.requests_running, snap.requests_waiting) == (2, 0)
    assert snap.kv_cache_usage == 0.0625  # gpu_cache_usage_perc is a fraction too
    assert (snap.prefix_cache_queries_total, snap.prefix_cache_hits_total) == (5120, 1536)
    assert snap.inter_token_latency is not None and snap.inter_token_latency.count == 9059
    assert snap.ttft is not None and dict(snap.ttft.buckets)[0.5] == 7
    assert snap.legacy_names == (
        "vllm:gpu_cache_usage_perc",
        "vllm:gpu_prefix_cache_queries_total",
        "vllm:gpu_prefix_cache_hits_total",
        "vllm:time_per_output_token_seconds",
    )
    assert snap.process_start_time_seconds == 1742631188.26


def test_v08_unknown_stays_none_and_config_without_engine_label_is_joined() -> None:
    snap = parse_fixture("vllm_0_8_v1_model_name_only.txt")
    assert snap.preemptions_total is None  # not exposed by this version: unknown, not 0
    assert snap.spec_decode_drafts_total is None
    assert snap.kv_cache_size_tokens == 8192 * 16
    assert snap.kv_cache_memory_bytes is None
    assert snap.cache_config["swap_space_bytes"] == "4294967296"


# --- small expositions ------------------------------------------------------------------------

MINIMAL = 'vllm:num_requests_running{engine="0",model_name="m"} 1.0\n'


def test_minimal_exposition_leaves_everything_else_unknown() -> None:
    data = parse_metrics_text(MINIMAL).as_dict()
    assert data["requests_running"] == 1
    assert all(data[key] is None for key in REQUIRED_KEYS - {"model_name", "requests_running"})


def test_new_kv_usage_name_wins_over_old_when_values_differ() -> None:
    text = (
        'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
    )
    snap = parse_metrics_text(text)
    assert snap.kv_cache_usage == 0.5
    assert snap.legacy_names == ()


def test_several_models_behind_one_endpoint() -> None:
    text = (
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1.0\n'
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="200"} 1.0\n'
        'vllm:num_requests_running{engine="0",model_name="a"} 1.0\n'
        'vllm:num_requests_running{engine="0",model_name="b"} 2.0\n'
    )
    first, second = parse_engines(text)
    assert (first.model_name, first.requests_running) == ("a", 1)
    assert (second.model_name, second.requests_running) == ("b", 2)
    # cache_config_info has no model_name label: which config is whose cannot be known.
    assert first.kv_cache_size_tokens is None and second.num_gpu_blocks is None


def test_non_numeric_config_labels_are_unknown() -> None:
    text = MINIMAL + 'vllm:cache_config_info{block_size="auto",engine="0",num_gpu_blocks="7"} 1\n'
    snap = parse_metrics_text(text)
    assert (snap.block_size, snap.num_gpu_blocks, snap.kv_cache_size_tokens) == (None, 7, None)


# --- rejected texts ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "not a vLLM /metrics endpoint: the body is empty"),
        ("# HELP node_load1 1m load average.\n# TYPE node_load1 gauge\nnode_load1 0.3\n",
         "not a vLLM /metrics endpoint: no vllm:num_requests_running"),
        ("<!DOCTYPE html>\n<html><body>Bad Gateway</body></html>\n",
         "not Prometheus text: invalid metric name"),
        ('{"detail":"Not Found"}\n', "not Prometheus text: Invalid labels"),
        (MINIMAL + 'vllm:prompt_tokens_total{engine="0",model_name="m"} 12',
         "not Prometheus text: the last line does not end with a line feed"),
    ],
)
def test_not_a_vllm_exposition(text: str, reason: str) -> None:
    with pytest.raises(MetricsParseError) as caught:
        parse_metrics_text(text)
    assert caught.value.reason.startswith(reason)
    assert "\n" not in caught.value.reason


def test_a_bad_line_after_good_ones_returns_nothing() -> None:
    # prometheus_client has already yielded the good families when it meets the bad line.
    text = fixture_text("vllm_0_33_hybrid_spec.txt") + "vllm:broken{ 1\n"
    with pytest.raises(MetricsParseError, match="^not Prometheus text: "):
        parse_engines(text)


HIST = "vllm:time_to_first_token_seconds"


@pytest.mark.parametrize(
    ("lines", "reason"),
    [
        ([f'{HIST}_bucket{{le="0.1",model_name="m"}} 1'],
         "invalid vLLM metrics: vllm:time_to_first_token_seconds for model 'm' engine None has "
         "no +Inf bucket"),
        ([f'{HIST}_bucket{{le="0.1",model_name="m"}} 5',
          f'{HIST}_bucket{{le="+Inf",model_name="m"}} 4'],
         "buckets are not cumulative"),
        ([f'{HIST}_bucket{{le="+Inf",model_name="m"}} 4', f'{HIST}_count{{model_name="m"}} 5'],
         "has _count 5 but +Inf bucket 4"),
        ([f'{HIST}_bucket{{le="soon",model_name="m"}} 4'], "has a bucket le='soon'"),
        (['vllm:prompt_tokens_total{model_name="m"} -3'],
         "vllm:prompt_tokens_total is -3.0, not a count"),
        (['vllm:num_requests_running{model_name="m"} 2.5'], "is 2.5, not a count"),
        (['vllm:kv_cache_usage_perc{model_name="m"} 57.0'], "not a fraction between 0 and 1"),
        (['vllm:kv_cache_usage_perc{model_name="m"} NaN'], "not a fraction between 0 and 1"),
        (['vllm:num_requests_running{model_name="m"} 1',
          'vllm:num_requests_running{model_name="m"} 2'],
         "several vllm:num_requests_running series for model 'm' engine None"),
    ],
)
def test_impossible_values_reject_the_whole_text(lines: list[str], reason: str) -> None:
    with pytest.raises(MetricsParseError) as caught:
        parse_engines("\n".join(lines) + "\n")
    assert caught.value.reason.startswith("invalid vLLM metrics: ")
    assert reason in caught.value.reason


def test_only_the_families_sparkops_reads_are_parsed_but_broken_text_is_still_refused() -> None:
    text = fixture_text("vllm_0_33_hybrid_spec.txt")
    # A family SparkOps never reads, written wrongly inside its braces: skipped unread.
    assert parse_engines(text + 'some_exporter_metric{a=unquoted} 1\n') == parse_engines(text)
    # Text whose shape is not a sample at all still reaches the parser, which refuses it.
    with pytest.raises(MetricsParseError, match="^not Prometheus text: "):
        parse_engines(text + "some_exporter_metric{ 1\n")
    with pytest.raises(MetricsParseError, match="^not Prometheus text: "):
        parse_engines(text + 'vllm:num_requests_running{model_name="m",engine="0"} one\n')
