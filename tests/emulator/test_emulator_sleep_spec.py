"""The emulator's sleep mode and speculative decoding, as a real process observed from outside.

Sleep mode really gives memory back and takes it again (the process's VmRSS), answers and logs
as vLLM 0.33 does (vllm/entrypoints/serve/dev/sleep/api_router.py, vllm/v1/worker/gpu_worker.py,
vllm/v1/executor/abstract.py), and its endpoints exist only with VLLM_SERVER_DEV_MODE=1; with
``--speculative-config`` the spec-decode counters move at the configured acceptance.
"""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from collectors.vllm.metrics import parse_engines

from .harness import FAST_PHASES, MIB, Emulator, metric_value

pytestmark = pytest.mark.slow
KV, WEIGHTS = 192 * MIB, 96 * MIB
# Pages the interpreter itself touches or gives back meanwhile: moves are checked to this.
SLACK = 24 * MIB


def _sleepy(*extra: str) -> Emulator:
    return Emulator(*FAST_PHASES, "--kv-cache-memory-bytes", "192M",
                    "--emulator-weights-bytes", "96M", *extra)


@pytest.fixture
def dev_mode(monkeypatch):
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")


def _sleep_state(emulator: Emulator) -> tuple[bool | None, int | None]:
    snapshot = parse_engines(emulator.metrics_text())[0]
    return snapshot.asleep, snapshot.sleep_level


def test_level_1_frees_the_kv_pool_only_and_waking_takes_it_back(dev_mode):
    emulator = _sleepy("--enable-sleep-mode")
    try:
        emulator.wait_ready()
        awake = emulator.rss_bytes()

        status, body = emulator.request("/sleep?level=1", {})
        asleep = emulator.rss_bytes()
        sleeping = emulator.get_json("/is_sleeping")
        state = _sleep_state(emulator)
        woke_status, woke_body = emulator.request("/wake_up", {})
        woken = emulator.rss_bytes()
        emulator.wait_for_line(r"It took [\d.]+ seconds to wake up tags \{'weights', 'kv_cache'\}")
        awake_state = _sleep_state(emulator)
    finally:
        emulator.close()

    assert (status, json.loads(body)) == (200, {"status": "sleeping", "level": 1})
    assert abs((awake - asleep) - KV) <= SLACK  # the weights stay: offloaded to host memory
    assert sleeping == {"is_sleeping": True} and state == (True, 1)
    assert (woke_status, json.loads(woke_body)) == (200, {"status": "awake", "tags": None})
    assert abs((woken - asleep) - KV) <= SLACK
    assert awake_state == (False, None)
    log = emulator.log_text()
    assert "[gpu_worker.py:335] Sleep mode freed " in log
    assert "GiB memory is still in use." in log
    assert "seconds to fall asleep." in log
    assert "wake up the engine with tags: None" in log


def test_level_2_frees_weights_and_kv_and_a_partial_wake_up_keeps_it_asleep(dev_mode):
    emulator = _sleepy("--enable-sleep-mode")
    try:
        emulator.wait_ready()
        awake = emulator.rss_bytes()
        emulator.request("/sleep?level=2", {})
        asleep = emulator.rss_bytes()
        state = _sleep_state(emulator)
        _, partial = emulator.request("/wake_up?tags=weights", {})
        weights_back = emulator.rss_bytes()
        still = emulator.get_json("/is_sleeping")
        _, whole = emulator.request("/wake_up?tags=kv_cache", {})
        woken = emulator.rss_bytes()
    finally:
        emulator.close()

    assert abs((awake - asleep) - (KV + WEIGHTS)) <= SLACK
    assert state == (True, 2)
    assert json.loads(partial) == {"status": "sleeping", "tags": ["weights"]}
    assert abs((weights_back - asleep) - WEIGHTS) <= SLACK and still == {"is_sleeping": True}
    assert json.loads(whole) == {"status": "awake", "tags": ["kv_cache"]}
    assert abs((woken - asleep) - (KV + WEIGHTS)) <= SLACK


def test_without_enable_sleep_mode_a_sleep_frees_nothing(dev_mode):
    emulator = _sleepy()
    try:
        emulator.wait_ready()
        awake = emulator.rss_bytes()
        status, _ = emulator.request("/sleep?level=1", {})
        asleep = emulator.rss_bytes()
        state = _sleep_state(emulator)
    finally:
        emulator.close()

    assert status == 200 and state == (True, 1)
    assert abs(awake - asleep) <= SLACK


def test_the_sleep_endpoints_need_vllm_server_dev_mode(monkeypatch):
    monkeypatch.delenv("VLLM_SERVER_DEV_MODE", raising=False)
    emulator = _sleepy("--enable-sleep-mode")
    try:
        emulator.wait_ready()
        sleep = emulator.request("/sleep?level=1", {})
        is_sleeping = emulator.request("/is_sleeping")
    finally:
        emulator.close()

    assert sleep[0] == 404 and is_sleeping[0] == 404


def test_a_level_out_of_range_is_refused_like_fastapi(dev_mode):
    emulator = _sleepy("--enable-sleep-mode")
    try:
        emulator.wait_ready()
        status, body = emulator.request("/sleep?level=3", {})
    finally:
        emulator.close()

    assert status == 422 and json.loads(body)["detail"][0]["loc"] == ["query", "level"]


def test_speculative_counters_move_at_the_configured_acceptance():
    emulator = Emulator(*FAST_PHASES, "--speculative-config",
                        '{"method": "eagle", "num_speculative_tokens": 4}',
                        "--emulator-spec-acceptance", "0.743", "--emulator-load", "6:64:48",
                        "--emulator-stats-interval", "1")
    try:
        emulator.wait_ready()
        emulator.wait_for_line(r"SpecDecoding metrics: Mean acceptance length: [\d.]+")
        families = {f.name: f for f in text_string_to_metric_families(emulator.metrics_text())}
    finally:
        emulator.close()

    drafts = metric_value(families, "vllm:spec_decode_num_drafts_total", engine="0")
    drafted = metric_value(families, "vllm:spec_decode_num_draft_tokens_total", engine="0")
    accepted = metric_value(families, "vllm:spec_decode_num_accepted_tokens_total", engine="0")
    per_position = [metric_value(families, "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                                 position=str(p)) for p in range(4)]
    assert drafts > 0 and drafted == 4 * drafts
    assert accepted / drafted == pytest.approx(0.743, abs=0.02)
    assert sum(per_position) == accepted and per_position == sorted(per_position, reverse=True)
    assert "speculative_config=SpeculativeConfig(method='eagle', model=None, num_spec_tokens=4)" \
        in emulator.log_text()
